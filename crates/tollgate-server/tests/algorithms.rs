//! Each `algorithm:` of the limits file decides as the core algorithm of that name: the engine's
//! answers and remaining counts equal those of a `tollgate::Limiter` of it on the same clock.

use std::time::Duration;

use futures::executor::block_on;

use tollgate::{Algorithm, FixedWindow, Limiter, ManualClock, Quota, SlidingWindow, TokenBucket, WeightedWindow};
use tollgate_policy::{Descriptor, Policy, SLIDING_SEGMENTS};
use tollgate_server::serve::{Action, Engine, Mode};

/// Arrivals (ms since start, permits): bursts at window edges and in between, where the
/// algorithms disagree.
const ARRIVALS: &[(u64, u64)] = &[
    (0, 4),
    (1_000, 3),
    (9_000, 3),
    (10_000, 2),
    (11_000, 4),
    (13_000, 1),
    (15_000, 3),
    (19_500, 2),
    (20_000, 5),
    (24_000, 3),
    (26_000, 2),
    (31_000, 6),
    (35_000, 1),
    (40_000, 4),
];

/// (allowed, remaining) per arrival, through the engine with a limits file naming `algorithm`.
fn through_engine(algorithm: &str) -> Vec<(bool, u64)> {
    let yaml = format!("- {{namespace: api, max_value: 10, seconds: 10, algorithm: {algorithm}}}\n");
    let policy = Policy::parse(&yaml, "limits.yaml").unwrap();
    let clock = ManualClock::new();
    let engine = Engine::new(policy, Mode::Accuracy, false, clock.clone());
    let values = [Descriptor::default()];
    replay(&clock, |n| {
        let outcome = block_on(engine.call("api", &values, n, Action::CheckAndReport)).unwrap();
        (outcome.allowed, outcome.statuses[0].meta.remaining)
    })
}

/// `decide(n)` for each of [`ARRIVALS`] at its time on `clock`: (allowed, remaining) each.
fn replay(clock: &ManualClock, mut decide: impl FnMut(u64) -> (bool, u64)) -> Vec<(bool, u64)> {
    let mut at = 0;
    ARRIVALS
        .iter()
        .map(|&(ms, n)| {
            clock.advance(Duration::from_millis(ms - at));
            at = ms;
            decide(n)
        })
        .collect()
}

/// The same through a core limiter of `algorithm`.
fn through_core<A: Algorithm>(algorithm: A) -> Vec<(bool, u64)> {
    let clock = ManualClock::new();
    let limiter = Limiter::builder(algorithm).clock(clock.clone()).build();
    replay(&clock, |n| match limiter.try_acquire(n) {
        Ok(lease) => (true, lease.remaining()),
        Err(rejected) => (false, rejected.remaining()),
    })
}

#[test]
fn each_algorithm_name_decides_as_that_algorithm() {
    let quota = Quota::per(Duration::from_secs(10), 10).unwrap();
    let sliding = || SlidingWindow::new(quota, SLIDING_SEGMENTS).unwrap();
    let weighted = through_core(WeightedWindow::new(quota));
    assert_eq!(through_engine("weighted_window"), weighted, "weighted_window is tollgate::WeightedWindow");
    assert_eq!(through_engine("sliding_window"), through_core(sliding()), "sliding_window is the segmented window");
    assert_eq!(through_engine("fixed_window"), through_core(FixedWindow::new(quota)));
    assert_eq!(through_engine("token_bucket"), through_core(TokenBucket::new(quota)));
    // The arrivals tell the two windows apart, so the first assertion could not pass by accident.
    assert_ne!(weighted, through_core(sliding()), "the arrivals should separate the two windows");
}

#[test]
fn an_engine_and_its_outcomes_print_what_they_are() {
    let policy = Policy::parse("- {namespace: api, max_value: 1, seconds: 60}", "limits.yaml").unwrap();
    let engine = Engine::new(policy, Mode::Accuracy, false, ManualClock::new());
    let shown = format!("{engine:?}");
    for part in ["Engine", "Accuracy", "Memory", "generation: 1"] {
        assert!(shown.contains(part), "{part:?} missing from {shown}");
    }
    let outcome = block_on(engine.call("api", &[Descriptor::default()], 1, Action::CheckAndReport)).unwrap();
    assert!(format!("{outcome:?}").contains("allowed: true"));
}
