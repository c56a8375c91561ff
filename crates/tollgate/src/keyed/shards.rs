//! The engine behind [`Keyed`](super::Keyed): the sharded table of key states, each shard
//! behind its lock with the bounds of when its keys go idle ([`IdleBounds`], per group of
//! buckets), and every decision and pass over the keys. The public type only forwards to it, as
//! tokio's `Semaphore` forwards to its batch semaphore.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use hashbrown::HashTable;

use super::at_limit::AtKeyLimit;
use super::idle_bounds::{IdleBounds, Queue};
use super::lock::TableLock;
use crate::algorithm::{Algorithm, peek};
use crate::biased_lock::BiasedLock;
use crate::clock::Clock;
use crate::decision::{Lease, PermitPool, Reason, Rejected};
use crate::snapshot::{Meta, Snapshot};
use crate::stats::Counts;
use crate::sync::{AtomicU64, Ordering};

/// What one stored key weighs against
/// [`KeyedBuilder::max_key_bytes`](crate::KeyedBuilder::max_key_bytes).
pub(super) type Weigh<K> = fn(&K) -> usize;

/// The shard of `hash` among `mask + 1`: from bits 32 and up, which a shard's table reads
/// neither for its slot (the low bits, up to its 2^32 slots) nor for its 7-bit tag (the top 7:
/// hashbrown matches a group of 16 slots against the tag before comparing keys). Sharding by the
/// top bits, as before, left a shard's keys one tag bit of 7 with the default 64 shards, so a
/// lookup compared about half the keys of each group it probed.
fn shard_index(hash: u64, mask: u64) -> usize {
    ((hash >> 32) & mask) as usize
}

/// Groups of 64 buckets of a shard's table a decision that inserts a key looks
/// at, at most, and keys it evicts for a heavy one: the bound on work under a shard's write lock.
pub const SWEEP: usize = 8;

/// The engine: the algorithm and clock every key shares, the shards, and the caps.
/// `L` is the lock over each shard's table: the biased lock unless a bench chooses another.
pub(super) struct Inner<K, A: Algorithm, C: Clock, L = BiasedLock<Table<K, <A as Algorithm>::State>>> {
    pub(super) algo: A,
    pub(super) clock: C,
    hasher: hashbrown::DefaultHashBuilder,
    pub(super) shards: Box<[Shard<L>]>,
    /// `shards - 1`: a shard is picked by bits of the hash its table does not read.
    shard_mask: u64,
    pub(super) max_per_shard: usize,
    /// Each shard's share of `max_key_bytes` (`usize::MAX` without one), and the key's weight.
    pub(super) max_bytes_per_shard: usize,
    pub(super) weigh: Option<Weigh<K>>,
    pub(super) at_limit: AtKeyLimit,
    /// Only a release makes a key idle: keys are filed under a counter, not a time.
    by_release: bool,
}

/// One shard: its table behind its lock, and its counters (on a line of their own).
#[repr(align(128))]
pub(super) struct Shard<L> {
    pub(super) table: L,
    pub(super) counts: Counts,
    /// New keys rejected at the cap, and decided without being stored (also under the read lock).
    pub(super) rejected: AtomicU64,
    pub(super) unstored: AtomicU64,
}

/// A shard's keys, when they go idle and what happened to them (written under the write lock).
pub(super) struct Table<K, S> {
    pub(super) map: HashTable<(K, S)>,
    /// What the stored keys weigh (0 without `max_key_bytes`).
    pub(super) bytes: usize,
    /// No key of a group of buckets goes idle before its bound.
    bounds: IdleBounds,
    /// The first keys to go idle of the group last looked at: while the first goes idle at the
    /// shard's earliest bound, that bound is exact.
    queue: Queue,
    /// The retry time a sweep that ran out of looks told (a key it looked at goes idle then, but
    /// groups with earlier, stale bounds remain), and that key's group: a retry then looks there
    /// first, so it finds the room it was told of instead of spending its looks on stale groups.
    told: Option<(u64, usize)>,
    pub(super) swept: u64,
    pub(super) evicted: u64,
}

struct KeyRelease<K, A: Algorithm, C: Clock, L> {
    inner: Arc<Inner<K, A, C, L>>,
    key: K,
}

