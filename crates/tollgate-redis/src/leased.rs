//! [`LeasedLimiter`]: a hot key's shared budget spent at in-process speed, with no over-admission.
//!
//! A process takes a lease on a slice of a key's fixed-window budget in one script call — the
//! tokens leave the shared budget atomically, as any grant does — and spends it locally until the
//! window ends. Every admission spends a token some process took from Redis in that window, so
//! the sum of admissions across processes never exceeds the limit. The cost is under-admission:
//! tokens parked in a lease that its process does not spend before the window ends. It is bounded
//! by the leases outstanding, and kept small by sizing each lease from the process's own recent
//! rate (what it will spend in the next [`horizon`](LeasedLimiterBuilder::horizon)), capped at a
//! quarter of what the budget has left, so leases shrink to single permits near exhaustion.
//! [`LeasedLimiter::release`] gives the unspent part back (on shutdown).
//!
//! A lease ends no later than its window: its end is measured on this process's clock from the
//! moment the request left, so the round trip can only shorten it. A grant whose answer does not
//! arrive within the deadline is lost until its window ends (the safe side: under-admission), and
//! the failure policy decides that request.
//!
//! Fixed windows only. A token bucket's tokens cannot be leased this way without breaking its
//! bound: a token taken now and spent later is spent in a later interval than the one that paid
//! for it, so an interval could see the burst plus every lease held at its start.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate::{
    Acquire, AlgorithmKind, Answer, Check, Clock, Decision, Lease, Meta, Quota, RateLimiter, Reason, Refund, Rejected,
    Settle, SettleError, SystemClock,
};

use crate::backend::Redis;
use crate::error::BackendError;
use crate::failure::FailurePolicy;
use crate::key::RedisKey;
use crate::limiter::{RedisLimiter, RedisLimiterBuilder};
use crate::metrics::RedisMetrics;
use crate::time::RedisTime;

/// The largest share of what a budget has left that one lease takes.
const SHARE: u64 = 4;

/// Keys kept before the first sweep of idle ones.
const SWEEP_FLOOR: usize = 1024;

/// Builds a [`LeasedLimiter`].
#[must_use = "a builder does nothing until .build()"]
pub struct LeasedLimiterBuilder<C: Clock = SystemClock> {
    /// The budget's own builder (a fixed window of the quota), which keeps the settings the two
    /// limiters share: the failure policy, whose clock times the windows, whole keys, metrics.
    budget: RedisLimiterBuilder,
    quota: Quota,
    clock: C,
    horizon: Duration,
    max_key_bytes: usize,
}

impl<C: Clock> LeasedLimiterBuilder<C> {
    /// Most bytes the state this process keeps per key may take in all (default: no cap): each
    /// key's text and its entry. A new key that would pass it is decided in Redis, one round trip
    /// per request with nothing kept here (no lease, so no under-admission either), until idle
    /// keys make room. For keys a client chooses, which would otherwise grow the state by every
    /// distinct key asked for within a window.
    pub fn max_key_bytes(mut self, max_key_bytes: usize) -> Self {
        self.max_key_bytes = max_key_bytes;
        self
    }

    /// How far ahead a lease is sized: what this process spent per second recently, times this
    /// (default 100 ms). Longer: fewer round trips, more tokens parked when traffic moves.
    pub fn horizon(mut self, horizon: Duration) -> Self {
        self.horizon = horizon;
        self
    }

    /// What to answer when Redis fails to grant a lease (default [`FailurePolicy::Deny`]). A lease
    /// already held keeps being spent; none is renewed until Redis answers.
    pub fn failure_policy(self, policy: FailurePolicy) -> Self {
        self.with_budget(|b| b.failure_policy(policy))
    }

    /// Times leases on `clock` (default: the system clock). Whose clock times the windows in
    /// Redis is [`time`](Self::time)'s to say: a test on a [`tollgate::ManualClock`] passes
    /// the same clock to both.
    pub fn clock<D: Clock>(self, clock: D) -> LeasedLimiterBuilder<D> {
        LeasedLimiterBuilder {
            budget: self.budget,
            quota: self.quota,
            clock,
            horizon: self.horizon,
            max_key_bytes: self.max_key_bytes,
        }
    }

