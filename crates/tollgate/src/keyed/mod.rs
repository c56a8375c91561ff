//! [`Keyed`]: one limiter state per key (user, IP, tenant) in a sharded map.
//!
//! The algorithm's configuration is stored once; each key costs its key, its state (8 bytes for
//! a [`crate::TokenBucket`]) and the hash table's own overhead. Lookups take a shard's read lock
//! only (through a per-thread slot while no writer is about, see `biased_lock`), so threads working
//! on different keys rarely touch the same cache line.
//!
//! Memory is bounded three ways: a key whose state is idle (back at full capacity, so it holds no
//! information) is removed when a new key is inserted into its shard, `max_keys` is a hard cap,
//! and `max_key_bytes` (off by default) caps the bytes the stored keys weigh, for keys whose size
//! the caller does not choose (strings a client sends); at either cap [`AtKeyLimit`] decides what
//! happens to a new key.
//!
//! See [`Keyed`] for the work each decision does and what the cap costs.
//!
//! [`Keyed`] is a thin public type over a private engine (`shards`: the sharded table and every
//! decision on it), as tokio's `Semaphore` is over its batch semaphore; the builder, the policy at
//! the cap and the statistics have a file each.

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::{Algorithm, algorithm_name};
use crate::clock::{Clock, SystemClock, nanos};
use crate::decision::{Lease, Reason, Rejected};
use crate::quota::Quota;
use crate::reservation::SettleError;
use crate::snapshot::Meta;

mod at_limit;
#[cfg(feature = "bench-locks")]
mod bench;
mod builder;
mod idle_bounds;
mod lock;
mod shards;
mod statistics;

pub use at_limit::AtKeyLimit;
#[cfg(feature = "bench-locks")]
pub use bench::KeyedOnRwLock;
pub use builder::KeyedBuilder;
use shards::Inner;
pub use shards::SWEEP;
pub use statistics::KeyedStatistics;

/// One limiter state per key.
///
/// # Work per decision
///
/// A decision on a stored key takes its shard's read lock and looks at that one key. A decision
/// that inserts a key (below the cap, or at it) takes the shard's write lock and looks at no more
/// than [`SWEEP`] groups of 64 buckets of the shard's hash table: each shard keeps, per group, a
/// time no later than the time each of its keys goes idle ([`crate::Algorithm::idle_at`]), in a
/// tree that finds the earliest group in a few steps, so the keys nearest to idle are found
/// there, removed if idle, and the group's time raised if its keys took permits since. At the
/// cap, [`AtKeyLimit::Reject`] and [`AtKeyLimit::AdmitUnstored`] answer a new key under the read
/// lock when no key can be idle. Nothing scans a shard inside a request. What is not bounded per
/// decision is the hash table's own growth (it doubles, copying its entries and re-reading their
/// times, at most `log2(max_keys / shards)` times per shard on the way up to the cap), the
/// table's occasional in-place clean-up of deleted slots after many removals (amortized over
/// them), and [`Keyed::evict_idle`], [`Keyed::set_config`] and [`Keyed::reset_matching`],
/// explicit passes over every key.
///
/// A key costs its table entry (the key and its state) and the table's slack, nothing else: the
/// group times cost 8 bytes per 64 buckets, under half a byte per key (measured beside
/// governor's: docs/benchmarks.md, "Memory per key"). A shard at its cap keeps its memory however
/// many keys come and go (evicted, or idle and replaced): the clean-up of deleted slots rebuilds
/// its table at the same size instead of letting it double, unless the shard's cap leaves less
/// than 1/32 of the table's room free, where the table doubles once (see `max_keys`).
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