impl<K, A, C, L> PermitPool for KeyRelease<K, A, C, L>
where
    K: Hash + Eq + Send + Sync + 'static,
    A: Algorithm,
    C: Clock,
    L: TableLock<Table<K, A::State>> + Send + Sync + 'static,
{
    fn release(self: Arc<Self>, n: u64) {
        self.inner.give_back(&self.key, n, 0);
    }
}

impl<K, A: Algorithm, C: Clock, L: TableLock<Table<K, A::State>>> Inner<K, A, C, L> {
    /// An empty table of `shards` shards (a power of two) holding up to `max_keys` keys, and
    /// `max_key_bytes` of them when given.
    pub(super) fn new(
        algo: A,
        clock: C,
        shards: usize,
        max_keys: usize,
        max_key_bytes: Option<(usize, Weigh<K>)>,
        at_limit: AtKeyLimit,
        statistics: bool,
    ) -> Self {
        let table: Box<[_]> = (0..shards)
            .map(|_| Shard {
                table: L::new(Table {
                    map: HashTable::new(),
                    bytes: 0,
                    bounds: IdleBounds::new(0),
                    queue: Queue::default(),
                    told: None,
                    swept: 0,
                    evicted: 0,
                }),
                counts: Counts::new(statistics),
                rejected: AtomicU64::new(0),
                unstored: AtomicU64::new(0),
            })
            .collect();
        let by_release = algo.releases_on_drop();
        Inner {
            algo,
            clock,
            hasher: hashbrown::DefaultHashBuilder::default(),
            max_per_shard: max_keys.div_ceil(shards),
            max_bytes_per_shard: max_key_bytes.map_or(usize::MAX, |(max, _)| max.div_ceil(shards)),
            weigh: max_key_bytes.map(|(_, weigh)| weigh),
            shard_mask: shards as u64 - 1,
            shards: table,
            at_limit,
            by_release,
        }
    }
}