    /// Whose clock times the windows in Redis (default [`RedisTime::redis`];
    /// [`RedisLimiterBuilder::time`](crate::RedisLimiterBuilder::time)).
    ///
    /// ```no_run
    /// use tollgate::{ManualClock, Quota};
    /// use tollgate_redis::{LeasedLimiter, Redis, RedisTime};
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = Redis::connect("redis://127.0.0.1/").await?;
    /// let clock = ManualClock::new();
    /// let tenant = LeasedLimiter::builder(&redis, "test", Quota::per_second(100)?)
    ///     .clock(clock.clone())
    ///     .time(RedisTime::clock(clock))
    ///     .build()?;
    /// # let _ = tenant; Ok(()) }
    /// ```
    pub fn time(self, time: RedisTime) -> Self {
        self.with_budget(|b| b.time(time))
    }

    /// Uses each key as its Redis key, whole ([`RedisLimiterBuilder::whole_keys`]): the caller's
    /// own layout, e.g. the rate-limit server's counter keys.
    ///
    /// [`RedisLimiterBuilder::whole_keys`]: crate::RedisLimiterBuilder::whole_keys
    pub fn whole_keys(self) -> Self {
        self.with_budget(RedisLimiterBuilder::whole_keys)
    }

    /// Records the lease calls' latency and errors into `metrics`
    /// ([`RedisLimiterBuilder::metrics`](crate::RedisLimiterBuilder::metrics)).
    pub fn metrics(self, metrics: RedisMetrics) -> Self {
        self.with_budget(|b| b.metrics(metrics))
    }

    /// Sets one of the shared settings on the budget's builder.
    fn with_budget(mut self, set: impl FnOnce(RedisLimiterBuilder) -> RedisLimiterBuilder) -> Self {
        self.budget = set(self.budget);
        self
    }

    /// The limiter.
    pub fn build(self) -> Result<LeasedLimiter<C>, crate::ConfigError> {
        Ok(LeasedLimiter {
            inner: Arc::new(Inner {
                budget: self.budget.build()?,
                limit: self.quota.limit(),
                window: self.quota.period(),
                clock: self.clock,
                horizon_ns: u64::try_from(self.horizon.as_nanos()).unwrap_or(u64::MAX),
                slices: Mutex::new(Slices {
                    map: HashMap::new(),
                    sweep_at: SWEEP_FLOOR,
                    bytes: 0,
                    max_bytes: self.max_key_bytes,
                    full_swept_at: None,
                }),
            }),
        })
    }
}

/// A fixed-window limit shared through Redis, spent from local leases: the decisions of
/// [`RedisLimiter`] (fixed window) at in-process speed while a lease lasts, never admitting more
/// than the limit across processes. Leases are sized from this process's recent rate and end
/// with their window; what is unspent when a window ends is lost (under-admission, bounded by the
/// leases outstanding).
///
/// ```no_run
/// use tollgate::Quota;
/// use tollgate_redis::{LeasedLimiter, Redis};
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let redis = Redis::connect("redis://127.0.0.1/").await?;
/// let tenant = LeasedLimiter::builder(&redis, "quota", Quota::per_second(10_000)?).build()?;
/// let lease = tenant.try_acquire("acme", 1).await?; // the first call leases from Redis
/// let again = tenant.try_acquire("acme", 1).await?; // later ones spend locally while it lasts
/// # let _ = (lease, again);
/// tenant.release().await?; // on shutdown: what was leased and not spent goes back
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LeasedLimiter<C: Clock = SystemClock> {
    inner: Arc<Inner<C>>,
}

struct Inner<C: Clock> {
    budget: RedisLimiter,
    limit: u64,
    window: Duration,
    clock: C,
    horizon_ns: u64,
    slices: Mutex<Slices>,
}

/// What this process holds, by key. A key idle for a window (its lease over, not asked for) is
/// dropped when new keys come, so a flood of distinct keys does not grow it without bound: a
/// sweep runs when the map has doubled since the last one (amortized constant work per new key).
struct Slices {
    map: HashMap<String, Slice>,
    /// The size at which the next new key sweeps.
    sweep_at: usize,
    /// What the keys weigh ([`Slices::weight`]), and the cap on that.
    bytes: usize,
    max_bytes: usize,
    /// When a new key last swept the whole map for room (at the cap, at most once per
    /// [`FULL_SWEEPS`]th of a window: a sweep is a pass over every key, and keys go idle with
    /// time, so a flood of new keys at the cap costs no pass per key).
    full_swept_at: Option<u64>,
}

