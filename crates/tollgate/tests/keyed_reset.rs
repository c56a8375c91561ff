//! `Keyed::reset` and `Keyed::reset_matching`: a reset key decides as a key never seen, the
//! others as before, and what the shard knows of when its keys go idle stays right (at the cap,
//! a new key is still told the exact time a stored key goes idle).

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::time::Duration;

use proptest::prelude::*;
use tollgate::{
    Algorithm, AtKeyLimit, Concurrency, FixedWindow, Keyed, Limiter, ManualClock, Quota, Reason, SlidingWindow,
    TokenBucket,
};

fn quota() -> Quota {
    Quota::per(Duration::from_millis(10), 4).unwrap()
}

#[test]
fn a_reset_key_starts_full_and_the_others_keep_their_state() {
    let clock = ManualClock::new();
    let k: Keyed<u64, _, _> = Keyed::builder(TokenBucket::new(quota())).clock(clock.clone()).build();
    let _ = k.try_acquire(&1, 4).unwrap();
    let _ = k.try_acquire(&2, 3).unwrap();
    assert!(k.reset(&1));
    assert_eq!(k.len(), 1);
    assert_eq!(k.check(&1, 0).unwrap().remaining, 4, "key 1 is full again");
    assert_eq!(k.check(&2, 0).unwrap().remaining, 1, "key 2 untouched");
    assert!(!k.reset(&1), "nothing left to forget");
    assert!(!k.reset(&3), "never seen");
    // A stored key that went idle is removed, but there was nothing to forget.
    clock.advance(Duration::from_millis(10));
    assert!(!k.reset(&2));
    assert!(k.is_empty());
}

#[test]
fn a_lease_given_back_after_a_reset_never_fills_beyond_full() {
    let clock = ManualClock::new();
    let k: Keyed<u64, _, _> = Keyed::builder(FixedWindow::new(quota())).clock(clock.clone()).build();
    let before = k.try_acquire(&1, 4).unwrap();
    assert!(k.reset(&1));
    clock.advance(Duration::from_millis(1));
    let _ = k.try_acquire(&1, 1).unwrap();
    k.give_back(&1, before);
    assert_eq!(k.check(&1, 0).unwrap().remaining, 3, "the old lease took from the old window only");
    let bucket: Keyed<u64, _, _> = Keyed::builder(TokenBucket::new(quota())).clock(clock.clone()).build();
    let before = bucket.try_acquire(&1, 4).unwrap();
    assert!(bucket.reset(&1));
    let _ = bucket.try_acquire(&1, 1).unwrap();
    bucket.give_back(&1, before);
    assert_eq!(bucket.check(&1, 0).unwrap().remaining, 4, "full, not beyond");
}

#[test]
fn a_concurrency_key_holding_permits_is_not_reset() {
    let k: Keyed<&'static str, _, _> = Keyed::builder(Concurrency::new(2).unwrap()).clock(ManualClock::new()).build();
    let held = k.try_acquire(&"a", 2).unwrap();
    assert!(!k.reset(&"a"));
    assert_eq!(k.reset_matching(|_| true), 0);
    assert_eq!(k.try_acquire(&"a", 1).unwrap_err().reason(), Reason::Exhausted);
    drop(held);
    assert_eq!(k.len(), 1);
    assert!(!k.reset(&"a"), "idle: removed, nothing to forget");
    assert!(k.is_empty());
}

#[test]
fn reset_matching_resets_the_chosen_keys_in_every_shard() {
    let k: Keyed<(u64, u64), _, _> = Keyed::builder(SlidingWindow::new(quota(), 4).unwrap())
        .clock(ManualClock::new())
        .shards(NonZeroUsize::new(8).unwrap())
        .build();
    for user in 0..50 {
        for route in 0..4 {
            let _ = k.try_acquire(&(user, route), 1 + route % 2).unwrap();
        }
    }
    assert_eq!(k.reset_matching(|(user, _)| user % 5 == 0), 40);
    assert_eq!(k.len(), 160);
    for user in 0..50 {
        let expected = if user % 5 == 0 { 4 } else { 2 };
        assert_eq!(k.check(&(user, 1), 0).unwrap().remaining, expected, "user {user}");
    }
    // New keys go into the rebuilt heaps as usual.
    for user in 50..100 {
        let _ = k.try_acquire(&(user, 0), 1).unwrap();
    }
    assert_eq!(k.len(), 210);
}

/// One operation of a random history.
#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Take(u64, u64),
    Reset(u64),
    ResetMatching(u64),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (0..12_000_000u64).prop_map(Op::Advance),
        6 => (0..8u64, 1..5u64).prop_map(|(k, n)| Op::Take(k, n)),
        2 => (0..8u64).prop_map(Op::Reset),
        1 => (2..5u64).prop_map(Op::ResetMatching),
    ];
    prop::collection::vec(op, 1..80)
}