impl<K, A: Algorithm, C: Clock, L: TableLock<Table<K, A::State>>> Inner<K, A, C, L>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    pub(super) fn shard(&self, hash: u64) -> &Shard<L> {
        &self.shards[shard_index(hash, self.shard_mask)]
    }

    /// What `key` weighs against `max_key_bytes` (0 without it).
    fn weight(&self, key: &K) -> usize {
        self.weigh.map_or(0, |weigh| weigh(key))
    }

    /// True when a key weighing `weight` can be stored in `t` now.
    fn fits(&self, t: &Table<K, A::State>, weight: usize) -> bool {
        t.map.len() < self.max_per_shard && t.bytes.saturating_add(weight) <= self.max_bytes_per_shard
    }

    /// Removes a stored key's entry and its weight (its group's bound stays: still no later).
    fn remove(&self, bytes: &mut usize, entry: hashbrown::hash_table::OccupiedEntry<'_, (K, A::State)>) {
        let ((key, _), _) = entry.remove();
        *bytes -= self.weight(&key);
    }

    pub(super) fn give_back<Q>(&self, key: &Q, n: u64, acquired_at: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let now = self.clock.now();
        self.shard(hash).table.read(|t| {
            let bucket = t.map.find_bucket_index(hash, |(k, _)| k.borrow() == key)?;
            let (_, state) = t.map.get_bucket(bucket)?;
            self.algo.give_back(state, now, n, acquired_at);
            // The one change that moves a key's idle time earlier (a release makes a held key idle).
            t.bounds.lower(bucket, self.algo.idle_at(state, now));
            Some(())
        });
    }

    /// Counts a decision on `state` and turns it into the limiter's answer. Every algorithm
    /// rejects more than its capacity (the decision's `limit`), so "never" is told from "not now"
    /// on the rejection path only; "never" reports the state as a probe.
    #[inline]
    fn count(
        &self,
        shard: &Shard<L>,
        outcome: Result<Snapshot, Snapshot>,
        state: &A::State,
        now: u64,
        n: u64,
        commit: bool,
    ) -> Result<(Snapshot, u64, bool), Rejected> {
        match outcome {
            Ok(meta) => {
                if n > 0 && commit {
                    shard.counts.admitted();
                }
                Ok((meta, now, true))
            }
            Err(meta) => {
                let (meta, reason) = if n > meta.limit() {
                    (peek(&self.algo, state, now, 0).with_retry(None), Reason::ExceedsCapacity)
                } else {
                    (meta, Reason::Exhausted)
                };
                shard.counts.rejected();
                Err(Rejected::of(meta, n, reason))
            }
        }
    }

    /// Looks at group `g`'s keys: removes those idle at `now`, sets the group's bound to the
    /// earliest idle time of the others and queues the first of them; returns that time
    /// (`u64::MAX`: no key left in the group).
    fn look(&self, t: &mut Table<K, A::State>, g: usize, now: u64) -> u64 {
        t.queue.start(g);
        for bucket in IdleBounds::buckets(g, t.map.num_buckets()) {
            let Ok(entry) = t.map.get_bucket_entry(bucket) else { continue };
            let at = self.algo.idle_at(&entry.get().1, now);
            if at <= now {
                self.remove(&mut t.bytes, entry);
                t.swept += 1;
            } else {
                t.queue.push(at, bucket);
            }
        }
        let earliest = t.queue.first().map_or(u64::MAX, |(at, _)| at);
        t.bounds.set(g, earliest);
        earliest
    }

    /// True when the queue's first key goes idle at `bound`, the shard's earliest bound: no key
    /// goes idle before it.
    fn first_is_current(&self, t: &Table<K, A::State>, bound: u64, now: u64) -> bool {
        t.queue.first().is_some_and(|(at, bucket)| {
            at == bound && t.map.get_bucket(bucket).is_some_and(|(_, s)| self.algo.idle_at(s, now) == at)
        })
    }

    /// Looks at the groups whose bounds are earliest: removes the keys idle at `now` and raises
    /// stale bounds. Without `room_for`, looks only at groups whose bounds are not later than
    /// `now`, at most 2 (a key inserted below the cap). With it (a key weighing that much at the
    /// cap), at most [`SWEEP`], until the key fits or the earliest bound is checked current (the
    /// queue's first key is then the nearest to idle). Returns the earliest time a stored key
    /// goes idle as far as it found out (exact when it stopped on a current bound; else a key
    /// looked at goes idle then, and a sweep for room at or after that time looks at its group
    /// first; see [`AtKeyLimit::Reject`]), `u64::MAX` when no key goes idle by time.
    fn sweep(&self, t: &mut Table<K, A::State>, now: u64, room_for: Option<usize>) -> u64 {
        let mut found = (u64::MAX, 0);
        let looks = if room_for.is_some() { SWEEP } else { 2 };
        let due = |&mut (at, g): &mut (u64, usize)| at <= now && room_for.is_some() && g < t.bounds.groups();
        if let Some((_, g)) = t.told.take_if(due) {
            found = (self.look(t, g, now), g);
        }
        for _ in 0..looks {
            let bound = t.bounds.earliest();
            if bound == u64::MAX || (bound > now && room_for.is_none()) {
                return bound;
            }
            if room_for.is_some_and(|weight| self.fits(t, weight)) {
                return found.0;
            }
            if bound > now && self.first_is_current(t, bound, now) {
                return bound;
            }
            // Among groups that tie for the earliest bound (all the keys of a fixed window end
            // together), the ones after the group last looked at first: a sweep then goes
            // through them in order instead of back to the first one, where new keys land one
            // by one.
            let after = (t.queue.group + 1..t.queue.group + 4).find(|&g| t.bounds.of(g) == bound);
            let g = after.unwrap_or_else(|| t.bounds.nearest().1);
            let at = self.look(t, g, now);
            found = found.min((at, g));
            if at != u64::MAX && at == t.bounds.earliest() && room_for.is_some_and(|weight| !self.fits(t, weight)) {
                return at;
            }
        }
        if room_for.is_some() && found.0 != u64::MAX {
            t.told = Some(found);
        }
        found.0
    }

    /// Sets every group's bound from its keys' states now, for a table whose keys moved (it grew,
    /// was rehashed or rebuilt) or whose states changed (a new configuration).
    fn rebound(&self, t: &mut Table<K, A::State>, now: u64) {
        t.queue.clear();
        t.told = None;
        let buckets = t.map.num_buckets();
        t.bounds.reset(buckets);
        for bucket in 0..buckets {
            if let Some((_, s)) = t.map.get_bucket(bucket) {
                t.bounds.lower(bucket, self.algo.idle_at(s, now));
            }
        }
    }

    /// Called when the table has no room left for an insert. When the table already has the
    /// buckets the shard's cap needs, and is over half full, that room can only be held by
    /// deleted slots, and the table is rebuilt in place: its entries are moved out and inserted
    /// again, which empties the deleted slots. Otherwise hashbrown makes room itself: by growing
    /// the table on the way up to the cap, or by rehashing in place when it is at most half full.
    ///
    /// A removal leaves a deleted slot (instead of an empty one) when its probe group is full, so
    /// at the cap, where evictions and idle keys swept for new ones keep removing and inserting,
    /// deleted slots pile up until they take all the room. hashbrown would then double the table,
    /// since it rehashes in place only when at most half full, and every shard would grow to
    /// twice what its cap needs (measured: +63 % of the resident memory of a full 10 million key
    /// table after 100 million evictions).
    ///
    /// A rebuild is a pass over the shard under its write lock, with its entries in a vector
    /// meanwhile, so it waits for at least 1/32 of the keys the table holds to be deleted slots;
    /// each removal leaves at most one, so a rebuild costs at most 37 buckets and 32 entries per
    /// removal since the table was last rebuilt. A shard whose cap leaves less room than that
    /// never gets there, and hashbrown doubles its table once (see [`KeyedBuilder::max_keys`]).
    #[cold]
    #[inline(never)]
    fn clear_deleted(&self, t: &mut Table<K, A::State>) {
        let full = full_capacity(t.map.num_buckets());
        let len = t.map.len();
        if full < self.max_per_shard || len < full / 2 || full - len < full / 32 {
            return;
        }
        let entries: Vec<(K, A::State)> = t.map.drain().collect();
        for entry in entries {
            t.map.insert_unique(self.hasher.hash_one(&entry.0), entry, |(k, _)| self.hasher.hash_one(k));
        }
    }

    #[inline]
    pub(super) fn lease<Q>(self: &Arc<Self>, key: &Q, meta: Snapshot, n: u64, now: u64, stored: bool) -> Lease
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        L: Send + Sync + 'static,
    {
        // An unstored key's permits go nowhere: the key stored later under that name never took them.
        let pool = (n > 0 && self.algo.releases_on_drop() && stored)
            .then(|| Arc::new(KeyRelease { inner: self.clone(), key: key.to_owned() }) as Arc<dyn PermitPool>);
        Lease::held_by(meta, n, now, pool)
    }

    /// The decision, the time it was made at, and whether the key is stored (false only for
    /// [`AtKeyLimit::AdmitUnstored`] at the cap).
    #[inline]
    pub(super) fn decide<Q>(&self, key: &Q, n: u64, commit: bool) -> Result<(Snapshot, u64, bool), Rejected>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        let now = self.clock.now();
        let stored = shard.table.read(|table| {
            let (_, state) = table.map.find(hash, |(k, _)| k.borrow() == key)?;
            Some(self.count(shard, self.algo.decide(state, now, n, commit), state, now, n, commit))
        });
        match stored {
            Some(answer) => answer,
            None => self.decide_new(key, hash, now, n, commit),
        }
    }

    /// [`Inner::decide`] for a key that was not stored a moment ago: the write path (kept out of
    /// line so that the read path stays small).
    #[inline(never)]
    fn decide_new<Q>(
        &self,
        key: &Q,
        hash: u64,
        now: u64,
        n: u64,
        commit: bool,
    ) -> Result<(Snapshot, u64, bool), Rejected>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let shard = self.shard(hash);
        let count = |outcome, state: &A::State| self.count(shard, outcome, state, now, n, commit);
        let rejected = |meta: Snapshot, reason| {
            shard.counts.rejected();
            Err(Rejected::of(meta, n, reason))
        };
        let fresh = self.algo.new_state(now);
        if n == 0 || n > self.algo.capacity() {
            // Nothing to take: answer from a fresh state without storing the key.
            return count(self.algo.decide(&fresh, now, n, false), &fresh);
        }
        if let Some(answer) = self.at_limit_read(key, hash, &fresh, now, n, commit) {
            return answer;
        }
        if !commit {
            // A check: what a fresh state would answer, storing nothing.
            return count(self.algo.decide(&fresh, now, n, false), &fresh);
        }
        let owned = key.to_owned();
        let weight = self.weight(&owned);
        let mut guard = shard.table.write();
        let t = &mut *guard;
        if let Some((_, state)) = t.map.find(hash, |(k, _)| k.borrow() == key) {
            return count(self.algo.decide(state, now, n, commit), state);
        }
        // Idle keys of the groups nearest to idle make room (a bounded look, see `Keyed`).
        let exact = self.at_limit != AtKeyLimit::AdmitUnstored;
        let earliest = self.sweep(t, now, (!self.fits(t, weight) && exact).then_some(weight));
        if !self.fits(t, weight) {
            // A key heavier than the shard's whole share never fits, whatever goes idle.
            let never = weight > self.max_bytes_per_shard;
            match self.at_limit {
                AtKeyLimit::AdmitUnstored => {
                    shard.unstored.fetch_add(1, Ordering::Relaxed);
                    return count(self.algo.decide(&fresh, now, n, commit), &fresh)
                        .map(|(meta, now, _)| (meta, now, false));
                }
                // A key holding permits is never evicted: its leases would release into
                // whichever key is stored under its name next.
                AtKeyLimit::EvictNearestIdle if self.by_release || never => {
                    shard.rejected.fetch_add(1, Ordering::Relaxed);
                    return rejected(key_limit(self.algo.capacity(), None), Reason::KeyLimit);
                }
                AtKeyLimit::Reject => {
                    shard.rejected.fetch_add(1, Ordering::Relaxed);
                    let retry = (earliest != u64::MAX && !never).then(|| earliest - now);
                    return rejected(key_limit(self.algo.capacity(), retry), Reason::KeyLimit);
                }
                AtKeyLimit::EvictNearestIdle => {
                    // The sweep left the key nearest to idle first in the queue (or, when it ran
                    // out of looks, the first of the last group it looked at); a heavy new key
                    // evicts the next ones as the bounds order them.
                    for _ in 0..SWEEP {
                        let Some((at, bucket)) = t.queue.first() else { break };
                        let Ok(entry) = t.map.get_bucket_entry(bucket) else { break };
                        if self.algo.idle_at(&entry.get().1, now) != at {
                            // Not the key queued (only if the sweep found no key by time).
                            self.look(t, t.queue.group, now);
                            continue;
                        }
                        self.remove(&mut t.bytes, entry);
                        t.evicted += 1;
                        // The group's bound moves to its next key's time, not left at the evicted
                        // one's (a group emptied by evictions would keep a bound that sends sweeps
                        // to look at nothing).
                        let next = t.queue.pop();
                        t.bounds.set(t.queue.group, next);
                        if self.fits(t, weight) {
                            break;
                        }
                        self.sweep(t, now, Some(weight));
                    }
                    if !self.fits(t, weight) {
                        // Only for a key that needs more than SWEEP evictions: the caps hold regardless.
                        shard.rejected.fetch_add(1, Ordering::Relaxed);
                        return rejected(key_limit(self.algo.capacity(), None), Reason::KeyLimit);
                    }
                }
            }
        }
        let outcome = self.algo.decide(&fresh, now, n, commit);
        let admitted = count(outcome, &fresh);
        if admitted.is_ok() {
            self.insert(t, hash, owned, weight, fresh, now);
        }
        admitted
    }

    /// Stores a key that fits, with its state, and lowers its group's bound to its idle time.
    fn insert(&self, t: &mut Table<K, A::State>, hash: u64, key: K, weight: usize, state: A::State, now: u64) {
        let at = self.algo.idle_at(&state, now);
        let moves = t.map.len() == t.map.capacity();
        if moves {
            self.clear_deleted(t);
        }
        let bucket = t.map.insert_unique(hash, (key, state), |(k, _)| self.hasher.hash_one(k)).bucket_index();
        t.bytes += weight;
        if moves {
            // The table was rebuilt, grew or was rehashed in place: its keys moved.
            self.rebound(t, now);
        } else {
            t.bounds.lower(bucket, at);
        }
    }

    /// Runs `f` on `key`'s state, or `None` when the key is not stored.
    pub(super) fn with_state<Q, T>(&self, key: &Q, f: impl FnOnce(&A::State, u64) -> T) -> Option<T>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let now = self.clock.now();
        self.shard(hash)
            .table
            .read(|table| table.map.find(hash, |(k, _)| k.borrow() == key).map(|(_, state)| f(state, now)))
    }

    /// Charges `n` permits to `key` past its limit ([`Algorithm::charge`]), storing the key if it
    /// is not (it went idle and was evicted since its reservation). `Err(None)`: at the key cap,
    /// with no idle key to make room; `Err(Some(why))`: the algorithm cannot carry a debt.
    pub(super) fn charge<Q>(&self, key: &Q, n: u64) -> Result<(), Option<&'static str>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(charged) = self.with_state(key, |state, now| self.algo.charge(state, now, n)) {
            return charged.map_err(Some);
        }
        let hash = self.hasher.hash_one(key);
        let now = self.clock.now();
        let owned = key.to_owned();
        let weight = self.weight(&owned);
        let mut guard = self.shard(hash).table.write();
        let t = &mut *guard;
        if let Some((_, state)) = t.map.find(hash, |(k, _)| k.borrow() == key) {
            return self.algo.charge(state, now, n).map_err(Some);
        }
        let fresh = self.algo.new_state(now);
        self.algo.charge(&fresh, now, n).map_err(Some)?;
        self.sweep(t, now, (!self.fits(t, weight)).then_some(weight));
        if !self.fits(t, weight) {
            return Err(None);
        }
        self.insert(t, hash, owned, weight, fresh, now);
        Ok(())
    }

    /// The answer at the cap under the read lock, when the shard is full and no key is idle
    /// without a doubt: a flood of new keys then never takes the write lock from the shard's
    /// stored keys. `None`: the write path decides (or, for a check, a fresh state answers).
    /// A check (`!commit`) on a new key at the cap with [`AtKeyLimit::Reject`] answers what a
    /// request would get; its retry time is the earliest bound, earlier than the exact time when
    /// that bound is stale (a check raises no bound).
    fn at_limit_read<Q>(
        &self,
        key: &Q,
        hash: u64,
        fresh: &A::State,
        now: u64,
        n: u64,
        commit: bool,
    ) -> Option<Result<(Snapshot, u64, bool), Rejected>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.by_release || self.at_limit == AtKeyLimit::EvictNearestIdle {
            return None;
        }
        let shard = self.shard(hash);
        shard.table.read(|t| {
            // Full by bytes only when none are left: a lighter key may still fit (the write path
            // weighs it).
            if t.map.len() < self.max_per_shard && t.bytes < self.max_bytes_per_shard {
                return None;
            }
            if let Some((_, state)) = t.map.find(hash, |(k, _)| k.borrow() == key) {
                return Some(self.count(shard, self.algo.decide(state, now, n, commit), state, now, n, commit));
            }
            // Bounds are lower bounds: no key idle yet if the earliest is later than now.
            let at = t.bounds.earliest();
            if at <= now || at == u64::MAX {
                return None;
            }
            if self.at_limit == AtKeyLimit::AdmitUnstored {
                if commit {
                    shard.unstored.fetch_add(1, Ordering::Relaxed);
                }
                let answer = self.count(shard, self.algo.decide(fresh, now, n, commit), fresh, now, n, commit);
                return Some(answer.map(|(meta, now, _)| (meta, now, false)));
            }
            // Reject, when the queue's first key is current (else the write path looks).
            if commit {
                if !self.first_is_current(t, at, now) {
                    return None;
                }
                shard.rejected.fetch_add(1, Ordering::Relaxed);
            }
            shard.counts.rejected();
            let meta = key_limit(self.algo.capacity(), Some(at - now));
            Some(Err(Rejected::of(meta, n, Reason::KeyLimit)))
        })
    }

    /// [`Keyed::evict_idle`](super::Keyed::evict_idle).
    pub(super) fn evict_idle(&self) -> usize {
        let now = self.clock.now();
        self.shards
            .iter()
            .map(|shard| {
                let mut guard = shard.table.write();
                let t = &mut *guard;
                let before = t.map.len();
                let bytes = &mut t.bytes;
                t.map.retain(|(k, s)| {
                    let idle = self.algo.is_idle(s, now);
                    if idle {
                        *bytes -= self.weight(k);
                    }
                    !idle
                });
                t.map.shrink_to_fit(|(k, _)| self.hasher.hash_one(k));
                self.rebound(t, now);
                before - t.map.len()
            })
            .sum()
    }

    /// [`Keyed::reset`](super::Keyed::reset).
    pub(super) fn reset<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let now = self.clock.now();
        let mut guard = self.shard(hash).table.write();
        let t = &mut *guard;
        let Ok(entry) = t.map.find_entry(hash, |(k, _)| k.borrow() == key) else { return false };
        let idle = self.algo.is_idle(&entry.get().1, now);
        if self.by_release && !idle {
            return false;
        }
        self.remove(&mut t.bytes, entry);
        !idle
    }

    /// [`Keyed::reset_matching`](super::Keyed::reset_matching).
    pub(super) fn reset_matching(&self, mut f: impl FnMut(&K) -> bool) -> usize {
        let now = self.clock.now();
        let mut reset = 0;
        for shard in self.shards.iter() {
            let mut guard = shard.table.write();
            let t = &mut *guard;
            let bytes = &mut t.bytes;
            // Removing keys leaves every bound still no later than its keys' idle times.
            t.map.retain(|(k, s)| {
                if !f(k) {
                    return true;
                }
                let idle = self.algo.is_idle(s, now);
                if self.by_release && !idle {
                    return true;
                }
                reset += usize::from(!idle);
                *bytes -= self.weight(k);
                false
            });
        }
        reset
    }

    /// [`Keyed::for_each`](super::Keyed::for_each).
    pub(super) fn for_each(&self, mut f: impl FnMut(&K, Meta)) {
        let now = self.clock.now();
        for shard in self.shards.iter() {
            shard.table.read_shared(|table| {
                for (key, state) in table.map.iter() {
                    if !self.algo.is_idle(state, now) {
                        f(key, peek(&self.algo, state, now, 0).meta());
                    }
                }
            });
        }
    }

    /// [`Keyed::len`](super::Keyed::len).
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.table.read(|t| t.map.len())).sum()
    }

    /// [`Keyed::set_config`](super::Keyed::set_config).
    pub(super) fn set_config(&self, config: A::Config) {
        let old = self.algo.set_config(config);
        let now = self.clock.now();
        for shard in self.shards.iter() {
            let mut guard = shard.table.write();
            guard.map.iter().for_each(|(_, s)| self.algo.carry_over(s, now, old));
            // Carrying over may move idle times earlier than the bounds.
            self.rebound(&mut guard, now);
        }
    }
}

