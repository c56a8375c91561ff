//! Envoy's Rate Limit Quota Service (RLQS, `envoy.service.rate_limit_quota.v3`): each Envoy
//! reports its buckets' usage on a long-lived stream and enforces locally what it is assigned;
//! this service hands each instance its fair share of every limit its buckets count against.
//!
//! - The stream's `domain` is the namespace, and a bucket's id map is matched as one descriptor
//!   (`descriptors[0]`), so one limits file serves RLS and RLQS alike.
//! - Each report is answered at once with an assignment for every bucket in it, lasting
//!   [`RlqsConfig::assignment_ttl`]: `ALLOW_ALL` for a bucket no denying limit counts,
//!   `DENY_ALL` while RLS callers alone used a limit's window up (until it ends), a limit of 0
//!   denies, or the share is 0, else a token bucket (see `strategy`).
//! - Shares: an instance's demand on a counter is what its buckets on it asked (allowed +
//!   denied) over the report's `time_elapsed`, scaled to the limit's window; the limit is
//!   divided max-min fairly among the instances holding a share of it (between Envoys, not
//!   buckets: an instance's buckets on a counter split its one share the same way), and no
//!   instance gets more than the others' assignments in force leave (see `ledger`). Every
//!   assignment's token bucket admits in any stretch of the window at most its share, bursts
//!   included, and a changed share (a new token bucket, which Envoy starts full) is made only
//!   when the bursts it rebuilds fit too, charged for a window (worked out here from
//!   `strategy`'s burst, taken in by the ledger and `fair_share.lua`), so the fleet admits at
//!   most the limit in any window of it.
//! - A stream that ends cleanly gives its shares back at once; one that breaks keeps them until
//!   its assignments expire, as Envoy keeps enforcing them until then.
//!
//! RLS and RLQS on one limit: the counters RLS calls take from hold what the assignments in
//! force may admit in their window (reserved in it at each share, up to the limit, and as soon as
//! an RLS decision opens a window: the fleet's admissions are bounded by the assignments, not
//! counted one by one), so
//! RLS callers get what the fleet leaves; and the RLS callers are one more holder in the fair
//! division, wanting what they used of the last window (the count less the reservation; twice
//! that when the window was full). A report's own counts are not charged: they hold admissions
//! from before the window opened (see `ledger`).

mod ledger;
mod strategy;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use hashbrown::HashMap;
use tollgate::{Clock, Meta, SystemClock};
use tollgate_policy::{Descriptor, Hit, LimitId};
use tollgate_redis::counters::{ShareAsk, drop_share, held_limits, mark_held, see_window, take_share};
use tollgate_redis::{Keyspace, Redis, RedisTime};
use tonic::Status as GrpcStatus;
use tracing::Instrument;

use self::ledger::{CounterKey, Ledger, Rebuild, Seen, Taken};
use self::strategy::{Assignment, Bucket};
use crate::serve::engine::{Engine, Seeing, WindowWatch};
use crate::serve::model::{Action as CallAction, CallError, fair_shares};
use crate::serve::ops::metrics::Metrics;
use crate::serve::ops::trace::TARGET;
use crate::serve::store::{RedisStore, counter_key};

/// The RLQS service's settings (`tollgate serve --rlqs-*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RlqsConfig {
    /// How long an assignment lasts in Envoy unless renewed; whole seconds, at least one (Envoy
    /// reads no more, and expires 0 at once). Envoy reports every 5 s: the default, 15 s, rides
    /// out two lost reports, and a server that is gone leaves no quota in force past it.
    pub assignment_ttl: Duration,
    /// Most buckets one stream (one Envoy) may report on; reports on more are ignored.
    pub max_buckets_per_stream: usize,
    /// Most buckets of all streams together; a new bucket past it is ignored.
    pub max_buckets: usize,
}

impl Default for RlqsConfig {
    fn default() -> RlqsConfig {
        RlqsConfig { assignment_ttl: Duration::from_secs(15), max_buckets_per_stream: 10_000, max_buckets: 1_000_000 }
    }
}

/// The RLQS service of one server: its streams' shares of every limit.
pub struct Rlqs<C: Clock = SystemClock> {
    engine: Arc<Engine<C>>,
    metrics: Arc<Metrics>,
    clock: C,
    config: RlqsConfig,
    /// This server's view of the shares: the shares themselves on memory storage.
    ledger: Mutex<Ledger>,
    /// The shares of every server on the same Redis, on the Redis storages.
    redis: Option<SharedShares>,
    instances: AtomicU64,
    bucket_numbers: AtomicU64,
    buckets: AtomicUsize,
    /// The limits a share was ever given of, as bits by id ([`HeldLimits`]): the counters of the
    /// others are not watched.
    held_limits: HeldLimits,
}

/// A set of limits, as one bit each of 256 by their id: one load to ask (a limit sharing a bit
/// with one in the set is in it too, which costs only a look that finds nothing).
#[derive(Debug, Default)]
struct HeldLimits([AtomicU64; 4]);

impl HeldLimits {
    fn bit(limit: LimitId) -> (usize, u64) {
        let bit = limit.0 % 256;
        ((bit / 64) as usize, 1 << (bit % 64))
    }

    fn insert(&self, limit: LimitId) {
        let (word, bit) = Self::bit(limit);
        self.0[word].fetch_or(bit, Ordering::Relaxed);
    }

    fn contains(&self, limit: LimitId) -> bool {
        let (word, bit) = Self::bit(limit);
        self.0[word].load(Ordering::Relaxed) & bit != 0
    }
}

