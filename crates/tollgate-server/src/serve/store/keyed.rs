//! The counters of one limit in memory: one [`Keyed`] limiter per limit, keyed by the values of
//! the limit's variables, made a [`Counters`] trait object.

use std::sync::Arc;

use tollgate::{
    Algorithm, AtKeyLimit, Clock, FixedWindow, Keyed, KeyedStatistics, Meta, Quota, SlidingWindow, TokenBucket,
    WeightedWindow,
};
use tollgate_policy::{AlgorithmKind, Limit};

use crate::serve::model::{CounterCap, Counters};

/// What one counter of an algorithm whose state is `S` weighs against
/// [`CounterCap::max_bytes`]: its key's heap bytes, its table entry and its expiry record (16
/// bytes, see [`tollgate::Keyed`]).
fn weigh<S>(key: &Vec<String>) -> usize {
    let heap = key.capacity() * size_of::<String>() + key.iter().map(String::capacity).sum::<usize>();
    size_of::<(Vec<String>, S)>() + 16 + heap
}

/// Sliding windows are counted in this many segments.
const SLIDING_SEGMENTS: u64 = tollgate_policy::SLIDING_SEGMENTS;

impl<A: Algorithm<Config = Quota>, C: Clock> Counters for Keyed<Vec<String>, A, C> {
    fn statistics(&self) -> KeyedStatistics {
        Keyed::statistics(self)
    }

    fn cap(&self) -> (usize, usize, AtKeyLimit) {
        (self.max_keys(), self.max_key_bytes().unwrap_or(usize::MAX), self.at_key_limit())
    }

    fn set_quota(&self, quota: Quota) {
        Keyed::set_quota(self, quota)
    }

    fn reset(&self, key: &[String]) -> bool {
        Keyed::reset(self, key)
    }

    fn reset_matching(&self, f: &mut dyn FnMut(&Vec<String>) -> bool) -> usize {
        Keyed::reset_matching(self, f)
    }

    fn for_each(&self, f: &mut dyn FnMut(&Vec<String>, Meta)) {
        Keyed::for_each(self, f)
    }
}

/// The counters of `limit`, kept on `clock` within `cap`.
pub(crate) fn counters<C: Clock + Clone>(limit: &Limit, clock: &C, cap: CounterCap) -> Arc<dyn Counters> {
    // The policy crate validated the quota when it read the file. A limit that denies all is
    // decided by the engine, which never asks its counters: they are kept (empty) for a reload
    // that gives it a quota.
    let max_value = limit.capacity().max(1);
    let quota = match limit.quota() {
        Err(tollgate::QuotaError::ZeroLimit) => Quota::window(limit.window(), 1),
        quota => quota,
    };
    let quota = quota.expect("a validated limit has a usable quota");
    match limit.algorithm() {
        AlgorithmKind::FixedWindow => keyed(
            match limit.calendar() {
                Some(calendar) => FixedWindow::calendar(max_value, calendar.clone(), clock)
                    .expect("a validated limit has a usable quota"),
                None => FixedWindow::new(quota),
            },
            limit,
            clock,
            cap,
        ),
        AlgorithmKind::TokenBucket => keyed(TokenBucket::new(quota), limit, clock, cap),
        AlgorithmKind::SlidingWindow => keyed(
            SlidingWindow::new(quota, SLIDING_SEGMENTS).expect("segments fit a whole-second window"),
            limit,
            clock,
            cap,
        ),
        AlgorithmKind::WeightedWindow => keyed(WeightedWindow::new(quota), limit, clock, cap),
        kind @ (AlgorithmKind::IntervalBucket | AlgorithmKind::SlidingLog) => {
            unreachable!("the policy crate reads only limits_file algorithms, not {kind}")
        }
    }
}

/// `algo`'s counters for `limit`: its own caps, else the server's.
fn keyed<A: Algorithm<Config = Quota>, C: Clock + Clone>(
    algo: A,
    limit: &Limit,
    clock: &C,
    cap: CounterCap,
) -> Arc<dyn Counters> {
    Arc::new(
        Keyed::builder(algo)
            .clock(clock.clone())
            .max_keys(limit.max_counters().unwrap_or(cap.max))
            .max_key_bytes(cap.max_bytes, weigh::<A::State>)
            .at_key_limit(limit.at_max_counters().unwrap_or(cap.at_max))
            .build(),
    )
}
