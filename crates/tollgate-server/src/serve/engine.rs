//! Deciding: a request (namespace, descriptors, delta) against the loaded limits and their counters.
//!
//! Data flows one way: the policy says which counters a request touches ([`Policy::hits`]), the
//! engine decides on them, the protocol layers (`rls`, `http`) turn the [`Outcome`] into a response.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, RwLock, Weak};

use tollgate::{Clock, Meta, SystemClock};
use tollgate_policy::{Descriptor, Hit, Limit, LimitId, Policy};
use tollgate_redis::BackendError;

use super::model::{
    Action, CallError, CounterCap, CounterFilter, CounterList, CounterTable, Counters, Loaded, Mode, Outcome,
    RequestBounds, Status, StorageError, StorageKind,
};
use super::store::keyed::counters;
use super::store::{Call, Memory, Namespace, RedisStore, Store, hits_on, open_redis};

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
    clock: C,
    shadow: bool,
    /// Where the counters live: the one value that decides every call.
    store: Box<dyn Store<C>>,
    cap: CounterCap,
    bounds: RequestBounds,
    /// Told of each window a call opens, finds full or meets near its end
    /// ([`Engine::watch_windows`]).
    windows: OnceLock<Weak<dyn WindowWatch>>,
}

/// What is told of a counter's window when a call opens it, finds it full or meets it in its last
/// eighth: how RLQS reserves in a window, as soon as an RLS decision opens it, what the Envoys'
/// assignments may admit in it, and sees what the RLS callers used of it (windows shorter than
/// Envoy's report interval would otherwise open and end between two reports, nothing reserved in
/// them and their use unseen).
pub(crate) trait WindowWatch: Send + Sync {
    /// Whether the counters of the limit `limit` may be watched (false: [`WindowWatch::seen`]
    /// would do nothing for them); asked first, as cheap as a load.
    fn watches(&self, limit: LimitId) -> bool;

    /// `hit`'s counter (in `namespace`, attributed to `descriptor`) had no hits in its window
    /// before this call's, which took them, or had no room for them, or its window ends within
    /// an eighth of its length: `meta` is its state after the call. Awaited by the call.
    fn seen<'a>(&'a self, namespace: &'a str, descriptor: &'a Descriptor, hit: &'a Hit<'a>, meta: Meta) -> Seeing<'a>;
}