/// At the byte cap, the whole map is swept for idle keys at most this many times a window.
const FULL_SWEEPS: u64 = 16;

impl Slices {
    /// What the state of `key` weighs: its text and its entry.
    fn weight(key: &str) -> usize {
        key.len() + size_of::<(String, Slice)>()
    }

    /// Drops the slices idle at `now` for a window of `window_ns`, if the map has grown enough
    /// (or, with `full`, whatever its size: a key is waiting for room).
    fn sweep(&mut self, now: u64, window_ns: u64, full: bool) {
        if self.map.len() < self.sweep_at && !full {
            return;
        }
        self.retain(|_, s| now < s.ends || now < s.spent_until || now.saturating_sub(s.since) < window_ns);
        self.sweep_at = (self.map.len() * 2).max(SWEEP_FLOOR);
    }

    fn retain(&mut self, mut keep: impl FnMut(&str, &Slice) -> bool) {
        let bytes = &mut self.bytes;
        self.map.retain(|key, slice| {
            let kept = keep(key, slice);
            if !kept {
                *bytes -= Slices::weight(key);
            }
            kept
        });
    }

    fn get_mut(&mut self, key: &str) -> Option<&mut Slice> {
        self.map.get_mut(key)
    }

    /// The slice of `key`, made by `new` if there is none and the cap leaves room for it (after
    /// a sweep of idle keys when it does not); `None` when it does not.
    fn get_or_insert(
        &mut self,
        key: &str,
        now: u64,
        window_ns: u64,
        new: impl FnOnce() -> Slice,
    ) -> Option<&mut Slice> {
        if !self.map.contains_key(key) {
            self.sweep(now, window_ns, false);
            let weight = Slices::weight(key);
            if self.bytes.saturating_add(weight) > self.max_bytes {
                if self.full_swept_at.is_none_or(|at| now.saturating_sub(at) >= window_ns / FULL_SWEEPS) {
                    self.full_swept_at = Some(now);
                    self.sweep(now, window_ns, true);
                }
                if self.bytes.saturating_add(weight) > self.max_bytes {
                    return None;
                }
            }
            self.bytes += weight;
            self.map.insert(key.to_owned(), new());
        }
        self.map.get_mut(key)
    }
}

impl std::ops::Deref for Slices {
    type Target = HashMap<String, Slice>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

/// What this process holds of one key's budget.
#[derive(Clone, Copy, Debug, Default)]
struct Slice {
    /// Leased and not yet spent.
    left: u64,
    /// When the lease's window ends, on this process's clock (ns); spent only before.
    ends: u64,
    /// When the first lease of that window was asked for (this process's clock, ns): leases
    /// granted here since belong to it.
    opened: u64,
    /// The budget as Redis reported it at the last grant (its `remaining` excludes what was leased).
    meta: Meta,
    /// When Redis granted the last lease (Redis's clock, ns): what a refund names.
    granted_at: u64,
    /// Until when (this process's clock, ns) Redis said the budget has less than was asked: requests
    /// larger than what it had left, plus what is held here, are rejected here until then.
    spent_until: u64,
    /// Permits asked for since `since`, and the rate they made (per second) before.
    asked: u64,
    since: u64,
    rate: f64,
}

impl Slice {
    fn live(&self, now: u64) -> u64 {
        if now < self.ends { self.left } else { 0 }
    }

    /// The state a caller is told: the budget's remaining at the last grant plus what is held here.
    fn meta(&self, now: u64, limit: u64) -> Meta {
        let remaining = self.meta.remaining.saturating_add(self.live(now)).min(limit);
        let reset_ns = self.ends.saturating_sub(now);
        Meta { limit, remaining, reset_ns, retry_ns: Some(if remaining > 0 { 0 } else { reset_ns }) }
    }
}

impl LeasedLimiter<SystemClock> {
    /// A limiter of `quota` (a fixed window) per key, its budgets under `prefix` in `redis`.
    pub fn builder(redis: &Redis, prefix: &str, quota: Quota) -> LeasedLimiterBuilder {
        LeasedLimiterBuilder {
            budget: RedisLimiter::builder(redis, prefix, AlgorithmKind::FixedWindow).limit("leased", quota),
            quota,
            clock: SystemClock::new(),
            horizon: Duration::from_millis(100),
            max_key_bytes: usize::MAX,
        }
    }
}

impl<C: Clock> LeasedLimiter<C> {
    /// Spends `n` permits of `key` from the lease this process holds, if it holds enough; never
    /// waits, never asks Redis.
    pub fn try_local(&self, key: &str, n: u64) -> Option<Lease> {
        self.try_local_or_reject(key, n)?.ok()
    }

