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

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use hashbrown::HashTable;

use crate::algorithm::{Algorithm, peek};
use crate::biased_lock::BiasedLock;
use crate::clock::{Clock, SystemClock, nanos};
use crate::decision::{Lease, PermitPool, Reason, Rejected};
use crate::expiry::{Expiry, Record};
use crate::quota::Quota;
use crate::snapshot::{Meta, Snapshot};
use crate::stats::Counts;
use crate::sync::{AtomicU64, Ordering};

/// One limiter state per key.
///
/// # Work per decision
///
/// A decision on a stored key takes its shard's read lock and looks at that one key. A decision
/// that inserts a key (below the cap, or at it) takes the shard's write lock and looks at no more
/// than [`SWEEP`] other keys besides its own: each shard keeps its keys in an expiry heap ordered
/// by the time each goes idle ([`crate::Algorithm::idle_at`]), so the keys nearest to idle are
/// found at its top, removed if idle, and re-filed if they took permits since they were filed.
/// At the cap, [`AtKeyLimit::Reject`] and [`AtKeyLimit::AdmitUnstored`] answer a new key under
/// the read lock when the heap shows no idle key. Nothing scans a shard inside a request. What is
/// not bounded per decision is the hash table's and the heap's own growth (each doubles, copying
/// its entries, at most `log2(max_keys / shards)` times per shard on the way up to the cap), the
/// table's occasional in-place clean-up of deleted slots after many removals (amortized over
/// them), [`Keyed::evict_idle`], [`Keyed::set_config`] and [`Keyed::reset_matching`], explicit
/// passes over every key, and [`Keyed::reset`], a search of one shard's expiry heap.
///
/// The heap costs 16 bytes per stored key (in a vector that doubles) on top of the key, its
/// state and the table's overhead. A shard at its cap keeps its memory however many keys come
/// and go (evicted, or idle and replaced): the clean-up of deleted slots rebuilds its table at
/// the same size instead of letting it double, unless the shard's cap leaves less than 1/32 of
/// the table's room free, where the table doubles once (see `max_keys`).
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

/// What one stored key weighs against [`KeyedBuilder::max_key_bytes`].
type Weigh<K> = fn(&K) -> usize;

/// Keys a decision that inserts a key looks at, besides its own, at most: the bound on work under
/// a shard's write lock.
pub const SWEEP: usize = 8;

/// What a [`Keyed`] limiter does with a new key when its shard holds `max_keys / shards` keys and
/// none of them is idle.
///
/// Keys are sharded, so "the cap" is reached shard by shard: a new key is compared with the keys
/// of its own shard only.
///
/// ```
/// use std::num::NonZeroUsize;
/// use std::time::Duration;
/// use tollgate::{AtKeyLimit, Keyed, ManualClock, Quota, Reason, TokenBucket};
///
/// let clock = ManualClock::new();
/// let per_ip: Keyed<u64, _, _> = Keyed::builder(TokenBucket::new(Quota::per_minute(10)?))
///     .clock(clock.clone())
///     .shards(NonZeroUsize::MIN)
///     .max_keys(NonZeroUsize::new(2).unwrap())
///     .at_key_limit(AtKeyLimit::Reject) // the default
///     .build();
/// per_ip.try_acquire(&1, 1).unwrap();
/// clock.advance(Duration::from_secs(1));
/// per_ip.try_acquire(&2, 1).unwrap();
/// // Key 1 is idle again 6 s after its permit (10 per minute): a new key is told so.
/// let no = per_ip.try_acquire(&3, 1).unwrap_err();
/// assert_eq!((no.reason(), no.retry_after()), (Reason::KeyLimit, Some(Duration::from_secs(5))));
/// clock.advance(Duration::from_secs(5));
/// assert!(per_ip.try_acquire(&3, 1).is_ok());
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AtKeyLimit {
    /// Reject the new key with [`Reason::KeyLimit`], telling it when a stored key of its shard
    /// goes idle (`retry_after`; `None` only when no key goes idle by time, as with
    /// [`crate::Concurrency`], where only a release makes room). The default: under a flood of
    /// new keys (rotating source addresses) every stored key keeps its limit and nobody is
    /// admitted uncounted, so the flood can deny service to new keys only, never buy permits;
    /// the other two policies trade that for availability.
    ///
    /// The retry time is exact (a retry then finds room if no other new key took it first,
    /// one tick earlier does not) unless more than [`SWEEP`] of the shard's keys nearest to idle
    /// took permits since the shard last looked at them; it is then the idle time of a key that
    /// was looked at, which is later than the exact time, never earlier.
    #[default]
    Reject,
    /// Evict the stored key closest to idle (as [`AtKeyLimit::Reject`] finds it) and store the
    /// new key. This over-admits: if the evicted key comes back, it starts from a fresh state,
    /// so it is granted again what it had spent and not yet earned back: at most its burst (its
    /// `limit` for windows) per eviction. Choose it when new keys must never be turned away and
    /// that excess is acceptable.
    ///
    /// Keys of an algorithm whose permits are held ([`crate::Concurrency`]) are never evicted
    /// while they hold permits (their leases would release into the next key of that name):
    /// there, a new key at the cap is rejected as with [`AtKeyLimit::Reject`].
    EvictNearestIdle,
    /// Decide the new key on a fresh state and do not store it (fail open): it gets up to its
    /// burst on every request while the shard is full, so the limit does not hold for new keys.
    /// Choose it only when the limit protects nothing that matters more than availability.
    AdmitUnstored,
}

