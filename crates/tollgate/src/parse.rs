//! Quotas, rates and durations as people write them: `"100/s"`, `"5/10m"`, `"60/1m30s"`,
//! `"250ms"`. One syntax and one error type for every front end (the `tollgate` command line, the
//! Python bindings, configuration files), so the same text means the same thing everywhere.
//!
//! - A **duration** is humantime's syntax: one or more `NUMBER UNIT` spans, `250ms`, `10s`,
//!   `1m30s`, `1.5h`, `2 days`. Units: `ns`, `us`/`µs`, `ms`, `s`/`sec`, `m`/`min`, `h`/`hr`,
//!   `d`/`day`, `w`/`week`, `M`/`month`, `y`/`year` and their plurals. Surrounding whitespace is
//!   ignored. [`parse_duration`] rejects zero; [`parse_duration_or_zero`] accepts it (`0`, `0s`).
//! - A **rate** is `COUNT/PERIOD`: a whole number, `/`, and a duration (`5/10m`, `60/1m30s`) or a
//!   bare unit meaning one of it (`100/s`, `600/m`, `1000/day`). Whitespace around either part is
//!   ignored. [`parse_rate`] accepts a zero count (traffic that offers nothing);
//!   a [`Quota`] does not (`Quota::parse`, or `str::parse::<Quota>()`).
//!
//! Every failure is a [`ParseError`] that names the text at fault, what is wrong with it and what
//! was expected.

use std::fmt;
use std::num::IntErrorKind;
use std::str::FromStr;
use std::time::Duration;

use crate::quota::{Quota, QuotaError};

const DURATION_HINT: &str = "a duration such as 250ms, 10s, 1m30s, 2h";
const RATE_HINT: &str = "COUNT/PERIOD such as 100/s, 5/10m, 60/1m30s, 1000/day";

/// What a string was being parsed as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ParseTarget {
    /// A duration, e.g. `250ms`.
    Duration,
    /// A rate, `COUNT/PERIOD`, e.g. `100/s` (the count may be zero).
    Rate,
    /// A quota, `LIMIT/PERIOD`, e.g. `100/s` (a rate a limiter can enforce).
    Quota,
}

impl ParseTarget {
    fn noun(self) -> &'static str {
        match self {
            ParseTarget::Duration => "duration",
            ParseTarget::Rate => "rate",
            ParseTarget::Quota => "quota",
        }
    }

    fn hint(self) -> &'static str {
        match self {
            ParseTarget::Duration => DURATION_HINT,
            ParseTarget::Rate | ParseTarget::Quota => RATE_HINT,
        }
    }
}

/// What is wrong with a quota, rate or duration string (see [`ParseError`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseErrorKind {
    /// Nothing but whitespace.
    #[error("nothing given")]
    Empty,
    /// A rate without `/` between its count and its period.
    #[error("no '/' between count and period")]
    NoSlash,
    /// The count of a rate is not a whole number (it holds the count as written).
    #[error("count {0:?} is not a whole number")]
    BadCount(String),
    /// The count of a rate does not fit in 64 bits (it holds the count as written).
    #[error("count {0:?} is too large (at most 2^64-1)")]
    CountTooLarge(String),
    /// A rate with nothing after `/`.
    #[error("no period after '/'")]
    NoPeriod,
    /// A duration (or a rate's period) that humantime cannot read.
    #[error("{text:?} is not a duration: {reason}")]
    BadDuration {
        /// The duration as written.
        text: String,
        /// humantime's explanation.
        reason: String,
    },
    /// A zero duration where a positive one is needed (a rate's period, a timeout, ...).
    #[error("{0:?} is zero; it must be longer than zero")]
    Zero(String),
    /// A duration that does not fit in 64-bit nanoseconds (about 584 years).
    #[error("{0:?} is longer than 64-bit nanoseconds can hold (about 584 years)")]
    TooLong(String),
    /// The text is a well-formed rate, but not a usable quota (zero limit, more than one permit per
    /// nanosecond, ...).
    #[error("{0}")]
    Quota(QuotaError),
}

