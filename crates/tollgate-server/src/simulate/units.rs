//! Rates, quotas and durations as people write them (`100/s`, `10/100ms`, `600/m`, `60s`), parsed
//! with errors that name the bad value, and printed back compactly.

use std::fmt;
use std::time::Duration;

use tollgate::Quota;

use super::error::SimError;

const RATE_HINT: &str = "expected COUNT/PERIOD, e.g. 100/s, 10/100ms, 600/m, 5/2h";

/// `count` events per `per`: the shape of a quota and of a traffic rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Events per period.
    pub count: u64,
    /// The period.
    pub per: Duration,
}

impl Rate {
    /// Parses `COUNT/PERIOD`: `100/s`, `10/100ms`, `600/m`, `5/2h`. A period without a number
    /// means one of its unit. `what` names the option in errors.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_server::simulate::Rate;
    /// let r = Rate::parse("--quota", "10/100ms")?;
    /// assert_eq!((r.count, r.per), (10, Duration::from_millis(100)));
    /// assert!(Rate::parse("--quota", "10/fortnight").unwrap_err().to_string().contains("10/fortnight"));
    /// # Ok::<(), tollgate_server::simulate::SimError>(())
    /// ```
    pub fn parse(what: &'static str, s: &str) -> Result<Rate, SimError> {
        let bad = |reason: String| SimError::invalid(what, s, format!("{reason} ({RATE_HINT})"));
        let (count, per) = s.trim().split_once('/').ok_or_else(|| bad("no '/' between count and period".into()))?;
        let count = count.trim();
        let count: u64 = count.parse().map_err(|_| bad(format!("count {count:?} is not a whole number")))?;
        let per = per.trim();
        if per.is_empty() {
            return Err(bad("no period after '/'".into()));
        }
        let with_number =
            if per.starts_with(|c: char| c.is_ascii_digit()) { per.to_owned() } else { format!("1{per}") };
        let per_d = humantime::parse_duration(&with_number).map_err(|e| bad(format!("period {per:?}: {e}")))?;
        if per_d.is_zero() {
            return Err(bad(format!("period {per:?} is zero")));
        }
        if u64::try_from(per_d.as_nanos()).is_err() {
            return Err(bad(format!("period {per:?} is longer than 584 years")));
        }
        Ok(Rate { count, per: per_d })
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

/// Parses a quota, `LIMIT/PERIOD` (see [`Rate::parse`]), with an optional burst for the token
/// buckets. Quota errors (zero limit, more than one permit per nanosecond, ...) name the value.
///
/// ```
/// use std::time::Duration;
/// let q = tollgate_server::simulate::parse_quota("600/m", Some(20))?;
/// assert_eq!((q.limit(), q.period(), q.burst()), (600, Duration::from_secs(60), 20));
/// assert!(tollgate_server::simulate::parse_quota("0/s", None).is_err());
/// # Ok::<(), tollgate_server::simulate::SimError>(())
/// ```
pub fn parse_quota(s: &str, burst: Option<u64>) -> Result<Quota, SimError> {
    let rate = Rate::parse("--quota", s)?;
    let quota = Quota::per(rate.per, rate.count).map_err(|e| SimError::invalid("--quota", s, e.to_string()))?;
    match burst {
        None => Ok(quota),
        Some(b) => quota.with_burst(b).map_err(|e| SimError::invalid("--burst", &b.to_string(), e.to_string())),
    }
}

/// Parses a duration such as `60s`, `1m30s`, `250ms` (humantime's syntax); zero is an error.
pub fn parse_duration(what: &'static str, s: &str) -> Result<Duration, SimError> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| SimError::invalid(what, s, format!("{e} (expected e.g. 60s, 1m30s, 250ms)")))?;
    if d.is_zero() {
        return Err(SimError::invalid(what, s, "must be longer than zero"));
    }
    if u64::try_from(d.as_nanos()).is_err() {
        return Err(SimError::invalid(what, s, "is longer than 584 years"));
    }
    Ok(d)
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
    fn rates_in_every_spelling() {
        let r = |s| Rate::parse("--quota", s).map(|r| (r.count, r.per));
        assert_eq!(r("100/s").unwrap(), (100, Duration::from_secs(1)));
        assert_eq!(r("10/100ms").unwrap(), (10, Duration::from_millis(100)));
        assert_eq!(r("600/m").unwrap(), (600, Duration::from_secs(60)));
        assert_eq!(r(" 5 / 2h ").unwrap(), (5, Duration::from_secs(7200)));
        assert_eq!(r("0/s").unwrap(), (0, Duration::from_secs(1)));
    }

    #[test]
    fn bad_rates_name_the_value_and_what_is_wrong() {
        for (input, needle) in [
            ("100", "no '/'"),
            ("x/s", "count \"x\""),
            ("-1/s", "count \"-1\""),
            ("10/", "no period"),
            ("10/parsec", "period \"parsec\""),
            ("10/0s", "zero"),
        ] {
            let e = Rate::parse("--quota", input).unwrap_err().to_string();
            assert!(e.contains(&format!("{input:?}")), "{e}");
            assert!(e.contains(needle), "{input}: {e}");
        }
    }

    #[test]
    fn quota_errors_come_from_the_core_with_the_value() {
        let e = parse_quota("0/s", None).unwrap_err().to_string();
        assert!(e.contains("\"0/s\"") && e.contains("at least 1"), "{e}");
        let e = parse_quota("2000000000/s", None).unwrap_err().to_string();
        assert!(e.contains("nanosecond"), "{e}");
        let e = parse_quota("100/s", Some(0)).unwrap_err().to_string();
        assert!(e.contains("--burst") && e.contains("\"0\""), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("--duration", "1m30s").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("--duration", "0s").unwrap_err().to_string().contains("longer than zero"));
        assert!(parse_duration("--duration", "soon").unwrap_err().to_string().contains("\"soon\""));
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
