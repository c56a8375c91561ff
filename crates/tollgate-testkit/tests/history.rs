//! The history checker against Tollgate's own limiters on a manual clock (their admissions must
//! pass) and against hand-made histories that break each bound (the shortest window is named).

use std::time::Duration;

use proptest::prelude::*;
use tollgate::{Algorithm, Clock, FixedWindow, Limiter, ManualClock, Quota, SlidingLog, TokenBucket};
use tollgate_testkit::{Bound, Decision, History, Hold, max_holders};

fn admit(history: &History, at_ns: u64, n: u64) {
    history.record(Decision { at_ns, key: "k".into(), n, allowed: true });
}

/// Replays arrivals (gaps in µs, permits asked) through a real limiter and records its answers.
fn replay<A: Algorithm>(algo: A, arrivals: &[(u64, u64)]) -> History {
    let clock = ManualClock::new();
    let limiter = Limiter::builder(algo).clock(clock.clone()).build();
    let history = History::default();
    for &(gap_us, n) in arrivals {
        clock.advance(Duration::from_micros(gap_us));
        let allowed = limiter.try_acquire(n).is_ok();
        history.record(Decision { at_ns: clock.now(), key: "k".into(), n, allowed });
    }
    history
}

fn arrivals() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..50_000, 1u64..4), 1..400)
}

proptest! {
    #[test]
    fn a_token_bucket_passes_its_own_bound(arrivals in arrivals()) {
        let quota = Quota::per_second(50).unwrap().with_burst(10).unwrap();
        let history = replay(TokenBucket::new(quota), &arrivals);
        let bound = Bound::TokenBucket { burst: 10, emission_ns: 20_000_000 };
        prop_assert_eq!(history.check(&bound), Ok(()));
        prop_assert_eq!(history.excess(&bound), 0);
    }

    #[test]
    fn a_sliding_log_passes_its_own_bound(arrivals in arrivals()) {
        let history = replay(SlidingLog::new(Quota::per_second(20).unwrap()), &arrivals);
        prop_assert_eq!(history.check(&Bound::SlidingLog { limit: 20, period_ns: 1_000_000_000 }), Ok(()));
    }

    #[test]
    fn a_fixed_window_passes_its_own_bound(arrivals in arrivals()) {
        let history = replay(FixedWindow::new(Quota::per_second(20).unwrap()), &arrivals);
        let bound = Bound::FixedWindow { limit: 20, period_ns: 1_000_000_000, aligned: false };
        prop_assert_eq!(history.check(&bound), Ok(()));
    }

    /// One permit more than the bucket allows anywhere is found, with a window that really
    /// holds more than the bound allows over its span.
    #[test]
    fn one_extra_admission_is_found(arrivals in arrivals(), extra_at in 0usize..400) {
        let quota = Quota::per_second(50).unwrap().with_burst(10).unwrap();
        let history = replay(TokenBucket::new(quota), &arrivals);
        let decisions = history.decisions();
        let rejected: Vec<_> = decisions.iter().filter(|d| !d.allowed).collect();
        prop_assume!(!rejected.is_empty());
        let forced = rejected[extra_at % rejected.len()];
        let broken = History::default();
        for d in &decisions {
            broken.record(Decision { allowed: d.allowed || d == forced, ..d.clone() });
        }
        let bound = Bound::TokenBucket { burst: 10, emission_ns: 20_000_000 };
        // A rejection means the bucket lacked `n` permits then; granting them breaks the bound.
        let v = broken.check(&bound).unwrap_err();
        prop_assert!(v.admitted > v.allowed);
        prop_assert_eq!(v.allowed, 10 + (v.to_ns - v.from_ns) / 20_000_000);
        prop_assert!(broken.excess(&bound) >= 1);
    }
}

#[test]
fn the_shortest_breaking_window_is_named() {
    let history = History::default();
    // Burst 2 at 1 per second: at 0, 1 s, 2 s the bucket is fine; three at 10 s..10.002 s break it.
    for at in [0, 1_000_000_000, 2_000_000_000, 10_000_000_000, 10_001_000_000, 10_002_000_000] {
        admit(&history, at, 1);
    }
    let v = history.check(&Bound::TokenBucket { burst: 2, emission_ns: 1_000_000_000 }).unwrap_err();
    assert_eq!((v.from_ns, v.to_ns, v.admitted, v.allowed), (10_000_000_000, 10_002_000_000, 3, 2));
    assert!(v.to_string().contains("3 permits admitted in 2000000 ns"), "{v}");
}

#[test]
fn windows_are_checked_where_they_are() {
    let history = History::default();
    for at in [0, 900, 999, 1_000, 1_001] {
        admit(&history, at, 1);
    }
    // Windows opened by a first request: [0, 1000) holds 3, [1000, 2000) holds 2.
    let opened = Bound::FixedWindow { limit: 3, period_ns: 1_000, aligned: false };
    assert_eq!(history.check(&opened), Ok(()));
    // Any 1000 ns: (1, 1001] holds 4.
    let v = history.check(&Bound::SlidingLog { limit: 3, period_ns: 1_000 }).unwrap_err();
    assert_eq!((v.from_ns, v.to_ns, v.admitted), (900, 1_001, 4));
    // Aligned windows of 1000: the first holds 3 as well, but of 2 allowed.
    let v = history.check(&Bound::FixedWindow { limit: 2, period_ns: 1_000, aligned: true }).unwrap_err();
    assert_eq!((v.from_ns, v.to_ns, v.admitted, v.allowed), (0, 999, 3, 2));
    assert_eq!(history.excess(&Bound::FixedWindow { limit: 2, period_ns: 1_000, aligned: true }), 1);
}

#[test]
fn keys_are_checked_apart_and_rejections_do_not_count() {
    let history = History::default();
    for key in ["a", "b"] {
        for at in [0, 1, 2] {
            history.record(Decision { at_ns: at, key: key.into(), n: 1, allowed: at < 2 });
        }
    }
    assert_eq!(history.check(&Bound::SlidingLog { limit: 2, period_ns: 10 }), Ok(()));
    assert_eq!(history.admitted(), 4);
}

#[test]
fn holders_are_counted_at_every_instant() {
    let hold = |from_ns, until_ns, token| Hold { from_ns, until_ns, token };
    // A permit passed on at 10 is one holder, not two.
    assert_eq!(max_holders(&[hold(0, 10, 1), hold(10, 20, 2)]), 1);
    assert_eq!(max_holders(&[hold(0, 10, 1), hold(5, 20, 2), hold(9, 12, 3)]), 3);
    assert_eq!(max_holders(&[]), 0);
}
