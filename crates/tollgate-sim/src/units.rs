//! Traffic rates (`150/s`, `0/s..300/s`) read with the core's parser ([`tollgate::parse_rate`],
//! the same syntax as `--quota`), and durations printed back compactly.

use std::fmt;
use std::time::Duration;

use crate::error::SimError;

/// `count` events per `per`: the shape of a traffic rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Events per period.
    pub count: u64,
    /// The period.
    pub per: Duration,
}

impl Rate {
    /// Parses `COUNT/PERIOD` with [`tollgate::parse_rate`]: `100/s`, `10/100ms`, `600/m`, `5/2h`.
    /// A period without a number means one of its unit; the count may be zero. `what` names the
    /// option in errors.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_sim::Rate;
    /// let r = Rate::parse("--traffic", "10/100ms")?;
    /// assert_eq!((r.count, r.per), (10, Duration::from_millis(100)));
    /// assert!(Rate::parse("--traffic", "10/fortnight").unwrap_err().to_string().contains("10/fortnight"));
    /// # Ok::<(), tollgate_sim::SimError>(())
    /// ```
    pub fn parse(what: &'static str, s: &str) -> Result<Rate, SimError> {
        let (count, per) = tollgate::parse_rate(s).map_err(|source| SimError::Parse { what, source })?;
        Ok(Rate { count, per })
    }

    /// Events per nanosecond.
    pub fn per_ns(&self) -> f64 {
        self.count as f64 / self.per.as_nanos() as f64
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.count, Span(self.per))
    }
}

/// Whole nanoseconds of `d`, saturating.
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A duration printed compactly with its natural unit: `1s`, `100ms`, `1.5s`, `2m`, `250us`.
#[derive(Clone, Copy, Debug)]
pub struct Span(pub Duration);

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        const UNITS: [(u128, &str); 6] = [
            (3_600_000_000_000, "h"),
            (60_000_000_000, "m"),
            (1_000_000_000, "s"),
            (1_000_000, "ms"),
            (1_000, "us"),
            (1, "ns"),
        ];
        if ns == 0 {
            return f.write_str("0s");
        }
        let &(unit, name) = UNITS.iter().find(|(u, _)| ns >= *u).unwrap_or(&UNITS[5]);
        if ns % unit == 0 {
            return write!(f, "{}{name}", ns / unit);
        }
        // Three decimals at most, trailing zeros dropped.
        let value = format!("{:.3}", ns as f64 / unit as f64);
        let value = value.trim_end_matches('0').trim_end_matches('.');
        write!(f, "{value}{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_rates_may_be_zero_and_errors_name_the_option_and_the_value() {
        let r = |s| Rate::parse("--traffic", s).unwrap();
        assert_eq!(r(" 5 / 2h "), Rate { count: 5, per: Duration::from_secs(7200) });
        assert_eq!(r("0/s"), Rate { count: 0, per: Duration::from_secs(1) });
        let e = Rate::parse("--traffic", "10/0s").unwrap_err().to_string();
        assert!(e.starts_with("--traffic: invalid rate \"10/0s\""), "{e}");
    }

    #[test]
    fn spans_print_compactly() {
        let s = |ns| Span(Duration::from_nanos(ns)).to_string();
        assert_eq!(s(0), "0s");
        assert_eq!(s(1_000_000_000), "1s");
        assert_eq!(s(100_000_000), "100ms");
        assert_eq!(s(1_500_000_000), "1.5s");
        assert_eq!(s(120_000_000_000), "2m");
        assert_eq!(s(10_000_001), "10ms");
        assert_eq!(s(12_345), "12.345us");
        assert_eq!(s(7), "7ns");
    }
}