/// The keys a hashbrown table of `buckets` buckets holds (its load factor: 7/8, or one slot free
/// below 8 buckets); checked against hashbrown in the tests below.
fn full_capacity(buckets: usize) -> usize {
    if buckets < 8 { buckets.saturating_sub(1) } else { buckets / 8 * 7 }
}

/// What a new key rejected at the cap is told: nothing left for it now, and room (a fresh state)
/// in `retry_ns`, which is also when this answer resets; `None`: not by time.
fn key_limit(limit: u64, retry_ns: Option<u64>) -> Snapshot {
    Meta { limit, remaining: 0, reset_ns: retry_ns.unwrap_or(0), retry_ns }.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard is picked from bits its table reads for nothing: neither the 7-bit tag hashbrown
    /// matches before comparing keys (the top 7) nor a slot (the low 32). Over fixed pseudo-random
    /// hashes (splitmix64), flipping either leaves the shard as it was, and every shard is used.
    #[test]
    fn sharding_reads_neither_the_tag_nor_the_slot_bits() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let z = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        for shards in [1u64, 2, 64, 1024] {
            let mut used = vec![false; shards as usize];
            for _ in 0..20_000 {
                let hash = next();
                let shard = shard_index(hash, shards - 1);
                assert_eq!(shard, shard_index(hash ^ (0x7f << 57), shards - 1), "{shards} shards: the tag bits");
                assert_eq!(shard, shard_index(hash ^ 0xFFFF_FFFF, shards - 1), "{shards} shards: the slot bits");
                used[shard] = true;
            }
            assert!(used.iter().all(|&u| u), "{shards} shards: some never used");
        }
    }

    #[test]
    fn full_capacity_is_what_a_hashbrown_table_holds_before_it_grows() {
        for buckets in (0..=16).map(|b| 1usize << b) {
            let full = full_capacity(buckets);
            let mut t: HashTable<u64> = HashTable::with_capacity(full.max(1));
            assert_eq!((t.num_buckets(), t.capacity()), (buckets.max(4), full_capacity(buckets.max(4))), "{buckets}");
            if buckets >= 4 {
                for k in 0..full as u64 {
                    t.insert_unique(k, k, |&k| k);
                }
                t.insert_unique(u64::MAX, u64::MAX, |&k| k);
                assert_eq!(t.num_buckets(), 2 * buckets, "{buckets}: one past its capacity grows it");
            }
        }
    }
}
