//! [`Chain`]: two limiters as one, all-or-nothing, whatever each is (in-process or distributed).
//! Nest chains for more (`Chain::new(a, Chain::new(b, c))`). This is all-or-nothing over
//! limiters that share a key. The tower layer's `Both` does the same over policies that each
//! read their own key from the request (and name the policy that said no); the server's stores
//! take a call's counters one by one and give back on a refusal as here (memory, holding the
//! call's lock stripes in accuracy mode; redis-leased), decide them under one lock
//! (redis-cached) or in one Lua script (redis).

use std::borrow::Borrow;
use std::sync::Arc;
use std::time::Duration;

use crate::answer::{Answer, Check, Decision, Refund};
use crate::decision::{Lease, Meta, Rejected};
use crate::rate_limiter::RateLimiter;

/// Both limits must admit; when the second rejects, what the first granted is given back (a real
/// refund, awaited before the rejection is answered), so nothing is taken from either. Metadata
/// is the tightest of the two: the smaller `remaining` (with its `limit`), the later reset, and the
/// longer retry-after.
///
/// ```
/// use tollgate::{Chain, Limiter, Quota, RateLimiter, TokenBucket};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tollgate::QuotaError> {
/// let per_second = Limiter::new(TokenBucket::new(Quota::per_second(10)?));
/// let per_minute = Limiter::new(TokenBucket::new(Quota::per_minute(12)?));
/// let both = Chain::new(per_second, per_minute);
/// assert!(both.decide(&(), 10).await.is_ok());
/// let no = both.decide(&(), 5).await.unwrap_err();  // the minute limit has only 2 left
/// assert_eq!(no.remaining(), 0);                     // per-second is empty too
/// assert_eq!(both.first().statistics().available, 0); // and nothing more was taken
/// assert_eq!(both.window(), Some(std::time::Duration::from_secs(60)));
/// # Ok(()) }
/// ```
///
/// Between a take from the first and the refund, a concurrent caller of the first limiter may
/// briefly see fewer permits; the net effect is nothing taken. Both parts are kept behind `Arc`s
/// so that a decision still in flight (a distributed part) can refund the other part later.
pub struct Chain<A, B> {
    first: Arc<A>,
    second: Arc<B>,
}

impl<A, B> Chain<A, B> {
    /// `first` then `second`.
    pub fn new(first: A, second: B) -> Self {
        Chain { first: Arc::new(first), second: Arc::new(second) }
    }

    /// The first limiter.
    pub fn first(&self) -> &A {
        &self.first
    }

    /// The second limiter.
    pub fn second(&self) -> &B {
        &self.second
    }
}

impl<A, B> std::fmt::Debug for Chain<A, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain")
            .field("first", &std::any::type_name::<A>())
            .field("second", &std::any::type_name::<B>())
            .finish()
    }
}

/// The tighter of two states.
pub(crate) fn tightest(a: Meta, b: Meta) -> Meta {
    let (limit, remaining) = if b.remaining < a.remaining { (b.limit, b.remaining) } else { (a.limit, a.remaining) };
    let retry_ns = match (a.retry_ns, b.retry_ns) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.and(y),
    };
    Meta { limit, remaining, reset_ns: a.reset_ns.max(b.reset_ns), retry_ns }
}

fn merge_rejection(r: Rejected, other: Result<Meta, Rejected>) -> Rejected {
    let other = other.unwrap_or_else(|o| o.meta());
    let mut meta = tightest(r.meta(), other);
    if r.retry_after().is_none() {
        // Waiting cannot help this limiter, so it cannot help the chain.
        meta.retry_ns = None;
    }
    r.with_meta(meta)
}

fn combine(a: Lease, b: Lease, n: u64) -> Lease {
    let meta = tightest(a.meta(), b.meta());
    let at = a.acquired_at.max(b.acquired_at);
    Lease::combine(meta, n, at, [a, b])
}

impl<K, A, B> RateLimiter<K> for Chain<A, B>
where
    K: ToOwned + Sync + ?Sized,
    K::Owned: Send + Sync + 'static,
    A: RateLimiter<K> + 'static,
    B: RateLimiter<K> + 'static,
{
    fn decide(&self, key: &K, n: u64) -> Decision {
        let a = match self.first.decide(key, n) {
            Answer::Ready(a) => a,
            Answer::Pending(a) => {
                let (first, second, key) = (self.first.clone(), self.second.clone(), key.to_owned());
                return Answer::Pending(Box::pin(async move {
                    match a.await {
                        Err(r) => Err(merge_rejection(r, second.check(key.borrow(), n).await)),
                        Ok(a) => {
                            let b = second.decide(key.borrow(), n).await;
                            second_answered(&*first, key.borrow(), n, a, b).await
                        }
                    }
                }));
            }
        };
        let a = match a {
            Ok(a) => a,
            Err(r) => return self.second.check(key, n).map(move |other| Err(merge_rejection(r, other))),
        };
        match self.second.decide(key, n) {
            Answer::Ready(Ok(b)) => Answer::Ready(Ok(combine(a, b, n))),
            Answer::Ready(Err(r)) => {
                let a_meta = a.meta();
                self.first.give_back(key, a).map(move |()| Err(merge_rejection(r, Ok(a_meta))))
            }
            Answer::Pending(b) => {
                let (first, key) = (self.first.clone(), key.to_owned());
                Answer::Pending(Box::pin(async move { second_answered(&*first, key.borrow(), n, a, b.await).await }))
            }
        }
    }

    fn check(&self, key: &K, n: u64) -> Check {
        match (self.first.check(key, n), self.second.check(key, n)) {
            (Answer::Ready(a), Answer::Ready(b)) => Answer::Ready(both_checked(a, b)),
            (a, b) => Answer::Pending(Box::pin(async move { both_checked(a.await, b.await) })),
        }
    }

    async fn acquire(&self, key: &K, n: u64) -> Result<Lease, Rejected> {
        let a = match self.first.acquire(key, n).await {
            Ok(a) => a,
            Err(r) => return Err(merge_rejection(r, self.second.check(key, n).await)),
        };
        let b = self.second.acquire(key, n).await;
        second_answered(&*self.first, key, n, a, b).await
    }

    fn give_back(&self, key: &K, lease: Lease) -> Refund {
        let Some([a, b]) = lease.take_parts() else { return Answer::Ready(()) };
        self.second.give_back(key, b).and(self.first.give_back(key, a))
    }

    fn capacity(&self) -> u64 {
        self.first.capacity().min(self.second.capacity())
    }

    /// The longer of the two windows.
    fn window(&self) -> Option<Duration> {
        self.first.window().max(self.second.window())
    }
}

/// The second part has answered: combine, or refund the first and reject.
async fn second_answered<K: ?Sized, A: RateLimiter<K>>(
    first: &A,
    key: &K,
    n: u64,
    a: Lease,
    b: Result<Lease, Rejected>,
) -> Result<Lease, Rejected> {
    match b {
        Ok(b) => Ok(combine(a, b, n)),
        Err(r) => {
            let a_meta = a.meta();
            first.give_back(key, a).await;
            Err(merge_rejection(r, Ok(a_meta)))
        }
    }
}

fn both_checked(a: Result<Meta, Rejected>, b: Result<Meta, Rejected>) -> Result<Meta, Rejected> {
    match (a, b) {
        (Ok(a), Ok(b)) => Ok(tightest(a, b)),
        (Err(r), other) | (other @ Ok(_), Err(r)) => Err(merge_rejection(r, other)),
    }
}
