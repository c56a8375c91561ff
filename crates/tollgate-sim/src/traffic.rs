//! Traffic patterns: when requests arrive. Each pattern turns into a sorted list of arrival times
//! (nanoseconds from the start); the random one takes a seed, so the same seed gives the same
//! arrivals.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tollgate::Quota;

use crate::clients::Clients;
use crate::error::SimError;
use crate::units::{Rate, Span, nanos};

/// Most requests one simulation offers: each algorithm keeps every admission time, so this bounds
/// memory (a few hundred MB at worst) and time (about a second per algorithm).
pub const MAX_REQUESTS: usize = 2_000_000;

const PATTERNS: &str = "steady[:RATE], bursts[:N/EVERY], boundary[:N[,SPREAD]], poisson[:RATE], \
                        ramp[:FROM..TO], replay:FILE";

/// When requests arrive.
#[derive(Clone, Debug, PartialEq)]
pub enum Traffic {
    /// Evenly spaced arrivals at `rate`, the first at time zero.
    Steady {
        /// Arrival rate.
        rate: Rate,
    },
    /// `size` requests at the same instant, every `every`, the first burst at time zero.
    Bursts {
        /// Requests per burst.
        size: u64,
        /// Time between bursts.
        every: Duration,
    },
    /// Seed 001's fixed-window flaw, attacked on purpose. Every two windows (of the quota's
    /// period, starting at zero): one request at the start (it opens a fixed window there, as an
    /// attacker learns from `reset_after`), `size` requests spread evenly over the last `spread`
    /// of that window, and `size` more over the first `spread` of the next one.
    Boundary {
        /// Requests on each side of the boundary.
        size: u64,
        /// How long each half of the attack lasts (zero: all at one instant, 1 ns apart).
        spread: Duration,
        /// The window length: the quota's period.
        window: Duration,
    },
    /// Poisson arrivals (exponential gaps) at `rate` on average, drawn from the seed.
    Poisson {
        /// Mean arrival rate.
        rate: Rate,
    },
    /// The rate climbs (or falls) linearly from `from` at the start to `to` at the end.
    Ramp {
        /// Rate at time zero.
        from: Rate,
        /// Rate at the end of the simulation.
        to: Rate,
    },
    /// Arrival times read from a file (see [`parse_replay`]).
    Replay {
        /// Where they came from.
        source: PathBuf,
        /// Offsets from the start in nanoseconds, sorted.
        times: Vec<u64>,
    },
    /// Clients with costs known only after the work, each holding one request at a time; each
    /// algorithm runs them twice, reserving and settling, and checking then charging (see
    /// [`Clients`] and [`crate::Way`]). Built from `--costs` ([`Clients::parse`]), not by
    /// [`Traffic::parse`]. Its requests are not known in advance (the clients ask when the
    /// limiter lets them): it has no [`arrivals`](Traffic::arrivals).
    Clients(Clients),
}

