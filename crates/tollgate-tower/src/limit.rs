//! [`Limit`]: what a policy asks — keyed or not, local or distributed.

use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tollgate::{Algorithm, Chain, Clock, Keyed, Lease, Limiter, RateLimiter, Rejected};

/// A decision that needs I/O (a distributed limiter).
pub type PendingDecision = Pin<Box<dyn Future<Output = Result<Lease, Rejected>> + Send>>;

/// A limiter's answer: at once (in-process limiters, no allocation) or after a round trip.
pub enum Decision {
    /// Decided now.
    Ready(Result<Lease, Rejected>),
    /// Decided when the future completes.
    Pending(PendingDecision),
}

/// A limiter a policy can consult for a key. Implemented for [`Keyed`] (one bucket per key) and
/// for unkeyed limiters ([`Limiter`], [`Chain`]: one bucket for all keys).
pub trait Limit<K>: Send + Sync + 'static {
    /// Takes `n` permits for `key`: at once for in-process limiters, after a round trip for
    /// distributed ones.
    fn decide(&self, key: &K, n: u64) -> Decision;
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
    fn decide(&self, key: &K, n: u64) -> Decision {
        Decision::Ready(Keyed::try_acquire(self, key, n))
    }
    fn give_back(&self, key: &K, lease: Lease) {
        Keyed::give_back(self, key, lease)
    }
    fn window(&self) -> Option<Duration> {
        Keyed::window(self)
    }
}

impl<K, A: Algorithm, C: Clock> Limit<K> for Limiter<A, C> {
    fn decide(&self, _key: &K, n: u64) -> Decision {
        Decision::Ready(Limiter::try_acquire(self, n))
    }
    fn give_back(&self, _key: &K, lease: Lease) {
        Limiter::give_back(self, lease)
    }
    fn window(&self) -> Option<Duration> {
        Limiter::window(self)
    }
}

impl<K, X: RateLimiter + 'static, Y: RateLimiter + 'static> Limit<K> for Chain<X, Y> {
    fn decide(&self, _key: &K, n: u64) -> Decision {
        Decision::Ready(RateLimiter::try_acquire(self, n))
    }
    fn give_back(&self, _key: &K, lease: Lease) {
        RateLimiter::give_back(self, lease)
    }
    fn window(&self) -> Option<Duration> {
        self.first().window().max(self.second().window())
    }
}

impl<K, L: Limit<K> + ?Sized> Limit<K> for Arc<L> {
    fn decide(&self, key: &K, n: u64) -> Decision {
        (**self).decide(key, n)
    }
    fn give_back(&self, key: &K, lease: Lease) {
        (**self).give_back(key, lease)
    }
    fn window(&self) -> Option<Duration> {
        (**self).window()
    }
}

/// A key a distributed limiter can store: its text form.
#[cfg(feature = "redis")]
pub trait RedisKey {
    /// The key as text.
    fn redis_key(&self) -> String;
}

#[cfg(feature = "redis")]
mod redis_keys {
    use super::RedisKey;
    impl RedisKey for std::net::IpAddr {
        fn redis_key(&self) -> String {
            self.to_string()
        }
    }
    impl RedisKey for String {
        fn redis_key(&self) -> String {
            self.clone()
        }
    }
    impl RedisKey for Arc<str> {
        fn redis_key(&self) -> String {
            self.to_string()
        }
    }
    impl RedisKey for bytes::Bytes {
        fn redis_key(&self) -> String {
            String::from_utf8_lossy(self).into_owned()
        }
    }
    impl RedisKey for () {
        fn redis_key(&self) -> String {
            "global".to_owned()
        }
    }
    use std::sync::Arc;
}

/// A Redis-backed limiter: one round trip per decision; when Redis fails, its
/// [`tollgate_redis::FailurePolicy`] decides and the reason says so.
#[cfg(feature = "redis")]
impl<K: RedisKey> Limit<K> for tollgate_redis::RedisLimiter {
    fn decide(&self, key: &K, n: u64) -> Decision {
        let (limiter, key) = (self.clone(), key.redis_key());
        Decision::Pending(Box::pin(async move { limiter.try_acquire(&key, n).await }))
    }
    fn give_back(&self, _key: &K, _lease: Lease) {}
    fn window(&self) -> Option<Duration> {
        tollgate_redis::RedisLimiter::window(self)
    }
}
