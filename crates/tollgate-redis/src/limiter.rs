//! [`RedisLimiter`]: one decision per round trip, time from Redis, several limits at once.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::cluster_routing::Slot;

use crate::scripts::Batched;
use tollgate::{
    Acquire, AlgorithmKind, Answer, Check, Decision, Lease, Meta, Quota, RateLimiter, Reason, Refund, Rejected, Settle,
    SettleError,
};

use crate::backend::Redis;
use crate::batch::CallWords;
use crate::error::BackendError;
use crate::failure::{Charge, FailurePolicy};
use crate::key::RedisKey;
use crate::keyspace::Keyspace;
use crate::metrics::{LimiterMetrics, RedisMetrics};
use crate::scripts;
use crate::time::RedisTime;

/// The script that runs `kind` (one of the catalogue's `support().redis` algorithms, which
/// [`RedisLimiterBuilder::build`] checks).
fn script(kind: AlgorithmKind) -> &'static Batched {
    match kind {
        AlgorithmKind::TokenBucket => &scripts::TOKEN_BUCKET,
        AlgorithmKind::FixedWindow => &scripts::FIXED_WINDOW,
        AlgorithmKind::WeightedWindow => &scripts::WEIGHTED_WINDOW,
        AlgorithmKind::SlidingLog => &scripts::SLIDING_LOG,
        AlgorithmKind::IntervalBucket | AlgorithmKind::SlidingWindow => {
            unreachable!("RedisLimiterBuilder::build refuses {kind}: it has no script")
        }
    }
}

/// The two per-limit numbers `kind`'s script takes, and the limit's capacity.
fn params(kind: AlgorithmKind, q: &Quota) -> ([u64; 2], u64) {
    let us = |ns: u64| ns.div_ceil(1000);
    match kind {
        AlgorithmKind::TokenBucket => ([us(q.emission_interval().as_nanos() as u64), q.burst()], q.burst()),
        _ => ([q.limit(), us(q.period().as_nanos() as u64)], q.limit()),
    }
}

#[derive(Clone, Debug)]
struct LimitSpec {
    name: String,
    params: [u64; 2],
}

/// Builds a [`RedisLimiter`].
#[must_use = "a builder does nothing until .build()"]
pub struct RedisLimiterBuilder {
    redis: Redis,
    pub(crate) prefix: String,
    algorithm: AlgorithmKind,
    limits: Vec<(String, Quota)>,
    failure: FailurePolicy,
    pub(crate) time: RedisTime,
    max_wait: Option<Duration>,
    whole_keys: bool,
    metrics: Option<RedisMetrics>,
}

impl RedisLimiterBuilder {
    /// Adds a limit named `name` (part of its Redis key). Several limits are decided together,
    /// all-or-nothing, in one script call.
    pub fn limit(mut self, name: &str, quota: Quota) -> Self {
        self.limits.push((name.to_owned(), quota));
        self
    }

    /// What to answer when Redis fails (default [`FailurePolicy::Deny`]).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// Longest `acquire` may wait (default: unbounded). A token bucket rejects at once, taking
    /// nothing, when its earliest slot is further away than this.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    /// Whose clock decides (default [`RedisTime::redis`]); `acquire` also waits on it.
    /// [`RedisTime::clock`] is for tests on a [`tollgate::ManualClock`]: processes with different
    /// clocks would disagree.
    ///
    /// ```no_run
    /// use tollgate::{ManualClock, Quota};
    /// use tollgate_redis::{Redis, AlgorithmKind, RedisLimiter, RedisTime};
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = Redis::connect("redis://127.0.0.1/").await?;
    /// let clock = ManualClock::new();
    /// let api = RedisLimiter::builder(&redis, "test", AlgorithmKind::FixedWindow)
    ///     .limit("per-user", Quota::per_second(1)?)
    ///     .time(RedisTime::clock(clock.clone()))
    ///     .build()?;
    /// api.try_acquire("alice", 1).await?;
    /// clock.advance(std::time::Duration::from_secs(1)); // the next window, without sleeping
    /// api.try_acquire("alice", 1).await?;
    /// # Ok(()) }
    /// ```
    pub fn time(mut self, time: RedisTime) -> Self {
        self.time = time;
        self
    }

