//! [`KeyedBuilder`]: a [`Keyed`] limiter's clock, caps, shards and policy at the cap.

use std::hash::Hash;
use std::marker::PhantomData;
use std::num::NonZeroUsize;
use std::sync::Arc;

use super::Keyed;
use super::at_limit::AtKeyLimit;
use super::lock::TableLock;
use super::shards::{Inner, Table, Weigh};
use crate::algorithm::Algorithm;
use crate::clock::{Clock, SystemClock};

/// The fewest keys a shard holds when the shard count is left to the builder.
const MIN_KEYS_PER_SHARD: usize = 1024;

/// Builds a [`Keyed`] limiter.
#[must_use = "a builder does nothing until .build()"]
pub struct KeyedBuilder<K, A: Algorithm, C: Clock> {
    algo: A,
    clock: C,
    max_keys: usize,
    max_key_bytes: Option<(usize, Weigh<K>)>,
    shards: usize,
    /// `shards` was chosen by the caller, not left at its default.
    shards_chosen: bool,
    statistics: bool,
    at_limit: AtKeyLimit,
    _key: PhantomData<fn() -> K>,
}

impl<K, A: Algorithm, C: Clock> KeyedBuilder<K, A, C> {
    /// Uses `clock` instead of the system clock.
    pub fn clock<C2: Clock>(self, clock: C2) -> KeyedBuilder<K, A, C2> {
        KeyedBuilder {
            algo: self.algo,
            clock,
            max_keys: self.max_keys,
            max_key_bytes: self.max_key_bytes,
            shards: self.shards,
            shards_chosen: self.shards_chosen,
            statistics: self.statistics,
            at_limit: self.at_limit,
            _key: PhantomData,
        }
    }

    /// What a new key gets when its shard is at the cap and no key is idle (default:
    /// [`AtKeyLimit::Reject`], which says when to retry; see [`AtKeyLimit`] for why).
    pub fn at_key_limit(mut self, policy: AtKeyLimit) -> Self {
        self.at_limit = policy;
        self
    }

    /// Hard cap on stored keys (default: 10 million). Rounded up to a multiple of the shard count.
    /// Each shard holds its share of the cap, so a new key can meet a full shard before the whole
    /// cap is used; unless [`KeyedBuilder::shards`] is set, a cap under 1,024 keys per default
    /// shard gets fewer shards (one below 2,048 keys), so that a small cap holds what it says.
    ///
    /// A shard's table has a power of two of slots and holds up to 7/8 of them. When a shard's
    /// cap (`max_keys / shards`) is within 1/32 of what its table holds, the table doubles once
    /// under churn at the cap (keys evicted, or idle and replaced), since rebuilding it in place
    /// would free too little room for the pass to pay off: with the default 64 shards, caps from
    /// 14.2 to 14.7 million, 7.1 to 7.3 million, and so on by halves, cost up to twice the table.
    pub fn max_keys(mut self, max_keys: NonZeroUsize) -> Self {
        self.max_keys = max_keys.get();
        self
    }