impl Traffic {
    /// Parses a pattern as the command line writes it; parameters left out default relative to
    /// the quota (limit `L` per period `P`):
    ///
    /// | pattern | meaning | default |
    /// | --- | --- | --- |
    /// | `steady[:RATE]` | evenly spaced, e.g. `steady:150/s` | `2L/P` |
    /// | `bursts[:N/EVERY]` | `N` at once every `EVERY`, e.g. `bursts:50/2s` | `2L/2P` |
    /// | `boundary[:N[,SPREAD]]` | see [`Traffic::Boundary`], e.g. `boundary:100,50ms` | `L`, `P/20` |
    /// | `poisson[:RATE]` | random gaps, mean rate `RATE` | `2L/P` |
    /// | `ramp[:FROM..TO]` or `ramp:TO` | rate rising linearly, e.g. `ramp:0/s..300/s` | `0/P..3L/P` |
    /// | `replay:FILE` | timestamps from `FILE` ([`parse_replay`]) | — |
    ///
    /// `replay` reads its file here, so errors in it (with their line number) surface before
    /// anything runs.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Quota;
    /// use tollgate_sim::Traffic;
    /// let quota = Quota::per_second(100)?;
    /// let t = Traffic::parse("boundary", &quota)?;
    /// assert_eq!(
    ///     t,
    ///     Traffic::Boundary { size: 100, spread: Duration::from_millis(50), window: Duration::from_secs(1) }
    /// );
    /// assert!(Traffic::parse("tsunami", &quota).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn parse(spec: &str, quota: &Quota) -> Result<Traffic, SimError> {
        let bad = |reason: String| SimError::invalid("--traffic", spec, reason);
        let (name, args) = match spec.split_once(':') {
            Some((name, args)) => (name.trim(), Some(args.trim())),
            None => (spec.trim(), None),
        };
        let limit = quota.limit();
        let period = quota.period();
        let times = |k: u64| Rate { count: limit.saturating_mul(k), per: period };
        let rate = |s: &str| Rate::parse("--traffic", s);
        let positive = |r: Rate, what: &str| {
            if r.count == 0 { Err(bad(format!("{what} must be more than zero requests"))) } else { Ok(r) }
        };
        match (name.to_ascii_lowercase().as_str(), args) {
            ("steady", None) => Ok(Traffic::Steady { rate: times(2) }),
            ("steady", Some(a)) => Ok(Traffic::Steady { rate: positive(rate(a)?, "the rate")? }),
            ("bursts" | "burst", None) => {
                Ok(Traffic::Bursts { size: limit.saturating_mul(2), every: period.saturating_mul(2) })
            }
            ("bursts" | "burst", Some(a)) => {
                let r = positive(rate(a)?, "a burst")?;
                Ok(Traffic::Bursts { size: r.count, every: r.per })
            }
            ("boundary" | "boundary-attack" | "boundary_attack", a) => {
                let (size, spread) = match a.map(|a| a.split_once(',').unwrap_or((a, ""))) {
                    None => (None, None),
                    Some((n, s)) => (Some(n.trim()), Some(s.trim()).filter(|s| !s.is_empty())),
                };
                let size = match size {
                    None => limit,
                    Some(n) => n.parse::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| {
                        bad(format!("burst size {n:?} is not a whole number above zero (boundary[:N[,SPREAD]])"))
                    })?,
                };
                let spread = match spread {
                    None => period / 20,
                    Some(s) => tollgate::parse_duration_or_zero(s)
                        .map_err(|source| SimError::Parse { what: "--traffic boundary spread", source })?,
                };
                if spread > period / 2 {
                    return Err(bad(format!(
                        "spread {} is more than half the quota's period {}",
                        Span(spread),
                        Span(period)
                    )));
                }
                Ok(Traffic::Boundary { size, spread, window: period })
            }
            ("poisson", None) => Ok(Traffic::Poisson { rate: times(2) }),
            ("poisson", Some(a)) => Ok(Traffic::Poisson { rate: positive(rate(a)?, "the rate")? }),
            ("ramp", None) => Ok(Traffic::Ramp { from: Rate { count: 0, per: period }, to: times(3) }),
            ("ramp", Some(a)) => {
                let (from, to) = match a.split_once("..") {
                    Some((from, to)) => (rate(from)?, rate(to)?),
                    None => {
                        let to = rate(a)?;
                        (Rate { count: 0, per: to.per }, to)
                    }
                };
                if from.count == 0 && to.count == 0 {
                    return Err(bad("a ramp from zero to zero offers nothing".into()));
                }
                Ok(Traffic::Ramp { from, to })
            }
            ("replay", Some(path)) if !path.is_empty() => {
                let path = Path::new(path);
                Ok(Traffic::Replay { source: path.to_owned(), times: read_replay(path)? })
            }
            ("replay", _) => Err(bad("replay needs a file: replay:FILE".into())),
            _ => Err(bad(format!("unknown pattern {name:?}; expected one of {PATTERNS}"))),
        }
    }

    /// Arrival times in nanoseconds from the start, sorted, all before `duration`. `seed` feeds
    /// the random patterns (only Poisson). None for [`Traffic::Clients`]: they ask as the limiter
    /// lets them.
    pub fn arrivals(&self, duration: Duration, seed: u64) -> Result<Vec<u64>, SimError> {
        let end = nanos(duration);
        let mut out = Arrivals { times: Vec::new(), end, what: self, duration };
        match self {
            Traffic::Steady { rate } => {
                let per = nanos(rate.per) as u128;
                for k in 0u128.. {
                    let t = k * per / rate.count.max(1) as u128;
                    if t >= end as u128 || rate.count == 0 {
                        break;
                    }
                    out.push(t as u64)?;
                }
            }
            Traffic::Bursts { size, every } => {
                let every = nanos(*every).max(1);
                let mut t = 0u64;
                while t < end && *size > 0 {
                    for _ in 0..*size {
                        out.push(t)?;
                    }
                    t = t.saturating_add(every);
                }
            }
            Traffic::Boundary { size, spread, window } => {
                let (p, spread) = (nanos(*window).max(1), nanos(*spread));
                let mut cycle = 0u64;
                while cycle < end {
                    out.push(cycle)?;
                    let boundary = cycle.saturating_add(p);
                    let step = |i: u64| (i as u128 * spread as u128 / *size as u128) as u64;
                    for i in 0..*size {
                        let t = if spread == 0 {
                            boundary.saturating_sub(1)
                        } else {
                            boundary.saturating_sub(spread).saturating_add(step(i))
                        };
                        out.push(t)?;
                    }
                    for i in 0..*size {
                        out.push(boundary.saturating_add(step(i)))?;
                    }
                    cycle = cycle.saturating_add(p.saturating_mul(2));
                }
            }
            Traffic::Poisson { rate } => {
                let mean = 1.0 / rate.per_ns();
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let mut t = 0.0f64;
                loop {
                    // 1 - u lies in (0, 1], so the logarithm is finite.
                    let u: f64 = rng.random();
                    t += -(1.0 - u).ln() * mean;
                    if t >= end as f64 {
                        break;
                    }
                    out.push(t as u64)?;
                }
            }
            Traffic::Ramp { from, to } => {
                // Requests so far N(t) = b·t + a·t², with b the starting rate and a its slope / 2;
                // the k-th request arrives when N(t) = k.
                let b = from.per_ns();
                let a = (to.per_ns() - b) / (2.0 * end as f64);
                for k in 1u64.. {
                    let disc = b * b + 4.0 * a * k as f64;
                    let denom = b + disc.max(0.0).sqrt();
                    if disc < 0.0 || denom <= 0.0 {
                        break;
                    }
                    let t = 2.0 * k as f64 / denom;
                    if t >= end as f64 {
                        break;
                    }
                    out.push(t as u64)?;
                }
            }
            Traffic::Replay { times, .. } => {
                for &t in times.iter().take_while(|&&t| t < end) {
                    out.push(t)?;
                }
            }
            Traffic::Clients(_) => {}
        }
        let mut times = out.times;
        times.sort_unstable();
        Ok(times)
    }
}

