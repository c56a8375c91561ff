//! Token bucket with interval replenishment (.NET's `TokenBucketRateLimiter`): tokens are added in
//! steps (at multiples of the step's interval since the clock's origin), up to `burst`; or, in
//! manual mode, only when [`crate::Limiter::replenish`] is called.
//!
//! A [`Quota`] means the same rate here as on every other algorithm: `limit` per `period`. When the
//! burst holds a whole period's tokens, a step is `limit` tokens every `period`; when it holds
//! fewer, a step is `burst` tokens every `period × burst / limit` (rounded up to the nanosecond, so
//! the rate is never above the quota's). .NET's own triple — tokens per period, period, token
//! limit — is [`IntervalBucket::replenishing`].

use std::sync::Mutex;

use crate::algorithm::Algorithm;
use crate::quota::{Quota, QuotaError};
use crate::seqlock::SeqCell;
use crate::snapshot::{Meta, Snapshot};

/// Token bucket refilled in steps.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{IntervalBucket, Limiter, ManualClock, Quota};
/// let clock = ManualClock::new();
/// // 5 tokens every 100 ms, at most 10 stored.
/// let quota = Quota::per(Duration::from_millis(100), 5)?.with_burst(10)?;
/// let limiter = Limiter::builder(IntervalBucket::new(quota)).clock(clock.clone()).build();
/// let _ = limiter.try_acquire(10).unwrap();
/// assert_eq!(limiter.try_acquire(6).unwrap_err().retry_after(), Some(Duration::from_millis(200)));
/// clock.advance(Duration::from_millis(100));
/// assert_eq!(limiter.try_acquire(0).unwrap().remaining(), 5);
///
/// // 100 per second with a burst of 20: 20 tokens every 200 ms, still 100 per second.
/// let quota = Quota::per_second(100)?.with_burst(20)?;
/// let limiter = Limiter::builder(IntervalBucket::new(quota)).clock(clock.clone()).build();
/// let _ = limiter.try_acquire(20).unwrap();
/// clock.advance(Duration::from_millis(200));
/// assert_eq!(limiter.try_acquire(0).unwrap().remaining(), 20);
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
///
/// Quota changes keep the tokens already spent: a bucket `k` short of its old burst is `k` short
/// of its new one.
pub struct IntervalBucket {
    /// The step: `limit` tokens every `period`, up to `burst` (read on every decision).
    quota: SeqCell<Quota>,
    /// What the caller configured (its rate and window).
    config: SeqCell<Quota>,
    auto: bool,
    /// Built from .NET's triple: the configuration is the step itself.
    exact: bool,
}

impl std::fmt::Debug for IntervalBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntervalBucket")
            .field("config", &self.config.load())
            .field("step", &self.quota.load())
            .field("auto", &self.auto)
            .finish()
    }
}

/// The state of one [`IntervalBucket`].
#[derive(Debug)]
pub struct IntervalBucketState(Mutex<Tokens>);

#[derive(Debug, Clone, Copy)]
struct Tokens {
    /// Tokens stored; below 0, tokens owed by a reservation settled past what was left
    /// ([`Algorithm::charge`]), paid from the next tokens before any is stored. One signed word,
    /// so the state is no bigger for it.
    level: i64,
    tick: u64,
}

impl Tokens {
    fn new(tokens: u64, tick: u64) -> Tokens {
        Tokens { level: i64::try_from(tokens).unwrap_or(i64::MAX), tick }
    }

    fn with_level(self, level: i128) -> Tokens {
        Tokens { level: level.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64, ..self }
    }

    /// Tokens stored (0 while some are owed).
    fn tokens(self) -> u64 {
        self.level.max(0).unsigned_abs()
    }

    /// Tokens owed.
    fn debt(self) -> u64 {
        self.level.min(0).unsigned_abs()
    }

    /// `n` tokens arrive (or come back): the debt is paid first, the rest stored up to `burst`.
    fn credited(self, n: u64, burst: u64) -> Tokens {
        self.with_level((i128::from(self.level) + i128::from(n)).min(i128::from(burst)))
    }

    /// `n` tokens taken, past what is stored if need be (a debt).
    fn taken(self, n: u64) -> Tokens {
        self.with_level(i128::from(self.level) - i128::from(n))
    }

    /// Tokens short of a full bucket, the debt included.
    fn missing(self, burst: u64) -> u64 {
        u64::try_from((i128::from(burst) - i128::from(self.level)).max(0)).unwrap_or(u64::MAX)
    }
}

