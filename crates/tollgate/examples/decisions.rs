//! A fixed number of decisions on one path, for instruction counts that do not depend on the
//! machine's load: run it under callgrind with two counts and divide the difference.
//!
//! ```text
//! cargo build --release -p tollgate --example decisions
//! for n in 100000 200000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/decisions admit/tollgate $n 2>&1 | grep refs
//! done
//! ```
//! Paths: `admit/{tollgate,governor}`, `reject/{tollgate,governor}` (the whole answer kept),
//! `admit_ok/{tollgate,governor}` and `reject_ok/…` (the caller asks `is_ok()`, as
//! `benches/limiters.rs` measures them), `keyed/{tollgate,governor}`
//! (1,000 `u64` keys, all present, walked in a fixed stride), `permit/{tollgate,tokio}` (borrowed
//! permits: `try_permit` against `Semaphore::try_acquire`) and `concurrency/{tollgate,tokio}`
//! (owned: a `Lease` against `Semaphore::try_acquire_owned`).

use std::hint::black_box;
use std::num::NonZeroU32;

use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, RateLimiter};
use tollgate::{Concurrency, Keyed, Limiter, Quota, TokenBucket};

/// Keys of the keyed path: all in cache.
const KEYS: u64 = 1_000;

/// The `i`th key of the walk: a stride coprime with `KEYS`, so consecutive decisions hit
/// different keys (and shards) without a random number generator's cost.
fn key(i: u64) -> u64 {
    (i * 617) % KEYS
}

/// The decisions themselves; `.ci/instructions` counts only inside this function (set-up, such as
/// the clocks' calibration, varies from run to run).
#[inline(never)]
fn measured(count: u64, mut decide: impl FnMut(u64)) {
    (0..count).for_each(&mut decide);
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage =
        "usage: decisions <admit|admit_ok|reject|reject_ok|keyed|permit|concurrency>/<tollgate|governor|tokio> <count>";
    let path = args.next().ok_or(usage)?;
    let count: u64 = args.next().ok_or(usage)?.parse()?;
    let nz = |n: u32| NonZeroU32::new(n).expect("nonzero");
    match path.as_str() {
        "admit/tollgate" => {
            let l = Limiter::new(TokenBucket::new(Quota::per_second(1_000_000_000)?.with_burst(u64::from(u32::MAX))?));
            measured(count, |_| drop(black_box(l.try_acquire(black_box(1)))));
        }
        "admit/governor" => {
            let l: DefaultDirectRateLimiter =
                RateLimiter::direct(governor::Quota::per_second(nz(1_000_000_000)).allow_burst(nz(u32::MAX)));
            measured(count, |_| drop(black_box(l.check())));
        }
        "admit_ok/tollgate" => {
            let l = Limiter::new(TokenBucket::new(Quota::per_second(1_000_000_000)?.with_burst(u64::from(u32::MAX))?));
            measured(count, |_| {
                black_box(l.try_acquire(black_box(1)).is_ok());
            });
        }
        "admit_ok/governor" => {
            let l: DefaultDirectRateLimiter =
                RateLimiter::direct(governor::Quota::per_second(nz(1_000_000_000)).allow_burst(nz(u32::MAX)));
            measured(count, |_| {
                black_box(l.check().is_ok());
            });
        }
        "reject_ok/tollgate" => {
            let l = Limiter::new(TokenBucket::new(Quota::per_hour(1)?));
            let _first = l.try_acquire(1);
            measured(count, |_| {
                black_box(l.try_acquire(black_box(1)).is_ok());
            });
        }
        "reject_ok/governor" => {
            let l: DefaultDirectRateLimiter = RateLimiter::direct(governor::Quota::per_hour(nz(1)));
            let _first = l.check();
            measured(count, |_| {
                black_box(l.check().is_ok());
            });
        }
        "reject/tollgate" => {
            let l = Limiter::new(TokenBucket::new(Quota::per_hour(1)?));
            let _first = l.try_acquire(1);
            measured(count, |_| drop(black_box(l.try_acquire(black_box(1)))));
        }
        "reject/governor" => {
            let l: DefaultDirectRateLimiter = RateLimiter::direct(governor::Quota::per_hour(nz(1)));
            let _first = l.check();
            measured(count, |_| drop(black_box(l.check())));
        }
        // As in benches/limiters.rs: 1 per hour, burst 1M, so every key admits and stays non-idle
        // (tollgate sweeps idle keys before a table grows; both maps keep all keys).
        "keyed/tollgate" => {
            let l: Keyed<u64, _> = Keyed::new(TokenBucket::new(Quota::per_hour(1)?.with_burst(1_000_000)?));
            (0..KEYS).for_each(|k| drop(l.try_acquire(&k, 1)));
            measured(count, |i| drop(black_box(l.try_acquire(&key(i), black_box(1)))));
        }
        "keyed/governor" => {
            let l: DefaultKeyedRateLimiter<u64> =
                RateLimiter::keyed(governor::Quota::per_hour(nz(1)).allow_burst(nz(1_000_000)));
            (0..KEYS).for_each(|k| drop(l.check_key(&k)));
            measured(count, |i| drop(black_box(l.check_key(&key(i)))));
        }
        "concurrency/tollgate" => {
            // An owned lease (it could move into a task), against tokio's owned permit.
            let l = Limiter::new(Concurrency::new(1_000)?);
            measured(count, |_| drop(black_box(l.try_acquire(black_box(1)))));
        }
        "permit/tollgate" => {
            let l = Limiter::new(Concurrency::new(1_000)?);
            measured(count, |_| drop(black_box(l.try_permit(black_box(1)))));
        }
        "permit/tokio" => {
            let s = tokio::sync::Semaphore::new(1_000);
            measured(count, |_| drop(black_box(s.try_acquire())));
        }
        "concurrency/tokio" => {
            let s = std::sync::Arc::new(tokio::sync::Semaphore::new(1_000));
            measured(count, |_| drop(black_box(s.clone().try_acquire_owned())));
        }
        other => return Err(format!("unknown path {other:?}; {usage}").into()),
    }
    Ok(())
}
