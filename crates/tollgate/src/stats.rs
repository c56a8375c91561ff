//! Counters a limiter keeps as it decides, when asked to.
//!
//! Counting is off by default: a shared counter is an atomic add on a cache line that every
//! thread's decisions write, which costs about as much as the decision it counts (and, across
//! cores, more). Turn it on with the builders' `statistics(true)` when you read the counts.

use crate::sync::{AtomicU64, Ordering};

/// A snapshot of a limiter's counters; every field is a relaxed atomic read.
///
/// ```
/// use tollgate::{Limiter, Quota, TokenBucket};
/// let limiter = Limiter::builder(TokenBucket::new(Quota::per_second(1)?)).statistics(true).build();
/// let _ = limiter.try_acquire(1);
/// let _ = limiter.try_acquire(1);
/// let s = limiter.statistics();
/// assert_eq!((s.admitted, s.rejected), (Some(1), Some(1)));
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Statistics {
    /// Permits that could be taken right now.
    pub available: u64,
    /// Permits waiting in the queue.
    pub queued: u64,
    /// Requests admitted so far (probes excluded; leases given back are subtracted); `None`
    /// unless the limiter was built with `statistics(true)`.
    pub admitted: Option<u64>,
    /// Requests rejected so far; `None` unless the limiter was built with `statistics(true)`.
    pub rejected: Option<u64>,
}

/// Admitted and rejected requests, counted only when `on`.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    on: bool,
    admitted: AtomicU64,
    rejected: AtomicU64,
}

impl Counts {
    pub(crate) fn new(on: bool) -> Counts {
        Counts { on, ..Counts::default() }
    }

    #[inline]
    pub(crate) fn admitted(&self) {
        if self.on {
            self.admitted.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[inline]
    pub(crate) fn rejected(&self) {
        if self.on {
            self.rejected.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A lease was given back: it no longer counts as admitted.
    pub(crate) fn given_back(&self) {
        if self.on {
            self.admitted.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// `(admitted, rejected)`, `None` when not counting.
    pub(crate) fn read(&self) -> (Option<u64>, Option<u64>) {
        let read = |c: &AtomicU64| self.on.then(|| c.load(Ordering::Relaxed));
        (read(&self.admitted), read(&self.rejected))
    }
}