impl Traffic {
    /// A short name for titles: `steady 200/1s`, `boundary attack 100+100`, ...
    pub fn label(&self) -> String {
        match self {
            Traffic::Steady { rate } => format!("steady {rate}"),
            Traffic::Bursts { size, every } => format!("bursts of {size} every {}", Span(*every)),
            Traffic::Boundary { size, .. } => format!("boundary attack {size}+{size}"),
            Traffic::Poisson { rate } => format!("Poisson {rate}"),
            Traffic::Ramp { from, to } => format!("ramp {from} -> {to}"),
            Traffic::Replay { source, .. } => format!("replay of {}", source.display()),
            Traffic::Clients(clients) => clients.label(),
        }
    }
}

/// Collects arrival times, refusing to grow past [`MAX_REQUESTS`].
struct Arrivals<'a> {
    times: Vec<u64>,
    end: u64,
    what: &'a Traffic,
    duration: Duration,
}

impl Arrivals<'_> {
    fn push(&mut self, t: u64) -> Result<(), SimError> {
        if t >= self.end {
            return Ok(());
        }
        if self.times.len() >= MAX_REQUESTS {
            return Err(SimError::TooManyRequests {
                traffic: self.what.to_string(),
                duration: Span(self.duration).to_string(),
                max: MAX_REQUESTS,
            });
        }
        self.times.push(t);
        Ok(())
    }
}