    /// Uses the key a decision names as its Redis key, whole: no prefix, no limit name, the
    /// caller's own layout (e.g. the rate-limit server's counter keys, so that a limiter and the
    /// server share counters). A limiter with whole keys has exactly one limit (two limits would
    /// share one key), else `build` fails with [`crate::ConfigError::WholeKeys`].
    ///
    /// ```no_run
    /// use tollgate::Quota;
    /// use tollgate_redis::{Redis, AlgorithmKind, RedisLimiter};
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = Redis::connect("redis://127.0.0.1/").await?;
    /// let api = RedisLimiter::builder(&redis, "api", AlgorithmKind::FixedWindow)
    ///     .limit("per-user", Quota::per_minute(100)?)
    ///     .whole_keys()
    ///     .build()?;
    /// assert_eq!(api.redis_keys("{tenant:acme}:alice"), ["{tenant:acme}:alice"]);
    /// # Ok(()) }
    /// ```
    pub fn whole_keys(mut self) -> Self {
        self.whole_keys = true;
        self
    }

    /// Records decision latency and errors into `metrics` (made earlier, e.g. under another
    /// recorder) instead of registering the prefix's own handles when built.
    pub fn metrics(mut self, metrics: RedisMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The limiter; at least one limit is required.
    pub fn build(self) -> Result<RedisLimiter, crate::ConfigError> {
        if self.limits.is_empty() {
            return Err(crate::ConfigError::NoLimits { prefix: self.prefix });
        }
        if !self.algorithm.support().redis {
            return Err(crate::ConfigError::Algorithm { prefix: self.prefix, algorithm: self.algorithm });
        }
        for (i, (name, _)) in self.limits.iter().enumerate() {
            if name.contains(':') {
                return Err(crate::ConfigError::LimitName { prefix: self.prefix, name: name.clone() });
            }
            if self.limits[..i].iter().any(|(earlier, _)| earlier == name) {
                return Err(crate::ConfigError::DuplicateLimit { prefix: self.prefix, name: name.clone() });
            }
        }
        if self.whole_keys && self.limits.len() != 1 {
            return Err(crate::ConfigError::WholeKeys { prefix: self.prefix, limits: self.limits.len() });
        }
        let mut capacity = u64::MAX;
        let mut specs = Vec::with_capacity(self.limits.len());
        for (name, quota) in &self.limits {
            let (params, cap) = params(self.algorithm, quota);
            capacity = capacity.min(cap);
            specs.push(LimitSpec { name: name.clone(), params });
        }
        let window = self.limits.iter().map(|(_, q)| q.period()).max();
        let metrics = LimiterMetrics::new(&self.prefix, self.metrics);
        Ok(RedisLimiter {
            inner: Arc::new(LimiterInner {
                redis: self.redis,
                keyspace: Keyspace::new(format!("{}:", self.prefix)),
                prefix: self.prefix,
                algorithm: self.algorithm,
                limits: specs,
                capacity,
                window,
                failure: self.failure,
                metrics,
                time: self.time,
                system: tollgate::SystemClock::new(),
                max_wait: self.max_wait,
                whole_keys: self.whole_keys,
            }),
        })
    }
}

/// A limiter whose state lives in Redis, shared by every process that uses the same prefix and
/// limit names. Decisions take one round trip; the time is Redis's own.
///
/// ```no_run
/// use tollgate::Quota;
/// use tollgate_redis::{Redis, AlgorithmKind, RedisLimiter};
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let redis = Redis::connect("redis://127.0.0.1/").await?;
/// let api = RedisLimiter::builder(&redis, "api", AlgorithmKind::TokenBucket)
///     .limit("per-user", Quota::per_second(10)?)
///     .build()?;
/// match api.try_acquire("user:42", 1).await {
///     Ok(lease) => println!("go, {} left", lease.remaining()),
///     Err(no) => println!("{} — retry in {:?}", no.reason(), no.retry_after()),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisLimiter {
    inner: Arc<LimiterInner>,
}

struct LimiterInner {
    redis: Redis,
    /// `{prefix}:`, where the keys of a decision are (but for whole keys).
    keyspace: Keyspace,
    prefix: String,
    algorithm: AlgorithmKind,
    limits: Vec<LimitSpec>,
    capacity: u64,
    window: Option<Duration>,
    failure: FailurePolicy,
    metrics: LimiterMetrics,
    time: RedisTime,
    /// Times the round trips for metrics: real time, whatever `time` is.
    system: tollgate::SystemClock,
    max_wait: Option<Duration>,
    whole_keys: bool,
}