/// Why a quota, rate or duration string could not be parsed: the text as given, what it was
/// parsed as, and what is wrong with it.
///
/// ```
/// let e = "5/".parse::<tollgate::Quota>().unwrap_err();
/// assert_eq!(e.input(), "5/");
/// assert_eq!(e.kind(), &tollgate::ParseErrorKind::NoPeriod);
/// assert_eq!(
///     e.to_string(),
///     "invalid quota \"5/\": no period after '/' (expected COUNT/PERIOD such as 100/s, 5/10m, 60/1m30s, 1000/day)"
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    input: String,
    expected: ParseTarget,
    kind: ParseErrorKind,
}

impl ParseError {
    fn new(input: &str, expected: ParseTarget, kind: ParseErrorKind) -> ParseError {
        ParseError { input: input.to_owned(), expected, kind }
    }

    /// The text as given.
    pub fn input(&self) -> &str {
        &self.input
    }

    /// What the text was parsed as.
    pub fn expected(&self) -> ParseTarget {
        self.expected
    }

    /// What is wrong with it.
    pub fn kind(&self) -> &ParseErrorKind {
        &self.kind
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} {:?}: {}", self.expected.noun(), self.input, self.kind)?;
        match self.kind {
            // The quota's own message says what would be right.
            ParseErrorKind::Quota(_) => Ok(()),
            _ => write!(f, " (expected {})", self.expected.hint()),
        }
    }
}

impl std::error::Error for ParseError {}

/// Parses a positive duration in humantime's syntax: `250ms`, `10s`, `1m30s`, `1.5h`, `2 days`
/// (units `ns`, `us`/`µs`, `ms`, `s`, `m`/`min`, `h`, `d`, `w`, `M`/`month`, `y` and their long
/// forms), surrounding whitespace ignored. Zero and durations beyond 64-bit nanoseconds (about 584
/// years) are errors.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(tollgate::parse_duration("250ms")?, Duration::from_millis(250));
/// assert_eq!(tollgate::parse_duration(" 1m30s ")?, Duration::from_secs(90));
/// assert!(tollgate::parse_duration("0s").is_err());
/// # Ok::<(), tollgate::ParseError>(())
/// ```
pub fn parse_duration(s: &str) -> Result<Duration, ParseError> {
    let d = parse_duration_or_zero(s)?;
    if d.is_zero() {
        return Err(ParseError::new(s, ParseTarget::Duration, ParseErrorKind::Zero(s.trim().to_owned())));
    }
    Ok(d)
}

/// Like [`parse_duration`], but zero (`0`, `0s`, `0ms`) is accepted: for settings where zero
/// means "none", such as a warm-up.
pub fn parse_duration_or_zero(s: &str) -> Result<Duration, ParseError> {
    duration(s.trim()).map_err(|kind| ParseError::new(s, ParseTarget::Duration, kind))
}

/// Parses a rate, `COUNT/PERIOD`: `100/s`, `5/10m`, `60/1m30s`, `1000/day`. Returns the count and
/// the period. The count may be zero; the period must be positive.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(tollgate::parse_rate("5/10m")?, (5, Duration::from_secs(600)));
/// assert_eq!(tollgate::parse_rate("0/s")?, (0, Duration::from_secs(1)));
/// # Ok::<(), tollgate::ParseError>(())
/// ```
pub fn parse_rate(s: &str) -> Result<(u64, Duration), ParseError> {
    rate(s).map_err(|kind| ParseError::new(s, ParseTarget::Rate, kind))
}

impl Quota {
    /// Parses a quota, `LIMIT/PERIOD`: `100/s`, `5/10m`, `60/1m30s`, `1000/day` (see
    /// [`parse_rate`]); the burst is the limit. Anything [`Quota::per`] rejects (a zero limit,
    /// more than one permit per nanosecond) is a [`ParseErrorKind::Quota`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Quota;
    /// let q = Quota::parse("5/10m")?;
    /// assert_eq!((q.limit(), q.period()), (5, Duration::from_secs(600)));
    /// assert_eq!("100/s".parse::<Quota>()?, Quota::per_second(100).unwrap());
    /// assert!(Quota::parse("0/s").unwrap_err().to_string().contains("at least 1"));
    /// # Ok::<(), tollgate::ParseError>(())
    /// ```
    pub fn parse(s: &str) -> Result<Quota, ParseError> {
        let fail = |kind| ParseError::new(s, ParseTarget::Quota, kind);
        let (limit, period) = rate(s).map_err(fail)?;
        Quota::per(period, limit).map_err(|e| fail(ParseErrorKind::Quota(e)))
    }
}