impl<C: Clock + Clone> Rlqs<C> {
    /// A service assigning the limits `engine` has loaded, timing assignments on `clock` (the
    /// engine's), recording into `metrics`.
    pub fn new(engine: Arc<Engine<C>>, metrics: Arc<Metrics>, clock: C, config: RlqsConfig) -> Rlqs<C> {
        let ttl = Duration::from_secs(config.assignment_ttl.as_secs().max(1));
        Rlqs {
            engine,
            metrics,
            clock,
            config: RlqsConfig { assignment_ttl: ttl, ..config },
            ledger: Mutex::new(Ledger::default()),
            redis: None,
            instances: AtomicU64::new(0),
            bucket_numbers: AtomicU64::new(0),
            buckets: AtomicUsize::new(0),
            held_limits: HeldLimits::default(),
        }
    }

    /// Shares decided with every server on `store`'s Redis (replicas behind one Envoy fleet):
    /// the counters' holders are kept there, under the store's prefix followed by `rlqs:`.
    #[must_use]
    pub fn with_redis(self, store: RedisStore) -> Rlqs<C> {
        let server = format!(
            "{:016x}",
            std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), std::process::id())
        );
        let keyspace = Keyspace::new(format!("{}rlqs:", store.prefix));
        let counters = Keyspace::new(store.prefix.as_str());
        // Assignment rounds are off the request path: a slow Redis should delay an assignment
        // (Envoy reports every 5 s), not drop it.
        let redis = store.redis.with_deadline(store.redis.deadline().max(Duration::from_secs(1)));
        let marked = Mutex::new(HashMap::new());
        Rlqs { redis: Some(SharedShares { redis, keyspace, counters, time: store.time, server, marked }), ..self }
    }

    /// On the Redis storages, reads every second (on the engine's clock) which limits
    /// the Envoys of every server on that Redis hold, and watches their windows as those of a
    /// limit this server's own Envoys hold: an RLS decision here may open a window that another
    /// server's Envoys admit in, and it is reserved in at once only if this server sees it
    /// (measured: RLS callers on one server, two Envoys on another, a limit per second: 1.80x
    /// the limit in a window, as on one server before windows were watched). Returns when the
    /// service is dropped; at once on memory storage.
    pub async fn learn_held_limits(rlqs: Weak<Self>)
    where
        C: Send + Sync + 'static,
    {
        loop {
            let Some(this) = rlqs.upgrade() else { return };
            let Some(shared) = &this.redis else { return };
            match held_limits(&shared.redis, &shared.held_key()).await {
                Ok(ids) if !ids.is_empty() => {
                    ids.into_iter().for_each(|id| this.held_limits.insert(LimitId(id)));
                    this.watch_windows();
                }
                Ok(_) => {}
                Err(e) => tracing::debug!("RLQS: cannot read the limits the fleet holds: {e}"),
            }
            let next = this.clock.now().saturating_add(LEARN_EVERY.as_nanos() as u64);
            let sleep = this.clock.sleep_until(next);
            // Not kept alive while asleep.
            drop(this);
            sleep.await;
        }
    }

    /// Gives `holder` its share of a counter (see `Ledger::share`), in memory or in Redis, and
    /// reserves what the holders hold in the counter's window (`entries`: the id of a bucket
    /// that counts on it, to charge it in memory); `None` when Redis cannot answer (the bucket
    /// is then left without an assignment: Envoy keeps the one it has until it expires).
    #[allow(clippy::too_many_arguments)]
    async fn share(
        &self,
        namespace: &str,
        part: &Part,
        entries: &[(String, String)],
        holder: u64,
        want: u64,
        rebuild: Rebuild,
        now: u64,
    ) -> Option<Taken> {
        let ttl = self.config.assignment_ttl;
        let expires = now.saturating_add(u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX));
        self.held_limits.insert(part.key.limit);
        let Some(shared) = &self.redis else {
            let window = u64::try_from(part.window.as_nanos()).unwrap_or(u64::MAX);
            let taken =
                self.ledger().share(&part.key, part.limit, holder, want, rebuild, part.seen, window, now, expires);
            self.reserve_in_memory(namespace, entries, &part.key, taken.reserve).await;
            return Some(taken);
        };
        shared.mark_held(part.key.limit, now, ttl).await;
        let (holders, counter, name) =
            (shared.key(namespace, &part.key), shared.counter(namespace, &part.key), shared.holder(holder));
        let ask = ShareAsk {
            holders: &holders,
            counter: &counter,
            holder: &name,
            limit: part.limit,
            window: part.window,
            want,
            rebuild_most: rebuild.most,
            rebuild_held: rebuild.held,
            resplit: rebuild.resplit,
            ttl,
        };
        match take_share(&shared.redis, &ask, &shared.time).await {
            Ok(taken) => {
                // This server's view, for its metrics.
                self.ledger().record(&part.key, holder, want, taken.share, now, expires);
                Some(Taken {
                    share: taken.share,
                    reserve: taken.reserved,
                    exhausted: taken.exhausted,
                    rebuilt: taken.rebuilt,
                })
            }
            Err(e) => {
                tracing::warn!("RLQS: cannot reach the shares in Redis, the bucket keeps its assignment: {e}");
                None
            }
        }
    }

    /// Counts `n` hits into `counter`'s open window in memory (a reservation: see `Ledger`),
    /// through a descriptor of `entries` that counts on it.
    async fn reserve_in_memory(&self, namespace: &str, entries: &[(String, String)], counter: &CounterKey, n: u64) {
        if n == 0 {
            return;
        }
        let descriptor = Descriptor { entries: entries.to_vec(), hits: None, limit: None };
        let (limit, values) = (counter.limit, &counter.values);
        if let Err(e) = self.engine.charge_counter(namespace, &descriptor, limit, values, n).await {
            tracing::warn!("RLQS: cannot reserve the assignments in the counter's window: {e}");
        }
    }

    /// From now on (the first stream here, or the first limit another server's Envoys hold), a
    /// window an RLS decision opens is reserved in at once, and one it finds full is seen used
    /// up: the engine tells this service (held weakly; set once, later calls do nothing).
    fn watch_windows(self: &Arc<Self>)
    where
        C: Send + Sync + 'static,
    {
        self.engine.watch_windows(Arc::downgrade(self) as Weak<dyn WindowWatch>);
    }

    /// A new stream: one Envoy instance.
    pub fn open(self: &Arc<Self>) -> Instance<C>
    where
        C: Send + Sync + 'static,
    {
        self.watch_windows();
        let id = self.instances.fetch_add(1, Ordering::Relaxed) + 1;
        self.metrics.rlqs_streams(1);
        Instance {
            rlqs: Arc::clone(self),
            id,
            domain: None,
            buckets: HashMap::new(),
            holdings: HashMap::new(),
            ended: false,
        }
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<C: Clock + Clone + Send + Sync + 'static> WindowWatch for Rlqs<C> {
    fn watches(&self, limit: LimitId) -> bool {
        self.held_limits.contains(limit)
    }

    /// Sees a counter that this server's Envoys hold as an RLS decision left its window (see
    /// `Ledger::window_seen`; on Redis `see_window`), as a report would, when the decision
    /// opened the window, found it full or came in its last eighth (at most once an eighth of a
    /// window, but for a new window): a new window is reserved in at once (what the assignments
    /// in force may admit in it, and the claims of holders the RLS callers kept short of their
    /// fair share), and what the RLS callers used of it is seen. Windows shorter than Envoy's
    /// report interval would otherwise open and end between two reports, nothing reserved in
    /// them (measured: 1.80x the limit in a window of 1 s, RLS callers beside two Envoys
    /// reporting every 5 s) and their use unseen. Only the decisions that opened a window go
    /// before its reservation. On Redis the call waits for one more round trip.
    fn seen<'a>(&'a self, namespace: &'a str, descriptor: &'a Descriptor, hit: &'a Hit<'a>, meta: Meta) -> Seeing<'a> {
        Box::pin(async move {
            let count = meta.limit.saturating_sub(meta.remaining);
            // No window is open at a count of 0 (a check before any hit).
            if count == 0 {
                return;
            }
            let key = CounterKey { limit: hit.counter.id(), values: hit.values.clone() };
            let now = self.clock.now();
            let window = u64::try_from(hit.limit.window().as_nanos()).unwrap_or(u64::MAX);
            let seen = Seen { count, end: now.saturating_add(meta.reset_ns) };
            let reserve = {
                let mut ledger = self.ledger();
                if !ledger.worth_seeing(&key, seen.end, window, now, self.redis.is_some()) {
                    return;
                }
                if self.redis.is_some() { 0 } else { ledger.window_seen(&key, hit.max_value, seen, window, now) }
            };
            if let Some(shared) = &self.redis {
                let (holders, counter) = (shared.key(namespace, &key), shared.counter(namespace, &key));
                let seen =
                    see_window(&shared.redis, &holders, &counter, hit.max_value, hit.limit.window(), &shared.time);
                if let Err(e) = seen.await {
                    tracing::warn!("RLQS: cannot reserve the assignments in the counter's window: {e}");
                }
            } else {
                self.reserve_in_memory(namespace, &descriptor.entries, &key, reserve).await;
            }
        })
    }
}