/// What a decision does (the scripts' ARGV[3] and ARGV[4]).
#[derive(Clone, Copy)]
enum Mode {
    /// Takes nothing.
    Check,
    /// Takes if it fits now.
    Take,
    /// Takes the earliest slot if it is at most this many µs away (a token bucket's).
    Reserve { max_wait_us: u64 },
}

impl Mode {
    /// ARGV[2] and ARGV[3] of a decision script's call: the mode's number, and the longest wait
    /// (µs) of a reservation (0 otherwise).
    fn args(self) -> (u8, u64) {
        match self {
            Mode::Check => (0, 0),
            Mode::Take => (1, 0),
            Mode::Reserve { max_wait_us } => (2, max_wait_us),
        }
    }
}

/// The script's answer.
struct Reply {
    admitted: bool,
    meta: Meta,
    wait_us: u64,
    /// The decision's time (Redis `TIME`, or the test clock).
    now_us: u64,
}

/// A multi-key decision named a number of keys other than the limiter's number of limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{given} key(s) given for a redis limiter with {limits} limit(s): pass one key per limit, in order")]
pub struct KeyCountError {
    /// Keys passed.
    pub given: usize,
    /// Limits the limiter has (keys it needs).
    pub limits: usize,
}

impl RedisLimiter {
    /// Starts a limiter whose keys start with `prefix`.
    pub fn builder(redis: &Redis, prefix: &str, algorithm: AlgorithmKind) -> RedisLimiterBuilder {
        RedisLimiterBuilder {
            redis: redis.clone(),
            prefix: prefix.to_owned(),
            algorithm,
            limits: Vec::new(),
            failure: FailurePolicy::Deny,
            time: RedisTime::redis(),
            max_wait: None,
            whole_keys: false,
            metrics: None,
        }
    }

    /// Most permits one request can be granted (the smallest of the limits).
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// The longest period among the limits.
    pub fn window(&self) -> Option<Duration> {
        self.inner.window
    }

    /// The Redis keys of a decision on `key`: `{prefix}:{<key>}:<limit name>` — the key is the
    /// hash tag, so all limits of one decision land on one cluster slot — or `key` itself with
    /// [`RedisLimiterBuilder::whole_keys`].
    pub fn redis_keys(&self, key: &str) -> Vec<String> {
        self.keys_for(key, &self.each(&key))
    }

    /// `key` for each limit: a decision on one key (no `Vec` for a limiter of one limit).
    fn each<'k>(&self, key: &'k &'k str) -> Cow<'k, [&'k str]> {
        match self.inner.limits.len() {
            1 => Cow::Borrowed(std::slice::from_ref(key)),
            limits => Cow::Owned(vec![*key; limits]),
        }
    }

    fn keys_for(&self, tag: &str, keys: &[&str]) -> Vec<String> {
        let i = &self.inner;
        i.limits
            .iter()
            .zip(keys)
            .map(|(l, k)| {
                let mut key = Vec::new();
                self.push_key(&mut key, tag, l, k);
                String::from_utf8(key).expect("written from &strs")
            })
            .collect()
    }

    /// The Redis key of limit `l` on `key` under `tag` (see [`RedisLimiter::redis_keys`]),
    /// appended to `out`.
    fn push_key(&self, out: &mut Vec<u8>, tag: &str, l: &LimitSpec, key: &str) {
        let i = &self.inner;
        if i.whole_keys {
            out.extend_from_slice(key.as_bytes());
        } else if key == tag {
            i.keyspace.push_plain_key(out, tag, &[&l.name]);
        } else {
            i.keyspace.push_plain_key(out, tag, &[&l.name, key]);
        }
    }

    /// Counts `charge` against the decision's keys (`charge.lua`), as far as no charge of its
    /// outage counted it before; answers the permits counted now.
    async fn charge(&self, tag: &str, keys: &[&str], charge: Charge) -> Result<u64, BackendError> {
        let i = &self.inner;
        let mut charge_keys = self.keys_for(tag, keys);
        charge_keys.push(self.marker_key(tag, &charge_keys[0], "charged", charge.outage));
        let args = self.args(charge.total, i.algorithm.name().to_owned(), String::new());
        i.redis.invoke(&scripts::CHARGE, &charge_keys, &args).await
    }

