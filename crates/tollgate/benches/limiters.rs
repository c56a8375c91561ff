//! Tollgate against the real alternatives, side by side in one run, each on its real clock
//! (tollgate's `SystemClock` and governor's default `QuantaClock`, both reading quanta):
//!
//! 0. `clock_now`: one clock read each, for context;
//! 1. `single_key/*`: one token bucket, `try_acquire(1)` against governor's direct `check()`,
//!    with a quota that admits nearly everything (`admit`: the caller asks `is_ok()`;
//!    `admit_kept`: the whole answer is kept) and one that rejects nearly everything (`reject`,
//!    `reject_kept`, the same two ways);
//! 2. `keyed_1m`: 1 million pre-populated `u64` keys, decisions on random keys, against
//!    governor's keyed limiter (a `DashMap`), the caller asking `is_ok()` on both sides;
//!    `keyed_1k` is the same on 1,000 keys, all in cache;
//! 3. `keyed_1m_threads/*`: the same limiters, 1 thread against 2 threads on distinct keys
//!    (wall time of one decision per thread, so the 2-thread case does twice the work);
//! 4. `concurrency/*`: acquire a permit and drop it, against `tokio::sync::Semaphore`: borrowed
//!    (`try_permit` against `try_acquire`), owned (a `Lease` against `try_acquire_owned`) and
//!    with `acquire().await` (polled by `futures::executor::block_on`).
//!
//! Run with `cargo bench -p tollgate --bench limiters`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, RateLimiter};
use tollgate::{Clock, Concurrency, Keyed, Limiter, Quota, SystemClock, TokenBucket};

#[path = "../tests/support/rng.rs"]
mod rng;
#[path = "../tests/support/threads.rs"]
mod threads;
use rng::Rng;
use threads::decisions;

/// Keys in the keyed benchmarks.
const KEYS: u64 = 1_000_000;
/// Keys in the in-cache keyed benchmark.
const SMALL_KEYS: u64 = 1_000;

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

/// Context for the rest: what one read of each library's clock costs (both read the TSC through
/// quanta; they differ in how they turn it into nanoseconds).
fn clock(c: &mut Criterion) {
    let ours = SystemClock::new();
    let theirs = governor::clock::QuantaClock::default();
    let mut g = c.benchmark_group("clock_now");
    g.throughput(Throughput::Elements(1));
    g.bench_function("tollgate", |b| b.iter(|| black_box(ours.now())));
    g.bench_function("governor", |b| b.iter(|| black_box(governor::clock::Clock::now(&theirs))));
    g.finish();
}

