//! A limit's counters in memory: the cap on how many are kept ([`CounterCap`]), what they must do
//! ([`Counters`]), and how their table is reported ([`CounterTable`]).

use std::num::NonZeroUsize;

use tollgate::{AtKeyLimit, KeyedStatistics, Meta, Quota, RateLimiter};

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

/// One limit's in-memory counters: how many are kept against the cap, and what new counters met
/// there (the counts start again when the limit's counters do: at start, and on a reload that
/// adds the limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterTable {
    /// Counters kept now.
    pub kept: usize,
    /// The cap (`max_counters`, rounded up to a multiple of the table's 64 shards).
    pub max: usize,
    /// What the counters kept weigh (see [`CounterCap::max_bytes`]).
    pub bytes: usize,
    /// The cap on that (`--max-counter-bytes`, rounded up to a multiple of the table's shards).
    pub max_bytes: usize,
    /// What a new counter gets at the cap.
    pub at_max: tollgate::AtKeyLimit,
    /// New counters rejected at the cap (`reject`).
    pub rejected_at_max: u64,
    /// Counters evicted at the cap for a new one (`evict`).
    pub evicted_at_max: u64,
    /// Requests on new counters decided without keeping them (`admit`).
    pub admitted_unstored_at_max: u64,
}
