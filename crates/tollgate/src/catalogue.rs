//! [`AlgorithmKind`]: every rate-limiting algorithm by the name people write, and where each can
//! run. The limits file, the simulator, the Redis limiters and the server's storage checks all
//! read this one table, so a name or a capability is written once.

use std::fmt;
use std::str::FromStr;

/// One of the rate-limiting algorithms, by name.
///
/// ```
/// use tollgate::AlgorithmKind;
/// let kind: AlgorithmKind = "sliding-log".parse()?;     // `-` may stand for `_`
/// assert_eq!(kind, AlgorithmKind::SlidingLog);
/// assert_eq!(kind.name(), "sliding_log");
/// assert!(kind.support().redis && !kind.support().limits_file);
/// assert!("leaky_bucket".parse::<AlgorithmKind>().unwrap_err().to_string().contains("token_bucket"));
/// # Ok::<(), tollgate::UnknownAlgorithm>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AlgorithmKind {
    /// [`crate::TokenBucket`]: continuous refill (GCRA), up to `burst` at once.
    TokenBucket,
    /// [`crate::IntervalBucket`]: `limit` tokens added every period, up to `burst`.
    IntervalBucket,
    /// [`crate::FixedWindow`]: `limit` per window; a window opens at the first request after the
    /// previous one ended (Limitador's).
    FixedWindow,
    /// [`crate::SlidingWindow`]: the period cut into segments.
    SlidingWindow,
    /// [`crate::WeightedWindow`]: the previous window weighted by its overlap, plus the current one.
    WeightedWindow,
    /// [`crate::SlidingLog`]: exact, one log entry per admission time.
    SlidingLog,
}

/// Where an algorithm can count (see [`AlgorithmKind::support`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Support {
    /// In this process ([`crate::Limiter`], [`crate::Keyed`]): every algorithm.
    pub memory: bool,
    /// In Redis, one script per decision (`tollgate_redis::RedisLimiter`).
    pub redis: bool,
    /// As counters in Redis shared by every replica of the rate-limit server (`--storage redis`,
    /// `redis-cached`, `redis-leased`).
    pub redis_counters: bool,
    /// Spent from slices leased from Redis (`tollgate_redis::LeasedLimiter`).
    pub leased: bool,
    /// In windows aligned to the calendar (`FixedWindow::calendar`, the `calendar` feature).
    pub calendar: bool,
    /// Named in a limits file: the server's algorithms, with one quota per limit.
    pub limits_file: bool,
    /// Counts permits per window and never refills one at a time, so any number per window is
    /// exact, more than one per nanosecond too ([`Quota::window`](crate::Quota::window)).
    pub windowed: bool,
}

impl AlgorithmKind {
    /// Every algorithm, in the order lists and reports show them.
    pub const ALL: [AlgorithmKind; 6] = [
        AlgorithmKind::TokenBucket,
        AlgorithmKind::IntervalBucket,
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingWindow,
        AlgorithmKind::WeightedWindow,
        AlgorithmKind::SlidingLog,
    ];

    /// The name in limits files and on the command line: `token_bucket`, `fixed_window`, ...
    pub fn name(self) -> &'static str {
        match self {
            AlgorithmKind::TokenBucket => "token_bucket",
            AlgorithmKind::IntervalBucket => "interval_bucket",
            AlgorithmKind::FixedWindow => "fixed_window",
            AlgorithmKind::SlidingWindow => "sliding_window",
            AlgorithmKind::WeightedWindow => "weighted_window",
            AlgorithmKind::SlidingLog => "sliding_log",
        }
    }

    /// The algorithm named `name` (exactly as [`AlgorithmKind::name`] writes it).
    pub fn from_name(name: &str) -> Option<AlgorithmKind> {
        AlgorithmKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Where this algorithm can count.
    pub fn support(self) -> Support {
        let no = Support {
            memory: true,
            redis: false,
            redis_counters: false,
            leased: false,
            calendar: false,
            limits_file: false,
            windowed: false,
        };
        match self {
            AlgorithmKind::TokenBucket => Support { redis: true, limits_file: true, ..no },
            AlgorithmKind::IntervalBucket => no,
            AlgorithmKind::FixedWindow => {
                let windowed = true;
                Support {
                    redis: true,
                    redis_counters: true,
                    leased: true,
                    calendar: true,
                    limits_file: true,
                    windowed,
                    ..no
                }
            }
            AlgorithmKind::SlidingWindow => Support { limits_file: true, windowed: true, ..no },
            AlgorithmKind::WeightedWindow => Support { redis: true, limits_file: true, windowed: true, ..no },
            AlgorithmKind::SlidingLog => Support { redis: true, ..no },
        }
    }

    /// The algorithms `supported` picks, by name, for error messages: `"a, b or c"`.
    pub fn names_where(supported: impl Fn(Support) -> bool) -> String {
        let names: Vec<&str> =
            AlgorithmKind::ALL.into_iter().filter(|k| supported(k.support())).map(|k| k.name()).collect();
        match names.split_last() {
            Some((last, [])) => (*last).to_owned(),
            Some((last, others)) => format!("{} or {last}", others.join(", ")),
            None => String::new(),
        }
    }
}

impl fmt::Display for AlgorithmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Text that names no algorithm.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown algorithm {name:?}: expected {}", AlgorithmKind::names_where(|_| true))]
pub struct UnknownAlgorithm {
    /// The text as given.
    pub name: String,
}

/// Parses a name as people type it: case and `-` for `_` do not matter, spaces around are
/// ignored.
impl FromStr for AlgorithmKind {
    type Err = UnknownAlgorithm;

    fn from_str(s: &str) -> Result<AlgorithmKind, UnknownAlgorithm> {
        AlgorithmKind::from_name(&s.trim().to_ascii_lowercase().replace('-', "_"))
            .ok_or_else(|| UnknownAlgorithm { name: s.to_owned() })
    }
}