impl AtKeyLimit {
    /// Reads `reject`, `evict` (or `evict-nearest-idle`) or `admit` (or `admit-unstored`), the
    /// names the server's `--at-max-counters` and the Python bindings use.
    ///
    /// ```
    /// use tollgate::AtKeyLimit;
    /// assert_eq!(AtKeyLimit::from_name("evict"), Some(AtKeyLimit::EvictNearestIdle));
    /// assert_eq!(AtKeyLimit::EvictNearestIdle.name(), "evict");
    /// assert_eq!(AtKeyLimit::from_name("drop"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<AtKeyLimit> {
        match name {
            "reject" => Some(AtKeyLimit::Reject),
            "evict" | "evict-nearest-idle" => Some(AtKeyLimit::EvictNearestIdle),
            "admit" | "admit-unstored" => Some(AtKeyLimit::AdmitUnstored),
            _ => None,
        }
    }

    /// The short name [`AtKeyLimit::from_name`] reads.
    pub fn name(self) -> &'static str {
        match self {
            AtKeyLimit::Reject => "reject",
            AtKeyLimit::EvictNearestIdle => "evict",
            AtKeyLimit::AdmitUnstored => "admit",
        }
    }
}

struct Inner<K, A: Algorithm, C: Clock> {
    algo: A,
    clock: C,
    hasher: hashbrown::DefaultHashBuilder,
    shards: Box<[Shard<K, A::State>]>,
    shift: u32,
    max_per_shard: usize,
    /// Each shard's share of `max_key_bytes` (`usize::MAX` without one), and the key's weight.
    max_bytes_per_shard: usize,
    weigh: Option<Weigh<K>>,
    at_limit: AtKeyLimit,
    /// Only a release makes a key idle: keys are filed under a counter, not a time.
    by_release: bool,
}

/// The fewest keys a shard holds when the shard count is left to the builder.
const MIN_KEYS_PER_SHARD: usize = 1024;

#[repr(align(128))]
struct Shard<K, S> {
    table: BiasedLock<Table<K, S>>,
    counts: Counts,
    /// New keys rejected at the cap, and decided without being stored (also under the read lock).
    rejected: AtomicU64,
    unstored: AtomicU64,
}

/// A shard's keys, their expiry heap and what happened to them (written under the write lock).
struct Table<K, S> {
    map: HashTable<(K, S)>,
    /// What the stored keys weigh (0 without `max_key_bytes`).
    bytes: usize,
    expiry: Expiry,
    swept: u64,
    evicted: u64,
}