    /// A decision without Redis: from the lease held, or a rejection while Redis has said the
    /// window's budget is spent; `None` when Redis must be asked.
    fn try_local_or_reject(&self, key: &str, n: u64) -> Option<Result<Lease, Rejected>> {
        let now = self.inner.clock.now();
        let mut slices = self.inner.slices.lock().unwrap_or_else(|e| e.into_inner());
        let slice = slices.get_mut(key)?;
        slice.asked = slice.asked.saturating_add(n);
        let limit = self.inner.limit;
        // A probe (n == 0) is answered here while a lease of this window is known: Redis's own
        // `remaining` would leave out what is held here.
        if slice.live(now) >= n && (n > 0 || now < slice.ends) {
            slice.left -= n;
            return Some(Ok(Lease::new(slice.meta(now, limit), n, now)));
        }
        // Redis's `remaining` only falls within a window (but for releases): a request larger
        // than what it last said, plus what is held here, would be refused.
        if now < slice.spent_until && n <= limit && n > slice.meta.remaining.saturating_add(slice.live(now)) {
            let mut meta = slice.meta(now, limit);
            meta.reset_ns = slice.spent_until - now;
            meta.retry_ns = Some(meta.reset_ns);
            return Some(Err(Rejected::new(meta, n, Reason::Exhausted)));
        }
        None
    }

    /// Takes `n` permits for `key`: from this process's lease, or from a new lease taken from
    /// Redis (one round trip) sized to what this process will spend next. Once Redis has refused a
    /// request, requests larger than what it said is left (plus what is held here) are rejected
    /// here, without a round trip, until that window ends (permits another process releases
    /// meanwhile are seen at the next refusal's round trip, or the next window).
    pub async fn try_acquire(&self, key: &str, n: u64) -> Result<Lease, Rejected> {
        match self.try_acquire_or_error(key, n).await {
            Ok(decided) => decided,
            Err(error) => {
                // Decided at once: asking Redis again would make each decision of an outage wait
                // for a second failure.
                tracing::debug!(%error, key, "lease from redis failed; the failure policy decides");
                self.inner.budget.failure_policy(key, n)
            }
        }
    }

    /// Like [`LeasedLimiter::try_acquire`], but a Redis failure is returned as the error it is
    /// instead of being decided by the failure policy (a lease held here is still spent).
    pub async fn try_acquire_or_error(&self, key: &str, n: u64) -> Result<Result<Lease, Rejected>, BackendError> {
        if let Some(decided) = self.try_local_or_reject(key, n) {
            return Ok(decided);
        }
        let i = &*self.inner;
        if n > i.limit || n == 0 {
            // Never grantable, or a probe: the budget answers as it is.
            return i.budget.try_acquire_or_error(key, n).await;
        }
        let sent = i.clock.now();
        let Some((held, size)) = self.plan(key, n, sent) else {
            // No room to keep a slice of this key: the budget decides this request alone.
            return i.budget.try_acquire_or_error(key, n).await;
        };
        let need = n - held;
        let mut asked = size;
        loop {
            match i.budget.try_acquire_or_error(key, asked).await? {
                Ok(grant) => return Ok(self.spend(key, n, sent, grant)),
                Err(no) if no.reason() == Reason::Exhausted && no.remaining() >= need && asked > no.remaining() => {
                    // Less than the lease wanted is left, enough for this request: take what is.
                    asked = no.remaining();
                }
                Err(no) => {
                    if no.reason() == Reason::Exhausted {
                        let mut slices = i.slices.lock().unwrap_or_else(|e| e.into_inner());
                        if let Some(slice) = slices.get_mut(key) {
                            slice.spent_until = sent.saturating_add(no.meta().reset_ns);
                            slice.meta = no.meta();
                        }
                    }
                    // What is held here counts as remaining too (it was not enough).
                    let mut meta = no.meta();
                    meta.remaining = meta.remaining.saturating_add(held).min(i.limit);
                    return Ok(Err(Rejected::new(meta, n, no.reason())));
                }
            }
        }
    }

