//! Counters a limiter keeps as it decides.

/// A snapshot of a limiter's counters; every field is a relaxed atomic read.
///
/// ```
/// use tollgate::{Limiter, Quota, TokenBucket};
/// let limiter = Limiter::new(TokenBucket::new(Quota::per_second(1)?));
/// let _ = limiter.try_acquire(1);
/// let _ = limiter.try_acquire(1);
/// let s = limiter.statistics();
/// assert_eq!((s.admitted, s.rejected), (1, 1));
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Statistics {
    /// Permits that could be taken right now.
    pub available: u64,
    /// Permits waiting in the queue.
    pub queued: u64,
    /// Requests admitted so far (probes excluded; leases given back are subtracted).
    pub admitted: u64,
    /// Requests rejected so far.
    pub rejected: u64,
}