fn single_key(c: &mut Criterion) {
    // 1e9 permits/s (one per nanosecond) with a burst of u32::MAX (governor's largest): every
    // decision costs far more than 1 ns, so the bucket never runs dry.
    let admit = Limiter::new(TokenBucket::new(
        Quota::per_second(1_000_000_000).unwrap().with_burst(u64::from(u32::MAX)).unwrap(),
    ));
    let gov_admit: DefaultDirectRateLimiter =
        RateLimiter::direct(governor::Quota::per_second(nz(1_000_000_000)).allow_burst(nz(u32::MAX)));
    assert!(admit.try_acquire(1).is_ok() && gov_admit.check().is_ok());

    // The decision as a caller that only asks "may it go?" sees it (`if try_acquire(1).is_ok()`).
    let mut g = c.benchmark_group("single_key/admit");
    g.throughput(Throughput::Elements(1));
    g.bench_function("tollgate", |b| b.iter(|| admit.try_acquire(black_box(1)).is_ok()));
    g.bench_function("governor", |b| b.iter(|| gov_admit.check().is_ok()));
    g.finish();
    // The whole answer kept (black-boxed): tollgate's `Lease` is ~100 bytes against governor's
    // `()`, and forcing it through memory costs a copy.
    let mut g = c.benchmark_group("single_key/admit_kept");
    g.throughput(Throughput::Elements(1));
    g.bench_function("tollgate", |b| b.iter(|| black_box(admit.try_acquire(black_box(1)))));
    g.bench_function("governor", |b| b.iter(|| black_box(gov_admit.check())));
    g.finish();
    // Not a single rejection, or this was not the admission path.
    assert!(admit.try_acquire(1).is_ok(), "still admitting after the run");

    // 1 per hour, burst 1: after the first permit everything is rejected.
    let reject = Limiter::new(TokenBucket::new(Quota::per_hour(1).unwrap()));
    let gov_reject: DefaultDirectRateLimiter = RateLimiter::direct(governor::Quota::per_hour(nz(1)));
    assert!(reject.try_acquire(1).is_ok() && gov_reject.check().is_ok());
    assert!(reject.try_acquire(1).is_err() && gov_reject.check().is_err());

    // As `admit`: the caller asks "may it go?".
    let mut g = c.benchmark_group("single_key/reject");
    g.throughput(Throughput::Elements(1));
    g.bench_function("tollgate", |b| b.iter(|| reject.try_acquire(black_box(1)).is_ok()));
    g.bench_function("governor", |b| b.iter(|| gov_reject.check().is_ok()));
    g.finish();
    // As `admit_kept`. The answer is put together in registers and copied into `black_box`'s
    // slot; the copy's 16-byte loads straddle two 8-byte stores and miss store forwarding (perf:
    // ~40 % of this loop's samples on one such load). A caller that reads the answer pays none
    // of it; one that stores it whole pays it as here.
    let mut g = c.benchmark_group("single_key/reject_kept");
    g.throughput(Throughput::Elements(1));
    g.bench_function("tollgate", |b| b.iter(|| black_box(reject.try_acquire(black_box(1)))));
    g.bench_function("governor", |b| b.iter(|| black_box(gov_reject.check())));
    g.finish();
    assert!(reject.try_acquire(1).is_err(), "still rejecting after the run");
}

/// 1M keys in each keyed limiter. Built on first use, so a filtered run that skips the keyed
/// benchmarks does not pay for it.
struct KeyedPair {
    ours: Keyed<u64, TokenBucket>,
    theirs: DefaultKeyedRateLimiter<u64>,
}

impl KeyedPair {
    fn build() -> KeyedPair {
        // 1 permit per hour with a burst of 1M: every key admits all the decisions this benchmark
        // makes on it, and a key touched once stays non-idle for an hour, so tollgate's sweep of
        // idle keys (before a shard's table grows) removes nothing and both maps keep all 1M keys.
        let quota = Quota::per_hour(1).unwrap().with_burst(1_000_000).unwrap();
        let gov_quota = governor::Quota::per_hour(nz(1)).allow_burst(nz(1_000_000));
        let ours: Keyed<u64, TokenBucket> = Keyed::new(TokenBucket::new(quota));
        let theirs: DefaultKeyedRateLimiter<u64> = RateLimiter::keyed(gov_quota);
        for key in 0..KEYS {
            assert!(ours.try_acquire(&key, 1).is_ok());
            assert!(theirs.check_key(&key).is_ok());
        }
        assert_eq!(ours.len() as u64, KEYS);
        assert_eq!(theirs.len() as u64, KEYS);
        KeyedPair { ours, theirs }
    }
}