/// What [`WindowWatch::seen`] does, awaited by the call.
pub(crate) type Seeing<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

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
            windows: OnceLock::new(),
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
        self.with_redis_storage(StorageKind::RedisCached, store)
    }

    /// Counters in Redis, as `kind` keeps them (not [`StorageKind::Memory`]): the one set-up
    /// behind `with_redis`, `with_redis_cached` and `with_redis_leased`.
    pub(crate) fn with_redis_storage(
        mut self,
        kind: StorageKind,
        store: RedisStore,
    ) -> Result<Engine<C>, StorageError> {
        kind.accepts(&self.loaded().policy)?;
        self.store = open_redis(kind, store, self.cap.max_bytes.get());
        self.renew_counters();
        Ok(self)
    }

    /// Sends the hits allowed locally since the last flush (redis-cached only); returns the
    /// counters flushed.
    pub async fn flush(&self) -> Result<usize, BackendError> {
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
        self.with_redis_storage(StorageKind::RedisLeased, store)
    }

    /// What must happen before the process exits: pending hits are sent (redis-cached), leased
    /// and unspent ones given back (redis-leased); nothing for the other storages.
    pub async fn close(&self) -> Result<(), BackendError> {
        self.store.close(&self.clock).await
    }

    /// Keeps counters in Redis. Fails, naming the first such limit, if a limit cannot be counted
    /// there. The store's Redis metrics (`tollgate_redis_decision_seconds{prefix}` and
    /// `tollgate_redis_errors_total{prefix, kind}`, see [`tollgate_redis::RedisMetrics`]) are
    /// registered now, with the recorder in force: call it inside [`metrics::with_local_recorder`]
    /// to record them elsewhere than in the global recorder, as `tollgate serve` does for its
    /// `/metrics`.
    pub fn with_redis(self, store: RedisStore) -> Result<Engine<C>, StorageError> {
        self.with_redis_storage(StorageKind::Redis, store)
    }

    /// Where the counters live.
    pub fn storage(&self) -> StorageKind {
        self.store.kind()
    }

    /// Whether `policy` can be served by this engine's storage: memory counts every algorithm,
    /// Redis fixed windows only, and `redis-cached` no calendar windows (its local windows end
    /// a period after their first hit). The error names the first limit that cannot be counted.
    pub fn accepts(&self, policy: &Policy) -> Result<(), StorageError> {
        self.storage().accepts(policy)
    }

    /// Decides one call with the engine's storage: in memory at once, in Redis in one round trip.
    /// `delta` is the number of hits (callers map Envoy's 0 to 1), unless a descriptor sets its own
    /// ([`Descriptor::hits`]) for the counters attributed to it. A request that is limited takes
    /// nothing from the other counters; a shadow or quota limit without room does not limit it
    /// (and a quota limit takes nothing then). Pooled limits (envoy/ratelimit's `quota_mode`)
    /// and shadow fixed windows are charged past their limit whatever the outcome, in the same
    /// step (on memory and Redis: see [`Limit::counts_past`]); pooled ones limit the request when
    /// every one it touches is over.
    /// An error means the request is over the engine's [`RequestBounds`], or the storage could
    /// not answer (Redis down or slow).
    pub async fn call(
        &self,
        namespace: &str,
        descriptors: &[Descriptor],
        delta: u64,
        action: Action,
    ) -> Result<Outcome, CallError> {
        self.bounds.check(namespace, descriptors)?;
        let loaded = self.loaded();
        let mut stats_keys = Vec::new();
        let statuses = {
            let mut hits = loaded.policy.hits(namespace, descriptors);
            for hit in &hits {
                stats_keys.extend(hit.limit.stats_key(&hit.values).map(|key| (hit.index, hit.descriptor, key)));
            }
            let hits_on = |at: usize| hits_on(descriptors, delta, at);
            let fixed = if hits.iter().any(|h| answered_here(h.limit)) {
                self.answer_here(&mut hits, hits_on)
            } else {
                Vec::new()
            };
            let limits = loaded.policy.limits();
            let fixed_denies = fixed.iter().any(|s| s.limited && limits[s.limit].enforcement().denies());
            // The limits that count past theirs are charged whatever the outcome, in the call's
            // own step (where every pooled limit over denies it); when a limit that denies all
            // has denied it, they are charged first and the others only checked.
            let counts_past = self.storage().counts_past();
            let first = |h: &tollgate_policy::Hit<'_>| counts_past && h.limit.counts_past();
            let call = Call {
                loaded: &loaded,
                namespace,
                hits: &[],
                descriptors,
                delta,
                action,
                charge: false,
                clock: &self.clock,
            };
            let charged = if fixed_denies && hits.iter().any(first) {
                let charged;
                (charged, hits) = hits.into_iter().partition(first);
                self.charge_first(Call { hits: &charged, ..call }).await?
            } else {
                Vec::new()
            };
            let action = if fixed_denies && action == Action::CheckAndReport { Action::Check } else { action };
            let call = Call { hits: &hits, action, ..call };
            let mut statuses = if hits.is_empty() { Vec::new() } else { self.store.decide(call).await? };
            if let Some(watch) = self.windows.get().and_then(Weak::upgrade) {
                for status in &statuses {
                    let hit = hits.iter().find(|h| h.index == status.limit && h.descriptor == status.descriptor);
                    if let (Some(hit), Some(descriptor)) = (hit, descriptors.get(status.descriptor))
                        && watch.watches(hit.counter.id())
                        && worth_watching(status, hit, action)
                    {
                        watch.seen(namespace, descriptor, hit, status.meta).await;
                    }
                }
            }
            if counts_past {
                let past = statuses.iter_mut().filter(|s| limits[s.limit].counts_past());
                count_past(limits, past, action);
            }
            statuses.extend(fixed);
            statuses.extend(charged);
            statuses
        };
        Ok(Outcome::new(loaded, statuses, self.shadow).with_stats_keys(stats_keys))
    }

    /// Tells `watch` of each window a call opens (the call's hits are all its count), finds full
    /// (the call is limited by it) or meets in its last eighth, from now on, once the call is
    /// decided and before it is answered. Set once: a second watch is ignored.
    pub(crate) fn watch_windows(&self, watch: Weak<dyn WindowWatch>) {
        let _ = self.windows.set(watch);
    }

    /// Charges `n` hits to one counter of `descriptor` in `namespace` (the one of the limit `limit`
    /// with the variables' `values`), or what is left of its window if less, deciding nothing:
    /// how RLQS reserves in a counter's window what the Envoys' assignments may admit in it, so
    /// RLS callers see it. Returns the counter's state after; `None` when the descriptor does
    /// not count on that counter (the limits were reloaded). Asked on memory storage only (on
    /// Redis, `fair_share.lua` reserves in the step that gives the share).
    pub(crate) async fn charge_counter(
        &self,
        namespace: &str,
        descriptor: &Descriptor,
        limit: LimitId,
        values: &[String],
        n: u64,
    ) -> Result<Option<Meta>, CallError> {
        let loaded = self.loaded();
        let descriptors = std::slice::from_ref(descriptor);
        let mut hits = loaded.policy.hits(namespace, descriptors);
        hits.retain(|h| h.counter.id() == limit && h.values == values && !answered_here(h.limit));
        hits.truncate(1);
        if hits.is_empty() {
            return Ok(None);
        }
        let call = Call {
            loaded: &loaded,
            namespace,
            hits: &hits,
            descriptors,
            delta: n,
            action: Action::Report,
            charge: true,
            clock: &self.clock,
        };
        let statuses = self.store.decide(call).await?;
        Ok(statuses.first().map(|s| s.meta))
    }

    /// Decides a call's limits that [count past](Limit::counts_past) their limit (pooled ones,
    /// shadow fixed windows) before the others, when a limit that denies all has denied it (the
    /// others are then only checked), as envoy/ratelimit counts every descriptor: a call that
    /// counts (a report too) charges every hit to each, a check takes nothing (see [`count_past`]).
    async fn charge_first(&self, call: Call<'_, C>) -> Result<Vec<Status>, CallError> {
        let charge = call.action != Action::Check;
        let mut statuses = self.store.decide(Call { charge, ..call }).await?;
        count_past(call.loaded.policy.limits(), statuses.iter_mut(), call.action);
        Ok(statuses)
    }

    /// Takes the hits on limits that count nothing out of `hits`, with their statuses: a limit
    /// that [denies all](Limit::denies_all) has no room, an [unlimited](Limit::unlimited) one
    /// all the room there is.
    fn answer_here(&self, hits: &mut Vec<tollgate_policy::Hit<'_>>, hits_on: impl Fn(usize) -> u64) -> Vec<Status> {
        let unix_now = self.clock.unix_origin_ns().saturating_add(self.clock.now());
        let mut statuses = Vec::new();
        hits.retain(|hit| {
            if !answered_here(hit.limit) {
                return true;
            }
            let meta = if hit.limit.unlimited() {
                Meta { limit: u64::MAX, remaining: u64::MAX, reset_ns: 0, retry_ns: None }
            } else {
                // Nothing resets a limit of 0: the window is what clients are told to wait.
                let reset_ns = match hit.limit.calendar() {
                    Some(calendar) => calendar.window_at(unix_now).1.saturating_sub(unix_now),
                    None => u64::try_from(hit.limit.window().as_nanos()).unwrap_or(u64::MAX),
                };
                Meta { limit: 0, remaining: 0, reset_ns, retry_ns: None }
            };
            let limited = !hit.limit.unlimited();
            let hits = hits_on(hit.descriptor);
            statuses.push(Status {
                limit: hit.index,
                descriptor: hit.descriptor,
                hits,
                meta,
                limited,
                past: 0,
                charged: false,
            });
            false
        });
        statuses
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
                        // A limit that denies all has no quota; its counters are not asked.
                        if before.max_value() != limit.max_value()
                            && let Ok(quota) = limit.quota()
                        {
                            counters.set_quota(quota);
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
        let fill = (loaded.counters.iter().zip(loaded.policy.limits()))
            .map(|(c, limit)| {
                let mut most = 0.0f64;
                c.for_each(&mut |_, meta| {
                    // Against max_value, for counters that hold more too.
                    let meta = limit.reported(meta);
                    if meta.limit > 0 {
                        most = most.max(meta.limit.saturating_sub(meta.remaining) as f64 / meta.limit as f64);
                    }
                });
                most
            })
            .collect();
        (loaded, fill)
    }

    /// Up to `max` live counters of `namespace`, from whichever storage the engine has; the
    /// list says when there were more. An error means Redis could not answer.
    ///
    /// ```
    /// use futures::executor::block_on;
    /// use tollgate::ManualClock;
    /// use tollgate_policy::{Descriptor, Policy};
    /// use tollgate_server::serve::{Action, Engine, Mode};
    ///
    /// let policy = Policy::parse("- {namespace: api, max_value: 5, seconds: 60, variables: [user]}", "limits.yaml")?;
    /// let engine = Engine::new(policy, Mode::Accuracy, false, ManualClock::new());
    /// for user in ["ann", "bob", "cat"] {
    ///     block_on(engine.call("api", &[Descriptor::from([("user", user)])], 1, Action::CheckAndReport)).unwrap();
    /// }
    /// let list = block_on(engine.list_counters("api", 2))?;
    /// assert_eq!((list.counters.len(), list.truncated), (2, true));
    /// assert_eq!(list.counters[0].meta.remaining, 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn list_counters(&self, namespace: &str, max: usize) -> Result<CounterList, BackendError> {
        self.store.list(Namespace { loaded: self.loaded(), name: namespace, clock: &self.clock }, max).await
    }

    /// Forgets the counters of `namespace` that `filter` chooses, with whichever storage the
    /// engine has: each starts its next window full. Returns how many held hits (the counters a
    /// listing would have shown). An error means Redis could not answer; the counters deleted
    /// before it stay deleted.
    ///
    /// ```
    /// use futures::executor::block_on;
    /// use tollgate::ManualClock;
    /// use tollgate_policy::{Descriptor, Policy};
    /// use tollgate_server::serve::{Action, CounterFilter, Engine, Mode};
    ///
    /// let policy = Policy::parse("- {namespace: api, max_value: 1, seconds: 60, variables: [user]}", "limits.yaml")?;
    /// let engine = Engine::new(policy, Mode::Accuracy, false, ManualClock::new());
    /// let ann = [Descriptor::from([("user", "ann")])];
    /// assert!(block_on(engine.call("api", &ann, 1, Action::CheckAndReport)).unwrap().allowed);
    /// assert!(!block_on(engine.call("api", &ann, 1, Action::CheckAndReport)).unwrap().allowed);
    /// let filter = CounterFilter::new([("user".to_string(), "ann".to_string())]);
    /// assert_eq!(block_on(engine.reset_counters("api", &filter))?, 1);
    /// assert!(block_on(engine.call("api", &ann, 1, Action::CheckAndReport)).unwrap().allowed, "ann starts again");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn reset_counters(&self, namespace: &str, filter: &CounterFilter) -> Result<u64, BackendError> {
        self.store.reset(Namespace { loaded: self.loaded(), name: namespace, clock: &self.clock }, filter).await
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