    /// Would `n` permits for `key` be granted now? Takes nothing: answered from the lease held
    /// here when it has room, else by Redis (its `remaining` plus what is held here). A Redis
    /// failure is returned as the error it is.
    pub async fn check_or_error(&self, key: &str, n: u64) -> Result<Result<Meta, Rejected>, BackendError> {
        let i = &*self.inner;
        let now = i.clock.now();
        let held = {
            let slices = i.slices.lock().unwrap_or_else(|e| e.into_inner());
            match slices.get(key) {
                Some(slice) if slice.live(now) >= n && (n > 0 || now < slice.ends) => {
                    return Ok(Ok(slice.meta(now, i.limit)));
                }
                Some(slice) => slice.live(now),
                None => 0,
            }
        };
        let with_held = |mut meta: Meta| {
            meta.remaining = meta.remaining.saturating_add(held).min(i.limit);
            meta
        };
        Ok(match i.budget.check_or_error(key, n.saturating_sub(held)).await? {
            Ok(meta) => Ok(with_held(meta)),
            Err(no) => Err(Rejected::new(with_held(no.meta()), n, no.reason())),
        })
    }

    /// Forgets what this process holds of every key `forget` chooses (after their counters were
    /// reset in Redis: tokens leased from the old window must not be spent in the new one).
    pub fn forget(&self, mut forget: impl FnMut(&str) -> bool) {
        let mut slices = self.inner.slices.lock().unwrap_or_else(|e| e.into_inner());
        slices.retain(|key, _| !forget(key));
    }

    /// What this process holds of `key` that is live, and how many permits to lease next: what it
    /// asked for per second recently times the horizon, at most a share of what the budget had
    /// left at the last grant, at least what this request lacks. `None` when the key has no
    /// slice and [`LeasedLimiterBuilder::max_key_bytes`] leaves no room for one.
    fn plan(&self, key: &str, n: u64, now: u64) -> Option<(u64, u64)> {
        let i = &*self.inner;
        let mut slices = i.slices.lock().unwrap_or_else(|e| e.into_inner());
        let window_ns = u64::try_from(i.window.as_nanos()).unwrap_or(u64::MAX);
        let slice = slices.get_or_insert(key, now, window_ns, || Slice {
            since: now,
            meta: Meta { limit: i.limit, remaining: i.limit, reset_ns: 0, retry_ns: None },
            ..Slice::default()
        })?;
        let elapsed = now.saturating_sub(slice.since);
        if elapsed > 0 {
            let observed = slice.asked as f64 * 1e9 / elapsed as f64;
            slice.rate = if slice.rate == 0.0 { observed } else { (slice.rate + observed) / 2.0 };
            slice.asked = 0;
            slice.since = now;
        }
        let held = slice.live(now);
        let need = n.saturating_sub(held);
        let want = (slice.rate * i.horizon_ns as f64 / 1e9).ceil() as u64;
        // After its window, the budget starts full again.
        let left = if now < slice.ends { slice.meta.remaining } else { i.limit };
        let cap = (left / SHARE).max(1);
        Some((held, want.min(cap).max(need).min(i.limit)))
    }

    /// A grant of `grant.permits()` arrived for a request of `n`: the request spends `n` from what
    /// is held now and the grant, the rest is held until the window ends. Other requests may have
    /// spent what was held while the grant was on its way: if the two no longer make `n`, the
    /// request is refused and both are kept here.
    fn spend(&self, key: &str, n: u64, sent: u64, grant: Lease) -> Result<Lease, Rejected> {
        let i = &*self.inner;
        if grant.reason() != Reason::Granted {
            // The failure policy's answer for this request alone: nothing to hold.
            return Ok(grant);
        }
        let now = i.clock.now();
        let mut slices = i.slices.lock().unwrap_or_else(|e| e.into_inner());
        let window_ns = u64::try_from(i.window.as_nanos()).unwrap_or(u64::MAX);
        // Made by `plan` just before, unless a reset or a sweep dropped it meanwhile and there is
        // no room for it now: the grant is then spent from a slice kept nowhere (what it holds
        // beyond `n` is lost with it, the safe side).
        let mut unkept = Slice::default();
        let slice = slices.get_or_insert(key, now, window_ns, Slice::default).unwrap_or(&mut unkept);
        let ends = sent.saturating_add(grant.meta().reset_ns);
        let held = slice.live(now);
        let total = held + grant.permits();
        if held > 0 {
            // Tokens of this window were still held: they all end with the earlier estimate.
            slice.ends = slice.ends.min(ends);
        } else {
            slice.ends = ends;
            slice.opened = sent;
        }
        slice.meta = grant.meta();
        slice.granted_at = grant.granted_at();
        if total < n {
            slice.left = total;
            return Err(Rejected::new(slice.meta(now, i.limit), n, Reason::Exhausted));
        }
        slice.left = total - n;
        Ok(Lease::new(slice.meta(now, i.limit), n, now))
    }