impl fmt::Display for Traffic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Traffic::Steady { rate } => write!(f, "steady {rate}"),
            Traffic::Bursts { size, every } => write!(f, "bursts of {size} every {}", Span(*every)),
            Traffic::Boundary { size, spread, window } => write!(
                f,
                "boundary attack ({size} in the last {s} of a {w} window, {size} in the first {s} of the next, every {w2})",
                s = Span(*spread),
                w = Span(*window),
                w2 = Span(window.saturating_mul(2)),
            ),
            Traffic::Poisson { rate } => write!(f, "Poisson {rate}"),
            Traffic::Ramp { from, to } => write!(f, "ramp {from} -> {to}"),
            Traffic::Replay { source, times } => {
                write!(f, "replay of {} ({} timestamps)", source.display(), times.len())
            }
            Traffic::Clients(clients) => write!(f, "{clients}"),
        }
    }
}

/// Reads a pattern file (see [`parse_replay`]).
pub fn read_replay(path: &Path) -> Result<Vec<u64>, SimError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| SimError::ReplayRead { path: path.to_owned(), source })?;
    parse_replay(&text, path)
}

/// Parses a pattern file: one arrival per line, either seconds from the start (`0`, `1.25`,
/// `3e-3`) or RFC 3339 timestamps (`2024-05-01T12:00:00.250Z`, `2024-05-01T14:00:00+02:00`), not
/// both in one file; timestamps are shifted so the earliest is at zero. Blank lines and lines
/// starting with `#` are skipped; lines need not be sorted. A bad line is an error naming `path`
/// and its 1-based line number.
///
/// ```
/// use std::path::Path;
/// use tollgate_sim::parse_replay;
/// let t = parse_replay("# arrivals\n2024-05-01T12:00:01Z\n2024-05-01T12:00:00.5Z\n", Path::new("a.txt"))?;
/// assert_eq!(t, [0, 500_000_000]);
/// let e = parse_replay("0.5\n1\nlater\n", Path::new("a.txt")).unwrap_err();
/// assert!(e.to_string().contains("a.txt, line 3"));
/// # Ok::<(), tollgate_sim::SimError>(())
/// ```
pub fn parse_replay(text: &str, path: &Path) -> Result<Vec<u64>, SimError> {
    #[derive(Clone, Copy, PartialEq)]
    enum Kind {
        Seconds,
        Rfc3339,
    }
    let bad = |line: usize, reason: String| SimError::ReplayLine { path: path.to_owned(), line, reason };
    let mut first: Option<(Kind, usize)> = None;
    let mut seconds: Vec<u64> = Vec::new();
    let mut stamps: Vec<(i128, usize)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let s = raw.trim();
        if s.is_empty() || s.starts_with('#') {
            continue;
        }
        let kind = if let Ok(v) = s.parse::<f64>() {
            if !v.is_finite() || v < 0.0 {
                return Err(bad(line, format!("{s:?} is not a non-negative, finite number of seconds")));
            }
            if v >= 1.8e10 {
                return Err(bad(line, format!("{s:?} seconds is more than 570 years")));
            }
            seconds.push((v * 1e9).round() as u64);
            Kind::Seconds
        } else if let Some(ns) = rfc3339_nanos(s) {
            stamps.push((ns, line));
            Kind::Rfc3339
        } else {
            return Err(bad(
                line,
                format!(
                    "{s:?} is neither seconds from the start (e.g. 1.25) nor an RFC 3339 timestamp \
                     (e.g. 2024-05-01T12:00:00.250Z)"
                ),
            ));
        };
        match first {
            None => first = Some((kind, line)),
            Some((k, at)) if k != kind => {
                let (this, that) = match kind {
                    Kind::Seconds => ("seconds", "RFC 3339 timestamps"),
                    Kind::Rfc3339 => ("an RFC 3339 timestamp", "seconds"),
                };
                return Err(bad(line, format!("{s:?} is {this}, but the file uses {that} (from line {at})")));
            }
            Some(_) => {}
        }
    }
    let mut times = match first {
        None => return Err(SimError::ReplayEmpty { path: path.to_owned() }),
        Some((Kind::Seconds, _)) => seconds,
        Some((Kind::Rfc3339, _)) => {
            let min = stamps.iter().map(|&(ns, _)| ns).min().unwrap_or(0);
            let mut out = Vec::with_capacity(stamps.len());
            for (ns, line) in stamps {
                let offset = u64::try_from(ns - min)
                    .map_err(|_| bad(line, "more than 584 years after the earliest timestamp".to_owned()))?;
                out.push(offset);
            }
            out
        }
    };
    times.sort_unstable();
    Ok(times)
}