fn keyed(c: &mut Criterion) {
    let pair = OnceLock::new();
    let ours = || &pair.get_or_init(KeyedPair::build).ours;
    let theirs = || &pair.get_or_init(KeyedPair::build).theirs;

    let mut g = c.benchmark_group("keyed_1m");
    g.throughput(Throughput::Elements(1));
    g.bench_function("tollgate", |b| {
        let (ours, mut rng) = (ours(), Rng(1));
        b.iter(|| ours.try_acquire(&rng.below(KEYS), 1).is_ok())
    });
    g.bench_function("governor", |b| {
        let (theirs, mut rng) = (theirs(), Rng(1));
        b.iter(|| theirs.check_key(&rng.below(KEYS)).is_ok())
    });
    g.finish();

    // The same decision on 1,000 keys (all in cache): what is left when memory is not the cost.
    let small = OnceLock::new();
    let small = || {
        small.get_or_init(|| {
            let quota = Quota::per_hour(1).unwrap().with_burst(1_000_000).unwrap();
            let ours: Keyed<u64, TokenBucket> = Keyed::new(TokenBucket::new(quota));
            let theirs: DefaultKeyedRateLimiter<u64> =
                RateLimiter::keyed(governor::Quota::per_hour(nz(1)).allow_burst(nz(1_000_000)));
            for key in 0..SMALL_KEYS {
                assert!(ours.try_acquire(&key, 1).is_ok() && theirs.check_key(&key).is_ok());
            }
            (ours, theirs)
        })
    };
    let mut g = c.benchmark_group("keyed_1k");
    g.throughput(Throughput::Elements(1));
    g.bench_function("tollgate", |b| {
        let (ours, mut rng) = (&small().0, Rng(1));
        b.iter(|| ours.try_acquire(&rng.below(SMALL_KEYS), 1).is_ok())
    });
    g.bench_function("governor", |b| {
        let (theirs, mut rng) = (&small().1, Rng(1));
        b.iter(|| theirs.check_key(&rng.below(SMALL_KEYS)).is_ok())
    });
    g.finish();

    // Thread `t` of `n` uses only keys `k` with `k % 2 == t`: the 1-thread run does thread 0's
    // share, the 2-thread run does both shares at once (twice the decisions).
    let mut g = c.benchmark_group("keyed_1m_threads");
    g.measurement_time(Duration::from_secs(3));
    for threads in [1u64, 2] {
        g.throughput(Throughput::Elements(threads));
        g.bench_function(format!("tollgate/{threads}"), |b| {
            let ours = ours();
            b.iter_custom(|iters| decisions(threads, iters, KEYS, |key| ours.try_acquire(&key, 1).is_ok()))
        });
        g.bench_function(format!("governor/{threads}"), |b| {
            let theirs = theirs();
            b.iter_custom(|iters| decisions(threads, iters, KEYS, |key| theirs.check_key(&key).is_ok()))
        });
    }
    g.finish();
    if let Some(pair) = pair.get() {
        let stats = pair.ours.statistics();
        assert_eq!(stats.keys as u64, KEYS);
    }
}

fn concurrency(c: &mut Criterion) {
    const PERMITS: u64 = 1024;
    let limiter = Limiter::new(Concurrency::new(PERMITS).unwrap());
    let semaphore = tokio::sync::Semaphore::new(PERMITS as usize);

    // Borrowed permits: neither side touches a reference count.
    let mut g = c.benchmark_group("concurrency/try_acquire_drop");
    g.throughput(Throughput::Elements(1));
    g.bench_function("tollgate", |b| b.iter(|| drop(black_box(limiter.try_permit(black_box(1)).unwrap()))));
    g.bench_function("tokio", |b| b.iter(|| drop(black_box(semaphore.try_acquire().unwrap()))));
    g.finish();

    // Owned permits (they can move into a task): a `Lease` against `try_acquire_owned`.
    let shared = std::sync::Arc::new(tokio::sync::Semaphore::new(PERMITS as usize));
    let mut g = c.benchmark_group("concurrency/owned_try_acquire_drop");
    g.throughput(Throughput::Elements(1));
    g.bench_function("tollgate", |b| b.iter(|| drop(black_box(limiter.try_acquire(black_box(1)).unwrap()))));
    g.bench_function("tokio", |b| b.iter(|| drop(black_box(shared.clone().try_acquire_owned().unwrap()))));
    g.finish();

    // One `block_on` per batch, so the executor's own cost is not in the per-decision time.
    let mut g = c.benchmark_group("concurrency/acquire_await_drop");
    g.throughput(Throughput::Elements(1));
    g.bench_function("tollgate", |b| {
        b.iter_custom(|iters| {
            futures::executor::block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    drop(black_box(limiter.acquire(black_box(1)).await.unwrap()));
                }
                start.elapsed()
            })
        })
    });
    g.bench_function("tokio", |b| {
        b.iter_custom(|iters| {
            futures::executor::block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    drop(black_box(semaphore.acquire().await.unwrap()));
                }
                start.elapsed()
            })
        })
    });
    g.finish();
    assert_eq!(limiter.held(), 0);
    assert_eq!(semaphore.available_permits(), PERMITS as usize);
}

fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(2)).sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = clock, single_key, keyed, concurrency
}
criterion_main!(benches);