    /// Where a script keeps what makes it count once: `charge.lua` the total the charges of one
    /// outage counted (`kind` "charged"), `settle.lua` that a reservation was settled
    /// ("settled"); named by `id`, beside the decision's keys (`first`), in their slot on a
    /// cluster.
    fn marker_key(&self, tag: &str, first: &str, kind: &str, id: u64) -> String {
        let id = format!("{id:016x}");
        if !self.inner.whole_keys {
            return self.inner.keyspace.key(tag, kind, &[id]);
        }
        // The caller's whole key: its hash tag kept, or (a key without one) the key as the tag. A
        // key with a `}` and no tag has no such neighbour; on a cluster its marker fails (CROSSSLOT).
        let beside = format!("{first}:{kind}:{id}");
        if Slot::for_key(&beside) == Slot::for_key(first) { beside } else { format!("{{{first}}}:charged:{id}") }
    }

    /// Takes `n` permits for `key` from every limit, or from none.
    pub async fn try_acquire(&self, key: &str, n: u64) -> Result<Lease, Rejected> {
        self.decide_keys(key, &self.each(&key), n, Mode::Take).await
    }

    /// Several limits on different keys in one atomic decision: `keys[i]` is the key for the
    /// i-th limit (e.g. `["user:42", "tenant:acme"]`). All keys are stored under the hash tag
    /// `tag`; on Redis Cluster choose the coarsest key (the tenant), so that a tenant's counter is
    /// one key shared by all its users. A number of keys other than the number of limits is a
    /// [`KeyCountError`], and nothing is asked of Redis.
    pub async fn try_acquire_keys(
        &self,
        tag: &str,
        keys: &[&str],
        n: u64,
    ) -> Result<Result<Lease, Rejected>, KeyCountError> {
        let limits = self.inner.limits.len();
        if keys.len() != limits {
            return Err(KeyCountError { given: keys.len(), limits });
        }
        Ok(self.decide_keys(tag, keys, n, Mode::Take).await)
    }

    /// Gives back a lease this limiter granted for `key` (by [`RedisLimiter::try_acquire`] or
    /// [`RedisLimiter::acquire`]): one script call restores what it took and still counts (a token
    /// bucket's tokens, a window's count while the window lasts, a log's entries). A lease
    /// admitted by the failure policy is given back where it came from (nothing for
    /// [`FailurePolicy::Allow`], the local limiter for [`FailurePolicy::Local`]). If Redis fails,
    /// the permits stay taken (the safe side) and the error is returned.
    pub async fn give_back(&self, key: &str, lease: Lease) -> Result<(), BackendError> {
        let i = &self.inner;
        if lease.permits() == 0 {
            return Ok(());
        }
        match lease.reason() {
            Reason::Granted => {}
            Reason::Fallback => {
                if let FailurePolicy::Local(local) = &i.failure {
                    local.give_back(key, lease);
                }
                return Ok(());
            }
            // Fail-open leases took nothing.
            _ => return Ok(()),
        }
        let granted_us = (lease.granted_at() / 1000).to_string();
        let args = self.args(lease.permits(), i.algorithm.name().to_owned(), granted_us);
        let keys = self.keys_for(key, &vec![key; i.limits.len()]);
        let _refunded: i64 =
            i.redis.invoke(&scripts::REFUND, &keys, &args).await.inspect_err(|e| i.metrics.error(e))?;
        Ok(())
    }

    /// Settles a reservation this limiter granted for `key` ([`RateLimiter::reserve`], a lease
    /// of its estimate) for `actual` permits, in one script call (`settle.lua`): gives back what
    /// the estimate exceeded (what still counts, as [`RedisLimiter::give_back`]), or charges the
    /// rest past the limits, a debt the key's next requests pay first. Applied once per `id`
    /// (the reservation's, [`tollgate::Reservation::id`]): a settle sent again after an error,
    /// within an hour, changes nothing more.
    ///
    /// A reservation the failure policy granted (Redis could not decide) settles to nothing: its
    /// estimate stands, as the outage counted it. If Redis fails, the error says so and the
    /// settle may be sent again.
    pub async fn settle(&self, key: &str, lease: &Lease, actual: u64, id: u64) -> Result<(), SettleError> {
        if lease.reason() != Reason::Granted || actual == lease.permits() {
            return Ok(());
        }
        let delta = i128::from(actual) - i128::from(lease.permits());
        self.settle_delta(key, delta, lease.granted_at(), id)
            .await
            .map_err(|e| SettleError::Unavailable { id, cause: e.to_string() })
    }

