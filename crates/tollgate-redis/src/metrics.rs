//! The Redis limiter's metrics, through the `metrics` facade, labelled by the limiter's prefix
//! (never by a key): decision latency, backend errors by kind, failure-policy outcomes.
//!
//! Handles are registered once, when a [`crate::RedisLimiter`] is built, with the recorder
//! installed then (every series exists from the start, at 0); a decision only bumps them.

use metrics::{Counter, Histogram, Unit, counter, describe_counter, describe_histogram, histogram};

use crate::error::BackendError;
use crate::failure::FailurePolicy;

const DECISION_SECONDS: &str = "tollgate_redis_decision_seconds";
const ERRORS: &str = "tollgate_redis_errors_total";
const FAILURE_POLICY: &str = "tollgate_redis_failure_policy_total";

/// The `kind` label of each [`BackendError`] variant.
const KINDS: [&str; 7] = ["invalid_url", "connect", "auth", "wrong_type", "timeout", "backing_off", "redis"];

fn kind(error: &BackendError) -> usize {
    match error {
        // The Sentinel lookups fail only in `connect`, never in a limiter's call; counted as the
        // URL fault (a master name no sentinel knows) and the connect failure they are.
        BackendError::InvalidUrl { .. } | BackendError::UnknownMaster { .. } => 0,
        BackendError::Connect { .. } | BackendError::MasterDown { .. } => 1,
        BackendError::Auth { .. } => 2,
        BackendError::WrongType { .. } => 3,
        BackendError::Timeout(_) => 4,
        BackendError::BackingOff { .. } => 5,
        BackendError::Redis(_) => 6,
    }
}

/// One limiter's handles.
pub(crate) struct LimiterMetrics {
    decision_seconds: Histogram,
    errors: [Counter; KINDS.len()],
    /// Outcomes of the failure policy: `denied`, `allowed`, `fallback`.
    failure: [Counter; 3],
}

impl LimiterMetrics {
    pub(crate) fn new(prefix: &str) -> LimiterMetrics {
        describe_histogram!(
            DECISION_SECONDS,
            Unit::Seconds,
            "Time a Redis limiter's decision took: its script call(s), answered or failed."
        );
        describe_counter!(ERRORS, "Redis failures a Redis limiter met, by kind (decisions, refunds, resets).");
        describe_counter!(FAILURE_POLICY, "Decisions the failure policy made because Redis could not, by outcome.");
        let prefix = || prefix.to_owned();
        LimiterMetrics {
            decision_seconds: histogram!(DECISION_SECONDS, "prefix" => prefix()),
            errors: KINDS.map(|kind| counter!(ERRORS, "prefix" => prefix(), "kind" => kind)),
            failure: ["denied", "allowed", "fallback"]
                .map(|outcome| counter!(FAILURE_POLICY, "prefix" => prefix(), "outcome" => outcome)),
        }
    }

    /// A decision's script call(s) took `ns` nanoseconds.
    pub(crate) fn decided(&self, ns: u64) {
        self.decision_seconds.record(ns as f64 / 1e9);
    }

    pub(crate) fn error(&self, error: &BackendError) {
        self.errors[kind(error)].increment(1);
    }

    /// Redis could not decide, and `policy` did.
    pub(crate) fn failure_policy(&self, policy: &FailurePolicy) {
        let outcome = match policy {
            FailurePolicy::Deny => 0,
            FailurePolicy::Allow => 1,
            FailurePolicy::Local(_) => 2,
        };
        self.failure[outcome].increment(1);
    }
}

impl std::fmt::Debug for LimiterMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimiterMetrics").finish_non_exhaustive()
    }
}
