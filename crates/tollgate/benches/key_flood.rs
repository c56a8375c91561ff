//! A flood of new keys against a `Keyed<u64, TokenBucket>` at `Quota::per_minute(10)` whose
//! table is full of live keys (issue 21), at caps of 100,000 and 1,000,000 keys:
//!
//! - `new_below_cap`: a new key's decision when the table holds `cap` live keys and has room for
//!   as many again (what a new key costs normally: the insertion, amortized table growth included);
//! - `new_at_cap/{reject,evict,admit}`: a new key's decision at the cap, for each `AtKeyLimit`
//!   (target: at most 2x `new_below_cap`);
//! - `existing` and `existing_during_flood`: decisions on stored keys, alone and while another
//!   thread sends new keys at the cap as fast as it can (target: within 2x of `existing`).
//!
//! Time is a `ManualClock` that does not move, so every stored key stays live for the whole run
//! (on the system clock they would go idle a minute in, and new keys would find room).
//!
//! Run with `cargo bench -p tollgate --bench key_flood` (about two minutes; add a filter such as
//! `-- 100k` for one cap).

use std::hint::black_box;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tollgate::{AtKeyLimit, Keyed, ManualClock, Quota, TokenBucket};

#[path = "../tests/support/rng.rs"]
mod rng;
use rng::Rng;

type Table = Keyed<u64, TokenBucket, ManualClock>;

/// New keys never collide with stored ones: stored keys are below 2^40.
const NEW_KEYS: u64 = 1 << 40;

/// A table with room for `max_keys`, filled with `cap` live keys (or up to its own cap, if
/// smaller: then to the cap after rounding); returns it with the keys it stored.
fn filled(cap: usize, max_keys: usize, policy: AtKeyLimit) -> (Table, Vec<u64>) {
    let keyed = Keyed::builder(TokenBucket::new(Quota::per_minute(10).unwrap()))
        .clock(ManualClock::new())
        .max_keys(NonZeroUsize::new(max_keys).unwrap())
        .at_key_limit(policy)
        .build();
    let target = if cap >= max_keys { keyed.max_keys() } else { cap };
    // Shards fill unevenly: go on until every shard of a table filled to its cap is full (new
    // keys past a full shard's cap meet the policy, which is harmless here).
    let mut key = 0;
    while keyed.len() < target {
        for _ in 0..256 {
            let _ = keyed.try_acquire(&key, 1);
            key += 1;
        }
    }
    let mut stored = Vec::with_capacity(keyed.len());
    keyed.for_each(|k, _| stored.push(*k));
    (keyed, stored)
}

fn flood(c: &mut Criterion) {
    for (name, cap) in [("100k", 100_000usize), ("1m", 1_000_000)] {
        let mut g = c.benchmark_group(format!("key_flood_{name}"));
        g.throughput(Throughput::Elements(1));
        g.measurement_time(Duration::from_secs(4));

        // Below the cap: `cap` live keys and room for `cap` more; rebuilt (untimed) when used up.
        g.bench_function("new_below_cap", |b| {
            let mut table = filled(cap, 2 * cap, AtKeyLimit::Reject).0;
            let mut room = table.max_keys() - table.len();
            let mut next = NEW_KEYS;
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    if room <= cap / 4 {
                        table = filled(cap, 2 * cap, AtKeyLimit::Reject).0;
                        room = table.max_keys() - table.len();
                    }
                    // Stay well clear of the cap, which fills unevenly across shards.
                    let batch = left.min((room - cap / 4) as u64);
                    let start = Instant::now();
                    for _ in 0..batch {
                        black_box(table.try_acquire(&next, 1).is_ok());
                        next += 1;
                    }
                    total += start.elapsed();
                    room -= batch as usize;
                    left -= batch;
                }
                total
            })
        });

        for policy in [AtKeyLimit::Reject, AtKeyLimit::EvictNearestIdle, AtKeyLimit::AdmitUnstored] {
            let (table, _) = filled(cap, cap, policy);
            assert_eq!(table.len(), table.max_keys());
            let mut next = NEW_KEYS;
            g.bench_function(format!("new_at_cap/{}", policy.name()), |b| {
                b.iter(|| {
                    next += 1;
                    black_box(table.try_acquire(&next, 1).is_ok())
                })
            });
            assert!(table.len() <= table.max_keys());
        }

        // Stored keys, alone and while another thread floods new keys at the cap (Reject).
        let (table, stored) = filled(cap, cap, AtKeyLimit::Reject);
        let existing = |b: &mut criterion::Bencher<'_>| {
            let mut rng = Rng(7);
            b.iter(|| {
                let key = stored[rng.below(stored.len() as u64) as usize];
                black_box(table.try_acquire(&key, 1).is_ok())
            })
        };
        g.bench_function("existing", existing);
        let (started, stop) = (AtomicBool::new(false), AtomicBool::new(false));
        std::thread::scope(|s| {
            let flooder = s.spawn(|| {
                let mut next = NEW_KEYS;
                let (mut sent, mut rejected) = (0u64, 0u64);
                loop {
                    next += 1;
                    rejected += u64::from(table.try_acquire(&next, 1).is_err());
                    sent += 1;
                    started.store(true, Ordering::Relaxed);
                    if stop.load(Ordering::Relaxed) {
                        return (sent, rejected);
                    }
                }
            });
            // The flood is on before the measurement starts (and when a filter skips it).
            while !started.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
            g.bench_function("existing_during_flood", existing);
            stop.store(true, Ordering::Relaxed);
            let (sent, rejected) = flooder.join().expect("flood thread");
            assert_eq!(rejected, sent, "every new key of the flood was rejected at the cap");
        });
        assert_eq!(table.len(), table.max_keys());
        g.finish();
    }
}

criterion_group!(benches, flood);
criterion_main!(benches);