    /// `settle.lua` for a grant of `granted_at` (ns): `delta` > 0 charged, < 0 given back.
    pub(crate) async fn settle_delta(
        &self,
        key: &str,
        delta: i128,
        granted_at: u64,
        id: u64,
    ) -> Result<(), BackendError> {
        let i = &self.inner;
        let mut keys = self.keys_for(key, &vec![key; i.limits.len()]);
        keys.push(self.marker_key(key, &keys[0], "settled", id));
        let mut args = self.args(0, i.algorithm.name().to_owned(), (granted_at / 1000).to_string());
        args[1] = delta.to_string();
        let _settled: i64 = i.redis.invoke(&scripts::SETTLE, &keys, &args).await.inspect_err(|e| i.metrics.error(e))?;
        Ok(())
    }

    /// Forgets what `key` has used: one script call deletes the Redis keys a decision on `key`
    /// uses ([`RedisLimiter::redis_keys`], one per limit, whatever the algorithm), so its next
    /// decision starts full, in every process that shares them. Returns true when any of them
    /// held state (keys expire once they stop mattering, so a key that exists still counted).
    ///
    /// With [`FailurePolicy::Local`], the local limiter forgets the key too, and so does its
    /// debt (what it granted during an outage and has not yet counted in Redis). If Redis fails,
    /// nothing is forgotten anywhere and the error is returned. The keys of decisions made with
    /// [`RedisLimiter::try_acquire_keys`] under another key or tag are not these keys, and are
    /// kept. A lease granted before the reset and given back after it ([`RedisLimiter::give_back`])
    /// restores its permits only where they still count in the fresh state, never beyond full.
    ///
    /// ```no_run
    /// use tollgate::Quota;
    /// use tollgate_redis::{Redis, AlgorithmKind, RedisLimiter};
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = Redis::connect("redis://127.0.0.1/").await?;
    /// let api = RedisLimiter::builder(&redis, "api", AlgorithmKind::FixedWindow)
    ///     .limit("per-user", Quota::per_minute(3)?)
    ///     .build()?;
    /// api.try_acquire("alice", 3).await?;
    /// assert!(api.try_acquire("alice", 1).await.is_err());
    /// assert!(api.reset("alice").await?);
    /// assert_eq!(api.try_acquire("alice", 1).await?.remaining(), 2);
    /// # Ok(()) }
    /// ```
    pub async fn reset(&self, key: &str) -> Result<bool, BackendError> {
        let i = &self.inner;
        let existed: i64 =
            i.redis.invoke(&scripts::RESET, &self.redis_keys(key), &[]).await.inspect_err(|e| i.metrics.error(e))?;
        if let FailurePolicy::Local(local) = &i.failure {
            local.forget(key);
        }
        Ok(existed > 0)
    }

    /// Like [`RedisLimiter::try_acquire`], but a Redis failure is returned as the error it is
    /// instead of being decided by the failure policy (more than the capacity is refused either
    /// way).
    pub async fn try_acquire_or_error(&self, key: &str, n: u64) -> Result<Result<Lease, Rejected>, BackendError> {
        let keys = self.each(&key);
        if n > self.inner.capacity {
            return Ok(Err(self.over_capacity(key, &keys, n).await));
        }
        let answer = self.call(key, &keys, n, Mode::Take).await?;
        Ok(self.outcome(answer, n, false))
    }

    /// Like [`RedisLimiter::check`], but a Redis failure is returned as the error it is instead
    /// of being decided by the failure policy (more than the capacity is refused either way).
    pub async fn check_or_error(&self, key: &str, n: u64) -> Result<Result<Meta, Rejected>, BackendError> {
        let keys = self.each(&key);
        if n > self.inner.capacity {
            return Ok(Err(self.over_capacity(key, &keys, n).await));
        }
        let answer = self.call(key, &keys, n, Mode::Check).await?;
        Ok(self.outcome(answer, n, false).map(|lease| lease.meta()))
    }

