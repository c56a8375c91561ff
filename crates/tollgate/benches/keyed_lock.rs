//! The lock over `Keyed`'s shards: the biased lock (`src/biased_lock.rs`, the core's one use of
//! `unsafe`) against a plain `std::sync::RwLock` per shard. Issue 36 keeps the `unsafe` only if
//! it buys at least 10 % on keyed decisions, on one thread or on two.
//!
//! The same decision both ways: `try_acquire(key, 1)` on 1,000 `u64` keys of a token bucket, all
//! stored and all in cache, on the system clock (the path `keyed_1k` in `limiters.rs` measures),
//! on 1 thread and on 2 threads (each thread on its own half of the keys; wall time of one
//! decision per thread, so the 2-thread case does twice the work). The two locks alternate within
//! one run, so that a noisy machine's drift falls on both alike: compare within a run only.
//!
//! Criterion's figures come first (`keyed_lock/{1,2}/{biased,rwlock}`), each lock measured for a
//! few seconds in turn; on a machine whose speed drifts within seconds they can disagree from run
//! to run. Then `paired` alternates the two locks in slices of a million decisions per thread
//! (each pair in the other order than the last), takes the ratio within each pair, and prints the
//! median ratio `rwlock / biased` (above 1: the biased lock is faster) with its quartiles.
//!
//! Run with `cargo bench -p tollgate --features bench-locks --bench keyed_lock` (about 30 s).

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group};
use threads::decisions;
use tollgate::{Keyed, KeyedOnRwLock, Quota, TokenBucket};

#[path = "../tests/support/rng.rs"]
mod rng;
#[path = "../tests/support/threads.rs"]
mod threads;

/// Keys: all stored before the run, all in cache.
const KEYS: u64 = 1_000;

/// Decisions per thread in one slice of the paired measurement.
const SLICE: u64 = 1_000_000;
/// Pairs of slices per thread count.
const PAIRS: usize = 40;

/// 1 permit per hour with a burst of 4M: every decision of the run is admitted (about a million
/// per key on a fast machine), and no key goes idle.
fn bucket() -> TokenBucket {
    TokenBucket::new(Quota::per_hour(1).unwrap().with_burst(4_000_000).unwrap())
}

/// The two limiters, every key stored.
fn tables() -> (Keyed<u64, TokenBucket>, KeyedOnRwLock<u64, TokenBucket>) {
    let biased: Keyed<u64, TokenBucket> = Keyed::new(bucket());
    let rwlock: KeyedOnRwLock<u64, TokenBucket> = Keyed::builder(bucket()).build_on_rwlock();
    for key in 0..KEYS {
        assert!(biased.try_acquire(&key, 1).is_ok() && rwlock.try_acquire(&key, 1).is_ok());
    }
    assert_eq!((biased.len() as u64, rwlock.len() as u64), (KEYS, KEYS));
    (biased, rwlock)
}

fn keyed_lock(c: &mut Criterion) {
    let (biased, rwlock) = tables();

    let mut g = c.benchmark_group("keyed_lock");
    for threads in [1u64, 2] {
        g.throughput(Throughput::Elements(threads));
        g.bench_function(format!("{threads}/biased"), |b| {
            b.iter_custom(|iters| decisions(threads, iters, KEYS, |key| biased.try_acquire(&key, 1).is_ok()))
        });
        g.bench_function(format!("{threads}/rwlock"), |b| {
            b.iter_custom(|iters| decisions(threads, iters, KEYS, |key| rwlock.try_acquire(&key, 1).is_ok()))
        });
    }
    g.finish();
    assert!(biased.try_acquire(&0, 1).is_ok() && rwlock.try_acquire(&0, 1).is_ok(), "every decision admitted");
}

fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(30)
}

/// Slices of `SLICE` decisions per thread, the two locks one after the other in alternating
/// order: prints, per thread count, the ratio `rwlock / biased` of each pair's times as its
/// median and quartiles.
fn paired() {
    let (biased, rwlock) = tables();
    let slice = |threads, on_biased: bool| {
        if on_biased {
            decisions(threads, SLICE, KEYS, |key| biased.try_acquire(&key, 1).is_ok())
        } else {
            decisions(threads, SLICE, KEYS, |key| rwlock.try_acquire(&key, 1).is_ok())
        }
    };
    for threads in [1u64, 2] {
        // One pair each way first, untimed: caches, the branch predictor and the clock settle.
        slice(threads, true);
        slice(threads, false);
        let mut ratios: Vec<f64> = (0..PAIRS)
            .map(|pair| {
                let first_biased = pair % 2 == 0;
                let first = slice(threads, first_biased);
                let second = slice(threads, !first_biased);
                let (b, r) = if first_biased { (first, second) } else { (second, first) };
                r.as_secs_f64() / b.as_secs_f64()
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        let at = |q: f64| ratios[((PAIRS - 1) as f64 * q).round() as usize];
        println!(
            "keyed_lock/paired/{threads}: rwlock / biased = {:.3} (quartiles {:.3} to {:.3}, {PAIRS} pairs of {SLICE} decisions per thread)",
            at(0.5),
            at(0.25),
            at(0.75),
        );
    }
    assert!(biased.try_acquire(&0, 1).is_ok() && rwlock.try_acquire(&0, 1).is_ok(), "every decision admitted");
}

criterion_group! {
    name = benches;
    config = config();
    targets = keyed_lock
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    paired();
}
