//! `Decision`: the answer of a `try_acquire`, allowed or not, as data.

use std::time::Duration;

use pyo3::prelude::*;
use tollgate::{Lease, Reason, Rejected};

/// What a `try_acquire` decided. Truthy when allowed; `retry_after` says when to try again.
#[pyclass(frozen, module = "tollgate._tollgate", name = "Decision")]
#[derive(Clone)]
pub struct Decision {
    allowed: bool,
    limit: u64,
    remaining: u64,
    retry_after: Option<f64>,
    reset_after: f64,
    reason: &'static str,
}

impl From<Result<Lease, Rejected>> for Decision {
    fn from(decision: Result<Lease, Rejected>) -> Decision {
        let (allowed, meta, reason) = match decision {
            Ok(lease) => (true, lease.meta(), lease.reason()),
            Err(no) => (false, no.meta(), no.reason()),
        };
        let secs = |ns: u64| Duration::from_nanos(ns).as_secs_f64();
        Decision {
            allowed,
            limit: meta.limit,
            remaining: meta.remaining,
            retry_after: meta.retry_ns.map(secs),
            reset_after: secs(meta.reset_ns),
            reason: code(reason),
        }
    }
}

/// A stable identifier for each reason (the Rust `Display` text is prose, free to change).
fn code(reason: Reason) -> &'static str {
    match reason {
        Reason::Granted => "granted",
        Reason::Probe => "probe",
        Reason::Exhausted => "exhausted",
        Reason::ExceedsCapacity => "exceeds_capacity",
        Reason::QueueFull => "queue_full",
        Reason::Evicted => "evicted",
        Reason::MaxWait => "max_wait",
        Reason::Closed => "closed",
        Reason::KeyLimit => "key_limit",
        Reason::Unavailable => "unavailable",
        Reason::FailOpen => "fail_open",
        Reason::Fallback => "fallback",
        _ => "other",
    }
}

#[pymethods]
impl Decision {
    /// Whether the permits were taken.
    #[getter]
    fn allowed(&self) -> bool {
        self.allowed
    }

    /// The limit's capacity.
    #[getter]
    fn limit(&self) -> u64 {
        self.limit
    }

    /// Permits left after this decision.
    #[getter]
    fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Seconds until the same request would be allowed (when allowed: until one more permit
    /// would be, 0 if now); `None` when waiting cannot help (more than the capacity was asked for).
    #[getter]
    fn retry_after(&self) -> Option<f64> {
        self.retry_after
    }

    /// Seconds until the limit is back to full.
    #[getter]
    fn reset_after(&self) -> f64 {
        self.reset_after
    }

    /// Why, as a stable code: "granted", "exhausted" (try later), "exceeds_capacity" (never),
    /// "key_limit" (a keyed limiter is full of busy keys), ...
    #[getter]
    fn reason(&self) -> &str {
        self.reason
    }

    fn __bool__(&self) -> bool {
        self.allowed
    }

    fn __repr__(&self) -> String {
        format!(
            "Decision(allowed={}, limit={}, remaining={}, retry_after={}, reset_after={}, reason={:?})",
            if self.allowed { "True" } else { "False" },
            self.limit,
            self.remaining,
            crate::args::py_option(self.retry_after),
            self.reset_after,
            self.reason
        )
    }
}