/// Counters of a [`Keyed`] limiter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyedStatistics {
    /// Keys currently stored.
    pub keys: usize,
    /// What the stored keys weigh, by the function given to [`KeyedBuilder::max_key_bytes`]
    /// (0 without one).
    pub key_bytes: usize,
    /// Requests admitted so far (probes excluded); `None` unless built with
    /// [`KeyedBuilder::statistics`].
    pub admitted: Option<u64>,
    /// Requests rejected so far; `None` unless built with [`KeyedBuilder::statistics`].
    pub rejected: Option<u64>,
    /// Idle keys removed to make room or keep memory down (always counted; not those removed by
    /// [`Keyed::evict_idle`]).
    pub swept_idle: u64,
    /// Keys that were not idle, evicted at the cap for a new key ([`AtKeyLimit::EvictNearestIdle`]).
    pub evicted_at_limit: u64,
    /// New keys rejected at the cap ([`AtKeyLimit::Reject`]).
    pub rejected_at_limit: u64,
    /// New keys decided without being stored at the cap ([`AtKeyLimit::AdmitUnstored`]).
    pub unstored_at_limit: u64,
}

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
    pub fn build(mut self) -> Keyed<K, A, C> {
        if !self.shards_chosen {
            // At least MIN_KEYS_PER_SHARD per shard: with 64 shards of one key each, a cap of 64
            // turned new keys away from about the tenth.
            let fit = (self.max_keys / MIN_KEYS_PER_SHARD).max(1);
            self.shards = self.shards.min(1 << fit.ilog2());
        }
        let shards: Box<[_]> = (0..self.shards)
            .map(|_| Shard {
                table: BiasedLock::new(Table {
                    map: HashTable::new(),
                    bytes: 0,
                    expiry: Expiry::default(),
                    swept: 0,
                    evicted: 0,
                }),
                counts: Counts::new(self.statistics),
                rejected: AtomicU64::new(0),
                unstored: AtomicU64::new(0),
            })
            .collect();
        let bits = self.shards.trailing_zeros();
        let by_release = self.algo.releases_on_drop();
        Keyed {
            inner: Arc::new(Inner {
                algo: self.algo,
                clock: self.clock,
                hasher: hashbrown::DefaultHashBuilder::default(),
                max_per_shard: self.max_keys.div_ceil(self.shards),
                max_bytes_per_shard: self.max_key_bytes.map_or(usize::MAX, |(max, _)| max.div_ceil(self.shards)),
                weigh: self.max_key_bytes.map(|(_, weigh)| weigh),
                // Shard from the top bits; the table uses the low bits, so the two stay independent.
                shift: 64 - bits,
                shards,
                at_limit: self.at_limit,
                by_release,
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
            max_key_bytes: None,
            shards: 64,
            shards_chosen: false,
            statistics: false,
            at_limit: AtKeyLimit::Reject,
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

    /// What `key` weighs against `max_key_bytes` (0 without it).
    fn weight(&self, key: &K) -> usize {
        self.weigh.map_or(0, |weigh| weigh(key))
    }

    /// True when a key weighing `weight` can be stored in `t` now.
    fn fits(&self, t: &Table<K, A::State>, weight: usize) -> bool {
        t.map.len() < self.max_per_shard && t.bytes.saturating_add(weight) <= self.max_bytes_per_shard
    }

    /// Removes a stored key's entry and its weight (not its expiry record).
    fn remove(&self, bytes: &mut usize, entry: hashbrown::hash_table::OccupiedEntry<'_, (K, A::State)>) {
        let ((key, _), _) = entry.remove();
        *bytes -= self.weight(&key);
    }

    fn give_back<Q>(&self, key: &Q, n: u64, acquired_at: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        self.shard(hash).table.read(|table| {
            if let Some((_, state)) = table.map.find(hash, |(k, _)| k.borrow() == key) {
                self.algo.give_back(state, self.clock.now(), n, acquired_at);
            }
        })
    }

    /// Counts a decision on `state` and turns it into the limiter's answer. Every algorithm
    /// rejects more than its capacity (the decision's `limit`), so "never" is told from "not now"
    /// on the rejection path only; "never" reports the state as a probe.
    #[inline]
    fn count(
        &self,
        shard: &Shard<K, A::State>,
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

    /// Where `state` is filed in the expiry heap.
    fn file_at(&self, expiry: &mut Expiry, state: &A::State, now: u64) -> u64 {
        if self.by_release { expiry.stamp() } else { self.algo.idle_at(state, now) }
    }

    /// Looks at the top of the shard's expiry heap, at most [`SWEEP`] keys: removes those idle at
    /// `now` and re-files those whose record went stale. Stops early at a record later than `now`
    /// unless `exact`, in which case it goes on until the top record is checked current. Returns
    /// the earliest time a stored key goes idle as far as it found out (exact when it stopped on
    /// a current top record; see [`AtKeyLimit::Reject`]), `u64::MAX` when no key goes idle by time.
    fn sweep(&self, t: &mut Table<K, A::State>, now: u64, exact: bool) -> u64 {
        let mut earliest = u64::MAX;
        for _ in 0..SWEEP {
            let Some(Record { at, hash }) = t.expiry.top() else { return u64::MAX };
            if at > now && !exact && !self.by_release {
                return at;
            }
            // Every record names a stored key with its hash (see `expiry`). The table matches
            // only 7 bits of the hash before asking `eq`, so `eq` compares the whole hash.
            let Ok(entry) = t.map.find_entry(hash, |(k, _)| self.hasher.hash_one(k) == hash) else {
                t.expiry.pop();
                continue;
            };
            let idle_at = self.algo.idle_at(&entry.get().1, now);
            if idle_at <= now {
                self.remove(&mut t.bytes, entry);
                t.expiry.pop();
                t.swept += 1;
                if !exact {
                    // Go on: idle keys removed now are memory given back.
                    continue;
                }
                return now;
            }
            if self.by_release {
                let stamp = t.expiry.stamp();
                t.expiry.set_top(stamp);
                continue;
            }
            if idle_at == at {
                // Current, and every other record is a lower bound of its key's idle time.
                return at;
            }
            earliest = earliest.min(idle_at);
            t.expiry.set_top(idle_at);
        }
        earliest
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

    /// Files every key of the shard again, from its state now.
    fn refile(&self, t: &mut Table<K, A::State>, now: u64) {
        let Table { map, expiry, .. } = t;
        let mut records = Vec::with_capacity(map.len());
        for (k, s) in map.iter() {
            records.push(Record { at: self.file_at(expiry, s, now), hash: self.hasher.hash_one(k) });
        }
        expiry.rebuild(records.into_iter());
    }
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
        self.decide(key, n, true).map(|(meta, now, stored)| self.lease(key, meta, n, now, stored))
    }

    /// Would `n` permits for `key` be granted now? Takes nothing, stores nothing.
    pub fn check<Q>(&self, key: &Q, n: u64) -> Result<Meta, Rejected>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.decide(key, n, false).map(|(meta, ..)| meta.meta())
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
    fn lease<Q>(&self, key: &Q, meta: Snapshot, n: u64, now: u64, stored: bool) -> Lease
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // An unstored key's permits go nowhere: the key stored later under that name never took them.
        let pool = (n > 0 && self.inner.algo.releases_on_drop() && stored)
            .then(|| Arc::new(KeyRelease { inner: self.inner.clone(), key: key.to_owned() }) as Arc<dyn PermitPool>);
        Lease::held_by(meta, n, now, pool)
    }

    /// The decision, the time it was made at, and whether the key is stored (false only for
    /// [`AtKeyLimit::AdmitUnstored`] at the cap).
    #[inline]
    fn decide<Q>(&self, key: &Q, n: u64, commit: bool) -> Result<(Snapshot, u64, bool), Rejected>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let shard = inner.shard(hash);
        let now = inner.clock.now();
        let stored = shard.table.read(|table| {
            let (_, state) = table.map.find(hash, |(k, _)| k.borrow() == key)?;
            Some(inner.count(shard, inner.algo.decide(state, now, n, commit), state, now, n, commit))
        });
        match stored {
            Some(answer) => answer,
            None => self.decide_new(key, hash, now, n, commit),
        }
    }

    /// [`Keyed::decide`] for a key that was not stored a moment ago: the write path (kept out of
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
        let inner = &*self.inner;
        let shard = inner.shard(hash);
        let count = |outcome, state: &A::State| inner.count(shard, outcome, state, now, n, commit);
        let rejected = |meta: Snapshot, reason| {
            shard.counts.rejected();
            Err(Rejected::of(meta, n, reason))
        };
        let fresh = inner.algo.new_state(now);
        if n == 0 || n > inner.algo.capacity() {
            // Nothing to take: answer from a fresh state without storing the key.
            return count(inner.algo.decide(&fresh, now, n, false), &fresh);
        }
        if let Some(answer) = self.at_limit_read(key, hash, &fresh, now, n, commit) {
            return answer;
        }
        if !commit {
            // A check: what a fresh state would answer, storing nothing.
            return count(inner.algo.decide(&fresh, now, n, false), &fresh);
        }
        let owned = key.to_owned();
        let weight = inner.weight(&owned);
        let mut guard = shard.table.write();
        let t = &mut *guard;
        if let Some((_, state)) = t.map.find(hash, |(k, _)| k.borrow() == key) {
            return count(inner.algo.decide(state, now, n, commit), state);
        }
        // Idle keys at the top of the expiry heap make room (a bounded look, see the module docs);
        // a heavy key may need the room of several.
        let exact = inner.at_limit != AtKeyLimit::AdmitUnstored;
        let mut earliest = inner.sweep(t, now, !inner.fits(t, weight) && exact);
        for _ in 1..SWEEP {
            if inner.fits(t, weight) || earliest != now {
                break;
            }
            earliest = inner.sweep(t, now, exact);
        }
        if !inner.fits(t, weight) {
            // A key heavier than the shard's whole share never fits, whatever goes idle.
            let never = weight > inner.max_bytes_per_shard;
            match inner.at_limit {
                AtKeyLimit::AdmitUnstored => {
                    shard.unstored.fetch_add(1, Ordering::Relaxed);
                    return count(inner.algo.decide(&fresh, now, n, commit), &fresh)
                        .map(|(meta, now, _)| (meta, now, false));
                }
                // A key holding permits is never evicted: its leases would release into
                // whichever key is stored under its name next.
                AtKeyLimit::EvictNearestIdle if inner.by_release || never => {
                    shard.rejected.fetch_add(1, Ordering::Relaxed);
                    return rejected(key_limit(inner.algo.capacity(), None), Reason::KeyLimit);
                }
                AtKeyLimit::Reject => {
                    shard.rejected.fetch_add(1, Ordering::Relaxed);
                    let retry = (earliest != u64::MAX && !never).then(|| earliest - now);
                    return rejected(key_limit(inner.algo.capacity(), retry), Reason::KeyLimit);
                }
                AtKeyLimit::EvictNearestIdle => {
                    // The sweep left the key nearest to idle on top, its record checked; a heavy
                    // new key evicts the next ones as their records order them.
                    for _ in 0..SWEEP {
                        let Some(Record { hash, .. }) = t.expiry.top() else { break };
                        if let Ok(entry) = t.map.find_entry(hash, |(k, _)| inner.hasher.hash_one(k) == hash) {
                            inner.remove(&mut t.bytes, entry);
                            t.evicted += 1;
                        }
                        t.expiry.pop();
                        if inner.fits(t, weight) {
                            break;
                        }
                    }
                    if !inner.fits(t, weight) {
                        // Only for a key that needs more than SWEEP evictions: the caps hold regardless.
                        shard.rejected.fetch_add(1, Ordering::Relaxed);
                        return rejected(key_limit(inner.algo.capacity(), None), Reason::KeyLimit);
                    }
                }
            }
        }
        let outcome = inner.algo.decide(&fresh, now, n, commit);
        let admitted = count(outcome, &fresh);
        if admitted.is_ok() {
            let at = inner.file_at(&mut t.expiry, &fresh, now);
            if t.map.len() == t.map.capacity() {
                inner.clear_deleted(t);
            }
            t.map.insert_unique(hash, (owned, fresh), |(k, _)| inner.hasher.hash_one(k));
            t.bytes += weight;
            t.expiry.push(at, hash);
            debug_assert_eq!(t.expiry.len(), t.map.len(), "one record per stored key");
        }
        admitted
    }

    /// The answer at the cap under the read lock, when the shard is full and no key is idle
    /// without a doubt: a flood of new keys then never takes the write lock from the shard's
    /// stored keys. `None`: the write path decides (or, for a check, a fresh state answers).
    /// A check (`!commit`) on a new key at the cap with [`AtKeyLimit::Reject`] answers what a
    /// request would get; its retry time is the top record's, a lower bound when that record is
    /// stale (a check does not re-file).
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
        let inner = &*self.inner;
        if inner.by_release || inner.at_limit == AtKeyLimit::EvictNearestIdle {
            return None;
        }
        let shard = inner.shard(hash);
        shard.table.read(|t| {
            // Full by bytes only when none are left: a lighter key may still fit (the write path
            // weighs it).
            if t.map.len() < inner.max_per_shard && t.bytes < inner.max_bytes_per_shard {
                return None;
            }
            if let Some((_, state)) = t.map.find(hash, |(k, _)| k.borrow() == key) {
                return Some(inner.count(shard, inner.algo.decide(state, now, n, commit), state, now, n, commit));
            }
            // Records are lower bounds: none idle yet if the top's is later than now.
            let Record { at, hash: top } = t.expiry.top()?;
            if at <= now {
                return None;
            }
            if inner.at_limit == AtKeyLimit::AdmitUnstored {
                if commit {
                    shard.unstored.fetch_add(1, Ordering::Relaxed);
                }
                let answer = inner.count(shard, inner.algo.decide(fresh, now, n, commit), fresh, now, n, commit);
                return Some(answer.map(|(meta, now, _)| (meta, now, false)));
            }
            // Reject, when the top's record is current (else the write path re-files it).
            if commit {
                let (_, state) = t.map.find(top, |(k, _)| inner.hasher.hash_one(k) == top)?;
                if inner.algo.idle_at(state, now) != at {
                    return None;
                }
                shard.rejected.fetch_add(1, Ordering::Relaxed);
            }
            shard.counts.rejected();
            let meta = key_limit(inner.algo.capacity(), Some(at - now));
            Some(Err(Rejected::of(meta, n, Reason::KeyLimit)))
        })
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

    /// Removes every idle key now and gives back the memory it can; returns how many were
    /// removed. A pass over every key, holding each shard's write lock in turn: for a quiet
    /// moment (a timer), not for the request path, where idle keys are removed a few at a time.
    pub fn evict_idle(&self) -> usize {
        let inner = &*self.inner;
        let now = inner.clock.now();
        inner
            .shards
            .iter()
            .map(|shard| {
                let mut guard = shard.table.write();
                let t = &mut *guard;
                let before = t.map.len();
                let bytes = &mut t.bytes;
                t.map.retain(|(k, s)| {
                    let idle = inner.algo.is_idle(s, now);
                    if idle {
                        *bytes -= inner.weight(k);
                    }
                    !idle
                });
                t.map.shrink_to_fit(|(k, _)| inner.hasher.hash_one(k));
                inner.refile(t, now);
                before - t.map.len()
            })
            .sum()
    }

    /// Forgets what `key` has used: its state is removed, so its next decision starts from a
    /// fresh state (full), as for a key never seen. Returns true when that changed something:
    /// the key was stored and not idle (a key [`Keyed::for_each`] shows).
    ///
    /// Takes the key's shard's write lock, and removes the key's record from the shard's expiry
    /// heap by a search of that heap: work in proportion to the keys of the shard (about 16
    /// bytes read per key), for an operator's reset rather than the request path. To reset many
    /// keys, [`Keyed::reset_matching`] does one pass per shard instead of one per key.
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
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let now = inner.clock.now();
        let mut guard = inner.shard(hash).table.write();
        let t = &mut *guard;
        let Ok(entry) = t.map.find_entry(hash, |(k, _)| k.borrow() == key) else { return false };
        let idle = inner.algo.is_idle(&entry.get().1, now);
        if inner.by_release && !idle {
            return false;
        }
        inner.remove(&mut t.bytes, entry);
        // One record per stored key: the key's own, or one of a key with the same hash (they
        // share their records, see `expiry`), which keeps the count right either way.
        let removed = t.expiry.remove(hash);
        debug_assert!(removed && t.expiry.len() == t.map.len(), "one record per stored key");
        !idle
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
    pub fn reset_matching(&self, mut f: impl FnMut(&K) -> bool) -> usize {
        let inner = &*self.inner;
        let now = inner.clock.now();
        let mut reset = 0;
        for shard in inner.shards.iter() {
            let mut guard = shard.table.write();
            let t = &mut *guard;
            let before = t.map.len();
            let bytes = &mut t.bytes;
            t.map.retain(|(k, s)| {
                if !f(k) {
                    return true;
                }
                let idle = inner.algo.is_idle(s, now);
                if inner.by_release && !idle {
                    return true;
                }
                reset += usize::from(!idle);
                *bytes -= inner.weight(k);
                false
            });
            if t.map.len() != before {
                inner.refile(t, now);
            }
        }
        reset
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
    pub fn for_each(&self, mut f: impl FnMut(&K, Meta)) {
        let inner = &*self.inner;
        let now = inner.clock.now();
        for shard in inner.shards.iter() {
            shard.table.read_shared(|table| {
                for (key, state) in table.map.iter() {
                    if !inner.algo.is_idle(state, now) {
                        f(key, peek(&inner.algo, state, now, 0).meta());
                    }
                }
            });
        }
    }

    /// Keys currently stored.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| s.table.read(|t| t.map.len())).sum()
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
        let mut stats = KeyedStatistics::default();
        for shard in self.inner.shards.iter() {
            let (keys, bytes, swept, evicted) = shard.table.read(|t| (t.map.len(), t.bytes, t.swept, t.evicted));
            stats.keys += keys;
            stats.key_bytes += bytes;
            stats.swept_idle += swept;
            stats.evicted_at_limit += evicted;
            stats.rejected_at_limit += shard.rejected.load(Ordering::Relaxed);
            stats.unstored_at_limit += shard.unstored.load(Ordering::Relaxed);
            let (admitted, rejected) = shard.counts.read();
            stats.admitted = admitted.map(|a| a + stats.admitted.unwrap_or(0));
            stats.rejected = rejected.map(|r| r + stats.rejected.unwrap_or(0));
        }
        stats
    }

    /// Replaces the configuration for every key; each key's state carries over by the
    /// algorithm's rule. A pass over every key that re-files each in its shard's expiry heap
    /// (the new configuration may move idle times either way), holding each shard's write lock
    /// in turn.
    pub fn set_config(&self, config: A::Config) {
        let inner = &*self.inner;
        let old = inner.algo.set_config(config);
        let now = inner.clock.now();
        for shard in inner.shards.iter() {
            let mut guard = shard.table.write();
            guard.map.iter().for_each(|(_, s)| inner.algo.carry_over(s, now, old));
            inner.refile(&mut guard, now);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ManualClock, Reason, TokenBucket};

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
        clock.advance(Duration::from_secs(6));
        assert!(k.try_acquire(key('b', 50).as_str(), 1).is_ok(), "idle keys made room");
        assert_eq!((k.len(), k.statistics().key_bytes), (2, 90), "a, idle, made room; c stays");

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
    #[test]
    fn the_stored_weight_is_kept_exact() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
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