/// The reference: one unkeyed limiter per key, made on first use; a reset drops it.
fn model_check<A: Algorithm>(algo: impl Fn() -> A, history: &[Op]) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let keyed: Keyed<u64, A, _> = Keyed::builder(algo()).clock(clock.clone()).build();
    let mut model: HashMap<u64, Limiter<A, ManualClock>> = HashMap::new();
    for (step, op) in history.iter().enumerate() {
        match *op {
            Op::Advance(ns) => clock.advance(Duration::from_nanos(ns)),
            Op::Take(key, n) => {
                let limiter = model.entry(key).or_insert_with(|| Limiter::builder(algo()).clock(clock.clone()).build());
                let expected = limiter.try_acquire(n).map(|l| l.meta()).map_err(|r| (r.reason(), r.meta()));
                let got = keyed.try_acquire(&key, n).map(|l| l.meta()).map_err(|r| (r.reason(), r.meta()));
                prop_assert_eq!(got, expected, "step {}: take {} on key {}", step, n, key);
            }
            Op::Reset(key) => {
                let had = model.remove(&key).is_some_and(|l| l.check(0).unwrap().remaining < l.capacity());
                prop_assert_eq!(keyed.reset(&key), had, "step {}: reset {}", step, key);
            }
            Op::ResetMatching(m) => {
                let mut had = 0;
                model.retain(|key, l| {
                    if key % m != 0 {
                        return true;
                    }
                    had += usize::from(l.check(0).unwrap().remaining < l.capacity());
                    false
                });
                prop_assert_eq!(keyed.reset_matching(|key| key % m == 0), had, "step {}: keys % {} == 0", step, m);
            }
        }
    }
    Ok(())
}

/// At a cap of 3 keys in one shard (fewer than the sweep looks at), a new key rejected with
/// `retry_after` is admitted exactly then: the heap still knows when each stored key goes idle
/// after any resets.
fn cap_check(policy: AtKeyLimit, history: &[Op]) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let keyed: Keyed<u64, _, _> = Keyed::builder(TokenBucket::new(quota()))
        .clock(clock.clone())
        .shards(NonZeroUsize::MIN)
        .max_keys(NonZeroUsize::new(3).unwrap())
        .at_key_limit(policy)
        .build();
    for (step, op) in history.iter().enumerate() {
        match *op {
            Op::Advance(ns) => clock.advance(Duration::from_nanos(ns)),
            Op::Take(key, n) => match keyed.try_acquire(&key, n) {
                Err(no) if no.reason() == Reason::KeyLimit => {
                    prop_assert_eq!(policy, AtKeyLimit::Reject);
                    let retry = no.retry_after().expect("token buckets go idle by time");
                    prop_assert!(retry > Duration::ZERO, "step {}: told to retry now", step);
                    clock.advance(retry - Duration::from_nanos(1));
                    prop_assert_eq!(
                        keyed.try_acquire(&key, n).map(drop).map_err(|r| r.reason()),
                        Err(Reason::KeyLimit),
                        "step {}: admitted before retry_after",
                        step
                    );
                    clock.advance(Duration::from_nanos(1));
                    prop_assert!(keyed.try_acquire(&key, n).is_ok(), "step {}: not admitted at retry_after", step);
                }
                _ => {}
            },
            Op::Reset(key) => {
                keyed.reset(&key);
                let mut stored = false;
                keyed.for_each(|k, _| stored |= *k == key);
                prop_assert!(!stored, "step {}: key {} still stored", step, key);
            }
            Op::ResetMatching(m) => {
                keyed.reset_matching(|key| key % m == 0);
            }
        }
        prop_assert!(keyed.len() <= 3, "step {}: {} keys stored", step, keyed.len());
    }
    Ok(())
}

proptest! {
    #[test]
    fn reset_token_bucket_matches_a_fresh_limiter_per_key(history in ops()) {
        model_check(|| TokenBucket::new(quota()), &history)?;
    }

    #[test]
    fn reset_fixed_window_matches_a_fresh_limiter_per_key(history in ops()) {
        model_check(|| FixedWindow::new(quota()), &history)?;
    }

    #[test]
    fn reset_sliding_window_matches_a_fresh_limiter_per_key(history in ops()) {
        model_check(|| SlidingWindow::new(quota(), 4).unwrap(), &history)?;
    }

    #[test]
    fn resets_keep_the_cap_and_its_retry_times_exact(history in ops()) {
        for policy in [AtKeyLimit::Reject, AtKeyLimit::EvictNearestIdle, AtKeyLimit::AdmitUnstored] {
            cap_check(policy, &history)?;
        }
    }
}