impl FromStr for Quota {
    type Err = ParseError;

    /// [`Quota::parse`].
    fn from_str(s: &str) -> Result<Quota, ParseError> {
        Quota::parse(s)
    }
}

/// A trimmed duration, zero allowed.
fn duration(s: &str) -> Result<Duration, ParseErrorKind> {
    if s.is_empty() {
        return Err(ParseErrorKind::Empty);
    }
    let d = humantime::parse_duration(s)
        .map_err(|e| ParseErrorKind::BadDuration { text: s.to_owned(), reason: e.to_string() })?;
    if u64::try_from(d.as_nanos()).is_err() {
        return Err(ParseErrorKind::TooLong(s.to_owned()));
    }
    Ok(d)
}

fn rate(s: &str) -> Result<(u64, Duration), ParseErrorKind> {
    let s = s.trim();
    if s.is_empty() {
        return Err(ParseErrorKind::Empty);
    }
    let (count, period) = s.split_once('/').ok_or(ParseErrorKind::NoSlash)?;
    let count = count.trim();
    let count = count.parse::<u64>().map_err(|e| match e.kind() {
        IntErrorKind::PosOverflow => ParseErrorKind::CountTooLarge(count.to_owned()),
        _ => ParseErrorKind::BadCount(count.to_owned()),
    })?;
    let period = period.trim();
    if period.is_empty() {
        return Err(ParseErrorKind::NoPeriod);
    }
    // A bare unit is one of it: `100/s` is `100/1s`.
    let d = if period.starts_with(char::is_alphabetic) {
        duration(&format!("1{period}")).map_err(|e| match e {
            ParseErrorKind::BadDuration { reason, .. } => {
                ParseErrorKind::BadDuration { text: period.to_owned(), reason }
            }
            other => other,
        })?
    } else {
        duration(period)?
    };
    if d.is_zero() {
        return Err(ParseErrorKind::Zero(period.to_owned()));
    }
    Ok((count, d))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn quotas_in_every_spelling() {
        let q = |s: &str| Quota::parse(s).map(|q| (q.limit(), q.period()));
        assert_eq!(q("100/s"), Ok((100, S)));
        assert_eq!(q("100/sec"), Ok((100, S)));
        assert_eq!(q("5/10m"), Ok((5, 600 * S)));
        assert_eq!(q("600/m"), Ok((600, 60 * S)));
        assert_eq!(q("600/min"), Ok((600, 60 * S)));
        assert_eq!(q("10/100ms"), Ok((10, Duration::from_millis(100))));
        assert_eq!(q("60/1m30s"), Ok((60, 90 * S)));
        assert_eq!(q("1000/day"), Ok((1000, 86_400 * S)));
        assert_eq!(q("1000/d"), Ok((1000, 86_400 * S)));
        assert_eq!(q("5/2h"), Ok((5, 7200 * S)));
        assert_eq!(q("3/1.5s"), Ok((3, Duration::from_millis(1500))));
        assert_eq!(q(" 5 / 2h "), Ok((5, 7200 * S)));
        assert_eq!(q("\t7/s\n"), Ok((7, S)));
        assert_eq!("100/s".parse::<Quota>().map(|q| q.burst()), Ok(100));
    }

    #[test]
    fn durations_in_every_spelling() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1m30s"), Ok(90 * S));
        assert_eq!(parse_duration(" 10s "), Ok(10 * S));
        assert_eq!(parse_duration("1ns"), Ok(Duration::from_nanos(1)));
        assert_eq!(parse_duration("2 days"), Ok(172_800 * S));
        assert_eq!(parse_duration_or_zero("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration_or_zero("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration_or_zero("100ms"), Ok(Duration::from_millis(100)));
    }

    #[test]
    fn rates_may_count_zero_but_quotas_may_not() {
        assert_eq!(parse_rate("0/s"), Ok((0, S)));
        let e = Quota::parse("0/s").unwrap_err();
        assert_eq!(e.kind(), &ParseErrorKind::Quota(QuotaError::ZeroLimit));
        assert_eq!(e.to_string(), "invalid quota \"0/s\": quota limit must be at least 1 permit per period, got 0");
    }

    #[test]
    fn bad_input_names_the_text_and_what_is_wrong() {
        use ParseErrorKind as K;
        // `None`: humantime's own complaint about the period (`BadDuration`).
        let cases = [
            ("abc", Some(K::NoSlash), "no '/'"),
            ("100", Some(K::NoSlash), "no '/'"),
            ("5/", Some(K::NoPeriod), "no period"),
            ("5/  ", Some(K::NoPeriod), "no period"),
            ("/s", Some(K::BadCount(String::new())), "count \"\""),
            ("x/s", Some(K::BadCount("x".into())), "count \"x\""),
            ("-1/s", Some(K::BadCount("-1".into())), "count \"-1\""),
            ("1.5/s", Some(K::BadCount("1.5".into())), "count \"1.5\""),
            ("99999999999999999999/s", Some(K::CountTooLarge("99999999999999999999".into())), "too large"),
            ("10/0s", Some(K::Zero("0s".into())), "\"0s\" is zero"),
            ("10/parsec", None, "\"parsec\" is not a duration"),
            ("10/fortnight", None, "unknown time unit"),
            ("10/10", None, "time unit needed"),
        ];
        for (input, kind, needle) in cases {
            let e = Quota::parse(input).unwrap_err();
            assert_eq!(e.input(), input);
            assert_eq!(e.expected(), ParseTarget::Quota);
            match kind {
                Some(kind) => assert_eq!(e.kind(), &kind, "{input}"),
                None => assert!(matches!(e.kind(), K::BadDuration { .. }), "{input}: {:?}", e.kind()),
            }
            let message = e.to_string();
            assert!(message.starts_with(&format!("invalid quota {input:?}: ")), "{message}");
            assert!(message.contains(needle), "{input}: {message}");
            assert!(message.ends_with("(expected COUNT/PERIOD such as 100/s, 5/10m, 60/1m30s, 1000/day)"), "{message}");
        }
    }

    #[test]
    fn quotas_the_core_cannot_enforce_are_errors() {
        let e = Quota::parse("2000000000/s").unwrap_err();
        assert!(matches!(e.kind(), ParseErrorKind::Quota(QuotaError::RateTooHigh { .. })), "{e}");
        assert!(e.to_string().contains("nanosecond"), "{e}");
        let e = Quota::parse("1/600years").unwrap_err();
        assert!(matches!(e.kind(), ParseErrorKind::TooLong(_)), "{e}");
        assert!(e.to_string().contains("584 years"), "{e}");
    }

    #[test]
    fn bad_durations() {
        for (input, kind) in [
            ("", ParseErrorKind::Empty),
            ("   ", ParseErrorKind::Empty),
            ("0s", ParseErrorKind::Zero("0s".into())),
            ("0", ParseErrorKind::Zero("0".into())),
            (" 0ms ", ParseErrorKind::Zero("0ms".into())),
            ("600years", ParseErrorKind::TooLong("600years".into())),
        ] {
            let e = parse_duration(input).unwrap_err();
            assert_eq!(e.kind(), &kind, "{input:?}");
            assert_eq!(e.input(), input);
            assert!(e.to_string().starts_with(&format!("invalid duration {input:?}: ")), "{e}");
        }
        for input in ["soon", "10", "5 parsecs", "-1s", "1s2", "99999999999999999999999h"] {
            let e = parse_duration(input).unwrap_err();
            assert!(matches!(e.kind(), ParseErrorKind::BadDuration { .. }), "{input}: {e:?}");
            assert!(e.to_string().ends_with("(expected a duration such as 250ms, 10s, 1m30s, 2h)"), "{e}");
        }
        assert!(parse_duration_or_zero("abc").is_err());
        assert!(parse_duration_or_zero("").is_err());
    }

    #[test]
    fn no_panic_on_odd_input() {
        for input in ["/", "//", "1//s", "1/s/s", "\u{0}", "µs", "1/µs", "1/é", "１/s", "1/ 1 s", "ß/ß"] {
            let _ = Quota::parse(input);
            let _ = parse_rate(input);
            let _ = parse_duration(input);
        }
    }
}