impl<C: Clock> std::fmt::Debug for Rlqs<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rlqs")
            .field("config", &self.config)
            .field("buckets", &self.buckets.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Shares kept in Redis for every server using it.
struct SharedShares {
    redis: Redis,
    keyspace: Keyspace,
    /// The RLS decisions' counters (the storage's prefix).
    counters: Keyspace,
    time: RedisTime,
    /// This server's name among them, random.
    server: String,
    /// When this server last marked each limit held in Redis ([`SharedShares::mark_held`]), on
    /// the engine's clock.
    marked: Mutex<HashMap<LimitId, u64>>,
}

/// How often a server on Redis reads the limits the fleet holds ([`Rlqs::learn_held_limits`]).
const LEARN_EVERY: Duration = Duration::from_secs(1);

impl SharedShares {
    /// A counter's holders: under the namespace as hash tag, named by the limit's id, with the
    /// counter's values (the counter's own key, in the `rlqs:` keyspace).
    fn key(&self, namespace: &str, counter: &CounterKey) -> String {
        self.keyspace.key(namespace, &counter.limit.to_string(), &counter.values)
    }

    /// The counter's window, as the RLS decisions keep it.
    fn counter(&self, namespace: &str, counter: &CounterKey) -> String {
        counter_key(&self.counters, namespace, counter.limit, &counter.values)
    }

    /// The set of the limits the holders of every server hold, by id (unique across namespaces).
    fn held_key(&self) -> String {
        self.keyspace.key("held", "limits", &[] as &[&str])
    }

    /// Marks `limit` held in Redis for the other servers ([`Rlqs::learn_held_limits`]): at most
    /// once per half an assignment's time to live `ttl`, kept for four of them. A failure is
    /// retried at the next share.
    async fn mark_held(&self, limit: LimitId, now: u64, ttl: Duration) {
        let every = u64::try_from(ttl.as_nanos() / 2).unwrap_or(u64::MAX);
        {
            let mut marked = self.marked.lock().unwrap_or_else(|e| e.into_inner());
            if marked.get(&limit).is_some_and(|&at| now.saturating_sub(at) < every) {
                return;
            }
            marked.insert(limit, now);
        }
        if let Err(e) = mark_held(&self.redis, &self.held_key(), limit.0, 4 * ttl).await {
            self.marked.lock().unwrap_or_else(|e| e.into_inner()).remove(&limit);
            tracing::warn!("RLQS: cannot mark limit {limit} held for the other servers: {e}");
        }
    }

    /// An instance's name as a holder, unique among the servers.
    fn holder(&self, instance: u64) -> String {
        format!("{}:{instance}", self.server)
    }
}

/// What a stream knows of one of its buckets.
#[derive(Debug)]
struct BucketState {
    /// Its number in the server.
    number: u64,
    /// The token bucket last assigned, if any: Envoy keeps it unless told one it can tell apart.
    last: Option<Bucket>,
    /// The counters it counts on, as last read.
    counters: Vec<CounterKey>,
}

/// What an instance wants and holds of one counter, bucket by bucket: the instance holds one
/// share of the counter (fairness is between Envoys, however many buckets each has on it), which
/// its buckets on the counter split.
#[derive(Debug, Default)]
struct Holding {
    /// Each bucket's demand in hits per window (`None`: not known yet), and what its assignment
    /// may admit per window.
    buckets: HashMap<u64, (Option<f64>, u64)>,
}

impl Holding {
    /// What the instance wants of the counter: its buckets' demands together (see [`want`]).
    fn want(&self, limit: u64) -> u64 {
        let demand = self.buckets.values().try_fold(0.0, |sum, (demand, _)| demand.map(|d| sum + d));
        want(limit, demand)
    }
}

/// One bucket of a report, read: its id, its number, and what its limits say.
struct Read {
    id: BucketId,
    entries: Vec<(String, String)>,
    number: u64,
    verdict: Verdict,
}

/// What a bucket's limits say before any share is given.
enum Verdict {
    /// An assignment that needs no share (allowed all, or denied all until its window ends), its
    /// time to live in whole seconds, and the counters it then holds nothing of.
    Fixed(Assignment, u64, Vec<CounterKey>),
    /// A share of each of these counters.
    Shared(Vec<Part>),
}

/// One counter a bucket counts on, as its report was read.
#[derive(Clone, Debug)]
struct Part {
    key: CounterKey,
    /// Its limit: hits per window.
    limit: u64,
    window: Duration,
    /// Its window as the probe saw it, on memory storage (on Redis, `fair_share.lua` reads it
    /// in the step that gives the share); `None` when none is open.
    seen: Option<Seen>,
    /// Nanoseconds until its window ends, as the probe saw it.
    reset_ns: u64,
}

/// One stream of reports: one Envoy instance, its buckets and their assignments.
pub struct Instance<C: Clock + Clone = SystemClock> {
    rlqs: Arc<Rlqs<C>>,
    id: u64,
    domain: Option<String>,
    buckets: HashMap<Vec<(String, String)>, BucketState>,
    /// What it wants and holds of each counter its buckets count on.
    holdings: HashMap<CounterKey, Holding>,
    ended: bool,
}

impl<C: Clock + Clone> Instance<C> {
    /// Answers one report: an assignment for each bucket in it, in its order. Buckets with an
    /// empty id, or past the bounds on buckets, are left out (Envoy keeps applying what it has
    /// to them). An error ends the stream: a report whose domain is missing on the first
    /// message, or differs from the stream's.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
    /// use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    /// use futures::executor::block_on;
    /// use tollgate::ManualClock;
    /// use tollgate_policy::Policy;
    /// use tollgate_server::serve::{Engine, Metrics, Mode, rlqs::{Rlqs, RlqsConfig}};
    ///
    /// let policy = Policy::parse("- {namespace: api, max_value: 600, seconds: 60, conditions: [\"descriptors[0].path == '/a'\"]}", "limits.yaml")?;
    /// let clock = ManualClock::new();
    /// let engine = Arc::new(Engine::new(policy, Mode::Accuracy, false, clock.clone()));
    /// let rlqs = Arc::new(Rlqs::new(engine, Arc::new(Metrics::new()), clock, RlqsConfig::default()));
    /// let mut envoy = rlqs.open();
    /// let bucket = BucketId { bucket: [("path".to_string(), "/a".to_string())].into() };
    /// let usage = BucketQuotaUsage { bucket_id: Some(bucket), num_requests_allowed: 1, ..Default::default() };
    /// let report = RateLimitQuotaUsageReports { domain: "api".into(), bucket_quota_usages: vec![usage] };
    /// let answer = block_on(envoy.report(report))?;
    /// assert_eq!(answer.bucket_action.len(), 1, "one assignment: a token bucket holding the whole limit");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn report(&mut self, reports: RateLimitQuotaUsageReports) -> Result<RateLimitQuotaResponse, GrpcStatus> {
        let domain = match (&self.domain, reports.domain.as_str()) {
            (None, "") => return Err(GrpcStatus::invalid_argument("the stream's first report names no domain")),
            (None, domain) => self.domain.insert(domain.to_string()).clone(),
            (Some(ours), domain) if !domain.is_empty() && domain != ours => {
                return Err(GrpcStatus::invalid_argument(format!(
                    "the report's domain {domain:?} is not the stream's, {ours:?}: one stream per domain"
                )));
            }
            (Some(ours), _) => ours.clone(),
        };
        let span = tracing::span!(
            target: TARGET,
            tracing::Level::TRACE,
            "ratelimit.rlqs.assign",
            ratelimit.namespace = domain.as_str(),
            rlqs.instance = self.id,
            rlqs.buckets = reports.bucket_quota_usages.len(),
        );
        self.answer(&domain, reports.bucket_quota_usages).instrument(span).await
    }

    async fn answer(
        &mut self,
        domain: &str,
        usages: Vec<BucketQuotaUsage>,
    ) -> Result<RateLimitQuotaResponse, GrpcStatus> {
        let now = self.rlqs.clock.now();
        let mut read = Vec::with_capacity(usages.len());
        for usage in usages {
            let Some(id) = usage.bucket_id.as_ref().filter(|id| !id.bucket.is_empty()) else {
                self.rlqs.metrics.rlqs_ignored("empty_bucket_id");
                continue;
            };
            let mut entries: Vec<(String, String)> = id.bucket.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            entries.sort();
            let descriptor = Descriptor { entries, hits: None, limit: None };
            if self.rlqs.engine.request_bounds().check(domain, std::slice::from_ref(&descriptor)).is_err() {
                self.rlqs.metrics.rlqs_ignored("oversize");
                continue;
            }
            let Some(number) = self.bucket(&descriptor.entries) else { continue };
            let Some(verdict) = self.read(domain, &descriptor, &usage, number).await else { continue };
            read.push(Read {
                id: BucketId { bucket: id.bucket.clone() },
                entries: descriptor.entries,
                number,
                verdict,
            });
        }
        let (parts, exhausted) = self.split(domain, &read, now).await;
        let ttl = self.rlqs.config.assignment_ttl.as_secs();
        let mut actions = Vec::with_capacity(read.len());
        let mut limits = Vec::new();
        for bucket in read {
            let (assignment, ttl) = match bucket.verdict {
                Verdict::Fixed(assignment, ttl, counters) => {
                    for key in &counters {
                        self.on(key, bucket.number).1 = 0;
                    }
                    (assignment, ttl)
                }
                Verdict::Shared(counters) if counters.iter().any(|p| exhausted.contains(&p.key)) => {
                    // The RLS callers used a window up: denied all until it ends.
                    for part in &counters {
                        self.on(&part.key, bucket.number).1 = 0;
                    }
                    let reset = counters.iter().filter(|p| exhausted.contains(&p.key)).map(|p| p.reset_ns).max();
                    (Assignment::DenyAll, ttl.max(reset.unwrap_or(0).div_ceil(1_000_000_000)))
                }
                Verdict::Shared(counters) => {
                    // A counter whose share Redis could not give: the bucket keeps what it has.
                    let Some(shares) = counters
                        .iter()
                        .map(|p| Some((*parts.get(&(p.key.clone(), bucket.number))?, p.window)))
                        .collect::<Option<Vec<_>>>()
                    else {
                        continue;
                    };
                    let last = self.buckets.get(&bucket.entries).and_then(|state| state.last);
                    let assignment = Bucket::next(&shares, last).map_or(Assignment::DenyAll, Assignment::Bucket);
                    for (part, (share, _)) in counters.iter().zip(&shares) {
                        let held = if matches!(assignment, Assignment::Bucket(_)) { *share } else { 0 };
                        self.on(&part.key, bucket.number).1 = held;
                        limits.push(part.key.limit);
                    }
                    (assignment, ttl)
                }
            };
            if let Some(state) = self.buckets.get_mut(&bucket.entries) {
                state.last = match assignment {
                    Assignment::Bucket(b) => Some(b),
                    _ => None,
                };
            }
            actions.push(BucketAction {
                bucket_id: Some(bucket.id),
                bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                    assignment_time_to_live: Some(ProtoDuration { seconds: ttl as i64, nanos: 0 }),
                    rate_limit_strategy: Some(assignment.strategy()),
                })),
            });
        }
        limits.sort_unstable();
        limits.dedup();
        self.record(domain, &limits);
        Ok(RateLimitQuotaResponse { bucket_action: actions })
    }

    /// The instance's share of each counter the report's buckets count on, taken once per
    /// counter (again for one whose bucket is rebuilt for another counter's sake), and split
    /// among those buckets: what each may hold, by (counter, bucket), and the
    /// counters whose window the RLS callers used up. What the instance's other buckets on a
    /// counter hold stays theirs. A counter Redis could not answer for has no parts.
    async fn split(
        &mut self,
        domain: &str,
        read: &[Read],
        now: u64,
    ) -> (HashMap<(CounterKey, u64), u64>, hashbrown::HashSet<CounterKey>) {
        // Each counter, with the first bucket on it (whose id charges it in memory) and all of them;
        // each bucket's burst in Envoy now (0 without a token bucket).
        let mut on: HashMap<CounterKey, (&Part, &Read, Vec<u64>)> = HashMap::new();
        let mut held: HashMap<u64, u64> = HashMap::new();
        for bucket in read {
            if let Verdict::Shared(counters) = &bucket.verdict {
                let last = self.buckets.get(&bucket.entries).and_then(|state| state.last);
                held.insert(bucket.number, last.map_or(0, |b| u64::from(b.max_tokens)));
                for part in counters {
                    on.entry(part.key.clone()).or_insert((part, bucket, Vec::new())).2.push(bucket.number);
                }
            }
        }
        let mut parts = HashMap::new();
        let mut exhausted = hashbrown::HashSet::new();
        let mut rebuilt = hashbrown::HashSet::new();
        for (key, (part, first, numbers)) in &mut on {
            // In one order, so that an unchanged share and wants split the same way.
            numbers.sort_unstable();
            let Some(counted) = self.count_on(domain, key, part, first, numbers, &held, false, now).await else {
                continue;
            };
            match counted {
                None => {
                    exhausted.insert(key.clone());
                }
                Some((split, rebuilds)) => {
                    if rebuilds {
                        rebuilt.insert(key.clone());
                    }
                    parts.extend(numbers.iter().zip(split).map(|(number, part)| ((key.clone(), *number), part)));
                }
            }
        }
        // A bucket on several counters is one token bucket: rebuilt for one counter's sake, its
        // old burst lands in the others' windows too, so those are charged for it (their split
        // moved, `Rebuild::resplit`) before the bucket is.
        let mut again = hashbrown::HashSet::new();
        for bucket in read {
            let Verdict::Shared(counters) = &bucket.verdict else { continue };
            let last = self.buckets.get(&bucket.entries).and_then(|state| state.last);
            if counters.len() < 2 || last.is_none() {
                continue;
            }
            let shares: Option<Vec<_>> =
                counters.iter().map(|p| Some((*parts.get(&(p.key.clone(), bucket.number))?, p.window))).collect();
            let new = shares.and_then(|shares| Bucket::next(&shares, last));
            if new.is_some() && new != last {
                again.extend(counters.iter().map(|p| &p.key).filter(|key| !rebuilt.contains(*key)).cloned());
            }
        }
        for key in again {
            let (part, first, numbers) = &on[&key];
            match self.count_on(domain, &key, part, first, numbers, &held, true, now).await {
                Some(Some((split, _))) => {
                    parts.extend(numbers.iter().zip(split).map(|(number, part)| ((key.clone(), *number), part)));
                }
                Some(None) => {
                    exhausted.insert(key);
                }
                // Redis could not answer: the buckets keep what they have.
                None => parts.retain(|(counter, _), _| *counter != key),
            }
        }
        (parts, exhausted)
    }

    /// The instance's share of one counter, taken now that its buckets `numbers` (whose token
    /// buckets have the bursts in `bursts`) report on it, split among them: their parts, and
    /// whether they are rebuilt (charged by the ledger); `Some(None)` when the RLS callers used
    /// the counter's window up; `None` when Redis could not answer. `resplit`: rebuild them even
    /// if the share and their split would stay (a bucket among them is rebuilt for another
    /// counter's sake).
    #[allow(clippy::too_many_arguments)]
    async fn count_on(
        &mut self,
        domain: &str,
        key: &CounterKey,
        part: &Part,
        first: &Read,
        numbers: &[u64],
        bursts: &HashMap<u64, u64>,
        resplit: bool,
        now: u64,
    ) -> Option<Option<(Vec<u64>, bool)>> {
        let limit = part.limit;
        let holding = self.holdings.entry_ref(key).or_default();
        let want = holding.want(limit);
        // What the buckets not in this report hold stays theirs; what the reported ones hold
        // now, and what they want.
        let elsewhere: u64 =
            holding.buckets.iter().filter(|(b, _)| !numbers.contains(*b)).map(|(_, (_, held))| *held).sum();
        let now_held: Vec<u64> = numbers.iter().map(|b| holding.buckets.get(b).map_or(0, |(_, held)| *held)).collect();
        let wants: Vec<u64> =
            numbers.iter().map(|b| bucket_want(limit, holding.buckets.get(b).and_then(|(d, _)| *d))).collect();
        let reported: u64 = now_held.iter().sum();
        let had = elsewhere + reported;
        // The split moves at an unchanged share only when a bucket is well short of its part
        // (by a quarter of it and a step of the wants' grid): a split moved by every waver of
        // the demands would rebuild the buckets at every report.
        let step = (limit / 50).max(1);
        let resplit = resplit
            || split_among(reported, &wants)
                .iter()
                .zip(&now_held)
                .any(|(&part, &has)| (has == 0 && part > 0) || has.saturating_add(step.max(part / 4)) < part);
        // A changed share, or split, rebuilds these buckets: each new one starts full, on top
        // of what the old one admitted in the window; the new one's burst is within the new
        // share, so what a change adds is the old ones' bursts (`strategy::burst` of their
        // parts), charged by the ledger.
        let held_now: u64 = numbers.iter().map(|n| bursts.get(n).copied().unwrap_or(0)).sum();
        let rebuild = Rebuild { most: held_now, held: held_now, resplit };
        let taken = self.rlqs.share(domain, part, &first.entries, self.id, want, rebuild, now).await?;
        if taken.exhausted {
            return Some(None);
        }
        // Kept as it is unless the ledger rebuilt (and charged) the buckets.
        let rebuilds = taken.rebuilt || taken.share != had;
        let split = if rebuilds { split_among(taken.share.saturating_sub(elsewhere), &wants) } else { now_held };
        Some(Some((split, rebuilds)))
    }

    /// What bucket `number` wants and holds of `counter`.
    fn on(&mut self, counter: &CounterKey, number: u64) -> &mut (Option<f64>, u64) {
        self.holdings.entry_ref(counter).or_default().buckets.entry(number).or_insert((None, 0))
    }

    /// Updates the per-limit metrics of `limits` from this server's view of the shares.
    fn record(&self, domain: &str, limits: &[tollgate_policy::LimitId]) {
        let loaded = self.rlqs.engine.loaded();
        let ledger = self.rlqs.ledger();
        for limit in loaded.policy.limits().iter().filter(|l| limits.contains(&l.id())) {
            let (instances, held) = ledger.limit_totals(limit.id());
            self.rlqs.metrics.rlqs_assigned(domain, limit, instances, held as f64 / limit.window().as_secs_f64());
        }
    }

    /// The bucket's number, a new one for a bucket not seen before; `None` when the stream or
    /// the server has as many buckets as it may.
    fn bucket(&mut self, entries: &[(String, String)]) -> Option<u64> {
        if let Some(state) = self.buckets.get(entries) {
            return Some(state.number);
        }
        let config = &self.rlqs.config;
        if self.buckets.len() >= config.max_buckets_per_stream {
            self.rlqs.metrics.rlqs_ignored("max_buckets_per_stream");
            return None;
        }
        let total = &self.rlqs.buckets;
        if total
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < config.max_buckets).then_some(n + 1))
            .is_err()
        {
            self.rlqs.metrics.rlqs_ignored("max_buckets");
            return None;
        }
        let number = self.rlqs.bucket_numbers.fetch_add(1, Ordering::Relaxed) + 1;
        self.buckets.insert(entries.to_vec(), BucketState { number, last: None, counters: Vec::new() });
        self.rlqs.metrics.rlqs_buckets(1);
        Some(number)
    }

    /// Reads one bucket: the limits its id matches, whether one is exhausted, and what it asked
    /// of each counter (recorded in the instance's holdings); `None` when the storage cannot
    /// answer (Envoy keeps the assignment it has until it expires).
    async fn read(
        &mut self,
        domain: &str,
        descriptor: &Descriptor,
        usage: &BucketQuotaUsage,
        number: u64,
    ) -> Option<Verdict> {
        let rlqs = Arc::clone(&self.rlqs);
        let values = std::slice::from_ref(descriptor);
        let probe = match rlqs.engine.call(domain, values, 1, CallAction::Check).await {
            Ok(outcome) => outcome,
            Err(CallError::Oversize(_)) => return None,
            Err(e) => {
                tracing::warn!("RLQS: cannot read the counters of {domain:?}, the bucket keeps its assignment: {e}");
                return None;
            }
        };
        let loaded = rlqs.engine.loaded();
        let hits = loaded.policy.hits(domain, values);
        let shared: Vec<_> = hits
            .iter()
            .filter(|h| h.limit.enforcement().denies() && !h.limit.unlimited() && !h.limit.denies_all())
            .collect();
        let asked = usage.num_requests_allowed.saturating_add(usage.num_requests_denied);
        let elapsed = usage.time_elapsed.map_or(Duration::ZERO, |d| {
            Duration::new(u64::try_from(d.seconds).unwrap_or(0), u32::try_from(d.nanos).unwrap_or(0))
        });
        for hit in &shared {
            rlqs.metrics.rlqs_usage(domain, hit.limit, usage.num_requests_allowed, usage.num_requests_denied, &probe);
        }
        // Each counter's window as the probe saw it: on memory, its count (the RLS callers' and
        // what RLQS reserved in it) and its end, the window's identity.
        let now = rlqs.clock.now();
        let counters: Vec<Part> = shared
            .iter()
            .map(|h| {
                let status = probe.statuses.iter().find(|s| s.limit == h.index);
                let (count, reset_ns) =
                    status.map_or((0, 0), |s| (s.meta.limit.saturating_sub(s.meta.remaining), s.meta.reset_ns));
                let seen =
                    (rlqs.redis.is_none() && count > 0).then(|| Seen { count, end: now.saturating_add(reset_ns) });
                let key = CounterKey { limit: h.counter.id(), values: h.values.clone() };
                Part { key, limit: h.max_value, window: h.limit.window(), seen, reset_ns }
            })
            .collect();
        // The bucket leaves the counters it no longer counts on (the limits were reloaded).
        let state = self.buckets.get_mut(&descriptor.entries).expect("numbered before it is read");
        for old in &state.counters {
            if !counters.iter().any(|part| &part.key == old)
                && let Some(holding) = self.holdings.get_mut(old)
            {
                holding.buckets.remove(&number);
                if holding.buckets.is_empty() {
                    self.holdings.remove(old);
                }
            }
        }
        state.counters = counters.iter().map(|part| part.key.clone()).collect();
        for part in &counters {
            let window = part.window.as_secs_f64();
            let demand = (!elapsed.is_zero()).then(|| asked as f64 * window / elapsed.as_secs_f64());
            self.on(&part.key, number).0 = demand;
        }
        // A counter that is shared is full when RLS callers used it up (decided with its share:
        // its count holds RLQS's reservation too); any other limit that denies (one of 0) denies
        // all now.
        let limits = loaded.policy.limits();
        let denied = probe.statuses.iter().filter(|s| {
            s.limited && limits[s.limit].enforcement().denies() && !shared.iter().any(|h| h.index == s.limit)
        });
        let reset = denied.map(|s| s.meta.reset_ns).max();
        if let Some(reset) = reset.filter(|_| probe.would_limit && !rlqs.engine.shadow()) {
            // Until the window ends, and at least the usual time to live.
            let ttl = rlqs.config.assignment_ttl.as_secs().max(reset.div_ceil(1_000_000_000));
            let keys = counters.into_iter().map(|part| part.key).collect();
            return Some(Verdict::Fixed(Assignment::DenyAll, ttl, keys));
        }
        if counters.is_empty() || rlqs.engine.shadow() {
            return Some(Verdict::Fixed(Assignment::AllowAll, rlqs.config.assignment_ttl.as_secs(), Vec::new()));
        }
        Some(Verdict::Shared(counters))
    }

    /// The stream ended cleanly: the instance enforces nothing more, its shares go back (on
    /// Redis, before this returns; a holder Redis does not hear of expires with its assignment).
    pub async fn end(mut self) {
        self.ended = true;
        if let Some(shared) = &self.rlqs.redis {
            let holder = shared.holder(self.id);
            let namespace = self.domain.as_deref().unwrap_or_default();
            for counter in self.holdings.keys() {
                if let Err(e) = drop_share(&shared.redis, &shared.key(namespace, counter), &holder).await {
                    tracing::warn!("RLQS: a closed stream's share stays in Redis until it expires: {e}");
                }
            }
        }
    }
}

