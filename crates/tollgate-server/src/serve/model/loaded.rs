//! The limits in force, with their in-memory counters: one value, swapped whole by a reload.

use std::sync::Arc;

use tollgate_policy::Policy;

use super::counters::Counters;

/// The limits in force and their counters; replaced as a whole by a reload.
pub struct Loaded {
    /// The limits.
    pub policy: Policy,
    /// Incremented by each successful load, from 1.
    pub generation: u64,
    /// Each limit's in-memory counters, in the policy's order; none at all when the counters
    /// live in Redis (an empty table costs ~16 KB per limit).
    pub(crate) counters: Vec<Arc<dyn Counters>>,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("generation", &self.generation)
            .field("limits", &self.policy.limits().len())
            .finish_non_exhaustive()
    }
}
