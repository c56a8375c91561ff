//! [`Keyed`]: one limiter state per key (user, IP, tenant) in a sharded map.
//!
//! The algorithm's configuration is stored once; each key costs its key, its state (8 bytes for
//! a [`crate::TokenBucket`]) and the hash table's own overhead. Lookups take a shard's read lock
//! only, so threads working on different keys rarely touch the same cache line.
//!
//! Memory is bounded two ways: a key whose state is idle (back at full capacity, so it holds no
//! information) is swept out before a shard grows its table, and `max_keys` is a hard cap. At the
//! cap, idle keys are swept; if none is idle a *new* key is rejected with [`Reason::KeyLimit`]
//! (fail closed: existing keys keep their limits, nobody gets a fresh bucket by flooding keys).

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::num::NonZeroUsize;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hashbrown::HashTable;

use crate::algorithm::{Algorithm, peek};
use crate::clock::{Clock, SystemClock, nanos};
use crate::decision::{Lease, Meta, PermitPool, Reason, Rejected};
use crate::quota::Quota;
use crate::snapshot::Snapshot;
use crate::stats::Counts;

/// One limiter state per key.
///
/// ```
/// use tollgate::{Keyed, Quota, TokenBucket};
/// let per_user = Keyed::new(TokenBucket::new(Quota::per_second(2)?));
/// assert!(per_user.try_acquire("alice", 2).is_ok());
/// assert!(per_user.try_acquire("alice", 1).is_err());
/// assert!(per_user.try_acquire("bob", 1).is_ok());       // bob has his own bucket
/// assert_eq!(per_user.len(), 2);
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
pub struct Keyed<K, A: Algorithm, C: Clock = SystemClock> {
    inner: Arc<Inner<K, A, C>>,
}

struct Inner<K, A: Algorithm, C: Clock> {
    algo: A,
    clock: C,
    hasher: hashbrown::DefaultHashBuilder,
    shards: Box<[Shard<K, A::State>]>,
    shift: u32,
    max_per_shard: usize,
}

#[repr(align(128))]
struct Shard<K, S> {
    table: RwLock<HashTable<(K, S)>>,
    counts: Counts,
}

/// Counters of a [`Keyed`] limiter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyedStatistics {
    /// Keys currently stored.
    pub keys: usize,
    /// Requests admitted so far (probes excluded); `None` unless built with
    /// [`KeyedBuilder::statistics`].
    pub admitted: Option<u64>,
    /// Requests rejected so far; `None` unless built with [`KeyedBuilder::statistics`].
    pub rejected: Option<u64>,
}

/// Builds a [`Keyed`] limiter.
#[must_use = "a builder does nothing until .build()"]
pub struct KeyedBuilder<K, A: Algorithm, C: Clock> {
    algo: A,
    clock: C,
    max_keys: usize,
    shards: usize,
    statistics: bool,
    _key: PhantomData<fn() -> K>,
}

impl<K, A: Algorithm, C: Clock> KeyedBuilder<K, A, C> {
    /// Uses `clock` instead of the system clock.
    pub fn clock<C2: Clock>(self, clock: C2) -> KeyedBuilder<K, A, C2> {
        KeyedBuilder {
            algo: self.algo,
            clock,
            max_keys: self.max_keys,
            shards: self.shards,
            statistics: self.statistics,
            _key: PhantomData,
        }
    }

    /// Hard cap on stored keys (default: 10 million). Rounded up to a multiple of the shard count.
    pub fn max_keys(mut self, max_keys: NonZeroUsize) -> Self {
        self.max_keys = max_keys.get();
        self
    }

    /// Number of shards, rounded up to a power of two (default: 64; more shards, less contention
    /// between threads, a little more memory when nearly empty).
    pub fn shards(mut self, shards: NonZeroUsize) -> Self {
        self.shards = shards.get().next_power_of_two();
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
        let shards: Box<[_]> = (0..self.shards)
            .map(|_| Shard { table: RwLock::new(HashTable::new()), counts: Counts::new(self.statistics) })
            .collect();
        let bits = self.shards.trailing_zeros();
        Keyed {
            inner: Arc::new(Inner {
                algo: self.algo,
                clock: self.clock,
                hasher: hashbrown::DefaultHashBuilder::default(),
                max_per_shard: self.max_keys.div_ceil(self.shards),
                // Shard from the top bits; the table uses the low bits, so the two stay independent.
                shift: 64 - bits,
                shards,
            }),
        }
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
            shards: 64,
            statistics: false,
            _key: PhantomData,
        }
    }
}

struct KeyRelease<K, A: Algorithm, C: Clock> {
    inner: Arc<Inner<K, A, C>>,
    key: K,
}

impl<K, A, C> PermitPool for KeyRelease<K, A, C>
where
    K: Hash + Eq + Send + Sync + 'static,
    A: Algorithm,
    C: Clock,
{
    fn release(self: Arc<Self>, n: u64) {
        self.inner.give_back(&self.key, n, 0);
    }
}

