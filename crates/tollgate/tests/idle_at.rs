//! `Algorithm::idle_at` is exact for every algorithm: after any history of decisions and
//! give-backs, the state is idle at `idle_at(state, now)` and, when that is later than `now`, not
//! one nanosecond earlier; and a decision that takes permits never moves it earlier (what the
//! keyed limiter's bounds of when its keys go idle rely on).

use proptest::prelude::*;
use tollgate::{
    Algorithm, Concurrency, FixedWindow, IntervalBucket, Quota, SlidingLog, SlidingWindow, TokenBucket, WeightedWindow,
};

/// One step of a history: wait `gap` ns, then take `n` permits (`n == 0`: give back the last
/// admitted request's permits instead).
#[derive(Clone, Debug)]
struct Step {
    gap: u64,
    n: u64,
}

fn steps(period: u64) -> impl Strategy<Value = Vec<Step>> {
    let gap = prop_oneof![Just(0), 1..10u64, 0..period, (0..4u64).prop_map(move |k| k * period), 0..3 * period];
    prop::collection::vec((gap, 0..5u64).prop_map(|(gap, n)| Step { gap, n }), 1..40)
}

/// Replays every prefix of `history` on a fresh state of `algo` and checks `idle_at` at its end
/// (`is_idle` may bring a state forward to the time it is asked about, so each check gets its
/// own replay).
fn check<A: Algorithm>(algo: &A, history: &[Step]) -> Result<(), TestCaseError> {
    for len in 0..=history.len() {
        let mut now = 1_000;
        let state = algo.new_state(now);
        let mut last: Option<(u64, u64)> = None;
        for step in &history[..len] {
            now += step.gap;
            let before = algo.idle_at(&state, now);
            if step.n > 0 {
                if algo.decide(&state, now, step.n, true).is_ok() {
                    last = Some((step.n, now));
                    prop_assert!(algo.idle_at(&state, now) >= before, "taking permits moved idle_at earlier");
                }
            } else if let Some((n, at)) = last.take() {
                algo.give_back(&state, now, n, at);
            }
        }
        let at = algo.idle_at(&state, now);
        prop_assert!(at >= now && at != u64::MAX, "idle_at {at} at {now}");
        if at > now {
            prop_assert!(!algo.is_idle(&state, at - 1), "idle at {} already, idle_at said {at}", at - 1);
        }
        prop_assert!(algo.is_idle(&state, at), "not idle at idle_at = {at} (now {now})");
    }
    Ok(())
}

const PERIOD: u64 = 1_000_000; // 1 ms

fn quota() -> Quota {
    Quota::per(std::time::Duration::from_nanos(PERIOD), 4).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn token_bucket(h in steps(PERIOD)) {
        check(&TokenBucket::new(quota().with_burst(3).unwrap()), &h)?;
    }

    #[test]
    fn interval_bucket(h in steps(PERIOD)) {
        check(&IntervalBucket::new(quota().with_burst(6).unwrap()), &h)?;
        check(&IntervalBucket::new(quota().with_burst(2).unwrap()), &h)?;
    }

    #[test]
    fn fixed_window(h in steps(PERIOD)) {
        check(&FixedWindow::new(quota()), &h)?;
    }

    #[test]
    fn sliding_window(h in steps(PERIOD)) {
        check(&SlidingWindow::new(quota(), 4).unwrap(), &h)?;
        check(&SlidingWindow::new(quota(), 1).unwrap(), &h)?;
    }

    #[test]
    fn weighted_window(h in steps(PERIOD)) {
        check(&WeightedWindow::new(quota()), &h)?;
    }

    #[test]
    fn sliding_log(h in steps(PERIOD)) {
        check(&SlidingLog::new(quota()), &h)?;
    }
}

#[test]
fn a_held_concurrency_permit_is_idle_only_after_its_release() {
    let algo = Concurrency::new(2).unwrap();
    let state = algo.new_state(0);
    assert_eq!(algo.idle_at(&state, 5), 5);
    algo.decide(&state, 5, 1, true).unwrap();
    assert_eq!(algo.idle_at(&state, 5), u64::MAX, "time does not release a permit");
    algo.give_back(&state, 9, 1, 5);
    assert_eq!(algo.idle_at(&state, 9), 9);
}