impl<K, A: Algorithm, C: Clock> Keyed<K, A, C>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// Takes `n` permits for `key` now or rejects. `n == 0` reports the key's state (a key not yet
    /// seen reports a fresh state) and stores nothing.
    #[inline]
    pub fn try_acquire<Q>(&self, key: &Q, n: u64) -> Result<Lease, Rejected>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.inner.decide(key, n, true).map(|(meta, now, stored)| self.inner.lease(key, meta, n, now, stored))
    }

    /// Would `n` permits for `key` be granted now? Takes nothing, stores nothing.
    pub fn check<Q>(&self, key: &Q, n: u64) -> Result<Meta, Rejected>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.inner.decide(key, n, false).map(|(meta, ..)| meta.meta())
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

    /// Settles a reservation's `lease` (granted by this limiter for `key`) for `actual` permits:
    /// gives back what it exceeded, or takes the rest past the limit as a debt
    /// ([`crate::Reservation`]). A key evicted since the reserve is stored again to hold its debt
    /// ([`SettleError::KeyLimit`] when the cap leaves no room). Usually called through
    /// [`crate::Reservation::settle`].
    pub fn settle<Q>(&self, key: &Q, lease: &Lease, actual: u64) -> Result<(), SettleError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let unsupported = |why| SettleError::Unsupported { limiter: algorithm_name::<A>(), why };
        let estimate = lease.permits();
        if actual > estimate {
            let debt = actual - estimate;
            return self.inner.charge(key, debt).map_err(|e| e.map_or(SettleError::KeyLimit { debt }, unsupported));
        }
        // A charge of nothing asks the algorithm whether it can carry a debt: only then it settles.
        let algo = &self.inner.algo;
        let settled = self.inner.with_state(key, |state, now| {
            algo.charge(state, now, 0)?;
            algo.give_back(state, now, estimate - actual, lease.acquired_at);
            Ok(())
        });
        // A key no longer stored has nothing left to give back.
        let now = self.inner.clock.now();
        settled.unwrap_or_else(|| algo.charge(&algo.new_state(now), now, 0)).map_err(unsupported)
    }

    /// Removes every idle key now and gives back the memory it can; returns how many were
    /// removed. A pass over every key, holding each shard's write lock in turn: for a quiet
    /// moment (a timer), not for the request path, where idle keys are removed a few at a time.
    pub fn evict_idle(&self) -> usize {
        self.inner.evict_idle()
    }

    /// Forgets what `key` has used: its state is removed, so its next decision starts from a
    /// fresh state (full), as for a key never seen. Returns true when that changed something:
    /// the key was stored and not idle (a key [`Keyed::for_each`] shows).
    ///
    /// Takes the key's shard's write lock and removes the key's entry: one lookup. To reset the
    /// keys a filter picks, [`Keyed::reset_matching`] does one pass per shard.
    ///
    /// A key of an algorithm whose permits are held ([`crate::Concurrency`]) is not removed
    /// while it holds permits (false): its leases would release into its fresh state. A lease
    /// of another algorithm taken before the reset and given back after it
    /// ([`Keyed::give_back`]) returns its permits to the fresh state only where they still count
    /// there, never beyond full.
    ///
    /// ```
    /// use tollgate::{FixedWindow, Keyed, Quota};
    /// let per_user: Keyed<String, _> = Keyed::new(FixedWindow::new(Quota::per_minute(3)?));
    /// per_user.try_acquire("alice", 3).unwrap();
    /// assert!(per_user.try_acquire("alice", 1).is_err());
    /// assert!(per_user.reset("alice"));
    /// assert_eq!(per_user.try_acquire("alice", 1).unwrap().remaining(), 2, "a fresh window");
    /// assert!(!per_user.reset("bob"), "never seen: nothing to forget");
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn reset<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.reset(key)
    }

    /// [`Keyed::reset`] for every stored key for which `f` returns true (a user's keys, a
    /// tenant's); returns how many of them were not idle. One pass over every key, holding each
    /// shard's write lock in turn, as [`Keyed::evict_idle`]; keys of a [`crate::Concurrency`]
    /// limiter that hold permits are kept. `f` runs under that lock: it must not call this
    /// limiter (a call on a key of the locked shard would wait for itself for ever).
    ///
    /// ```
    /// use tollgate::{Keyed, Quota, TokenBucket};
    /// let per_route: Keyed<(String, String), _> = Keyed::new(TokenBucket::new(Quota::per_second(5)?));
    /// for (user, route) in [("alice", "/a"), ("alice", "/b"), ("bob", "/a")] {
    ///     per_route.try_acquire(&(user.to_string(), route.to_string()), 1).unwrap();
    /// }
    /// assert_eq!(per_route.reset_matching(|(user, _)| user == "alice"), 2);
    /// assert_eq!(per_route.len(), 1, "bob's key is kept");
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn reset_matching(&self, f: impl FnMut(&K) -> bool) -> usize {
        self.inner.reset_matching(f)
    }

    /// Calls `f` with every stored key that is not idle and its state now (as a probe of `n == 0`
    /// reports it). Holds one shard's read lock at a time: keys changing meanwhile may be seen
    /// before or after the change. `f` runs under that lock: it must not call this limiter (a
    /// new key in the locked shard would wait for itself for ever); collect, then act.
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
    pub fn for_each(&self, f: impl FnMut(&K, Meta)) {
        self.inner.for_each(f)
    }

    /// Keys currently stored.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// True when no key is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The hard cap on stored keys (`max_keys` rounded up to a multiple of the shard count).
    pub fn max_keys(&self) -> usize {
        self.inner.max_per_shard * self.inner.shards.len()
    }

    /// What a new key gets at the cap.
    pub fn at_key_limit(&self) -> AtKeyLimit {
        self.inner.at_limit
    }

    /// Stored keys, what happened at the cap and (when built with [`KeyedBuilder::statistics`])
    /// request counters.
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// use tollgate::{AtKeyLimit, Keyed, ManualClock, Quota, TokenBucket};
    /// let keyed: Keyed<u64, _, _> = Keyed::builder(TokenBucket::new(Quota::per_minute(10)?))
    ///     .clock(ManualClock::new())
    ///     .shards(NonZeroUsize::MIN)
    ///     .max_keys(NonZeroUsize::new(100).unwrap())
    ///     .at_key_limit(AtKeyLimit::EvictNearestIdle)
    ///     .build();
    /// (0..150).for_each(|key| drop(keyed.try_acquire(&key, 1)));
    /// let s = keyed.statistics();
    /// assert_eq!((s.keys, s.evicted_at_limit, s.rejected_at_limit), (100, 50, 0));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn statistics(&self) -> KeyedStatistics {
        self.inner.statistics()
    }

    /// Replaces the configuration for every key; each key's state carries over by the
    /// algorithm's rule. A pass over every key that re-reads when each goes idle (the new
    /// configuration may move idle times either way), holding each shard's write lock in turn.
    pub fn set_config(&self, config: A::Config) {
        self.inner.set_config(config)
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

impl<K, A: Algorithm, C: Clock> Keyed<K, A, C> {
    /// The cap on what the stored keys weigh (`max_key_bytes` rounded up to a multiple of the
    /// shard count); `None` without one.
    pub fn max_key_bytes(&self) -> Option<usize> {
        let inner = &*self.inner;
        inner.weigh.map(|_| inner.max_bytes_per_shard.saturating_mul(inner.shards.len()))
    }
}

impl<K, A: Algorithm, C: Clock> std::fmt::Debug for Keyed<K, A, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("Keyed")
            .field("config", &inner.algo.config())
            .field("shards", &inner.shards.len())
            .field("max_keys", &(inner.max_per_shard * inner.shards.len()))
            .field("max_key_bytes", &self.max_key_bytes())
            .field("at_key_limit", &inner.at_limit)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;

    use super::*;
    use crate::{ManualClock, Reason, TokenBucket};

    fn by_bytes(policy: AtKeyLimit, clock: &ManualClock, max: usize) -> Keyed<String, TokenBucket, ManualClock> {
        Keyed::builder(TokenBucket::new(Quota::per_minute(10).unwrap()))
            .clock(clock.clone())
            .shards(NonZeroUsize::MIN)
            .max_key_bytes(NonZeroUsize::new(max).unwrap(), |k: &String| k.len())
            .at_key_limit(policy)
            .build()
    }

    /// The stored keys' weight, as the shards count it and as a sum over the keys; every
    /// shard within its share.
    fn weights(k: &Keyed<String, TokenBucket, ManualClock>) -> (usize, usize) {
        let mut counted = 0;
        let mut summed = 0;
        for shard in k.inner.shards.iter() {
            shard.table.read(|t| {
                assert!(t.bytes <= k.inner.max_bytes_per_shard, "{} over {}", t.bytes, k.inner.max_bytes_per_shard);
                counted += t.bytes;
                summed += t.map.iter().map(|(key, _)| key.len()).sum::<usize>();
            });
        }
        (counted, summed)
    }

    #[test]
    fn the_byte_cap_meets_each_policy() {
        let key = |c: char, n: usize| c.to_string().repeat(n);
        let clock = ManualClock::new();
        // Reject: told when room comes (a key of 10 per minute is idle 6 s after one permit).
        let k = by_bytes(AtKeyLimit::Reject, &clock, 100);
        let no = k.try_acquire(key('d', 101).as_str(), 1).unwrap_err();
        assert_eq!((no.reason(), no.retry_after()), (Reason::KeyLimit, None), "heavier than the cap: never");
        assert!(k.try_acquire(key('a', 60).as_str(), 1).is_ok());
        clock.advance(Duration::from_secs(1));
        let no = k.try_acquire(key('b', 50).as_str(), 1).unwrap_err();
        assert_eq!((no.reason(), no.retry_after()), (Reason::KeyLimit, Some(Duration::from_secs(5))));
        assert!(k.try_acquire(key('c', 40).as_str(), 1).is_ok(), "a key that fits is stored");
        clock.advance(Duration::from_millis(5_500));
        assert!(k.try_acquire(key('b', 50).as_str(), 1).is_ok(), "idle keys made room");
        assert_eq!((k.len(), k.statistics().key_bytes), (2, 90), "a, idle, made room; c (idle at 7 s) stays");

        // Evict: as many of the keys nearest to idle as the new key needs.
        let k = by_bytes(AtKeyLimit::EvictNearestIdle, &clock, 100);
        for c in ['a', 'b', 'c', 'd'] {
            assert!(k.try_acquire(key(c, 25).as_str(), 1).is_ok());
            clock.advance(Duration::from_millis(10));
        }
        assert!(k.try_acquire(key('e', 60).as_str(), 1).is_ok());
        let mut kept = Vec::new();
        k.for_each(|key, _| kept.push(key.clone()));
        kept.sort();
        assert_eq!(kept, [key('d', 25), key('e', 60)], "a, b and c, the nearest to idle, made room");
        assert_eq!(k.statistics().evicted_at_limit, 3);

        // Admit: decided, not stored.
        let k = by_bytes(AtKeyLimit::AdmitUnstored, &clock, 100);
        assert!(k.try_acquire(key('a', 90).as_str(), 1).is_ok());
        assert!(k.try_acquire(key('b', 20).as_str(), 1).is_ok());
        assert_eq!((k.len(), k.statistics().unstored_at_limit, weights(&k)), (1, 1, (90, 90)));
    }

    /// Keys of every size come, go idle, are reset one by one or by a filter and swept: the
    /// shards' byte counts stay the sum of their keys' weights, within the cap.
    /// A fixed xorshift sequence: `next(n)` is below `n`.
    pub(super) fn xorshift() -> impl FnMut(u64) -> u64 {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        move |n| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        }
    }

    #[test]
    fn the_stored_weight_is_kept_exact() {
        let mut next = xorshift();
        for policy in [AtKeyLimit::Reject, AtKeyLimit::EvictNearestIdle, AtKeyLimit::AdmitUnstored] {
            let clock = ManualClock::new();
            let k = Keyed::builder(TokenBucket::new(Quota::per_minute(10).unwrap()))
                .clock(clock.clone())
                .shards(NonZeroUsize::new(4).unwrap())
                .max_keys(NonZeroUsize::new(64).unwrap())
                .max_key_bytes(NonZeroUsize::new(4000).unwrap(), |k: &String| k.len())
                .at_key_limit(policy)
                .build();
            for step in 0..20_000 {
                let name = format!("{}-{}", next(300), "x".repeat(next(400) as usize));
                match next(100) {
                    0 => drop(k.reset(name.as_str())),
                    1 => drop(k.reset_matching(|key| key.len() % 7 == 0)),
                    2 => drop(k.evict_idle()),
                    3..=20 => clock.advance(Duration::from_millis(next(3000))),
                    _ => drop(k.try_acquire(name.as_str(), 1 + next(3))),
                }
                let (counted, summed) = weights(&k);
                assert_eq!(counted, summed, "{policy:?}, step {step}");
                assert_eq!(k.statistics().key_bytes, summed);
            }
        }
    }

    /// Stored keys are replaced one by one at the cap for a hundred times the cap (evicted, or
    /// idle and swept for the new key): the table keeps the buckets it had when it reached the
    /// cap, where hashbrown alone would double it once its deleted slots took all the room.
    #[test]
    fn churn_at_the_cap_does_not_grow_the_table() {
        let cap = 10_000;
        for policy in [AtKeyLimit::Reject, AtKeyLimit::EvictNearestIdle, AtKeyLimit::AdmitUnstored] {
            let clock = ManualClock::new();
            let k: Keyed<u64, _, _> = Keyed::builder(TokenBucket::new(Quota::per_minute(10).unwrap()))
                .clock(clock.clone())
                .shards(NonZeroUsize::MIN)
                .max_keys(NonZeroUsize::new(cap).unwrap())
                .at_key_limit(policy)
                .build();
            let buckets = || k.inner.shards[0].table.read(|t| t.map.num_buckets());
            // Under eviction no key goes idle; otherwise one key goes idle per new key, 6 s after
            // its permit (10 per minute).
            let step = if policy == AtKeyLimit::EvictNearestIdle { 0 } else { 6_000_000_000 / cap as u64 };
            let new_keys = |keys: std::ops::Range<u64>| {
                for key in keys {
                    assert!(k.try_acquire(&key, 1).is_ok(), "{policy:?}: key {key}");
                    clock.advance(Duration::from_nanos(step));
                }
            };
            new_keys(0..cap as u64);
            let at_cap = buckets();
            new_keys(cap as u64..100 * cap as u64);
            assert_eq!(k.len(), cap, "{policy:?}");
            assert_eq!(buckets(), at_cap, "{policy:?}: the table grew from {at_cap} buckets");
        }
    }
}
