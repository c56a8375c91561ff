//! The Redis limiter's metrics, through the `metrics` facade, labelled by the limiter's prefix
//! (never by a key): decision latency, backend errors by kind, failure-policy outcomes.
//!
//! Handles are registered once, when a [`crate::RedisLimiter`] is built (or a [`RedisMetrics`]
//! made), with the recorder installed then (every series exists from the start, at 0); a decision
//! only bumps them.

use std::time::Duration;

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

/// The decision latency and the failures of Redis calls made under one key prefix: what a
/// [`crate::RedisLimiter`] records, for code that calls Redis through this crate another way (the
/// rate-limit server's storages, around [`crate::counters::decide_windows`]).
///
/// `new` registers `tollgate_redis_decision_seconds{prefix}` and
/// `tollgate_redis_errors_total{prefix, kind}` (one series per [`BackendError`] variant, at 0) with
/// the recorder in force then: the global one, or the one [`metrics::with_local_recorder`] sets.
/// Recording only bumps the handles.
///
/// ```
/// use std::time::Duration;
/// use tollgate_redis::RedisMetrics;
///
/// let metrics = RedisMetrics::new("api:");
/// metrics.decided(Duration::from_micros(180)); // no recorder installed: a no-op
/// ```
#[derive(Clone)]
pub struct RedisMetrics {
    decision_seconds: Histogram,
    errors: [Counter; KINDS.len()],
}

impl RedisMetrics {
    /// The handles of `prefix`'s series, registered with the recorder in force.
    pub fn new(prefix: &str) -> RedisMetrics {
        describe_histogram!(
            DECISION_SECONDS,
            Unit::Seconds,
            "Time a Redis decision took: its script call(s), answered or failed."
        );
        describe_counter!(ERRORS, "Redis failures met, by kind (decisions, refunds, resets, flushes).");
        let prefix = || prefix.to_owned();
        RedisMetrics {
            decision_seconds: histogram!(DECISION_SECONDS, "prefix" => prefix()),
            errors: KINDS.map(|kind| counter!(ERRORS, "prefix" => prefix(), "kind" => kind)),
        }
    }

    /// A decision's Redis call(s) took `took`, answered or failed.
    pub fn decided(&self, took: Duration) {
        self.decision_seconds.record(took.as_secs_f64());
    }

    /// A Redis call failed with `error`: counted under its kind.
    pub fn error(&self, error: &BackendError) {
        self.errors[kind(error)].increment(1);
    }
}

impl std::fmt::Debug for RedisMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisMetrics").finish_non_exhaustive()
    }
}

/// One limiter's handles: its prefix's [`RedisMetrics`], and its failure policy's outcomes.
pub(crate) struct LimiterMetrics {
    redis: RedisMetrics,
    /// Outcomes of the failure policy: `denied`, `allowed`, `fallback`.
    failure: [Counter; 3],
}

impl LimiterMetrics {
    /// `prefix`'s handles; its latency and errors recorded into `redis` when given.
    pub(crate) fn new(prefix: &str, redis: Option<RedisMetrics>) -> LimiterMetrics {
        describe_counter!(FAILURE_POLICY, "Decisions the failure policy made because Redis could not, by outcome.");
        LimiterMetrics {
            redis: redis.unwrap_or_else(|| RedisMetrics::new(prefix)),
            failure: ["denied", "allowed", "fallback"]
                .map(|outcome| counter!(FAILURE_POLICY, "prefix" => prefix.to_owned(), "outcome" => outcome)),
        }
    }

    /// A decision's script call(s) took `ns` nanoseconds.
    pub(crate) fn decided(&self, ns: u64) {
        self.redis.decided(Duration::from_nanos(ns));
    }

    pub(crate) fn error(&self, error: &BackendError) {
        self.redis.error(error);
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
