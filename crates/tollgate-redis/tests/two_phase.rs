//! Two-phase and sequential decide the same, uncontended: `counters.lua` (every counter of a call
//! read, then all taken or none, in one script) against [`AllOrNothing`] taking from in-process
//! fixed windows one at a time, on random counters (enforcing or only counting, with or without
//! room), in check and take modes. Same admission, same part that denies, same `remaining` and
//! `limited` per counter, same state left behind. The limiter scripts are held to the same rule
//! (all their limits enforce) in `the_limiter_scripts_decide_as_all_or_nothing`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::{AllOrNothing, FixedWindow, Limiter, ManualClock, Quota};
use tollgate_redis::counters::{CountersMode, WindowCounter, decide_windows};
use tollgate_redis::{Redis, RedisTime};
use tollgate_testkit::{RedisServer, part};

const WINDOW: Duration = Duration::from_secs(60);

fn counter(key: String, limit: u64, hits: u64, enforce: bool) -> WindowCounter {
    WindowCounter { enforce, ..WindowCounter::enforcing(key, limit, WINDOW, hits) }
}

#[test]
fn counters_lua_decides_as_all_or_nothing() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let redis = runtime.block_on(Redis::connect(&server.url())).unwrap();
    let clock = ManualClock::new();
    let time = RedisTime::clock(clock.clone());
    let calls = AtomicU64::new(0);
    proptest!(ProptestConfig::with_cases(128), |(parts in prop::collection::vec(part(), 1..6), check in any::<bool>())| {
        let call = calls.fetch_add(1, Ordering::Relaxed);
        let key = |i: usize| format!("{{two-phase:{call}}}:{i}");
        let mut locals = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            let local = Limiter::builder(FixedWindow::new(Quota::per(WINDOW, p.limit).unwrap())).clock(clock.clone()).build();
            if p.used > 0 {
                let _ = local.try_acquire(p.used).unwrap();
                let used = [counter(key(i), p.limit, p.used, true)];
                let answer = runtime.block_on(decide_windows(&redis, &used, CountersMode::Take, &time)).unwrap();
                prop_assert!(answer.admitted);
            }
            locals.push(local);
        }

        let counters: Vec<WindowCounter> =
            parts.iter().enumerate().map(|(i, p)| counter(key(i), p.limit, p.hits, p.enforce)).collect();
        let mode = if check { CountersMode::Check } else { CountersMode::Take };
        let two_phase = runtime.block_on(decide_windows(&redis, &counters, mode, &time)).unwrap();

        let enforces = parts.iter().map(|p| p.enforce);
        let sequential = if check { AllOrNothing::check(enforces) } else { AllOrNothing::new(enforces) };
        let sequential = sequential.run_now(|step| {
            let i = step.part();
            step.run(&locals[i], &(), parts[i].hits)
        });

        prop_assert_eq!(two_phase.admitted, sequential.is_granted());
        for (i, (answer, (meta, limited))) in sequential.parts().iter().zip(&two_phase.counters).enumerate() {
            prop_assert_eq!(meta.remaining, answer.meta().remaining, "counter {} ({:?})", i, answer);
            prop_assert_eq!(*limited, answer.is_limited(), "counter {} ({:?})", i, answer);
            // Both leave the counter in the same state.
            let probe = [counter(key(i), parts[i].limit, 0, true)];
            let stored = runtime.block_on(decide_windows(&redis, &probe, CountersMode::Check, &time)).unwrap();
            prop_assert_eq!(stored.counters[0].0.remaining, locals[i].check(0).unwrap().remaining, "counter {}", i);
        }
    });
}

/// The same for the limiter scripts (`fixed_window.lua`, `token_bucket.lua`,
/// `weighted_window.lua`, `sliding_log.lua`): a `RedisLimiter` of several limits on one key
/// decides in one script run, all-or-nothing; [`AllOrNothing`] takes from in-process limiters of
/// the same algorithm one at a time. Same admission, and each limit left in the same state (read
/// back through a one-limit `RedisLimiter` on the same key).
#[test]
fn the_limiter_scripts_decide_as_all_or_nothing() {
    use tollgate::{Algorithm, AlgorithmKind, RateLimiter, SlidingLog, TokenBucket, WeightedWindow};
    use tollgate_redis::RedisLimiter;

    fn local<A: Algorithm<Config = Quota> + Send + Sync + 'static>(
        algorithm: A,
        clock: &ManualClock,
    ) -> Box<dyn RateLimiter<()>> {
        Box::new(Limiter::builder(algorithm).clock(clock.clone()).build())
    }

    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let redis = runtime.block_on(Redis::connect(&server.url())).unwrap();
    let clock = ManualClock::new();
    let calls = AtomicU64::new(0);
    let kinds = [
        AlgorithmKind::FixedWindow,
        AlgorithmKind::TokenBucket,
        AlgorithmKind::WeightedWindow,
        AlgorithmKind::SlidingLog,
    ];
    proptest!(ProptestConfig::with_cases(128), |(parts in prop::collection::vec((1u64..6, 0u64..6), 1..5), n in 0u64..7, kind in 0..kinds.len())| {
        let kind = kinds[kind];
        let key = format!("case-{}", calls.fetch_add(1, Ordering::Relaxed));
        let quota = |limit: u64| Quota::per(WINDOW, limit).unwrap();
        let redis_limiter = |limits: &[(usize, u64)]| {
            let mut builder = RedisLimiter::builder(&redis, "two-phase", kind).time(RedisTime::clock(clock.clone()));
            for &(i, limit) in limits {
                builder = builder.limit(&format!("l{i}"), quota(limit));
            }
            builder.build().unwrap()
        };
        let mut locals = Vec::new();
        for (i, &(limit, used)) in parts.iter().enumerate() {
            let used = used.min(limit);
            let local = match kind {
                AlgorithmKind::FixedWindow => local(FixedWindow::new(quota(limit)), &clock),
                AlgorithmKind::TokenBucket => local(TokenBucket::new(quota(limit)), &clock),
                AlgorithmKind::WeightedWindow => local(WeightedWindow::new(quota(limit)), &clock),
                _ => local(SlidingLog::new(quota(limit)), &clock),
            };
            if used > 0 {
                prop_assert!(local.decide(&(), used).now().ok().unwrap().is_ok());
                let one = redis_limiter(&[(i, limit)]);
                prop_assert!(runtime.block_on(one.try_acquire(&key, used)).is_ok());
            }
            locals.push(local);
        }

        let all = redis_limiter(&parts.iter().enumerate().map(|(i, &(limit, _))| (i, limit)).collect::<Vec<_>>());
        let two_phase = runtime.block_on(all.try_acquire(&key, n));

        let sequential = AllOrNothing::new(parts.iter().map(|_| true)).run_now(|step| {
            let i = step.part();
            step.run(&*locals[i], &(), n)
        });

        prop_assert_eq!(two_phase.is_ok(), sequential.is_granted(), "{:?}: {:?} vs {:?}", kind, two_phase, sequential);
        drop(two_phase);
        for (i, &(limit, _)) in parts.iter().enumerate() {
            let stored = runtime.block_on(redis_limiter(&[(i, limit)]).check(&key, 0)).unwrap().remaining;
            let kept = locals[i].check(&(), 0).now().ok().unwrap().unwrap().remaining;
            prop_assert_eq!(stored, kept, "{:?}, limit {}", kind, i);
        }
    });
}
