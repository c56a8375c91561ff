//! Deciding: a request (namespace, descriptors, delta) against the loaded limits and their counters.
//!
//! Data flows one way: the policy says which counters a request touches ([`Policy::hits`]), the
//! engine decides on them, the protocol layers (`rls`, `http`) turn the [`Outcome`] into a response.

use std::sync::{Arc, RwLock};

use tollgate::{Clock, Meta, SystemClock};
use tollgate_policy::{AlgorithmKind, Descriptor, Enforcement, Limit, LimitId, Policy, Position};

use super::bounds::{Oversize, RequestBounds};
use super::counters::{CounterCap, Counters, counters};
use super::store::{Cached, Call, InRedis, Leased, Memory, RedisStore, Store};

/// Accuracy vs throughput, as seed 003 defines them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// All counters a request touches are checked and updated together, under locks on those
    /// counters only: no overshoot, no undershoot, whatever the concurrency.
    Accuracy,
    /// Each counter is updated on its own and a rejection gives back what it took: faster, but a
    /// concurrent request can see a counter that is briefly too high (overshoot, measured by
    /// `tollgate bench`).
    Throughput,
}

/// What a call asks for (Limitador's three HTTP endpoints; Envoy's RLS is `CheckAndReport`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Would `delta` hits be allowed? Counts nothing.
    Check,
    /// Count `delta` hits without deciding; a counter saturates at its limit.
    Report,
    /// Decide and, if allowed, count: all counters or none.
    CheckAndReport,
}

/// The limits in force and their counters; replaced as a whole by a reload.
pub struct Loaded {
    /// The limits.
    pub policy: Policy,
    /// Incremented by each successful load, from 1.
    pub generation: u64,
    /// Each limit's in-memory counters, in the policy's order; none at all when the counters
    /// live in Redis (an empty table costs ~16 KB per limit).
    pub(super) counters: Vec<Arc<dyn Counters>>,
}

/// One counter's part in a decision.
#[derive(Clone, Debug)]
pub struct Status {
    /// Index of the limit in the policy's limits (see [`Outcome::limit`]).
    pub limit: usize,
    /// The descriptor the counter is attributed to.
    pub descriptor: usize,
    /// The counter's state after the decision.
    pub meta: Meta,
    /// True when this counter (alone) did not have room for the request.
    pub limited: bool,
}

/// The result of one call.
pub struct Outcome {
    loaded: Arc<Loaded>,
    /// Every counter the request touched.
    pub statuses: Vec<Status>,
    /// The answer to give: false means "limited" (HTTP 429, RLS `OVER_LIMIT`).
    pub allowed: bool,
    /// True when an enforcing limit said no; differs from `!allowed` only in shadow mode
    /// (`--shadow`). Shadow and quota limits never set it: see [`Outcome::marked`].
    pub would_limit: bool,
}

impl Outcome {
    /// The limit a status is about.
    pub fn limit(&self, status: &Status) -> &Limit {
        &self.loaded.policy.limits()[status.limit]
    }

    /// The generation of the limits that decided.
    pub fn generation(&self) -> u64 {
        self.loaded.generation
    }

    /// True when the limits that decided have a limit in `namespace`.
    pub fn names_namespace(&self, namespace: &str) -> bool {
        !self.loaded.policy.namespace_indexes(namespace).is_empty()
    }

    /// The counters without room whose limit did not deny: shadow limits (and every limit under
    /// `--shadow`) and quota limits, with what each did instead.
    pub fn marked(&self) -> impl Iterator<Item = (&Status, Enforcement)> + '_ {
        self.statuses.iter().filter(|s| s.limited).filter_map(move |s| match self.limit(s).enforcement() {
            Enforcement::Enforce if self.allowed => Some((s, Enforcement::Shadow)),
            Enforcement::Enforce => None,
            other => Some((s, other)),
        })
    }

    /// The names (or ids, for unnamed limits) of the quota limits this call exceeded.
    pub fn quotas_exceeded(&self) -> Vec<String> {
        self.marked()
            .filter(|(_, e)| *e == Enforcement::Quota)
            .map(|(s, _)| {
                let limit = self.limit(s);
                limit.name().map_or_else(|| limit.id().to_string(), str::to_string)
            })
            .collect()
    }
}