impl<C: Clock + Clone> Drop for Instance<C> {
    fn drop(&mut self) {
        let rlqs = &self.rlqs;
        rlqs.buckets.fetch_sub(self.buckets.len(), Ordering::Relaxed);
        rlqs.metrics.rlqs_buckets(-(self.buckets.len() as i64));
        rlqs.metrics.rlqs_streams(-1);
        let mut ledger = rlqs.ledger();
        if self.ended {
            ledger.release(self.id);
        }
        ledger.expire(rlqs.clock.now());
    }
}

impl<C: Clock + Clone> std::fmt::Debug for Instance<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("id", &self.id)
            .field("domain", &self.domain)
            .field("buckets", &self.buckets.len())
            .finish_non_exhaustive()
    }
}

/// The hits per window an instance wants of a limit of `limit`, given its buckets' demand in
/// hits per window (`None` when a bucket's is not known yet: Envoy's first report of a bucket
/// says 0 s elapsed, and it then wants it all): a tenth more, rounded up to a fiftieth of the
/// limit (so a demand that wavers a little keeps its assignment, and Envoy its bucket), at least
/// 1 (an idle instance keeps a trickle), at most the limit.
fn want(limit: u64, demand: Option<f64>) -> u64 {
    let Some(demand) = demand else { return limit };
    let grid = (limit / 50).max(1) as f64;
    let rounded = (demand * 1.1 / grid).ceil() * grid;
    if rounded >= limit as f64 { limit } else { (rounded as u64).max(1) }
}

