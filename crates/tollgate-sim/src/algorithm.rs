//! [`AlgorithmKind`]: the rate-limiting algorithms of the core crate the simulator compares, by the
//! names the command line uses.

use crate::error::SimError;

/// One of the core crate's rate-limiting algorithms (the core's catalogue: every one can be
/// simulated).
pub use tollgate::AlgorithmKind;

/// Parses `all` or a comma-separated list of names (`-` may stand for `_`); duplicates are
/// dropped, the order given is kept.
///
/// ```
/// use tollgate_sim::{AlgorithmKind, parse_algorithms};
/// assert_eq!(parse_algorithms("all")?.len(), 6);
/// assert_eq!(parse_algorithms("sliding-log,fixed_window")?, [AlgorithmKind::SlidingLog, AlgorithmKind::FixedWindow]);
/// assert!(parse_algorithms("leaky_bucket").is_err());
/// # Ok::<(), tollgate_sim::SimError>(())
/// ```
pub fn parse_algorithms(s: &str) -> Result<Vec<AlgorithmKind>, SimError> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(AlgorithmKind::ALL.to_vec());
    }
    let mut out = Vec::new();
    for part in s.split(',') {
        let kind: AlgorithmKind = part.parse().map_err(|e: tollgate::UnknownAlgorithm| {
            SimError::invalid("--algorithms", s, format!("{e}, or `all`, or a comma-separated list of them"))
        })?;
        if !out.contains(&kind) {
            out.push(kind);
        }
    }
    Ok(out)
}
