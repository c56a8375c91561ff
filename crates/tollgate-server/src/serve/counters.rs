//! The counters of one limit in memory: one keyed limiter per limit, keyed by the values of the
//! limit's variables.

use std::num::NonZeroUsize;
use std::sync::Arc;

use tollgate::{
    Algorithm, AtKeyLimit, Clock, FixedWindow, Keyed, KeyedStatistics, Meta, Quota, RateLimiter, SlidingWindow,
    TokenBucket, WeightedWindow,
};
use tollgate_policy::{AlgorithmKind, Limit};

/// How many counters one limit keeps in memory, how many bytes they may take, and what a new
/// counter gets past either: the server's `--max-counters`, `--max-counter-bytes` and
/// `--at-max-counters`, of which a limit's own `max_counters` and `at_max_counters` override
/// the first and the last.
///
/// Idle counters are removed a few at a time as new ones come in; the caps bound the rest, so
/// that a flood of distinct variable values (one per source address, say), or of long ones,
/// cannot take the server's memory. The default rejects new counters at a cap and tells them
/// when one goes idle (see [`AtKeyLimit`] for why, and for the other two choices).
///
/// ```
/// use tollgate_server::serve::CounterCap;
/// let cap = CounterCap::default();
/// assert_eq!((cap.max.get(), cap.max_bytes.get(), cap.at_max), (10_000_000, 1 << 30, tollgate::AtKeyLimit::Reject));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterCap {
    /// Most counters per limit (rounded up to a multiple of 64, the shards of its table).
    pub max: NonZeroUsize,
    /// Most bytes one limit's counters take (rounded up to a multiple of its table's shards; a
    /// counter heavier than one shard's share is never kept). Counted per counter: the text of
    /// its variables' values and the vector holding them (their heap bytes), its table entry and
    /// its expiry record; not counted: the table's free slots (at most as many again as the
    /// entries, which `max` bounds).
    pub max_bytes: NonZeroUsize,
    /// What a new counter gets when `max` are kept, or `max_bytes` would be passed, and none is
    /// idle.
    pub at_max: AtKeyLimit,
}

impl Default for CounterCap {
    fn default() -> CounterCap {
        CounterCap {
            max: NonZeroUsize::new(10_000_000).expect("nonzero"),
            max_bytes: NonZeroUsize::new(1 << 30).expect("nonzero"),
            at_max: AtKeyLimit::Reject,
        }
    }
}

/// What one counter of an algorithm whose state is `S` weighs against
/// [`CounterCap::max_bytes`]: its key's heap bytes, its table entry and its expiry record (16
/// bytes, see [`tollgate::Keyed`]).
fn weigh<S>(key: &Vec<String>) -> usize {
    let heap = key.capacity() * size_of::<String>() + key.iter().map(String::capacity).sum::<usize>();
    size_of::<(Vec<String>, S)>() + 16 + heap
}

/// Sliding windows are counted in this many segments.
const SLIDING_SEGMENTS: u64 = tollgate_policy::SLIDING_SEGMENTS;

/// The counters of one limit, whatever its algorithm: a keyed limiter (decided through
/// [`RateLimiter`]), with what the admin API and reloads ask of it besides.
pub(crate) trait Counters: RateLimiter<[String]> {
    /// Counters kept, and what happened at the cap.
    fn statistics(&self) -> KeyedStatistics;

    /// The caps on counters kept (count, bytes), and what a new one gets past them.
    fn cap(&self) -> (usize, usize, AtKeyLimit);

    /// A new `max_value` for a kept limit: each counter carries over by its algorithm's rule.
    fn set_quota(&self, quota: Quota);

    /// Forgets one counter; true when it held hits.
    fn reset(&self, key: &[String]) -> bool;

    /// Forgets the counters `f` chooses; returns how many held hits.
    fn reset_matching(&self, f: &mut dyn FnMut(&Vec<String>) -> bool) -> usize;

    /// Calls `f` with every counter kept and its state.
    fn for_each(&self, f: &mut dyn FnMut(&Vec<String>, Meta));
}

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
    // The policy crate validated the quota when it read the file.
    let quota = limit.quota().expect("a validated limit has a usable quota");
    match limit.algorithm() {
        AlgorithmKind::FixedWindow => keyed(
            match limit.calendar() {
                Some(calendar) => FixedWindow::calendar(limit.max_value(), calendar.clone(), clock)
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