    /// Gives a lease this limiter granted for `key` back: to this process's slice of the budget
    /// while its window lasts (spent again here, or returned by [`LeasedLimiter::release`]); a
    /// lease of an ended window restores nothing. A lease the failure policy granted goes back
    /// where it came from ([`RedisLimiter::give_back`]).
    pub async fn give_back(&self, key: &str, lease: Lease) -> Result<(), BackendError> {
        if lease.reason() != Reason::Granted {
            return self.inner.budget.give_back(key, lease).await;
        }
        self.to_slice(key, lease.permits(), lease.granted_at());
        Ok(())
    }

    /// Puts `n` permits granted at `granted_at` back in `key`'s slice, while its window lasts.
    fn to_slice(&self, key: &str, n: u64, granted_at: u64) {
        let now = self.inner.clock.now();
        let mut slices = self.inner.slices.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slice) = slices.get_mut(key)
            && now < slice.ends
            && granted_at >= slice.opened
        {
            slice.left = slice.left.saturating_add(n);
        }
    }

    /// Settles a reservation this limiter granted for `key` for `actual` permits: what the
    /// estimate exceeded goes back to this process's slice (as [`LeasedLimiter::give_back`]); a
    /// cost above it is taken from the slice first, and what the slice does not hold is charged
    /// to the key's budget in Redis past its limit (`settle.lua`, once per `id`, so a settle sent
    /// again after an error charges nothing twice). A reservation the failure policy granted
    /// settles as [`RedisLimiter::settle`] does.
    pub async fn settle(&self, key: &str, lease: &Lease, actual: u64, id: u64) -> Result<(), SettleError> {
        let estimate = lease.permits();
        if lease.reason() != Reason::Granted {
            return self.inner.budget.settle(key, lease, actual, id).await;
        }
        if actual <= estimate {
            self.to_slice(key, estimate - actual, lease.granted_at());
            return Ok(());
        }
        let now = self.inner.clock.now();
        let mut owed = actual - estimate;
        let from_slice = {
            let mut slices = self.inner.slices.lock().unwrap_or_else(|e| e.into_inner());
            match slices.get_mut(key) {
                Some(slice) if now < slice.ends => {
                    let k = slice.left.min(owed);
                    slice.left -= k;
                    k
                }
                _ => 0,
            }
        };
        owed -= from_slice;
        if owed == 0 {
            return Ok(());
        }
        let charged = self.inner.budget.settle_delta(key, i128::from(owed), lease.granted_at(), id).await;
        charged.map_err(|e| {
            // Nothing settled: what the slice gave goes back, so that a settle sent again takes it once.
            self.to_slice(key, from_slice, now);
            SettleError::Unavailable { id, cause: e.to_string() }
        })
    }

