//! How much, per what: the one description of a rate every limiter is built from.

use std::time::Duration;

/// A rate: `limit` permits per `period`, with at most `burst` available at once.
///
/// `burst` defaults to `limit`. Token buckets use all three; the window algorithms count `limit`
/// permits per `period` and ignore `burst`.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Quota;
/// let q = Quota::per_second(100)?.with_burst(20)?;
/// assert_eq!(q.limit(), 100);
/// assert_eq!(q.burst(), 20);
/// assert_eq!(q.emission_interval(), Duration::from_millis(10));
/// assert!(Quota::per_second(0).is_err());
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    period_ns: u64,
    burst: u64,
    emission_ns: u64,
}

/// Why a [`Quota`] could not be built. Each variant carries the offending value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// `limit` was zero: a limiter that never admits anything is a configuration mistake.
    #[error("quota limit must be at least 1 permit per period, got 0")]
    ZeroLimit,
    /// The period was zero.
    #[error("quota period must be longer than zero, got {0:?}")]
    ZeroPeriod(Duration),
    /// The period does not fit in 64-bit nanoseconds (about 584 years).
    #[error("quota period {0:?} does not fit in 64-bit nanoseconds (at most ~584 years)")]
    PeriodTooLong(Duration),
    /// More than one permit per nanosecond: finer than the clock can tell apart.
    #[error("quota of {limit} permits per {period:?} is more than one permit per nanosecond")]
    RateTooHigh {
        /// The requested limit.
        limit: u64,
        /// The requested period.
        period: Duration,
    },
    /// `burst` was zero.
    #[error("quota burst must be at least 1, got 0")]
    ZeroBurst,
    /// `burst` permits take longer to accumulate than 64-bit nanoseconds can hold.
    #[error("quota burst {burst} at one permit per {emission:?} overflows 64-bit nanoseconds")]
    BurstOverflow {
        /// The requested burst.
        burst: u64,
        /// Time to accumulate one permit.
        emission: Duration,
    },
    /// A sliding window's segment count was zero or finer than one nanosecond per segment.
    #[error("sliding window needs 1 to min(period in ns, 2^32-1) segments, got {segments} for period {period:?}")]
    BadSegments {
        /// The requested segment count.
        segments: u64,
        /// The quota's period.
        period: Duration,
    },
}

impl Quota {
    /// `limit` permits per `period`.
    pub fn per(period: Duration, limit: u64) -> Result<Quota, QuotaError> {
        if limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        if period.is_zero() {
            return Err(QuotaError::ZeroPeriod(period));
        }
        let period_ns = u64::try_from(period.as_nanos()).map_err(|_| QuotaError::PeriodTooLong(period))?;
        if limit > period_ns {
            return Err(QuotaError::RateTooHigh { limit, period });
        }
        // Rounded up so that the long-run rate never exceeds the quota.
        let emission_ns = period_ns.div_ceil(limit);
        Quota { limit, period_ns, burst: limit, emission_ns }.checked()
    }

    /// `limit` permits per `period`, for the window algorithms, which count permits per window and
    /// never refill one at a time: unlike [`Quota::per`], any `limit` from 1 up, so more than one
    /// permit per nanosecond too (a byte budget of 10<sup>12</sup> per minute). Its
    /// [`emission_interval`](Quota::emission_interval) is then 1 ns, so an algorithm that refills
    /// ([`TokenBucket`](crate::TokenBucket)) built from it would admit fewer than `limit` per period.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FixedWindow, Limiter, Quota};
    /// let bytes = Quota::window(Duration::from_secs(60), 1_000_000_000_000)?;
    /// assert!(Quota::per(Duration::from_secs(60), 1_000_000_000_000).is_err());
    /// let limiter = Limiter::new(FixedWindow::new(bytes));
    /// assert!(limiter.try_acquire(999_999_999_999).is_ok());
    /// assert!(limiter.try_acquire(2).is_err());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn window(period: Duration, limit: u64) -> Result<Quota, QuotaError> {
        match Quota::per(period, limit) {
            Err(QuotaError::RateTooHigh { .. }) => {
                Ok(Quota { limit, period_ns: period.as_nanos() as u64, burst: limit, emission_ns: 1 })
            }
            other => other,
        }
    }

    /// `limit` permits per second.
    pub fn per_second(limit: u64) -> Result<Quota, QuotaError> {
        Quota::per(Duration::from_secs(1), limit)
    }

    /// `limit` permits per minute.
    pub fn per_minute(limit: u64) -> Result<Quota, QuotaError> {
        Quota::per(Duration::from_secs(60), limit)
    }

    /// `limit` permits per hour.
    pub fn per_hour(limit: u64) -> Result<Quota, QuotaError> {
        Quota::per(Duration::from_secs(3600), limit)
    }

    /// The same rate with at most `burst` permits available at once.
    pub fn with_burst(self, burst: u64) -> Result<Quota, QuotaError> {
        if burst == 0 {
            return Err(QuotaError::ZeroBurst);
        }
        Quota { burst, ..self }.checked()
    }

    fn checked(self) -> Result<Quota, QuotaError> {
        match self.burst.checked_mul(self.emission_ns) {
            Some(_) => Ok(self),
            None => {
                Err(QuotaError::BurstOverflow { burst: self.burst, emission: Duration::from_nanos(self.emission_ns) })
            }
        }
    }

    /// Permits per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The period.
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.period_ns)
    }

    /// Most permits available at once (token buckets).
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Time to earn one permit: `period / limit`, rounded up to whole nanoseconds.
    pub fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.emission_ns)
    }

    pub(crate) fn from_parts(limit: u64, period_ns: u64, burst: u64, emission_ns: u64) -> Quota {
        Quota { limit, period_ns, burst, emission_ns }
    }

    pub(crate) fn period_ns(&self) -> u64 {
        self.period_ns
    }

    pub(crate) fn emission_ns(&self) -> u64 {
        self.emission_ns
    }

    /// Time for a full burst to refill: `burst * emission_interval` (cannot overflow, checked at
    /// construction).
    pub(crate) fn tau_ns(&self) -> u64 {
        self.burst * self.emission_ns
    }
}

impl std::fmt::Display for Quota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} per {:?} (burst {})", self.limit, self.period(), self.burst)
    }
}