/// True when a status without room belongs to a limit that denies.
fn denies(loaded: &Loaded, statuses: &[Status]) -> bool {
    statuses.iter().any(|s| s.limited && loaded.policy.limits()[s.limit].enforcement().denies())
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

/// One live counter, as `GET /counters/{namespace}` lists it.
#[derive(Clone, Debug)]
pub struct CounterView {
    /// Index of the limit in the policy's limits.
    pub limit: usize,
    /// The variables' values.
    pub values: Vec<String>,
    /// The counter's state now.
    pub meta: Meta,
}

/// The deciding core of the server, independent of protocols.
///
/// ```
/// use futures::executor::block_on;
/// use tollgate::ManualClock;
/// use tollgate_policy::{Descriptor, Policy};
/// use tollgate_server::serve::{Action, Engine, Mode};
///
/// let policy = Policy::parse("- {namespace: api, max_value: 1, seconds: 60}", "limits.yaml")?;
/// let engine = Engine::new(policy, Mode::Accuracy, false, ManualClock::new());
/// let values = [Descriptor::default()];
/// assert!(block_on(engine.call("api", &values, 1, Action::CheckAndReport)).unwrap().allowed);
/// assert!(!block_on(engine.call("api", &values, 1, Action::CheckAndReport)).unwrap().allowed);
/// assert!(block_on(engine.call("other", &values, 1, Action::CheckAndReport)).unwrap().allowed, "unknown namespaces are allowed");
/// # Ok::<(), tollgate_policy::PolicyError>(())
/// ```
pub struct Engine<C: Clock = SystemClock> {
    loaded: RwLock<Arc<Loaded>>,
    pub(super) clock: C,
    shadow: bool,
    /// Where the counters live: the one value that decides every call.
    pub(super) store: Box<dyn Store<C>>,
    cap: CounterCap,
    bounds: RequestBounds,
}

/// Why [`Engine::call`] decided nothing.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The request is over one of the [`RequestBounds`] (HTTP 400, gRPC `INVALID_ARGUMENT`).
    #[error(transparent)]
    Oversize(#[from] Oversize),
    /// The storage could not answer: Redis down or slow (HTTP 503, gRPC `UNAVAILABLE`).
    #[error("counter storage unavailable: {0}")]
    Storage(#[from] tollgate_redis::BackendError),
}

/// Where an engine keeps its counters, as `--storage` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StorageKind {
    /// In the engine's own counters (`memory`).
    Memory,
    /// In Redis, one round trip per call (`redis`).
    Redis,
    /// Decided in memory, flushed to Redis in batches (`redis-cached`).
    RedisCached,
    /// In Redis, spent from slices leased to this process (`redis-leased`).
    RedisLeased,
}

impl StorageKind {
    /// The name `--storage` takes.
    pub fn name(self) -> &'static str {
        match self {
            StorageKind::Memory => "memory",
            StorageKind::Redis => "redis",
            StorageKind::RedisCached => "redis-cached",
            StorageKind::RedisLeased => "redis-leased",
        }
    }
}

impl std::fmt::Display for StorageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A limit the engine's storage cannot count: which limit (position, namespace, name), which
/// algorithm it asks for, and which storage refused it. Counters in Redis are fixed windows only,
/// and `redis-cached` counts no calendar windows.
///
/// ```
/// use tollgate_policy::{AlgorithmKind, Position};
/// use tollgate_server::serve::{StorageError, StorageKind};
///
/// let err = StorageError {
///     source_name: "limits.yaml".into(),
///     position: Position::new(3, 3),
///     namespace: "api".into(),
///     name: Some("per-user".into()),
///     algorithm: AlgorithmKind::TokenBucket,
///     calendar: false,
///     storage: StorageKind::Redis,
/// };
/// assert_eq!(
///     err.to_string(),
///     "line 3: algorithm token_bucket is not available with --storage redis (fixed_window only): \
///      limit `per-user` of namespace `api`"
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct StorageError {
    /// The file the limit is in.
    pub source_name: String,
    /// Where the limit starts in its file.
    pub position: Position,
    /// The limit's namespace.
    pub namespace: String,
    /// The limit's name, if it has one.
    pub name: Option<String>,
    /// The algorithm the limit asks for.
    pub algorithm: AlgorithmKind,
    /// True when what the storage cannot count is the limit's calendar window, not its algorithm.
    pub calendar: bool,
    /// The storage that cannot count it.
    pub storage: StorageKind,
}