impl IntervalBucket {
    /// `quota.limit()` tokens per `quota.period()`, up to `quota.burst()` stored, added in steps
    /// (see the module docs: a burst smaller than the limit makes the steps smaller and more
    /// frequent, never the rate lower).
    pub fn new(quota: Quota) -> IntervalBucket {
        IntervalBucket::with(quota, true, false)
    }

    /// .NET's `TokenBucketRateLimiter` triple: `tokens` added every `period`, at most `capacity`
    /// stored. Later configuration changes ([`crate::Limiter::set_quota`]) are read the same way:
    /// `limit` tokens every `period`, up to `burst`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::IntervalBucket;
    /// let bucket = IntervalBucket::replenishing(5, Duration::from_secs(1), 20)?; // 5/s, 20 stored
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn replenishing(tokens: u64, period: std::time::Duration, capacity: u64) -> Result<IntervalBucket, QuotaError> {
        Ok(IntervalBucket::with(Quota::per(period, tokens)?.with_burst(capacity)?, true, true))
    }

    /// Tokens are only added by [`crate::Limiter::replenish`] (e.g. driven by an external timer or
    /// signal): `quota.limit()` per call, up to `quota.burst()`.
    pub fn manual(quota: Quota) -> IntervalBucket {
        IntervalBucket::with(quota, false, true)
    }

    fn with(quota: Quota, auto: bool, exact: bool) -> IntervalBucket {
        let bucket = IntervalBucket { quota: SeqCell::new(quota), config: SeqCell::new(quota), auto, exact };
        bucket.quota.store(bucket.step(quota));
        bucket
    }

    /// The step that gives `quota`'s rate with at most `burst` tokens per step.
    fn step(&self, quota: Quota) -> Quota {
        if self.exact || quota.burst() >= quota.limit() {
            return quota;
        }
        let interval = (u128::from(quota.period_ns()) * u128::from(quota.burst())).div_ceil(u128::from(quota.limit()));
        let interval = std::time::Duration::from_nanos(u64::try_from(interval).unwrap_or(u64::MAX));
        // Both are nonzero (burst >= 1, interval >= 1 ns), so this cannot fail; if it did, the
        // quota itself is the safe fallback (a lower rate, never a higher one).
        Quota::per(interval, quota.burst()).and_then(|q| q.with_burst(quota.burst())).unwrap_or(quota)
    }

    /// True unless built with [`IntervalBucket::manual`].
    pub fn is_auto(&self) -> bool {
        self.auto
    }

    /// Adds one period's tokens now (the manual mode's replenishment).
    pub(crate) fn replenish(&self, state: &IntervalBucketState, now: u64) {
        let q = self.quota.load();
        let mut guard = state.0.lock().unwrap_or_else(|e| e.into_inner());
        *guard = self.refreshed(*guard, now, &q).credited(q.limit(), q.burst());
    }

    fn refreshed(&self, t: Tokens, now: u64, q: &Quota) -> Tokens {
        if !self.auto {
            return t;
        }
        let tick = now / q.period_ns();
        let ticks = tick.saturating_sub(t.tick);
        Tokens { tick: tick.max(t.tick), ..t.credited(ticks.saturating_mul(q.limit()), q.burst()) }
    }

    /// Nanoseconds until `permits` tokens will have been available in total.
    fn wait_for(&self, t: Tokens, now: u64, q: &Quota, permits: u64) -> Option<u64> {
        let needed = permits.saturating_add(t.debt());
        if needed <= t.tokens() {
            return Some(0);
        }
        if !self.auto {
            return None;
        }
        let ticks = (needed - t.tokens()).div_ceil(q.limit());
        let at = (t.tick as u128 + ticks as u128) * q.period_ns() as u128;
        Some(u64::try_from(at.saturating_sub(now as u128)).unwrap_or(u64::MAX))
    }

    fn meta(&self, t: Tokens, now: u64, q: &Quota) -> Meta {
        let reset_ns = if self.auto { self.wait_for(t, now, q, q.burst()).unwrap_or(0) } else { 0 };
        Meta { limit: q.burst(), remaining: t.tokens(), reset_ns, retry_ns: self.wait_for(t, now, q, 1) }
    }
}

