//! [`Limit`]: what a policy asks — keyed or not, local or distributed.

use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use tollgate::{Algorithm, Chain, Clock, Keyed, Lease, Limiter, RateLimiter, Rejected};

/// A limiter a policy can consult for a key. Implemented for [`Keyed`] (one bucket per key) and
/// for unkeyed limiters ([`Limiter`], [`Chain`]: one bucket for all keys).
pub trait Limit<K>: Send + Sync + 'static {
    /// Takes `n` permits for `key` now or rejects.
    fn try_acquire(&self, key: &K, n: u64) -> Result<Lease, Rejected>;
    /// Gives a lease back as if it had never been granted (a later policy rejected).
    fn give_back(&self, key: &K, lease: Lease);
    /// The period the quota is counted over, for the `RateLimit-Policy` header.
    fn window(&self) -> Option<Duration>;
}

impl<K, A, C> Limit<K> for Keyed<K, A, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    C: Clock,
{
    fn try_acquire(&self, key: &K, n: u64) -> Result<Lease, Rejected> {
        Keyed::try_acquire(self, key, n)
    }
    fn give_back(&self, key: &K, lease: Lease) {
        Keyed::give_back(self, key, lease)
    }
    fn window(&self) -> Option<Duration> {
        Keyed::window(self)
    }
}

impl<K, A: Algorithm, C: Clock> Limit<K> for Limiter<A, C> {
    fn try_acquire(&self, _key: &K, n: u64) -> Result<Lease, Rejected> {
        Limiter::try_acquire(self, n)
    }
    fn give_back(&self, _key: &K, lease: Lease) {
        Limiter::give_back(self, lease)
    }
    fn window(&self) -> Option<Duration> {
        Limiter::window(self)
    }
}

impl<K, X: RateLimiter + 'static, Y: RateLimiter + 'static> Limit<K> for Chain<X, Y> {
    fn try_acquire(&self, _key: &K, n: u64) -> Result<Lease, Rejected> {
        RateLimiter::try_acquire(self, n)
    }
    fn give_back(&self, _key: &K, lease: Lease) {
        RateLimiter::give_back(self, lease)
    }
    fn window(&self) -> Option<Duration> {
        self.first().window().max(self.second().window())
    }
}

impl<K, L: Limit<K> + ?Sized> Limit<K> for Arc<L> {
    fn try_acquire(&self, key: &K, n: u64) -> Result<Lease, Rejected> {
        (**self).try_acquire(key, n)
    }
    fn give_back(&self, key: &K, lease: Lease) {
        (**self).give_back(key, lease)
    }
    fn window(&self) -> Option<Duration> {
        (**self).window()
    }
}