impl StorageError {
    /// The same message without the leading `line N: ` (for callers that print the position
    /// themselves, as `file:line:column: message`).
    pub fn message(&self) -> String {
        let limit = match &self.name {
            Some(name) => format!("limit `{name}` of namespace `{}`", self.namespace),
            None => format!("limit of namespace `{}`", self.namespace),
        };
        if self.calendar {
            return format!(
                "calendar windows are not available with --storage {} (windows opened by the first hit only): {limit}",
                self.storage
            );
        }
        format!(
            "algorithm {} is not available with --storage {} ({} only): {limit}",
            self.algorithm.name(),
            self.storage,
            AlgorithmKind::names_where(|s| s.redis_counters),
        )
    }
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.position.line, self.message())
    }
}

impl<C: Clock + Clone> Engine<C> {
    /// An engine deciding on `policy` (generation 1) with counters on `clock`.
    pub fn new(policy: Policy, mode: Mode, shadow: bool, clock: C) -> Engine<C> {
        let engine = Engine {
            loaded: RwLock::new(Arc::new(Loaded { policy, generation: 1, counters: Vec::new() })),
            clock,
            shadow,
            store: Box::new(Memory::new(mode)),
            cap: CounterCap::default(),
            bounds: RequestBounds::default(),
        };
        engine.renew_counters();
        engine
    }

    /// Bounds the in-memory counters of each limit (`--max-counters`, `--at-max-counters`;
    /// a limit's own `max_counters` and `at_max_counters` win). Call it before deciding: the
    /// counters of the loaded limits start again, empty.
    ///
    /// ```
    /// use futures::executor::block_on;
    /// use std::num::NonZeroUsize;
    /// use tollgate::{AtKeyLimit, ManualClock};
    /// use tollgate_policy::{Descriptor, Policy};
    /// use tollgate_server::serve::{Action, CounterCap, Engine, Mode};
    ///
    /// let policy = Policy::parse("- {namespace: api, max_value: 5, seconds: 60, variables: [ip]}", "limits.yaml")?;
    /// let cap = CounterCap { max: NonZeroUsize::new(64).unwrap(), at_max: AtKeyLimit::Reject, ..CounterCap::default() };
    /// let engine = Engine::new(policy, Mode::Accuracy, false, ManualClock::new()).with_counter_cap(cap);
    /// for ip in 0..1000 {
    ///     let _ = block_on(engine.call("api", &[Descriptor::from([("ip", ip.to_string().as_str())])], 1, Action::CheckAndReport)).unwrap();
    /// }
    /// let (_, tables) = engine.counter_tables();
    /// assert_eq!((tables[0].kept, tables[0].max), (64, 64));
    /// assert_eq!(tables[0].rejected_at_max, 1000 - 64);
    /// # Ok::<(), tollgate_policy::PolicyError>(())
    /// ```
    pub fn with_counter_cap(self, cap: CounterCap) -> Engine<C> {
        let engine = Engine { cap, ..self };
        engine.renew_counters();
        engine
    }

    /// Every limit's counters start again, empty (none when they live in Redis).
    fn renew_counters(&self) {
        let loaded = self.loaded();
        let counters = self.new_counters(loaded.policy.limits());
        let fresh = Loaded { policy: loaded.policy.clone(), generation: loaded.generation, counters };
        *self.loaded.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(fresh);
    }

    /// Empty in-memory counters for `limits`, or none when this engine's storage does not use them.
    fn new_counters(&self, limits: &[Limit]) -> Vec<Arc<dyn Counters>> {
        if self.storage() != StorageKind::Memory {
            return Vec::new();
        }
        limits.iter().map(|l| counters(l, &self.clock, self.cap)).collect()
    }

    /// Bounds the size of each request's descriptors (`--max-value-bytes` and the others): a
    /// call over them is refused with [`CallError::Oversize`], before anything is decided.
    ///
    /// ```
    /// use futures::executor::block_on;
    /// use tollgate::ManualClock;
    /// use tollgate_policy::{Descriptor, Policy};
    /// use tollgate_server::serve::{Action, CallError, Engine, Mode, RequestBounds};
    ///
    /// let policy = Policy::parse("- {namespace: api, max_value: 5, seconds: 60, variables: [user]}", "limits.yaml")?;
    /// let bounds = RequestBounds { max_value_bytes: 16, ..RequestBounds::default() };
    /// let engine = Engine::new(policy, Mode::Accuracy, false, ManualClock::new()).with_request_bounds(bounds);
    /// let long = [Descriptor::from([("user", "a-name-longer-than-16-bytes")])];
    /// let refused = block_on(engine.call("api", &long, 1, Action::CheckAndReport)).unwrap_err();
    /// assert!(matches!(refused, CallError::Oversize(_)), "{refused}");
    /// assert_eq!(engine.counter_tables().1[0].kept, 0, "nothing stored");
    /// # Ok::<(), tollgate_policy::PolicyError>(())
    /// ```
    #[must_use]
    pub fn with_request_bounds(self, bounds: RequestBounds) -> Engine<C> {
        Engine { bounds, ..self }
    }

