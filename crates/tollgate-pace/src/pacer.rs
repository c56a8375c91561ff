//! The pacer: spends a budget smoothly, in short slices, and adapts to a throttling service.
//!
//! The rate is released in slices of `granularity` (seed 004's "20 every 200 ms" rather than 100
//! at the top of each second), so the downstream service sees an even flow. An item costs any
//! number of units; an item dearer than one slice waits for as many slices as it needs.
//!
//! Adaptation is AIMD, as TCP's congestion control: each [`Pacer::throttled`] (a 429/503 or an
//! error the caller classifies as throttling; several within one slice count once) multiplies the
//! rate by `decrease` (default 0.7, not
//! below `min_rate`) and, given a Retry-After, pauses everything until then; each second without
//! throttling the rate grows by `increase` of the ceiling (default 5%) until it is back at the
//! ceiling. The ceiling is the configured budget, or what the partitions this worker holds allow.

use std::sync::Mutex;
use std::time::Duration;

use tollgate::{Clock, IntervalBucket, Limiter, Quota, SystemClock};

use crate::metrics::PaceMetrics;
use crate::{Budget, PaceError};

/// Builds a [`Pacer`].
#[derive(Debug)]
#[must_use = "a builder does nothing until .build()"]
pub struct PacerBuilder<C: Clock = SystemClock> {
    budget: Budget,
    granularity: Duration,
    decrease: f64,
    increase: f64,
    min_rate: Option<f64>,
    name: String,
    clock: C,
}

impl<C: Clock> PacerBuilder<C> {
    /// The pacer's name (default `"pacer"`): the `pacer` label of its metrics and its pump's. A
    /// name per kind of work (`"orders"`), not per item: labels must stay few.
    ///
    /// ```
    /// use tollgate_pace::{Budget, Pacer};
    /// let pacer = Pacer::builder(Budget::per_second(50)?).name("orders").build()?;
    /// # let _ = pacer;
    /// # Ok::<(), tollgate_pace::PaceError>(())
    /// ```
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// The length of a slice (default 200 ms): the budget is released this often.
    pub fn granularity(mut self, granularity: Duration) -> Self {
        self.granularity = granularity;
        self
    }

    /// The factor the rate is multiplied by on throttling, in (0, 1) (default 0.7, as the AWS
    /// SDKs' adaptive retry mode: a gentler cut than TCP's 0.5 keeps the average nearer the
    /// service's limit).
    pub fn decrease(mut self, factor: f64) -> Self {
        self.decrease = factor;
        self
    }

    /// The share of the ceiling added back each second without throttling, in (0, 1] (default 0.05).
    pub fn increase(mut self, share: f64) -> Self {
        self.increase = share;
        self
    }

    /// The lowest rate throttling can push the pacer to, in units per second (default 1% of the budget).
    pub fn min_rate(mut self, units_per_second: f64) -> Self {
        self.min_rate = Some(units_per_second);
        self
    }

    /// The clock (a `ManualClock` in tests).
    pub fn clock<C2: Clock>(self, clock: C2) -> PacerBuilder<C2> {
        PacerBuilder {
            budget: self.budget,
            granularity: self.granularity,
            decrease: self.decrease,
            increase: self.increase,
            min_rate: self.min_rate,
            name: self.name,
            clock,
        }
    }

    /// The pacer, or an error naming the setting that is out of range.
    pub fn build(self) -> Result<Pacer<C>, PaceError> {
        let ceiling = self.budget.units_per_second();
        if self.granularity.is_zero() {
            return Err(PaceError::config("granularity", "longer than zero", format!("{:?}", self.granularity)));
        }
        if !(self.decrease > 0.0 && self.decrease < 1.0) {
            return Err(PaceError::config("decrease", "in (0, 1)", self.decrease));
        }
        if !(self.increase > 0.0 && self.increase <= 1.0) {
            return Err(PaceError::config("increase", "in (0, 1]", self.increase));
        }
        let min_rate = self.min_rate.unwrap_or(ceiling / 100.0);
        if !(min_rate > 0.0 && min_rate <= ceiling) {
            return Err(PaceError::config("min_rate", format!("in (0, {ceiling}]"), min_rate));
        }
        let quota = slice_quota(ceiling, self.granularity)?;
        let limiter = Limiter::builder(IntervalBucket::new(quota)).clock(self.clock.clone()).build();
        let metrics = PaceMetrics::new(&self.name);
        metrics.rate.set(ceiling);
        metrics.ceiling.set(ceiling);
        Ok(Pacer {
            limiter,
            clock: self.clock,
            granularity: self.granularity,
            decrease: self.decrease,
            increase: self.increase,
            min_rate,
            metrics,
            state: Mutex::new(Adapt { rate: ceiling, ceiling, paused_until: 0, last_increase: 0, last_decrease: None }),
        })
    }
}

