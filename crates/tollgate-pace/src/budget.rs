//! How much may be spent: units (operations, bytes, cost units) per period.

use std::time::Duration;

/// A budget of `units` per `period`, e.g. 1000 request units per second.
///
/// ```
/// use std::time::Duration;
/// use tollgate_pace::Budget;
/// let budget = Budget::per_second(1000)?;
/// assert_eq!(budget.units_per_second(), 1000.0);
/// assert!(Budget::new(0, Duration::from_secs(1)).is_err());
/// # Ok::<(), tollgate_pace::PaceError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    units: u64,
    period: Duration,
}

impl std::str::FromStr for Budget {
    type Err = crate::PaceError;

    /// [`Budget::parse`].
    fn from_str(s: &str) -> Result<Budget, crate::PaceError> {
        Budget::parse(s)
    }
}

impl Budget {
    /// `units` per `period`; both must be non-zero.
    pub fn new(units: u64, period: Duration) -> Result<Budget, crate::PaceError> {
        if units == 0 {
            return Err(crate::PaceError::config("budget units", "at least 1", units));
        }
        if period.is_zero() {
            return Err(crate::PaceError::config("budget period", "longer than zero", format!("{period:?}")));
        }
        Ok(Budget { units, period })
    }

    /// Parses `UNITS/PERIOD` with the core's rate parser ([`tollgate::parse_rate`], the syntax of
    /// every quota): `200/s`, `12000/m`, `5/10m`, `60/1m30s`. Text that is not a rate is a
    /// [`PaceError::Parse`](crate::PaceError::Parse) naming it; zero units are refused as by
    /// [`Budget::new`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_pace::{Budget, PaceError};
    /// let budget = Budget::parse("12000/m")?;
    /// assert_eq!((budget.units(), budget.period()), (12000, Duration::from_secs(60)));
    /// assert!(matches!(Budget::parse("200/"), Err(PaceError::Parse(_))));
    /// assert!(Budget::parse("0/s").is_err());
    /// # Ok::<(), PaceError>(())
    /// ```
    pub fn parse(s: &str) -> Result<Budget, crate::PaceError> {
        let (units, period) = tollgate::parse_rate(s)?;
        Budget::new(units, period)
    }

    /// `units` per second.
    pub fn per_second(units: u64) -> Result<Budget, crate::PaceError> {
        Budget::new(units, Duration::from_secs(1))
    }

    /// Units in one period.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The rate, in units per second.
    pub fn units_per_second(&self) -> f64 {
        self.units as f64 / self.period.as_secs_f64()
    }

    /// `parts` equal shares of this budget: what one of `parts` partitions may spend.
    pub fn share(&self, parts: u64) -> f64 {
        self.units_per_second() / parts.max(1) as f64
    }
}