    /// Would `n` permits for `key` be granted now? Takes nothing.
    pub async fn check(&self, key: &str, n: u64) -> Result<Meta, Rejected> {
        self.decide_keys(key, &self.each(&key), n, Mode::Check).await.map(|l| l.meta())
    }

    /// Waits for `n` permits for `key`. A token bucket reserves the earliest slot in the same
    /// round trip and sleeps until it (first come, first served across processes); the window
    /// algorithms retry at each `retry_after` (not ordered). Rejects with [`Reason::MaxWait`],
    /// taking nothing, when the wait would exceed `max_wait`.
    pub async fn acquire(&self, key: &str, n: u64) -> Result<Lease, Rejected> {
        let keys = self.each(&key);
        let max_wait_us = self.inner.max_wait.map_or(u64::MAX / 4, |d| d.as_micros() as u64);
        if self.inner.algorithm == AlgorithmKind::TokenBucket {
            // The lease is granted at its slot on Redis's clock; we sleep the same span on ours.
            let asked = self.inner.time.local_now();
            let (lease, wait_us) = self.decide_with(key, &keys, n, Mode::Reserve { max_wait_us }).await?;
            if wait_us > 0 {
                self.inner.time.sleep_until(asked.saturating_add(wait_us.saturating_mul(1000))).await;
            }
            return Ok(lease);
        }
        let start = self.inner.time.local_now();
        loop {
            let rejected = match self.decide_keys(key, &keys, n, Mode::Take).await {
                Ok(lease) => return Ok(lease),
                Err(r) if r.reason() == Reason::Exhausted => r,
                Err(r) => return Err(r),
            };
            let retry = rejected.retry_after().unwrap_or_default().max(Duration::from_micros(1));
            let at = self.inner.time.local_now().saturating_add(retry.as_nanos() as u64);
            if at.saturating_sub(start) / 1000 > max_wait_us {
                return Err(rejected.because(Reason::MaxWait));
            }
            self.inner.time.sleep_until(at).await;
        }
    }

    async fn decide_keys(&self, tag: &str, keys: &[&str], n: u64, mode: Mode) -> Result<Lease, Rejected> {
        self.decide_with(tag, keys, n, mode).await.map(|(lease, _)| lease)
    }

    /// The decision and, for a reservation, the µs until its slot.
    async fn decide_with(&self, tag: &str, keys: &[&str], n: u64, mode: Mode) -> Result<(Lease, u64), Rejected> {
        let i = &self.inner;
        if n > i.capacity {
            return Err(self.over_capacity(tag, keys, n).await);
        }
        let reserve = matches!(mode, Mode::Reserve { .. });
        match self.call(tag, keys, n, mode).await {
            Ok(reply) => {
                let wait_us = reply.wait_us;
                self.outcome(reply, n, reserve).map(|lease| (lease, wait_us))
            }
            Err(error) => {
                tracing::debug!(%error, prefix = %i.prefix, key = tag, "redis decision failed; failure policy decides");
                self.failure_policy(tag, n).map(|lease| (lease, 0))
            }
        }
    }

    /// The refusal of `n` permits, more than the limit's capacity: never granted, so waiting
    /// cannot help (no retry-after), and refused whatever Redis says — a Redis failure is no
    /// error here, nor the failure policy's to decide. It reports the key's state, read from
    /// Redis, as the in-memory limiters do (without Redis: nothing remaining).
    async fn over_capacity(&self, tag: &str, keys: &[&str], n: u64) -> Rejected {
        let meta = match self.call(tag, keys, 0, Mode::Check).await {
            Ok(answer) => answer.meta,
            Err(_) => Meta { limit: self.inner.capacity, remaining: 0, reset_ns: 0, retry_ns: None },
        };
        Rejected::new(Meta { retry_ns: None, ..meta }, n, Reason::ExceedsCapacity)
    }

    /// The failure policy's answer for `n` permits under the hash tag `tag`, counted as its
    /// answer: for a decision whose call to Redis failed (and was counted as an error).
    pub(crate) fn failure_policy(&self, tag: &str, n: u64) -> Result<Lease, Rejected> {
        let i = &self.inner;
        i.metrics.failure_policy(&i.failure);
        i.failure.decide(tag, n, i.capacity)
    }