    /// Keys this process keeps state for (a lease, a rate): the ones idle for a window are
    /// dropped as new keys come.
    pub fn keys(&self) -> usize {
        self.inner.slices.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// What the state kept per key weighs now (see [`LeasedLimiterBuilder::max_key_bytes`]).
    pub fn key_bytes(&self) -> usize {
        self.inner.slices.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }

    /// Permits of `key` this process holds and has not spent (0 once the window ended).
    pub fn held(&self, key: &str) -> u64 {
        let now = self.inner.clock.now();
        let slices = self.inner.slices.lock().unwrap_or_else(|e| e.into_inner());
        slices.get(key).map_or(0, |s| s.live(now))
    }

    /// Returns every live lease's unspent permits to Redis (call it on shutdown); returns how many
    /// went back. A lease whose return fails stays taken until its window ends (the safe side).
    pub async fn release(&self) -> Result<u64, BackendError> {
        let i = &*self.inner;
        let now = i.clock.now();
        let held: Vec<(String, Slice)> = {
            let mut slices = i.slices.lock().unwrap_or_else(|e| e.into_inner());
            slices
                .map
                .iter_mut()
                .filter(|(_, s)| s.live(now) > 0)
                .map(|(k, s)| {
                    let slice = *s;
                    s.left = 0;
                    (k.clone(), slice)
                })
                .collect()
        };
        let mut returned = 0;
        for (key, slice) in held {
            let lease = Lease::new(slice.meta, slice.left, slice.granted_at);
            i.budget.give_back(&key, lease).await?;
            returned += slice.left;
        }
        Ok(returned)
    }

    /// Most permits one request can be granted: the limit.
    pub fn capacity(&self) -> u64 {
        self.inner.limit
    }
}

/// A leased limiter is a [`RateLimiter`] for any key with a text form: a decision from a held lease
/// is [`Answer::Ready`] (no allocation, no I/O); one that needs a new lease is
/// [`Answer::Pending`].
impl<K: RedisKey + ?Sized, C: Clock> RateLimiter<K> for LeasedLimiter<C> {
    fn decide(&self, key: &K, n: u64) -> Decision {
        let key = key.redis_key();
        if let Some(lease) = self.try_local(&key, n) {
            return Answer::Ready(Ok(lease));
        }
        let (limiter, key) = (self.clone(), key.into_owned());
        Answer::Pending(Box::pin(async move { limiter.try_acquire(&key, n).await }))
    }

    fn check(&self, key: &K, n: u64) -> Check {
        let key = key.redis_key();
        let now = self.inner.clock.now();
        {
            let slices = self.inner.slices.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(slice) = slices.get(&*key).filter(|s| s.live(now) >= n) {
                return Answer::Ready(Ok(slice.meta(now, self.inner.limit)));
            }
        }
        let (limiter, key) = (self.clone(), key.into_owned());
        Answer::Pending(Box::pin(async move { limiter.inner.budget.check(&key, n).await }))
    }

    fn give_back(&self, key: &K, lease: Lease) -> Refund {
        let (limiter, key) = (self.clone(), key.redis_key().into_owned());
        Answer::Pending(Box::pin(async move {
            if let Err(error) = limiter.give_back(&key, lease).await {
                tracing::warn!(%error, %key, "refund to redis failed; the permits stay taken");
            }
        }))
    }

    fn capacity(&self) -> u64 {
        self.inner.limit
    }

    fn settle(&self, key: &K, lease: &Lease, actual: u64, id: u64) -> Settle {
        let (limiter, key) = (self.clone(), key.redis_key().into_owned());
        let lease = lease.detached();
        Answer::Pending(Box::pin(async move { LeasedLimiter::settle(&limiter, &key, &lease, actual, id).await }))
    }

    fn window(&self) -> Option<Duration> {
        Some(self.inner.window)
    }
}

/// Waits as [`RedisLimiter::acquire`] does when no lease has room.
impl<K: RedisKey + ?Sized, C: Clock> Acquire<K> for LeasedLimiter<C> {
    fn acquire(&self, key: &K, n: u64) -> impl std::future::Future<Output = Result<Lease, Rejected>> + Send {
        let (limiter, key) = (self.clone(), key.redis_key().into_owned());
        async move {
            match limiter.try_acquire(&key, n).await {
                Err(no) if no.reason() == Reason::Exhausted => limiter.inner.budget.acquire(&key, n).await,
                decided => decided,
            }
        }
    }
}

impl<C: Clock> std::fmt::Debug for LeasedLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = &*self.inner;
        f.debug_struct("LeasedLimiter")
            .field("budget", &i.budget)
            .field("limit", &i.limit)
            .field("horizon", &Duration::from_nanos(i.horizon_ns))
            .finish_non_exhaustive()
    }
}

impl<C: Clock> std::fmt::Debug for LeasedLimiterBuilder<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasedLimiterBuilder")
            .field("prefix", &self.budget.prefix)
            .field("quota", &self.quota)
            .field("horizon", &self.horizon)
            .field("time", &self.budget.time)
            .finish_non_exhaustive()
    }
}
