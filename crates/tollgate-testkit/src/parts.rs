//! Random parts of an all-or-nothing call, for the property tests that hold a two-phase site
//! (one script run, one lock) to `tollgate::AllOrNothing` taking one part at a time.

use proptest::prelude::*;

/// One part of a call: a counter's limit, what is already used of it, the hits the call asks
/// for, and whether it enforces (or only counts).
#[derive(Clone, Debug)]
pub struct Part {
    /// The counter's limit.
    pub limit: u64,
    /// Used before the call (at most `limit`).
    pub used: u64,
    /// Asked for by the call (0 to 6: past the limit too).
    pub hits: u64,
    /// True when the part denies the call without room; false when it only counts.
    pub enforce: bool,
}

/// A part with a limit from 1 to 5, any use of it, 0 to 6 hits, enforcing or not.
///
/// ```
/// use proptest::strategy::{Strategy, ValueTree};
/// let mut runner = proptest::test_runner::TestRunner::default();
/// let part = tollgate_testkit::part().new_tree(&mut runner).unwrap().current();
/// assert!(part.used <= part.limit && part.hits <= 6);
/// ```
pub fn part() -> impl Strategy<Value = Part> {
    (1u64..6, 0u64..6, 0u64..7, any::<bool>()).prop_map(|(limit, used, hits, enforce)| Part {
        limit,
        used: used.min(limit),
        hits,
        enforce,
    })
}