    fn outcome(&self, answer: Reply, n: u64, reserve: bool) -> Result<Lease, Rejected> {
        if answer.admitted {
            // Granted at the decision's time on Redis's clock (a reservation: at its slot); a
            // refund names this time to find what the grant took.
            let at = answer.now_us.saturating_add(answer.wait_us).saturating_mul(1000);
            Ok(Lease::new(answer.meta, n, at))
        } else if reserve {
            Err(Rejected::new(answer.meta, n, Reason::MaxWait))
        } else {
            Err(Rejected::new(answer.meta, n, Reason::Exhausted))
        }
    }

    /// One decision's round trip(s), timed and its failure counted by kind: real time, even on a
    /// test clock, since it measures Redis, not the limit.
    async fn call(&self, tag: &str, keys: &[&str], n: u64, mode: Mode) -> Result<Reply, BackendError> {
        let i = &self.inner;
        let started = tollgate::Clock::now(&i.system);
        // Held until the call is answered, fails, or is dropped at its deadline.
        let _in_flight = i.failure.calling();
        let reply = self.script(tag, keys, n, mode).await;
        i.metrics.decided(tollgate::Clock::now(&i.system).saturating_sub(started));
        reply.inspect_err(|e| i.metrics.error(e))
    }

    async fn script(&self, tag: &str, keys: &[&str], n: u64, mode: Mode) -> Result<Reply, BackendError> {
        let i = &self.inner;
        // What a local fallback granted for this key during an outage is counted first, once
        // (a charge is idempotent: it may be sent again until one is answered).
        if let Some(charge) = i.failure.pending_charge(tag) {
            self.charge(tag, keys, charge).await?;
            i.failure.charged(tag, charge);
        }
        let (mode, max_wait_us) = mode.args();
        // KEYS and ARGV as `call_args` says, written as bytes into one buffer.
        let mut call = CallWords::with_capacity(
            keys.len() * (i.keyspace.prefix().len() + tag.len() + 40) + 8 * (3 + 2 * i.limits.len()),
        );
        for (l, k) in i.limits.iter().zip(keys) {
            call.key_with(|out| self.push_key(out, tag, l, k));
        }
        call.arg_u64(n);
        call.arg_u64(mode.into());
        call.arg_u64(max_wait_us);
        for l in &i.limits {
            call.arg_u64(l.params[0]);
            call.arg_u64(l.params[1]);
        }
        // Batched with the calls that arrive meanwhile (`Redis::batched`).
        let reply = i.redis.batched(script(i.algorithm), &i.time, call).await?;
        i.failure.answered(tag);
        let get = |k: usize| reply.get(k).unwrap_or(0).max(0) as u64;
        Ok(Reply {
            admitted: get(0) == 1,
            meta: Meta { limit: get(1), remaining: get(2), reset_ns: get(3) * 1000, retry_ns: Some(get(4) * 1000) },
            // meta.reply (all_or_nothing.lua): the wait only when there is one (a missing element reads 0).
            now_us: get(5),
            wait_us: get(6),
        })
    }

    /// ARGV of a decision script's call: n, two script-specific values, then each limit's two
    /// numbers (a batched run takes now and the minimum TTL once, for all its calls).
    fn call_args(&self, n: u64, third: String, fourth: String) -> Vec<String> {
        let i = &self.inner;
        let mut args = Vec::with_capacity(3 + 2 * i.limits.len());
        args.extend([n.to_string(), third, fourth]);
        for l in &i.limits {
            args.extend(l.params.iter().map(u64::to_string));
        }
        args
    }

    /// ARGV of the refund and charge scripts (one call each): now, the call's n and two values,
    /// the minimum TTL, the expiry shift, then each limit's two numbers.
    fn args(&self, n: u64, third: String, fourth: String) -> Vec<String> {
        let time = self.inner.time.script_now();
        let mut args = self.call_args(n, third, fourth);
        args.insert(0, time.now);
        args.insert(4, time.min_ttl_ms.to_string());
        args.insert(5, time.shift_ms.to_string());
        args
    }
}