/// Nanoseconds since the Unix epoch of an RFC 3339 timestamp with `Z` or a numeric offset.
fn rfc3339_nanos(s: &str) -> Option<i128> {
    if !s.is_ascii() {
        return None;
    }
    // RFC 3339 allows lower-case `t` and `z`.
    let s = s.to_ascii_uppercase();
    let b = s.as_bytes();
    let (utc, offset_s) = if s.ends_with('Z') {
        (s.clone(), 0i128)
    } else if b.len() > 6 && matches!(b[b.len() - 6], b'+' | b'-') && b[b.len() - 3] == b':' {
        let (hh, mm) = (&s[s.len() - 5..s.len() - 3], &s[s.len() - 2..]);
        if !(hh.bytes().chain(mm.bytes())).all(|c| c.is_ascii_digit()) {
            return None;
        }
        let (hh, mm): (i128, i128) = (hh.parse().ok()?, mm.parse().ok()?);
        if hh > 23 || mm > 59 {
            return None;
        }
        let sign = if b[b.len() - 6] == b'-' { -1 } else { 1 };
        (format!("{}Z", &s[..s.len() - 6]), sign * (hh * 3600 + mm * 60))
    } else {
        return None;
    };
    let t = humantime::parse_rfc3339(&utc).ok()?;
    let since = t.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    // Local time = UTC + offset, so UTC = local - offset.
    Some(since.as_nanos() as i128 - offset_s * 1_000_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(limit: u64, period_ms: u64) -> Quota {
        Quota::per(Duration::from_millis(period_ms), limit).unwrap()
    }

    #[test]
    fn steady_is_exact_and_evenly_spaced() {
        let t = Traffic::parse("steady:3/s", &q(1, 1000)).unwrap().arrivals(Duration::from_secs(2), 0).unwrap();
        assert_eq!(t, [0, 333_333_333, 666_666_666, 1_000_000_000, 1_333_333_333, 1_666_666_666]);
        // The default is twice the quota.
        let t = Traffic::parse("steady", &q(10, 1000)).unwrap().arrivals(Duration::from_secs(1), 0).unwrap();
        assert_eq!(t.len(), 20);
    }

    #[test]
    fn bursts_arrive_together() {
        let t = Traffic::parse("bursts:3/500ms", &q(1, 1000)).unwrap().arrivals(Duration::from_secs(1), 0).unwrap();
        assert_eq!(t, [0, 0, 0, 500_000_000, 500_000_000, 500_000_000]);
    }

    #[test]
    fn boundary_straddles_every_other_window_boundary() {
        let quota = q(4, 1000);
        let t = Traffic::parse("boundary:4,40ms", &quota).unwrap().arrivals(Duration::from_secs(4), 0).unwrap();
        let ms: Vec<u64> = t.iter().map(|t| t / 1_000_000).collect();
        assert_eq!(
            ms,
            [0, 960, 970, 980, 990, 1000, 1010, 1020, 1030, 2000, 2960, 2970, 2980, 2990, 3000, 3010, 3020, 3030]
        );
        let t = Traffic::parse("boundary:2,0", &quota).unwrap().arrivals(Duration::from_secs(2), 0).unwrap();
        assert_eq!(t, [0, 999_999_999, 999_999_999, 1_000_000_000, 1_000_000_000]);
        assert!(Traffic::parse("boundary:4,600ms", &quota).unwrap_err().to_string().contains("half"));
        assert!(Traffic::parse("boundary:0", &quota).unwrap_err().to_string().contains("\"0\""));
    }

    #[test]
    fn poisson_is_seeded_and_near_its_rate() {
        let p = Traffic::parse("poisson:1000/s", &q(1, 1000)).unwrap();
        let a = p.arrivals(Duration::from_secs(10), 7).unwrap();
        assert_eq!(a, p.arrivals(Duration::from_secs(10), 7).unwrap());
        assert_ne!(a, p.arrivals(Duration::from_secs(10), 8).unwrap());
        assert!((9_500..10_500).contains(&a.len()), "{}", a.len());
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn ramp_offers_the_area_under_its_rate() {
        let r = Traffic::parse("ramp:0/s..200/s", &q(1, 1000)).unwrap();
        let a = r.arrivals(Duration::from_secs(10), 0).unwrap();
        // 100/s on average over 10 s; the second half three times as busy as the first.
        assert!((999..=1000).contains(&a.len()), "{}", a.len());
        let first_half = a.iter().filter(|&&t| t < 5_000_000_000).count();
        assert!((249..=251).contains(&first_half), "{first_half}");
        let down =
            Traffic::parse("ramp:200/s..0/s", &q(1, 1000)).unwrap().arrivals(Duration::from_secs(10), 0).unwrap();
        assert!((999..=1000).contains(&down.len()), "{}", down.len());
    }

    #[test]
    fn unknown_and_malformed_patterns_name_the_value() {
        let quota = q(1, 1000);
        for (spec, needle) in [
            ("wave", "unknown pattern \"wave\""),
            ("steady:0/s", "more than zero"),
            ("steady:fast", "no '/'"),
            ("ramp:0/s..0/s", "zero to zero"),
            ("replay", "needs a file"),
            ("replay:/definitely/not/here.txt", "cannot read pattern file /definitely/not/here.txt"),
        ] {
            let e = Traffic::parse(spec, &quota).unwrap_err().to_string();
            assert!(e.contains(needle), "{spec}: {e}");
        }
    }

    #[test]
    fn too_much_traffic_is_an_error_not_an_out_of_memory() {
        let t = Traffic::parse("steady:1000000/s", &q(1, 1000)).unwrap();
        let e = t.arrivals(Duration::from_secs(3600), 0).unwrap_err();
        assert!(matches!(e, SimError::TooManyRequests { .. }), "{e}");
    }

    #[test]
    fn replay_reads_seconds_and_timestamps() {
        let p = Path::new("p.txt");
        assert_eq!(parse_replay("\n1.5\n# c\n0\n  2e-3 \n", p).unwrap(), [0, 2_000_000, 1_500_000_000]);
        let t =
            parse_replay("2024-05-01T12:00:00+02:00\n2024-05-01t10:00:00.25z\n2024-05-01T09:59:59-00:00\n", p).unwrap();
        assert_eq!(t, [0, 1_000_000_000, 1_250_000_000]);
    }

    #[test]
    fn replay_errors_carry_the_line_number() {
        let p = Path::new("p.txt");
        let e = |text| parse_replay(text, p).unwrap_err().to_string();
        assert!(e("0\n1\n\nabc\n").contains("p.txt, line 4: \"abc\" is neither"), "{}", e("0\n1\n\nabc\n"));
        assert!(e("0\n-1\n").contains("line 2"));
        assert!(e("0\nNaN\n").contains("line 2"));
        assert!(e("0\n2024-05-01T12:00:00Z\n").contains("line 2: \"2024-05-01T12:00:00Z\" is an RFC 3339 timestamp"));
        assert!(e("2024-05-01T12:00:00+25:00\n").contains("line 1"));
        assert!(e("# nothing\n\n").contains("holds no timestamps"));
    }
}
