//! [`RateLimiter`]: the one contract for "may `n` permits for this key go now?", whether the
//! answer is in this process or across the network.
//!
//! It is object-safe (`Box<dyn RateLimiter<str>>`, a table of limits of different algorithms);
//! waiting for permits, which each limiter does its own way, is the extension trait [`Acquire`].
//!
//! Every limiter implements it — [`Limiter`] (one state, the key is ignored), [`Keyed`] (a state
//! per key), [`Chain`](crate::Chain) (several, all-or-nothing), `Arc<L>`, and distributed limiters
//! in other crates (`tollgate_redis::RedisLimiter`) — so middleware, servers and bindings take any
//! of them and mix them freely.

use std::borrow::Borrow;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::answer::{Answer, Check, Decision, Refund};
use crate::clock::Clock;
use crate::decision::{Lease, Rejected};
use crate::keyed::Keyed;
use crate::limiter::Limiter;
use crate::reservation::{Reservation, Settle, SettleError, SettleFailed, Settled};

/// A limiter that decides on permits for a key.
///
/// - [`decide`](RateLimiter::decide) takes `n` permits or rejects, never waits; `n == 0` is a
///   probe that reports the state and takes nothing.
/// - [`check`](RateLimiter::check) says whether `n` would go, taking nothing.
/// - [`Acquire::acquire`] (a separate trait, so that this one can be a trait object) waits for
///   `n` permits.
/// - [`give_back`](RateLimiter::give_back) refunds a lease as if it had never been granted (what
///   still counts at the time of the refund), so all-or-nothing over several limiters holds.
///
/// The key type defaults to `()` for limiters with one state:
///
/// ```
/// use tollgate::{Keyed, Limiter, Quota, RateLimiter, TokenBucket};
///
/// async fn admit<K: ?Sized>(limiter: &impl RateLimiter<K>, key: &K) -> bool {
///     limiter.decide(key, 1).await.is_ok()
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tollgate::QuotaError> {
/// assert!(admit(&Limiter::new(TokenBucket::new(Quota::per_second(1)?)), &()).await);
/// let per_user: Keyed<String, _> = Keyed::new(TokenBucket::new(Quota::per_second(1)?));
/// assert!(admit(&per_user, "alice").await);
/// # Ok(()) }
/// ```
///
/// Limits of different algorithms behind one type:
///
/// ```
/// use tollgate::{FixedWindow, Keyed, Quota, RateLimiter, TokenBucket};
/// let limits: Vec<Box<dyn RateLimiter<str>>> = vec![
///     Box::new(Keyed::<String, _>::new(TokenBucket::new(Quota::per_second(5)?))),
///     Box::new(Keyed::<String, _>::new(FixedWindow::new(Quota::per_minute(100)?))),
/// ];
/// assert!(limits.iter().all(|l| l.decide("alice", 1).now().is_ok_and(|d| d.is_ok())));
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
pub trait RateLimiter<K: ?Sized = ()>: Send + Sync {
    /// Takes `n` permits for `key` now or rejects; never waits. `n == 0` is a probe.
    fn decide(&self, key: &K, n: u64) -> Decision;

    /// Would `n` permits for `key` be granted now? Takes nothing.
    fn check(&self, key: &K, n: u64) -> Check;

    /// Gives `lease` (granted for `key` by this limiter) back: what it took and still counts is
    /// restored. Concurrency permits are released.
    fn give_back(&self, key: &K, lease: Lease) -> Refund;

    /// Most permits one request can be granted.
    fn capacity(&self) -> u64;

    /// The period the quota is counted over (HTTP's `RateLimit-Policy` window); `None` when not
    /// counted over time (concurrency).
    fn window(&self) -> Option<Duration>;

    /// Takes `estimate` permits for work whose cost is known only afterwards, to be settled
    /// for the actual cost ([`Reservation::settle`]); the same decision as
    /// [`decide`](RateLimiter::decide), never waiting.
    fn reserve(&self, key: &K, estimate: u64) -> Answer<Result<Reservation, Rejected>> {
        self.decide(key, estimate).map(|decision| decision.map(Reservation::new))
    }

    /// Settles `lease` (a reservation's, granted by this limiter for `key`) at `actual` permits:
    /// gives back what it exceeded, or takes the rest past the limit as a debt (see
    /// [`crate::reservation`](crate::Reservation) for the rule and its bound). `id` names the
    /// reservation: a distributed limiter applies one id's settle once. Callers use
    /// [`Reservation::settle`].
    ///
    /// The default cannot settle ([`SettleError::Unsupported`]).
    fn settle(&self, key: &K, lease: &Lease, actual: u64, id: u64) -> Settle {
        let _ = (key, lease, actual, id);
        Answer::Ready(Err(SettleError::Unsupported {
            limiter: std::any::type_name::<Self>(),
            why: "it does not implement RateLimiter::settle",
        }))
    }
}

/// A [`RateLimiter`] that can wait for permits.
///
/// ```
/// use tollgate::{Acquire, Chain, Limiter, Quota, TokenBucket};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let both = Chain::new(
///     Limiter::new(TokenBucket::new(Quota::per_second(10)?)),
///     Limiter::new(TokenBucket::new(Quota::per_minute(100)?)),
/// );
/// let lease = both.acquire(&(), 2).await?;
/// assert_eq!(lease.permits(), 2);
/// # Ok(()) }
/// ```
pub trait Acquire<K: ?Sized = ()>: RateLimiter<K> {
    /// Waits for `n` permits for `key` (each limiter documents its queue or retry rule).
    fn acquire(&self, key: &K, n: u64) -> impl Future<Output = Result<Lease, Rejected>> + Send;
}

/// One state for everything: the key is `()`.
impl<A: Algorithm, C: Clock> RateLimiter for Limiter<A, C> {
    #[inline]
    fn decide(&self, _key: &(), n: u64) -> Decision {
        Answer::Ready(Limiter::try_acquire(self, n))
    }
    fn check(&self, _key: &(), n: u64) -> Check {
        Answer::Ready(Limiter::check(self, n))
    }
    fn give_back(&self, _key: &(), lease: Lease) -> Refund {
        Limiter::give_back(self, lease);
        Answer::Ready(())
    }
    fn capacity(&self) -> u64 {
        Limiter::capacity(self)
    }
    fn window(&self) -> Option<Duration> {
        Limiter::window(self)
    }
    fn settle(&self, _key: &(), lease: &Lease, actual: u64, _id: u64) -> Settle {
        Answer::Ready(Limiter::settle(self, lease, actual))
    }
}

/// Waits in the limiter's queue.
impl<A: Algorithm, C: Clock> Acquire for Limiter<A, C> {
    fn acquire(&self, _key: &(), n: u64) -> impl Future<Output = Result<Lease, Rejected>> + Send {
        Limiter::acquire(self, n)
    }
}

/// A key-by-key limiter.
impl<K, Q, A, C> RateLimiter<Q> for Keyed<K, A, C>
where
    K: Borrow<Q> + Hash + Eq + Send + Sync + 'static,
    Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    A: Algorithm,
    C: Clock,
{
    #[inline]
    fn decide(&self, key: &Q, n: u64) -> Decision {
        Answer::Ready(Keyed::try_acquire(self, key, n))
    }
    fn check(&self, key: &Q, n: u64) -> Check {
        Answer::Ready(Keyed::check(self, key, n))
    }
    fn give_back(&self, key: &Q, lease: Lease) -> Refund {
        Keyed::give_back(self, key, lease);
        Answer::Ready(())
    }
    fn capacity(&self) -> u64 {
        Keyed::capacity(self)
    }
    fn window(&self) -> Option<Duration> {
        Keyed::window(self)
    }
    fn settle(&self, key: &Q, lease: &Lease, actual: u64, _id: u64) -> Settle {
        Answer::Ready(Keyed::settle(self, key, lease, actual))
    }
}

/// Retries at each `retry_after` without a bound on the wait (use [`Keyed::acquire`] for one).
impl<K, Q, A, C> Acquire<Q> for Keyed<K, A, C>
where
    K: Borrow<Q> + Hash + Eq + Send + Sync + 'static,
    Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    A: Algorithm,
    C: Clock,
{
    fn acquire(&self, key: &Q, n: u64) -> impl Future<Output = Result<Lease, Rejected>> + Send {
        Keyed::acquire(self, key, n, None)
    }
}

/// A pointer to a limiter decides as the limiter does (`Arc<L>`, and `Box<dyn RateLimiter<K>>`).
macro_rules! through_pointer {
    ($($pointer:ident),+) => {$(
        impl<K: ?Sized, L: RateLimiter<K> + ?Sized> RateLimiter<K> for $pointer<L> {
            #[inline]
            fn decide(&self, key: &K, n: u64) -> Decision {
                (**self).decide(key, n)
            }
            fn check(&self, key: &K, n: u64) -> Check {
                (**self).check(key, n)
            }
            fn give_back(&self, key: &K, lease: Lease) -> Refund {
                (**self).give_back(key, lease)
            }
            fn capacity(&self) -> u64 {
                (**self).capacity()
            }
            fn window(&self) -> Option<Duration> {
                (**self).window()
            }
            fn reserve(&self, key: &K, estimate: u64) -> Answer<Result<Reservation, Rejected>> {
                (**self).reserve(key, estimate)
            }
            fn settle(&self, key: &K, lease: &Lease, actual: u64, id: u64) -> Settle {
                (**self).settle(key, lease, actual, id)
            }
        }
    )+};
}

through_pointer!(Arc, Box);

impl<K: ?Sized, L: Acquire<K> + ?Sized> Acquire<K> for Arc<L> {
    fn acquire(&self, key: &K, n: u64) -> impl Future<Output = Result<Lease, Rejected>> + Send {
        (**self).acquire(key, n)
    }
}

// Beside the contract it calls: the reservation's own module stays below it.
impl Reservation {
    /// Settles for `actual`: gives back what the estimate exceeded, or charges the rest past the
    /// limit as a debt. `limiter` and `key` are those the reservation was taken from.
    pub fn settle<K, L>(self, limiter: &L, key: &K, actual: u64) -> Settled
    where
        K: ?Sized,
        L: RateLimiter<K> + ?Sized,
    {
        match limiter.settle(key, &self.lease, actual, self.id) {
            Answer::Ready(result) => Answer::Ready(result.map_err(|error| SettleFailed { error, reservation: self })),
            Answer::Pending(fut) => Answer::Pending(Box::pin(async move {
                fut.await.map_err(|error| SettleFailed { error, reservation: self })
            })),
        }
    }

    /// Gives the whole estimate back: the work was not done (a settle for 0).
    pub fn cancel<K, L>(self, limiter: &L, key: &K) -> Settled
    where
        K: ?Sized,
        L: RateLimiter<K> + ?Sized,
    {
        self.settle(limiter, key, 0)
    }
}
