//! [`FailurePolicy`]: who decides when Redis cannot, within the deadline.

use std::sync::Arc;

use tollgate::{Keyed, Lease, Meta, Quota, QuotaError, Reason, Rejected, SystemClock, TokenBucket};

/// What a distributed limiter answers when Redis fails or misses its deadline. The outcome's
/// [`Reason`] says so ([`Reason::Unavailable`], [`Reason::FailOpen`], [`Reason::Fallback`]), so
/// "limited" and "Redis was down" are never confused.
#[derive(Clone, Default)]
pub enum FailurePolicy {
    /// Reject (fail closed). The default: a limit that silently stops limiting is worse.
    #[default]
    Deny,
    /// Admit (fail open).
    Allow,
    /// Decide with an in-memory limiter, per key.
    Local(Arc<Keyed<String, TokenBucket, SystemClock>>),
}

impl FailurePolicy {
    /// A local token bucket per key with `quota` split across `replicas` processes (each gets
    /// `limit / replicas`, at least 1), so the replicas together stay near the global limit.
    pub fn local_share(quota: Quota, replicas: u64) -> Result<FailurePolicy, QuotaError> {
        let replicas = replicas.max(1);
        let share = Quota::per(quota.period(), (quota.limit() / replicas).max(1))?
            .with_burst((quota.burst() / replicas).max(1))?;
        Ok(FailurePolicy::Local(Arc::new(Keyed::new(TokenBucket::new(share)))))
    }

    pub(crate) fn decide(&self, key: &str, n: u64, capacity: u64) -> Result<Lease, Rejected> {
        let meta = Meta { limit: capacity, remaining: 0, reset_ns: 0, retry_ns: None };
        match self {
            FailurePolicy::Deny => Err(Rejected::new(meta, n, Reason::Unavailable)),
            FailurePolicy::Allow => {
                Ok(Lease::new(Meta { remaining: capacity, ..meta }, n, 0).with_reason(Reason::FailOpen))
            }
            FailurePolicy::Local(local) => match local.try_acquire(key, n) {
                Ok(lease) => Ok(lease.with_reason(Reason::Fallback)),
                Err(rejected) => Err(rejected.because(Reason::Fallback)),
            },
        }
    }
}

impl std::fmt::Debug for FailurePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FailurePolicy::Deny => f.write_str("Deny"),
            FailurePolicy::Allow => f.write_str("Allow"),
            FailurePolicy::Local(_) => f.write_str("Local(..)"),
        }
    }
}