impl<K, A: Algorithm, C: Clock> Inner<K, A, C>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    fn shard(&self, hash: u64) -> &Shard<K, A::State> {
        // `shift == 64` (one shard) would overflow the shift; `checked_shr` maps it to shard 0.
        &self.shards[hash.checked_shr(self.shift).unwrap_or(0) as usize]
    }

    fn give_back<Q>(&self, key: &Q, n: u64, acquired_at: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let table = self.shard(hash).table.read().unwrap_or_else(|e| e.into_inner());
        if let Some((_, state)) = table.find(hash, |(k, _)| k.borrow() == key) {
            self.algo.give_back(state, self.clock.now(), n, acquired_at);
        }
    }
}

impl<K, A: Algorithm, C: Clock> Keyed<K, A, C>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// Takes `n` permits for `key` now or rejects. `n == 0` reports the key's state (a key not yet
    /// seen reports a fresh state) and stores nothing.
    pub fn try_acquire<Q>(&self, key: &Q, n: u64) -> Result<Lease, Rejected>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.decide(key, n, true).map(|(meta, now)| self.lease(key, meta, n, now))
    }

    /// Would `n` permits for `key` be granted now? Takes nothing, stores nothing.
    pub fn check<Q>(&self, key: &Q, n: u64) -> Result<Meta, Rejected>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.decide(key, n, false).map(|(meta, _)| meta.meta())
    }

    /// Waits until `n` permits for `key` are granted, re-trying at each `retry_after`. Keys have no
    /// queue (that would cost memory per key): concurrent waiters on one key are not ordered.
    /// Rejects at once when retrying cannot help, or when the wait would exceed `max_wait`.
    pub async fn acquire<Q>(&self, key: &Q, n: u64, max_wait: Option<Duration>) -> Result<Lease, Rejected>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let deadline = max_wait.map(|d| self.inner.clock.now().saturating_add(nanos(d)));
        loop {
            let rejected = match self.try_acquire(key, n) {
                Ok(lease) => return Ok(lease),
                Err(r) => r,
            };
            let Some(retry) = rejected.retry_after() else { return Err(rejected) };
            let at = self.inner.clock.now().saturating_add(nanos(retry).max(1));
            if deadline.is_some_and(|d| at > d) {
                return Err(rejected.with_reason(Reason::MaxWait, rejected.meta().retry_ns));
            }
            self.inner.clock.sleep_until(at).await;
        }
    }

    #[inline]
    fn lease<Q>(&self, key: &Q, meta: Snapshot, n: u64, now: u64) -> Lease
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let lease = Lease::of(meta, n, now);
        if n > 0 && self.inner.algo.releases_on_drop() {
            let pool = KeyRelease { inner: self.inner.clone(), key: key.to_owned() };
            lease.holding(Arc::new(pool))
        } else {
            lease
        }
    }

    fn decide<Q>(&self, key: &Q, n: u64, commit: bool) -> Result<(Snapshot, u64), Rejected>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let shard = inner.shard(hash);
        let now = inner.clock.now();
        let rejected = |meta: Snapshot, reason| {
            shard.counts.rejected();
            Err(Rejected::of(meta, n, reason))
        };
        // Every algorithm rejects more than its capacity (the decision's `limit`), so "never" is
        // told from "not now" on the rejection path only; "never" reports the state as a probe.
        let count = |outcome: Result<Snapshot, Snapshot>, state: &A::State| match outcome {
            Ok(meta) => {
                if n > 0 && commit {
                    shard.counts.admitted();
                }
                Ok((meta, now))
            }
            Err(meta) if n > meta.limit() => {
                rejected(peek(&inner.algo, state, now, 0).with_retry(None), Reason::ExceedsCapacity)
            }
            Err(meta) => rejected(meta, Reason::Exhausted),
        };
        {
            let table = shard.table.read().unwrap_or_else(|e| e.into_inner());
            if let Some((_, state)) = table.find(hash, |(k, _)| k.borrow() == key) {
                return count(inner.algo.decide(state, now, n, commit), state);
            }
        }
        let fresh = inner.algo.new_state(now);
        if n == 0 || !commit || n > inner.algo.capacity() {
            // Nothing to take: answer from a fresh state without storing the key.
            return count(inner.algo.decide(&fresh, now, n, false), &fresh);
        }
        let mut table = shard.table.write().unwrap_or_else(|e| e.into_inner());
        if let Some((_, state)) = table.find(hash, |(k, _)| k.borrow() == key) {
            return count(inner.algo.decide(state, now, n, commit), state);
        }
        // Before the table grows (or at the cap), idle keys make room.
        if table.len() >= inner.max_per_shard || table.len() == table.capacity() {
            table.retain(|(_, s)| !inner.algo.is_idle(s, now));
        }
        if table.len() >= inner.max_per_shard {
            return rejected(peek(&inner.algo, &fresh, now, 0).with_retry(None), Reason::KeyLimit);
        }
        let outcome = inner.algo.decide(&fresh, now, n, commit);
        let admitted = count(outcome, &fresh);
        if admitted.is_ok() {
            table.insert_unique(hash, (key.to_owned(), fresh), |(k, _)| inner.hasher.hash_one(k));
        }
        admitted
    }

    /// Gives a lease's permits for `key` back as if they had never been taken.
    pub fn give_back<Q>(&self, key: &Q, lease: Lease)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if lease.permits() == 0 {
            return;
        }
        if self.inner.algo.releases_on_drop() {
            drop(lease);
        } else {
            self.inner.give_back(key, lease.permits(), lease.acquired_at);
        }
    }

    /// Removes every idle key now; returns how many were removed.
    pub fn evict_idle(&self) -> usize {
        let now = self.inner.clock.now();
        self.inner
            .shards
            .iter()
            .map(|shard| {
                let mut table = shard.table.write().unwrap_or_else(|e| e.into_inner());
                let before = table.len();
                table.retain(|(_, s)| !self.inner.algo.is_idle(s, now));
                table.shrink_to_fit(|(k, _)| self.inner.hasher.hash_one(k));
                before - table.len()
            })
            .sum()
    }

    /// Calls `f` with every stored key that is not idle and its state now (as a probe of `n == 0`
    /// reports it). Holds one shard's read lock at a time: keys changing meanwhile may be seen
    /// before or after the change.
    ///
    /// ```
    /// use tollgate::{FixedWindow, Keyed, Quota};
    /// let keyed: Keyed<String, _> = Keyed::new(FixedWindow::new(Quota::per_second(10)?));
    /// keyed.try_acquire("alice", 3).unwrap();
    /// let mut seen = Vec::new();
    /// keyed.for_each(|key, meta| seen.push((key.clone(), meta.remaining)));
    /// assert_eq!(seen, [("alice".to_string(), 7)]);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn for_each(&self, mut f: impl FnMut(&K, Meta)) {
        let inner = &*self.inner;
        let now = inner.clock.now();
        for shard in inner.shards.iter() {
            let table = shard.table.read().unwrap_or_else(|e| e.into_inner());
            for (key, state) in table.iter() {
                if !inner.algo.is_idle(state, now) {
                    f(key, peek(&inner.algo, state, now, 0).meta());
                }
            }
        }
    }

    /// Keys currently stored.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| s.table.read().unwrap_or_else(|e| e.into_inner()).len()).sum()
    }

    /// True when no key is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The hard cap on stored keys (`max_keys` rounded up to a multiple of the shard count).
    pub fn max_keys(&self) -> usize {
        self.inner.max_per_shard * self.inner.shards.len()
    }

    /// Stored keys and (when built with [`KeyedBuilder::statistics`]) request counters.
    pub fn statistics(&self) -> KeyedStatistics {
        let s = &self.inner.shards;
        KeyedStatistics {
            keys: self.len(),
            admitted: s.iter().map(|s| s.counts.read().0).sum(),
            rejected: s.iter().map(|s| s.counts.read().1).sum(),
        }
    }

    /// Replaces the configuration for every key; each key's state carries over by the
    /// algorithm's rule.
    pub fn set_config(&self, config: A::Config) {
        let old = self.inner.algo.set_config(config);
        let now = self.inner.clock.now();
        for shard in self.inner.shards.iter() {
            let table = shard.table.read().unwrap_or_else(|e| e.into_inner());
            table.iter().for_each(|(_, s)| self.inner.algo.carry_over(s, now, old));
        }
    }

    /// Most permits one request can be granted.
    pub fn capacity(&self) -> u64 {
        self.inner.algo.capacity()
    }

    /// The period the quota is counted over; `None` for concurrency limits.
    pub fn window(&self) -> Option<Duration> {
        self.inner.algo.window()
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.inner.clock
    }
}

impl<K, A: Algorithm<Config = Quota>, C: Clock> Keyed<K, A, C>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// Changes the quota of every key at run time.
    pub fn set_quota(&self, quota: Quota) {
        self.set_config(quota)
    }
}

impl<K, A: Algorithm, C: Clock> std::fmt::Debug for Keyed<K, A, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("Keyed")
            .field("config", &inner.algo.config())
            .field("shards", &inner.shards.len())
            .field("max_keys", &(inner.max_per_shard * inner.shards.len()))
            .finish_non_exhaustive()
    }
}

impl<K, A: Algorithm, C: Clock> std::fmt::Debug for KeyedBuilder<K, A, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedBuilder")
            .field("config", &self.algo.config())
            .field("shards", &self.shards)
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}