struct Adapt {
    rate: f64,
    ceiling: f64,
    paused_until: u64,
    last_increase: u64,
    last_decrease: Option<u64>,
}

/// Spends a budget smoothly and backs off when the downstream throttles.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tollgate_pace::PaceError> {
/// use std::time::Duration;
/// use tollgate_pace::{Budget, Pacer};
/// let pacer = Pacer::builder(Budget::per_second(1000)?).granularity(Duration::from_millis(200)).build()?;
/// pacer.acquire(150).await?;                 // an item costing 150 units: within the first slice of 200
/// pacer.throttled(None);                     // the service said 429: cut the rate
/// assert_eq!(pacer.rate(), 700.0);
/// # Ok(()) }
/// ```
pub struct Pacer<C: Clock = SystemClock> {
    limiter: Limiter<IntervalBucket, C>,
    clock: C,
    granularity: Duration,
    decrease: f64,
    increase: f64,
    min_rate: f64,
    pub(crate) metrics: PaceMetrics,
    state: Mutex<Adapt>,
}

impl<C: Clock> std::fmt::Debug for Pacer<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Pacer");
        d.field("granularity", &self.granularity)
            .field("decrease", &self.decrease)
            .field("increase", &self.increase)
            .field("min_rate", &self.min_rate);
        // try_lock: formatting must never wait for (or deadlock with) the pacer's own lock.
        if let Ok(state) = self.state.try_lock() {
            d.field("rate", &state.rate).field("ceiling", &state.ceiling).field("paused_until", &state.paused_until);
        }
        d.finish_non_exhaustive()
    }
}

impl Pacer<SystemClock> {
    /// Starts building a pacer for `budget`.
    pub fn builder(budget: Budget) -> PacerBuilder<SystemClock> {
        PacerBuilder {
            budget,
            granularity: Duration::from_millis(200),
            decrease: 0.7,
            increase: 0.05,
            min_rate: None,
            name: "pacer".to_owned(),
            clock: SystemClock::new(),
        }
    }
}

impl<C: Clock> Pacer<C> {
    /// Waits until `cost` units may be spent, then spends them. Waiters are served in order.
    pub async fn acquire(&self, cost: u64) -> Result<(), PaceError> {
        let paused_until = self.lock().paused_until;
        if paused_until > self.clock.now() {
            self.clock.sleep_until(paused_until).await;
        }
        let mut left = cost;
        while left > 0 {
            // An item dearer than a slice takes several: first what the current slice has left (so
            // no unit of it is wasted), then whole slices, in queue order.
            let now = self.limiter.try_acquire(0).map(|probe| probe.remaining()).unwrap_or(0);
            if now > 0
                && let Ok(spent) = self.limiter.try_acquire(left.min(now))
            {
                left -= spent.permits();
                continue;
            }
            let take = left.min(self.limiter.capacity());
            // Rate permits are spent, not held: the lease has nothing to release.
            let _spent = self.limiter.acquire(take).await.map_err(|r| PaceError::Closed { reason: r.reason() })?;
            left -= take;
        }
        self.metrics.units.increment(cost);
        Ok(())
    }