/// A Redis limiter is a [`RateLimiter`] for any key with a text form: the same decisions as
/// [`RedisLimiter::try_acquire`], and a real refund ([`RedisLimiter::give_back`]; a refund that
/// fails is logged, and leaves the permits taken).
impl<K: RedisKey + ?Sized> RateLimiter<K> for RedisLimiter {
    fn decide(&self, key: &K, n: u64) -> Decision {
        let (limiter, key) = (self.clone(), key.redis_key().into_owned());
        Answer::Pending(Box::pin(async move { limiter.try_acquire(&key, n).await }))
    }

    fn check(&self, key: &K, n: u64) -> Check {
        let (limiter, key) = (self.clone(), key.redis_key().into_owned());
        Answer::Pending(Box::pin(async move { RedisLimiter::check(&limiter, &key, n).await }))
    }

    fn give_back(&self, key: &K, lease: Lease) -> Refund {
        let (limiter, key) = (self.clone(), key.redis_key().into_owned());
        Answer::Pending(Box::pin(async move {
            if let Err(error) = RedisLimiter::give_back(&limiter, &key, lease).await {
                tracing::warn!(%error, prefix = %limiter.inner.prefix, %key, "refund to redis failed; the permits stay taken");
            }
        }))
    }

    fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    fn window(&self) -> Option<Duration> {
        self.inner.window
    }

    fn settle(&self, key: &K, lease: &Lease, actual: u64, id: u64) -> Settle {
        let (limiter, key) = (self.clone(), key.redis_key().into_owned());
        let lease = lease.detached();
        Answer::Pending(Box::pin(async move { RedisLimiter::settle(&limiter, &key, &lease, actual, id).await }))
    }
}

/// Waits as [`RedisLimiter::acquire`] does.
impl<K: RedisKey + ?Sized> Acquire<K> for RedisLimiter {
    fn acquire(&self, key: &K, n: u64) -> impl Future<Output = Result<Lease, Rejected>> + Send {
        let (limiter, key) = (self.clone(), key.redis_key().into_owned());
        async move { RedisLimiter::acquire(&limiter, &key, n).await }
    }
}

impl std::fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = &self.inner;
        f.debug_struct("RedisLimiter")
            .field("prefix", &i.prefix)
            .field("algorithm", &i.algorithm)
            .field("limits", &i.limits)
            .field("failure", &i.failure)
            .field("time", &i.time)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for RedisLimiterBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiterBuilder")
            .field("prefix", &self.prefix)
            .field("algorithm", &self.algorithm)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use tollgate::ManualClock;
    use tollgate_testkit::RedisServer;

    use super::*;

    /// A charge sent again (its answer lost), or landing late after a later one, counts nothing
    /// twice; another outage's charge counts on its own. Every algorithm: each stores its count
    /// its own way.
    #[tokio::test]
    async fn a_charge_counts_what_no_charge_of_its_outage_counted() {
        let server = RedisServer::start();
        let redis = Redis::connect(&server.url()).await.unwrap();
        let clock = ManualClock::new();
        for algorithm in [
            AlgorithmKind::TokenBucket,
            AlgorithmKind::FixedWindow,
            AlgorithmKind::WeightedWindow,
            AlgorithmKind::SlidingLog,
        ] {
            let l = RedisLimiter::builder(&redis, &format!("charged:{algorithm:?}"), algorithm)
                .limit("l", Quota::per_minute(100).unwrap())
                .time(RedisTime::clock(clock.clone()))
                .build()
                .unwrap();
            let remaining = async || l.check("k", 0).await.unwrap().remaining;
            let charge = async |outage, total| l.charge("k", &["k"], Charge { outage, total }).await.unwrap();
            assert_eq!(charge(7, 5).await, 5, "{algorithm:?}");
            assert_eq!(charge(7, 5).await, 0, "{algorithm:?}: the same charge again");
            assert_eq!(remaining().await, 95, "{algorithm:?}");
            assert_eq!(charge(7, 8).await, 3, "{algorithm:?}: the outage granted 3 more");
            assert_eq!(charge(7, 6).await, 0, "{algorithm:?}: an earlier charge, late");
            assert_eq!(remaining().await, 92, "{algorithm:?}");
            assert_eq!(charge(8, 4).await, 4, "{algorithm:?}: another outage");
            assert_eq!(remaining().await, 88, "{algorithm:?}");
        }
    }
}