impl IntervalBucket {
    fn decide_meta(&self, state: &IntervalBucketState, now: u64, n: u64, commit: bool) -> Result<Meta, Meta> {
        let q = self.quota.load();
        let mut guard = state.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut t = self.refreshed(*guard, now, &q);
        *guard = t;
        if n > t.tokens() {
            let mut m = self.meta(t, now, &q);
            m.retry_ns = self.wait_for(t, now, &q, n);
            return Err(m);
        }
        if commit {
            t = t.taken(n);
            *guard = t;
        }
        Ok(self.meta(t, now, &q))
    }
}

impl Algorithm for IntervalBucket {
    type State = IntervalBucketState;
    type Config = Quota;

    fn new_state(&self, now: u64) -> IntervalBucketState {
        let q = self.quota.load();
        IntervalBucketState(Mutex::new(Tokens::new(q.burst(), now / q.period_ns())))
    }

    fn capacity(&self) -> u64 {
        self.quota.load().burst()
    }

    #[inline]
    fn decide(&self, state: &IntervalBucketState, now: u64, n: u64, commit: bool) -> Result<Snapshot, Snapshot> {
        self.decide_meta(state, now, n, commit).map(Snapshot::from).map_err(Snapshot::from)
    }

    /// Tokens taken in an earlier step no longer count: the steps since have refilled the bucket
    /// as if they had never been taken (up to `burst`, which is where a step that holds a whole
    /// burst leaves it), so giving them back too would let a step admit more than it adds. As a
    /// fixed window forgets what is given back after it ends. (In manual mode, steps are
    /// `replenish` calls, which this does not see: tokens are given back whenever taken.)
    fn give_back(&self, state: &IntervalBucketState, now: u64, n: u64, acquired_at: u64) {
        let q = self.quota.load();
        let mut guard = state.0.lock().unwrap_or_else(|e| e.into_inner());
        let t = self.refreshed(*guard, now, &q);
        let counts = !self.auto || acquired_at / q.period_ns() >= t.tick;
        *guard = if counts { t.credited(n, q.burst()) } else { t };
    }

    /// Taken from the tokens left, the rest as a debt the next tokens pay (in auto mode the next
    /// periods', in manual mode the next `replenish`es').
    fn charge(&self, state: &IntervalBucketState, now: u64, n: u64) -> Result<(), &'static str> {
        let q = self.quota.load();
        let mut guard = state.0.lock().unwrap_or_else(|e| e.into_inner());
        let t = self.refreshed(*guard, now, &q);
        *guard = t.taken(n);
        Ok(())
    }

    fn is_idle(&self, state: &IntervalBucketState, now: u64) -> bool {
        let q = self.quota.load();
        let t = self.refreshed(*state.0.lock().unwrap_or_else(|e| e.into_inner()), now, &q);
        t.missing(q.burst()) == 0
    }

    fn idle_at(&self, state: &IntervalBucketState, now: u64) -> u64 {
        let q = self.quota.load();
        let t = self.refreshed(*state.0.lock().unwrap_or_else(|e| e.into_inner()), now, &q);
        let missing = t.missing(q.burst());
        if missing == 0 {
            return now;
        }
        if !self.auto {
            return u64::MAX;
        }
        // Full at the start of the tick that brings the missing tokens.
        let ticks = missing.div_ceil(q.limit());
        let at = (u128::from(t.tick) + u128::from(ticks)) * u128::from(q.period_ns());
        u64::try_from(at).unwrap_or(u64::MAX)
    }

    fn wait_estimate(&self, state: &IntervalBucketState, now: u64, permits: u64) -> Option<u64> {
        let q = self.quota.load();
        let t = self.refreshed(*state.0.lock().unwrap_or_else(|e| e.into_inner()), now, &q);
        self.wait_for(t, now, &q, permits)
    }

    fn config(&self) -> Quota {
        self.config.load()
    }

    fn window(&self) -> Option<std::time::Duration> {
        Some(self.config.load().period())
    }

    fn set_config(&self, quota: Quota) -> Quota {
        self.quota.store(self.step(quota));
        self.config.store(quota)
    }

    fn carry_over(&self, state: &IntervalBucketState, now: u64, old: Quota) {
        let q = self.quota.load();
        let old = self.step(old);
        let mut guard = state.0.lock().unwrap_or_else(|e| e.into_inner());
        let t = self.refreshed(*guard, now, &old);
        let used = t.missing(old.burst());
        *guard = Tokens::new(0, now / q.period_ns()).with_level(i128::from(q.burst()) - i128::from(used));
    }
}
