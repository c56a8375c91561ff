//! [`RateLimiter`]: the one trait every limiter implements, so limiters can be chained, wrapped by
//! middleware and compared by the simulator without knowing which algorithm is inside.

use std::future::Future;
use std::sync::Arc;

use crate::algorithm::Algorithm;
use crate::clock::Clock;
use crate::decision::{Lease, Meta, Rejected};
use crate::limiter::Limiter;
use crate::stats::Statistics;

/// A limiter that decides on permits.
///
/// ```
/// use tollgate::{Limiter, Quota, RateLimiter, TokenBucket};
/// fn admit(limiter: &impl RateLimiter) -> bool {
///     limiter.try_acquire(1).is_ok()
/// }
/// assert!(admit(&Limiter::new(TokenBucket::new(Quota::per_second(1)?))));
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
pub trait RateLimiter: Send + Sync {
    /// Takes `n` permits now or rejects; never waits. `n == 0` is a probe.
    fn try_acquire(&self, n: u64) -> Result<Lease, Rejected>;

    /// Would `n` permits be granted now? Takes nothing.
    fn check(&self, n: u64) -> Result<Meta, Rejected>;

    /// Waits for `n` permits (see [`Limiter::acquire`]).
    fn acquire(&self, n: u64) -> impl Future<Output = Result<Lease, Rejected>> + Send;

    /// Gives a lease back as if it had never been granted.
    fn give_back(&self, lease: Lease);

    /// Cheap counters.
    fn statistics(&self) -> Statistics;

    /// Most permits one request can be granted.
    fn capacity(&self) -> u64;

    /// The period the quota is counted over; `None` when not counted over time.
    fn window(&self) -> Option<std::time::Duration> {
        None
    }
}

impl<A: Algorithm, C: Clock> RateLimiter for Limiter<A, C> {
    #[inline]
    fn try_acquire(&self, n: u64) -> Result<Lease, Rejected> {
        Limiter::try_acquire(self, n)
    }
    fn check(&self, n: u64) -> Result<Meta, Rejected> {
        Limiter::check(self, n)
    }
    fn acquire(&self, n: u64) -> impl Future<Output = Result<Lease, Rejected>> + Send {
        Limiter::acquire(self, n)
    }
    fn give_back(&self, lease: Lease) {
        Limiter::give_back(self, lease)
    }
    fn statistics(&self) -> Statistics {
        Limiter::statistics(self)
    }
    fn capacity(&self) -> u64 {
        Limiter::capacity(self)
    }
    fn window(&self) -> Option<std::time::Duration> {
        Limiter::window(self)
    }
}

impl<L: RateLimiter> RateLimiter for Arc<L> {
    fn try_acquire(&self, n: u64) -> Result<Lease, Rejected> {
        (**self).try_acquire(n)
    }
    fn check(&self, n: u64) -> Result<Meta, Rejected> {
        (**self).check(n)
    }
    fn acquire(&self, n: u64) -> impl Future<Output = Result<Lease, Rejected>> + Send {
        (**self).acquire(n)
    }
    fn give_back(&self, lease: Lease) {
        (**self).give_back(lease)
    }
    fn statistics(&self) -> Statistics {
        (**self).statistics()
    }
    fn capacity(&self) -> u64 {
        (**self).capacity()
    }
    fn window(&self) -> Option<std::time::Duration> {
        (**self).window()
    }
}
