//! Two-phase and sequential decide the same, uncontended: `counters.lua` (every counter of a call
//! read, then all taken or none, in one script) against [`AllOrNothing`] taking from in-process
//! fixed windows one at a time, on random counters (enforcing or only counting, with or without
//! room), in check and take modes. Same admission, same part that denies, same `remaining` and
//! `limited` per counter, same state left behind.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::{AllOrNothing, FixedWindow, Limiter, ManualClock, Quota};
use tollgate_redis::counters::{CountersMode, WindowCounter, decide_windows};
use tollgate_redis::{Redis, RedisTime};
use tollgate_testkit::RedisServer;

const WINDOW: Duration = Duration::from_secs(60);

#[derive(Clone, Debug)]
struct Part {
    limit: u64,
    used: u64,
    hits: u64,
    enforce: bool,
}

fn part() -> impl Strategy<Value = Part> {
    (1u64..6, 0u64..6, 0u64..7, any::<bool>()).prop_map(|(limit, used, hits, enforce)| Part {
        limit,
        used: used.min(limit),
        hits,
        enforce,
    })
}

fn counter(key: String, limit: u64, hits: u64, enforce: bool) -> WindowCounter {
    WindowCounter { key, limit, window: WINDOW, hits, enforce, calendar: None, opened_ago: Duration::ZERO }
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
        let mut sequential = if check { AllOrNothing::check(enforces) } else { AllOrNothing::new(enforces) };
        while let Some(step) = sequential.step() {
            let i = step.part();
            match step.run(&locals[i], &(), parts[i].hits).now() {
                Ok(reply) => sequential.reply(reply),
                Err(_) => unreachable!("in-process limiters answer at once"),
            }
        }
        let sequential = sequential.finish();

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
