//! [`AlgorithmKind`]: the rate-limiting algorithms of the core crate the simulator compares, by the
//! names the command line uses.

use std::fmt;

use crate::error::SimError;

/// One of the core crate's rate-limiting algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AlgorithmKind {
    /// [`tollgate::TokenBucket`]: continuous refill (GCRA), up to `burst` at once.
    TokenBucket,
    /// [`tollgate::IntervalBucket`]: `limit` tokens added every period, up to `burst`.
    IntervalBucket,
    /// [`tollgate::FixedWindow`]: `limit` per window; a window opens at the first request after the
    /// previous one ended.
    FixedWindow,
    /// [`tollgate::SlidingWindow`]: the period cut into segments (`--segments`).
    SlidingWindow,
    /// [`tollgate::WeightedWindow`]: previous window weighted by its overlap plus the current one.
    WeightedWindow,
    /// [`tollgate::SlidingLog`]: exact, one log entry per admission time.
    SlidingLog,
}

impl AlgorithmKind {
    /// Every algorithm, in the order the report lists them.
    pub const ALL: [AlgorithmKind; 6] = [
        AlgorithmKind::TokenBucket,
        AlgorithmKind::IntervalBucket,
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingWindow,
        AlgorithmKind::WeightedWindow,
        AlgorithmKind::SlidingLog,
    ];

    /// The command-line name: `token_bucket`, `fixed_window`, ...
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

    /// Parses `all` or a comma-separated list of names (`-` may stand for `_`); duplicates are
    /// dropped, the order given is kept.
    ///
    /// ```
    /// use tollgate_sim::AlgorithmKind;
    /// assert_eq!(AlgorithmKind::parse_list("all")?.len(), 6);
    /// assert_eq!(
    ///     AlgorithmKind::parse_list("sliding-log,fixed_window")?,
    ///     [AlgorithmKind::SlidingLog, AlgorithmKind::FixedWindow]
    /// );
    /// assert!(AlgorithmKind::parse_list("leaky_bucket").is_err());
    /// # Ok::<(), tollgate_sim::SimError>(())
    /// ```
    pub fn parse_list(s: &str) -> Result<Vec<AlgorithmKind>, SimError> {
        if s.trim().eq_ignore_ascii_case("all") {
            return Ok(AlgorithmKind::ALL.to_vec());
        }
        let mut out = Vec::new();
        for part in s.split(',') {
            let name = part.trim().to_ascii_lowercase().replace('-', "_");
            let kind = AlgorithmKind::ALL.into_iter().find(|k| k.name() == name).ok_or_else(|| {
                let known: Vec<&str> = AlgorithmKind::ALL.iter().map(|k| k.name()).collect();
                SimError::invalid(
                    "--algorithms",
                    s,
                    format!(
                        "unknown algorithm {:?}; expected `all` or a comma-separated list of {}",
                        part.trim(),
                        known.join(", ")
                    ),
                )
            })?;
            if !out.contains(&kind) {
                out.push(kind);
            }
        }
        Ok(out)
    }
}

impl fmt::Display for AlgorithmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