/// `available` split among buckets wanting `wants`: max-min fairly, and what is left past their
/// wants (the instance's margin) evenly.
fn split_among(available: u64, wants: &[u64]) -> Vec<u64> {
    let mut split = fair_shares(available, wants);
    let left = available - split.iter().sum::<u64>();
    let count = split.len().max(1) as u64;
    for (i, part) in split.iter_mut().enumerate() {
        *part += left / count + u64::from((i as u64) < left % count);
    }
    split
}

/// What one bucket wants of an instance's share, to split it: its demand with a tenth more, at
/// least 1, at most the limit (all of it when not known yet).
fn bucket_want(limit: u64, demand: Option<f64>) -> u64 {
    demand.map_or(limit, |d| ((d * 1.1).ceil() as u64).clamp(1, limit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use futures::executor::block_on;
    use tollgate::ManualClock;
    use tollgate_policy::Policy;

    use crate::serve::{Metrics, Mode};

    /// A report of one bucket `id`: `allowed` requests over `seconds`.
    fn report(id: &[(&str, &str)], allowed: u64, seconds: i64) -> RateLimitQuotaUsageReports {
        let bucket = BucketId { bucket: id.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() };
        let usage = BucketQuotaUsage {
            bucket_id: Some(bucket),
            num_requests_allowed: allowed,
            time_elapsed: Some(ProtoDuration { seconds, nanos: 0 }),
            ..Default::default()
        };
        RateLimitQuotaUsageReports { domain: "ns".into(), bucket_quota_usages: vec![usage] }
    }

    #[test]
    fn held_limits_hold_what_was_inserted_and_what_shares_its_bit() {
        let held = HeldLimits::default();
        assert!(!held.contains(LimitId(3)), "empty");
        held.insert(LimitId(3));
        held.insert(LimitId(200));
        assert!(held.contains(LimitId(3)) && held.contains(LimitId(200)));
        assert!(!held.contains(LimitId(4)) && !held.contains(LimitId(199)));
        assert!(held.contains(LimitId(3 + 256)), "one bit for ids 256 apart");
    }

    #[test]
    fn a_bucket_rebuilt_for_one_of_its_limits_is_charged_to_the_others_too() {
        // Envoy a's bucket counts on limits x and y; Envoy b's on x alone.
        let limits = r#"
- {namespace: ns, name: x, max_value: 1000, seconds: 10, conditions: ["descriptors[0].api == 'search'"]}
- {namespace: ns, name: y, max_value: 1000, seconds: 10, conditions: ["descriptors[0].tier == 'gold'"]}
"#;
        let policy = Policy::parse(limits, "limits.yaml").unwrap();
        let clock = ManualClock::new();
        let engine = Arc::new(Engine::new(policy, Mode::Accuracy, false, clock.clone()));
        let y = engine.loaded().policy.limits().iter().find(|l| l.name() == Some("y")).unwrap().id();
        let rlqs = Arc::new(Rlqs::new(engine, Arc::new(Metrics::new()), clock.clone(), RlqsConfig::default()));
        let (mut a, mut b) = (rlqs.open(), rlqs.open());
        let gold: &[(&str, &str)] = &[("api", "search"), ("tier", "gold")];
        block_on(a.report(report(gold, 1, 0))).unwrap();
        block_on(b.report(report(&[("api", "search"), ("tier", "silver")], 1, 0))).unwrap();
        clock.advance(Duration::from_secs(2));
        // a wants all of both; b's share of x cuts a's, which rebuilds a's bucket: its old burst
        // lands in y's window too, though a's share of y stays all of it.
        block_on(a.report(report(gold, 1_000, 2))).unwrap();
        let charged = rlqs.ledger().charged(&CounterKey { limit: y, values: Vec::new() });
        assert_eq!(charged, 8, "a's old bucket's burst, charged to y");
    }

    #[test]
    fn a_want_is_the_demand_per_window_with_a_margin_on_a_coarse_grid() {
        // 600 a minute is 660 with the margin, on a grid of 20.
        assert_eq!(want(1_000, Some(600.0)), 660);
        assert_eq!(want(1_000, Some(612.0)), 680, "rounded up");
        assert_eq!(want(1_000, Some(6_000.0)), 1_000, "at most the limit");
        assert_eq!(want(1_000, Some(0.0)), 1, "an idle instance keeps a trickle");
        assert_eq!(want(1_000, None), 1_000, "not known yet: all of it");
    }
}