/// The statuses of counters that count past their limit, decided by `action` (charged unless it
/// is a check): whether they were charged, and limited when the counter is, or a check's hits
/// would take it, past the limit (a report's never is). Their counters hold up to
/// [`Limit::capacity`], so what they report is the count.
fn count_past<'s>(limits: &[Limit], statuses: impl Iterator<Item = &'s mut Status>, action: Action) {
    let charged = action != Action::Check;
    for status in statuses {
        let limit = &limits[status.limit];
        status.charged = charged;
        let asked = if charged { 0 } else { status.hits };
        status.limited = action != Action::Report && limit.over(status.meta, asked);
    }
}

/// True when a [`WindowWatch`] is told of `status`, `hit`'s counter as `action` left it: the call
/// opened its window (its hits, taken, are all the window holds), had no room in it, or came in
/// the window's last eighth (what was used of a window is seen near its end, without a call per
/// request).
fn worth_watching(status: &Status, hit: &Hit<'_>, action: Action) -> bool {
    let count = status.meta.limit.saturating_sub(status.meta.remaining);
    let opened = action != Action::Check && !status.limited && status.hits > 0 && count == status.hits;
    let window = u64::try_from(hit.limit.window().as_nanos()).unwrap_or(u64::MAX);
    status.limited || opened || status.meta.reset_ns <= window / 8
}

/// True for a limit whose answer needs no counter: one that denies all, or an unlimited one.
fn answered_here(limit: &Limit) -> bool {
    limit.denies_all() || limit.unlimited()
}