    /// Waits while nothing may be spent: no capacity (a ceiling of 0, no partition held) or a
    /// Retry-After pause. A pump calls it before taking work, so that it does not hold items it
    /// cannot send.
    pub async fn ready(&self) {
        loop {
            let (ceiling, paused_until) = {
                let state = self.lock();
                (state.ceiling, state.paused_until)
            };
            let now = self.clock.now();
            if paused_until > now {
                self.clock.sleep_until(paused_until).await;
            } else if ceiling <= 0.0 {
                self.clock.sleep_until(now.saturating_add(self.granularity.as_nanos() as u64)).await;
            } else {
                return;
            }
        }
    }

    /// The downstream throttled a call: cut the rate, and pause until `retry_after` if given.
    pub fn throttled(&self, retry_after: Option<Duration>) {
        self.metrics.throttled.increment(1);
        let now = self.clock.now();
        let mut state = self.lock();
        if let Some(wait) = retry_after {
            let until = now.saturating_add(u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX));
            state.paused_until = state.paused_until.max(until);
        }
        // The answers to one slice's requests are one signal: cut at most once per slice.
        let granularity = u64::try_from(self.granularity.as_nanos()).unwrap_or(u64::MAX);
        if state.last_decrease.is_some_and(|at| now.saturating_sub(at) < granularity) {
            return;
        }
        state.last_decrease = Some(now);
        state.rate = (state.rate * self.decrease).max(self.min_rate.min(state.ceiling));
        state.last_increase = now;
        self.apply(&state);
    }

    /// A call went through: after a second without throttling, probe the rate back up.
    pub fn succeeded(&self) {
        let now = self.clock.now();
        let mut state = self.lock();
        if state.rate >= state.ceiling || now.saturating_sub(state.last_increase) < 1_000_000_000 {
            return;
        }
        let seconds = now.saturating_sub(state.last_increase) as f64 / 1e9;
        state.rate = (state.rate + state.ceiling * self.increase * seconds.floor()).min(state.ceiling);
        state.last_increase = now;
        self.apply(&state);
    }

    /// The rate now, in units per second.
    pub fn rate(&self) -> f64 {
        self.lock().rate
    }

    /// The most the pacer may spend, in units per second (the budget, or the partitions' share).
    pub fn ceiling(&self) -> f64 {
        self.lock().ceiling
    }

    /// Sets the ceiling (when partitions are gained or lost); the rate follows it down at once, and
    /// up by the additive increase. A ceiling of 0 stops spending until it is raised.
    pub fn set_ceiling(&self, units_per_second: f64) {
        let mut state = self.lock();
        state.ceiling = units_per_second.max(0.0);
        if state.rate > state.ceiling || state.rate == 0.0 {
            state.rate = state.ceiling;
        }
        self.apply(&state);
    }

    /// The clock the pacer (and a pump under it) reads.
    pub(crate) fn clock(&self) -> &C {
        &self.clock
    }

    /// Until when everything is paused by a Retry-After, in the clock's nanoseconds (0: never).
    pub fn paused_until(&self) -> u64 {
        self.lock().paused_until
    }

    fn apply(&self, state: &Adapt) {
        self.metrics.rate.set(state.rate);
        self.metrics.ceiling.set(state.ceiling);
        match slice_quota(state.rate, self.granularity) {
            Ok(quota) => self.limiter.set_quota(quota),
            // A zero rate (no partition held): a slice of one unit per hour is "stopped" in practice.
            Err(_) => {
                if let Ok(quota) = Quota::per(Duration::from_secs(3600), 1) {
                    self.limiter.set_quota(quota)
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Adapt> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `rate` units per second as whole units per slice; a rate below one unit per slice gets longer
/// slices of one unit instead.
fn slice_quota(rate: f64, granularity: Duration) -> Result<Quota, PaceError> {
    if !(rate.is_finite() && rate > 0.0) {
        return Err(PaceError::config("rate", "above zero", rate));
    }
    let per_slice = rate * granularity.as_secs_f64();
    let quota = if per_slice >= 1.0 {
        Quota::per(granularity, per_slice.round() as u64)
    } else {
        Quota::per(Duration::from_secs_f64(1.0 / rate), 1)
    };
    quota.map_err(|source| PaceError::Rate { rate, granularity, source })
}
