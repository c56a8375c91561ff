//! The counters of one limit in memory: one keyed limiter per limit, keyed by the values of the
//! limit's variables.

use std::num::NonZeroUsize;

use tollgate::{
    Algorithm, AtKeyLimit, Clock, FixedWindow, Keyed, KeyedStatistics, Lease, Meta, Rejected, SlidingWindow,
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

/// [`weigh`] for `A`'s counters.
fn weigher<A: Algorithm>(_: &A) -> fn(&Vec<String>) -> usize {
    weigh::<A::State>
}

/// Sliding windows are counted in this many segments.
const SLIDING_SEGMENTS: u64 = tollgate_policy::SLIDING_SEGMENTS;

pub(crate) enum Counters<C: Clock> {
    Fixed(Keyed<Vec<String>, FixedWindow, C>),
    Bucket(Keyed<Vec<String>, TokenBucket, C>),
    Sliding(Keyed<Vec<String>, SlidingWindow, C>),
    Weighted(Keyed<Vec<String>, WeightedWindow, C>),
}

macro_rules! each {
    ($self:expr, $k:ident => $body:expr) => {
        match $self {
            Counters::Fixed($k) => $body,
            Counters::Bucket($k) => $body,
            Counters::Sliding($k) => $body,
            Counters::Weighted($k) => $body,
        }
    };
}

impl<C: Clock + Clone> Counters<C> {
    pub(crate) fn new(limit: &Limit, clock: &C, cap: CounterCap) -> Counters<C> {
        // The policy crate validated the quota when it read the file.
        let quota = limit.quota().expect("a validated limit has a usable quota");
        let max = limit.max_counters().unwrap_or(cap.max);
        let at_max = limit.at_max_counters().unwrap_or(cap.at_max);
        macro_rules! keyed {
            ($algo:expr) => {{
                let algo = $algo;
                let weigh = weigher(&algo);
                Keyed::builder(algo)
                    .clock(clock.clone())
                    .max_keys(max)
                    .max_key_bytes(cap.max_bytes, weigh)
                    .at_key_limit(at_max)
                    .build()
            }};
        }
        match limit.algorithm() {
            AlgorithmKind::FixedWindow => Counters::Fixed(keyed!(match limit.calendar() {
                Some(calendar) => FixedWindow::calendar(limit.max_value(), calendar.clone(), clock)
                    .expect("a validated limit has a usable quota"),
                None => FixedWindow::new(quota),
            })),
            AlgorithmKind::TokenBucket => Counters::Bucket(keyed!(TokenBucket::new(quota))),
            AlgorithmKind::SlidingWindow => Counters::Sliding(keyed!(
                SlidingWindow::new(quota, SLIDING_SEGMENTS).expect("segments fit a whole-second window")
            )),
            AlgorithmKind::WeightedWindow => Counters::Weighted(keyed!(WeightedWindow::new(quota))),
        }
    }

    /// Counters kept, and what happened at the cap.
    pub(crate) fn statistics(&self) -> KeyedStatistics {
        each!(self, k => k.statistics())
    }

    /// The caps on counters kept (count, bytes), and what a new one gets past them.
    pub(crate) fn cap(&self) -> (usize, usize, AtKeyLimit) {
        each!(self, k => (k.max_keys(), k.max_key_bytes().unwrap_or(usize::MAX), k.at_key_limit()))
    }

    pub(crate) fn check(&self, key: &[String], n: u64) -> Result<Meta, Rejected> {
        each!(self, k => k.check(key, n))
    }

    pub(crate) fn take(&self, key: &[String], n: u64) -> Result<Lease, Rejected> {
        each!(self, k => k.try_acquire(key, n))
    }

    pub(crate) fn give_back(&self, key: &[String], lease: Lease) {
        each!(self, k => k.give_back(key, lease))
    }

    /// A new `max_value` for a kept limit: each counter carries over by its algorithm's rule.
    pub(crate) fn set_quota(&self, quota: tollgate::Quota) {
        each!(self, k => k.set_quota(quota))
    }

    /// Forgets one counter; true when it held hits.
    pub(crate) fn reset(&self, key: &[String]) -> bool {
        each!(self, k => k.reset(key))
    }

    /// Forgets the counters `f` chooses; returns how many held hits.
    pub(crate) fn reset_matching(&self, f: impl FnMut(&Vec<String>) -> bool) -> usize {
        each!(self, k => k.reset_matching(f))
    }

    pub(crate) fn for_each(&self, f: impl FnMut(&Vec<String>, Meta)) {
        each!(self, k => k.for_each(f))
    }
}