    /// Hard cap on what the stored keys weigh together, each key weighed by `weigh` when it is
    /// stored (default: none). For keys whose size a client chooses, such as strings taken from
    /// requests, where `max_keys` alone would let a few large keys take the memory: `weigh`
    /// says what one stored key costs, e.g. its heap bytes plus its entry's size. A new key
    /// that would take the stored keys past the cap meets it as it meets `max_keys`:
    /// [`AtKeyLimit`] decides, with idle keys removed to make room first.
    ///
    /// As `max_keys`, the cap is held shard by shard (each holds `max_key_bytes / shards`,
    /// rounded up): a key weighing more than a shard's share is never stored (with
    /// [`AtKeyLimit::Reject`], it is told so by a `retry_after` of `None`, except while its shard
    /// has no bytes left at all: new keys are then turned away before they are weighed, with
    /// the time the next key goes idle). Only inserts weigh keys; a decision on a stored key
    /// costs nothing more.
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// use tollgate::{AtKeyLimit, Keyed, ManualClock, Quota, Reason, TokenBucket};
    ///
    /// let per_name: Keyed<String, _, _> = Keyed::builder(TokenBucket::new(Quota::per_minute(10)?))
    ///     .clock(ManualClock::new())
    ///     .shards(NonZeroUsize::MIN)
    ///     .max_key_bytes(NonZeroUsize::new(1000).unwrap(), |k: &String| k.capacity())
    ///     .build();
    /// assert!(per_name.try_acquire("a".repeat(600).as_str(), 1).is_ok());
    /// let no = per_name.try_acquire("b".repeat(600).as_str(), 1).unwrap_err();
    /// assert_eq!(no.reason(), Reason::KeyLimit, "600 + 600 bytes is over the cap");
    /// assert!(per_name.try_acquire("c".repeat(300).as_str(), 1).is_ok(), "a lighter key fits");
    /// assert_eq!(per_name.statistics().key_bytes, 900);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn max_key_bytes(mut self, max_key_bytes: NonZeroUsize, weigh: fn(&K) -> usize) -> Self {
        self.max_key_bytes = Some((max_key_bytes.get(), weigh));
        self
    }

    /// Number of shards, rounded up to a power of two (default: 64, fewer for caps under 65,536
    /// keys, see [`KeyedBuilder::max_keys`]; more shards, less contention between threads, a
    /// little more memory when nearly empty).
    pub fn shards(mut self, shards: NonZeroUsize) -> Self {
        self.shards = shards.get().next_power_of_two();
        self.shards_chosen = true;
        self
    }

    /// Counts admitted and rejected requests for [`Keyed::statistics`] (default: off; the counts
    /// are kept per shard, but still cost an atomic add per decision).
    pub fn statistics(mut self, on: bool) -> Self {
        self.statistics = on;
        self
    }
    /// The keyed limiter.
    pub fn build(self) -> Keyed<K, A, C> {
        Keyed { inner: Arc::new(self.engine()) }
    }

    /// The engine this builder describes, each shard's table behind a lock `L`.
    pub(super) fn engine<L: TableLock<Table<K, A::State>>>(mut self) -> Inner<K, A, C, L> {
        if !self.shards_chosen {
            // At least MIN_KEYS_PER_SHARD per shard: with 64 shards of one key each, a cap of 64
            // turned new keys away from about the tenth.
            let fit = (self.max_keys / MIN_KEYS_PER_SHARD).max(1);
            self.shards = self.shards.min(1 << fit.ilog2());
        }
        Inner::new(
            self.algo,
            self.clock,
            self.shards,
            self.max_keys,
            self.max_key_bytes,
            self.at_limit,
            self.statistics,
        )
    }
}

impl<K, A: Algorithm> Keyed<K, A, SystemClock> {
    /// A keyed limiter on the system clock with the default cap and shard count.
    pub fn new(algo: A) -> Self
    where
        K: Hash + Eq + Send + Sync + 'static,
    {
        Self::builder(algo).build()
    }

    /// Starts building a keyed limiter.
    pub fn builder(algo: A) -> KeyedBuilder<K, A, SystemClock> {
        KeyedBuilder {
            algo,
            clock: SystemClock::new(),
            max_keys: 10_000_000,
            max_key_bytes: None,
            shards: 64,
            shards_chosen: false,
            statistics: false,
            at_limit: AtKeyLimit::Reject,
            _key: PhantomData,
        }
    }
}

impl<K, A: Algorithm, C: Clock> std::fmt::Debug for KeyedBuilder<K, A, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedBuilder")
            .field("config", &self.algo.config())
            .field("shards", &self.shards)
            .field("max_keys", &self.max_keys)
            .field("max_key_bytes", &self.max_key_bytes.map(|(max, _)| max))
            .field("at_key_limit", &self.at_limit)
            .finish_non_exhaustive()
    }
}