    /// The bounds on each request's descriptors.
    pub fn request_bounds(&self) -> RequestBounds {
        self.bounds
    }

    /// Decides in memory and flushes counts to Redis in batches (call [`Engine::flush`]
    /// periodically): see `--storage redis-cached` for the overshoot this allows across replicas.
    /// The local copies weigh at most the counter cap's `max_bytes` in all (set by
    /// [`Engine::with_counter_cap`] before this); a call that would pass it is decided in Redis.
    /// Fails, naming the first such limit, if a limit cannot be counted there. Registers the
    /// store's `tollgate_redis_*` metrics as [`Engine::with_redis`] does (loads from Redis are its
    /// decisions' round trips; failed flushes count as errors).
    pub fn with_redis_cached(self, store: RedisStore) -> Result<Engine<C>, StorageError> {
        let max_bytes = self.cap.max_bytes.get();
        self.with_store(Box::new(Cached::new(store, max_bytes)))
    }

    fn with_store(mut self, store: Box<dyn Store<C>>) -> Result<Engine<C>, StorageError> {
        store.accepts(&self.loaded().policy)?;
        self.store = store;
        self.renew_counters();
        Ok(self)
    }

    /// Sends the hits allowed locally since the last flush (redis-cached only); returns the
    /// counters flushed.
    pub async fn flush(&self) -> Result<usize, tollgate_redis::BackendError> {
        self.store.flush(&self.clock).await
    }

    /// Keeps counters in Redis and spends them from slices leased to this process (see
    /// `--storage redis-leased`: replicas never admit more than a limit together; hits leased and
    /// not spent before their window ends are lost). Call [`Engine::close`] before exiting to
    /// give back what is unspent. Fails, naming the first such limit, if a limit cannot be
    /// counted there. The state kept here for its counters weighs at most the counter cap's
    /// `max_bytes` per quota (set by [`Engine::with_counter_cap`] before this); a new counter
    /// past it is decided in Redis, nothing kept.
    pub fn with_redis_leased(self, store: RedisStore) -> Result<Engine<C>, StorageError> {
        let max_bytes = self.cap.max_bytes.get();
        self.with_store(Box::new(Leased::new(store, max_bytes)))
    }

    /// What must happen before the process exits: pending hits are sent (redis-cached), leased
    /// and unspent ones given back (redis-leased); nothing for the other storages.
    pub async fn close(&self) -> Result<(), tollgate_redis::BackendError> {
        self.store.close(&self.clock).await
    }

    /// Keeps counters in Redis. Fails, naming the first such limit, if a limit cannot be counted
    /// there. The store's Redis metrics (`tollgate_redis_decision_seconds{prefix}` and
    /// `tollgate_redis_errors_total{prefix, kind}`, see [`tollgate_redis::RedisMetrics`]) are
    /// registered now, with the recorder in force: call it inside [`metrics::with_local_recorder`]
    /// to record them elsewhere than in the global recorder, as `tollgate serve` does for its
    /// `/metrics`.
    pub fn with_redis(self, store: RedisStore) -> Result<Engine<C>, StorageError> {
        self.with_store(Box::new(InRedis::new(store)))
    }

    /// Where the counters live.
    pub fn storage(&self) -> StorageKind {
        self.store.kind()
    }

    /// Whether `policy` can be served by this engine's storage: memory counts every algorithm,
    /// Redis fixed windows only, and `redis-cached` no calendar windows (its local windows end
    /// a period after their first hit). The error names the first limit that cannot be counted.
    pub fn accepts(&self, policy: &Policy) -> Result<(), StorageError> {
        self.store.accepts(policy)
    }

    /// Decides one call with the engine's storage: in memory at once, in Redis in one round trip.
    /// `delta` is the number of hits (callers map Envoy's 0 to 1), unless a descriptor sets its own
    /// ([`Descriptor::hits`]) for the counters attributed to it. A request that is limited takes
    /// nothing from any counter; a shadow or quota limit without room takes nothing and does not
    /// limit it. An error means the request is over the engine's [`RequestBounds`], or the storage
    /// could not answer (Redis down or slow).
    pub async fn call(
        &self,
        namespace: &str,
        descriptors: &[Descriptor],
        delta: u64,
        action: Action,
    ) -> Result<Outcome, CallError> {
        self.bounds.check(namespace, descriptors)?;
        let loaded = self.loaded();
        let statuses = {
            let hits = loaded.policy.hits(namespace, descriptors);
            let call = Call { loaded: &loaded, namespace, hits: &hits, descriptors, delta, action, clock: &self.clock };
            self.store.decide(call).get().await?
        };
        let would_limit = denies(&loaded, &statuses);
        Ok(Outcome { loaded, statuses, allowed: !would_limit || self.shadow, would_limit })
    }

