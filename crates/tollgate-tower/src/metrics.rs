//! The layer's metrics, through the `metrics` facade: `tollgate_layer_decisions_total{policy,
//! outcome}`, and for policies that settle from the response `tollgate_layer_settles_total{policy,
//! outcome}`.
//!
//! Handles are registered once, when a [`crate::Policy`] is built (the settles' when
//! [`crate::Policy::settle_from`] is called), with the recorder installed then; a decision only bumps a handle (a branch when no recorder is installed), so the allow
//! path neither allocates nor formats labels. Labels are the policy's name and a fixed outcome,
//! never the request's key.

use metrics::{Counter, counter};
use tollgate::Reason;

use crate::policy::Denied;

/// Requests decided, by policy and outcome.
pub(crate) const DECISIONS: &str = "tollgate_layer_decisions_total";

/// Reservations ended, by policy and outcome ([`SettleOutcome`]).
pub(crate) const SETTLES: &str = "tollgate_layer_settles_total";

/// One policy's counters, one per outcome.
pub(crate) struct PolicyMetrics {
    allowed: Counter,
    limited: Counter,
    unavailable: Counter,
    no_key: Counter,
}

impl PolicyMetrics {
    pub(crate) fn new(policy: &str) -> PolicyMetrics {
        let outcome = |outcome: &'static str| counter!(DECISIONS, "policy" => policy.to_owned(), "outcome" => outcome);
        PolicyMetrics {
            allowed: outcome("allowed"),
            limited: outcome("limited"),
            unavailable: outcome("unavailable"),
            no_key: outcome("no_key"),
        }
    }

    #[inline]
    pub(crate) fn allowed(&self) {
        self.allowed.increment(1);
    }

    /// A rejection by this policy: no key, a backend that could not decide, or limited (any other
    /// reason, a local fallback's rejection included).
    pub(crate) fn denied(&self, denied: &Denied) {
        match denied.rejected.map(|r| r.reason()) {
            None => self.no_key.increment(1),
            Some(Reason::Unavailable) => self.unavailable.increment(1),
            Some(_) => self.limited.increment(1),
        }
    }
}

/// How a reservation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SettleOutcome {
    /// Settled for the cost the response reported.
    Settled,
    /// The body ended and no cost was reported: the estimate stands.
    Missing,
    /// The reported cost is not a number: the estimate stands.
    Unparseable,
    /// The body was dropped before its end (or failed): the estimate stands.
    Dropped,
    /// The limiter did not apply the settle: the estimate stands.
    Failed,
}

impl SettleOutcome {
    const ALL: [SettleOutcome; 5] = [
        SettleOutcome::Settled,
        SettleOutcome::Missing,
        SettleOutcome::Unparseable,
        SettleOutcome::Dropped,
        SettleOutcome::Failed,
    ];

    fn label(self) -> &'static str {
        match self {
            SettleOutcome::Settled => "settled",
            SettleOutcome::Missing => "missing",
            SettleOutcome::Unparseable => "unparseable",
            SettleOutcome::Dropped => "dropped",
            SettleOutcome::Failed => "failed",
        }
    }
}

/// One settling policy's counters, one per [`SettleOutcome`].
pub(crate) struct SettleMetrics {
    counters: [Counter; 5],
}

impl SettleMetrics {
    pub(crate) fn new(policy: &str) -> SettleMetrics {
        let counters = SettleOutcome::ALL
            .map(|outcome| counter!(SETTLES, "policy" => policy.to_owned(), "outcome" => outcome.label()));
        SettleMetrics { counters }
    }

    pub(crate) fn count(&self, outcome: SettleOutcome) {
        self.counters[outcome as usize].increment(1);
    }
}

impl std::fmt::Debug for SettleMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SettleMetrics").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for PolicyMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyMetrics").finish_non_exhaustive()
    }
}