    /// Replaces the limits. Counters of limits present before and after (same [`LimitId`]: they
    /// count the same requests) are kept, with a changed `max_value` applied to them; the others
    /// start empty. Returns the new generation.
    pub fn reload(&self, policy: Policy) -> u64 {
        let mut slot = self.loaded.write().unwrap_or_else(|e| e.into_inner());
        let old = &**slot;
        let by_id: std::collections::HashMap<LimitId, (&Limit, &Arc<dyn Counters>)> = old
            .policy
            .limits()
            .iter()
            .map(|l| (l.id(), l))
            .zip(&old.counters)
            .map(|((id, l), c)| (id, (l, c)))
            .collect();
        let counters = if self.storage() != StorageKind::Memory {
            Vec::new()
        } else {
            policy
                .limits()
                .iter()
                .map(|limit| match by_id.get(&limit.id()) {
                    Some((before, counters)) => {
                        if before.max_value() != limit.max_value() {
                            counters.set_quota(limit.quota().expect("a validated limit has a usable quota"));
                        }
                        Arc::clone(counters)
                    }
                    None => counters(limit, &self.clock, self.cap),
                })
                .collect()
        };
        let generation = old.generation + 1;
        *slot = Arc::new(Loaded { policy, generation, counters });
        generation
    }

    /// The limits in force.
    pub fn loaded(&self) -> Arc<Loaded> {
        Arc::clone(&self.loaded.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The mode decisions are made in.
    pub fn mode(&self) -> Mode {
        self.store.mode()
    }

    /// True in shadow mode: decisions are counted and reported, and every request is allowed.
    pub fn shadow(&self) -> bool {
        self.shadow
    }

    /// With `--storage redis-cached`, what its local copies of the counters weigh now, and the
    /// cap on that (`--max-counter-bytes`); `None` with the other storages.
    pub fn cached_bytes(&self) -> Option<(usize, usize)> {
        self.store.local_bytes()
    }

    /// Each limit's in-memory counters (in the policy's order): how many are kept, the cap, and
    /// what new counters met at the cap; empty when the counters live in Redis.
    pub fn counter_tables(&self) -> (Arc<Loaded>, Vec<CounterTable>) {
        let loaded = self.loaded();
        let tables = loaded
            .counters
            .iter()
            .map(|c| {
                let s = c.statistics();
                let (max, max_bytes, at_max) = c.cap();
                CounterTable {
                    kept: s.keys,
                    max,
                    bytes: s.key_bytes,
                    max_bytes,
                    at_max,
                    rejected_at_max: s.rejected_at_limit,
                    evicted_at_max: s.evicted_at_limit,
                    admitted_unstored_at_max: s.unstored_at_limit,
                }
            })
            .collect();
        (loaded, tables)
    }

    /// For each limit (by index), its fullest counter's use of `max_value` from 0.0 to 1.0; empty
    /// when the counters live in Redis.
    pub fn fill(&self) -> (Arc<Loaded>, Vec<f64>) {
        let loaded = self.loaded();
        let fill = loaded
            .counters
            .iter()
            .map(|c| {
                let mut most = 0.0f64;
                c.for_each(&mut |_, meta| {
                    if meta.limit > 0 {
                        most = most.max(meta.limit.saturating_sub(meta.remaining) as f64 / meta.limit as f64);
                    }
                });
                most
            })
            .collect();
        (loaded, fill)
    }
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("generation", &self.generation)
            .field("limits", &self.policy.limits().len())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outcome")
            .field("allowed", &self.allowed)
            .field("would_limit", &self.would_limit)
            .field("statuses", &self.statuses)
            .field("generation", &self.loaded.generation)
            .finish()
    }
}

impl<C: Clock + Clone> std::fmt::Debug for Engine<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("mode", &self.mode())
            .field("shadow", &self.shadow)
            .field("storage", &self.storage())
            .field("generation", &self.loaded().generation)
            .finish_non_exhaustive()
    }
}
