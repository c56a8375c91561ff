//! [`Chain`]: two limiters as one, all-or-nothing. Nest chains for more
//! (`Chain::new(a, Chain::new(b, c))`).

use crate::decision::{Lease, Meta, Rejected};
use crate::rate_limiter::RateLimiter;
use crate::stats::Statistics;

/// Both limits must admit; when the second rejects, what the first granted is given back, so
/// nothing is taken from either. Metadata is the tightest of the two: the smaller `remaining`
/// (with its `limit`), the later reset, and the longer retry-after.
///
/// ```
/// use tollgate::{Chain, Limiter, Quota, RateLimiter, TokenBucket};
/// let per_second = Limiter::new(TokenBucket::new(Quota::per_second(10)?));
/// let per_minute = Limiter::new(TokenBucket::new(Quota::per_minute(12)?));
/// let both = Chain::new(per_second, per_minute);
/// assert!(both.try_acquire(10).is_ok());
/// let no = both.try_acquire(5).unwrap_err();      // the minute limit has only 2 left
/// assert_eq!(no.remaining(), 0);                   // per-second is empty too
/// assert_eq!(both.first().statistics().available, 0); // and nothing more was taken
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
///
/// Between a take from the first and the give-back, a concurrent caller of the first limiter may
/// briefly see fewer permits; the net effect is nothing taken.
pub struct Chain<A, B> {
    first: A,
    second: B,
}

impl<A: RateLimiter, B: RateLimiter> Chain<A, B> {
    /// `first` then `second`.
    pub fn new(first: A, second: B) -> Self {
        Chain { first, second }
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

impl<A: RateLimiter, B: RateLimiter> RateLimiter for Chain<A, B> {
    fn try_acquire(&self, n: u64) -> Result<Lease, Rejected> {
        let a = match self.first.try_acquire(n) {
            Ok(lease) => lease,
            Err(r) => return Err(merge_rejection(r, self.second.check(n))),
        };
        match self.second.try_acquire(n) {
            Ok(b) => Ok(combine(a, b, n)),
            Err(r) => {
                let a_meta = a.meta();
                self.first.give_back(a);
                Err(merge_rejection(r, Ok(a_meta)))
            }
        }
    }

    fn check(&self, n: u64) -> Result<Meta, Rejected> {
        match (self.first.check(n), self.second.check(n)) {
            (Ok(a), Ok(b)) => Ok(tightest(a, b)),
            (Err(r), other) | (other @ Ok(_), Err(r)) => Err(merge_rejection(r, other)),
        }
    }

    async fn acquire(&self, n: u64) -> Result<Lease, Rejected> {
        let a = self.first.acquire(n).await.map_err(|r| merge_rejection(r, self.second.check(n)))?;
        match self.second.acquire(n).await {
            Ok(b) => Ok(combine(a, b, n)),
            Err(r) => {
                let a_meta = a.meta();
                self.first.give_back(a);
                Err(merge_rejection(r, Ok(a_meta)))
            }
        }
    }

    fn give_back(&self, lease: Lease) {
        let mut parts = lease.take_parts().into_iter();
        if let (Some(a), Some(b)) = (parts.next(), parts.next()) {
            self.second.give_back(b);
            self.first.give_back(a);
        }
    }

    fn statistics(&self) -> Statistics {
        let (a, b) = (self.first.statistics(), self.second.statistics());
        Statistics {
            available: a.available.min(b.available),
            queued: a.queued + b.queued,
            admitted: a.admitted.min(b.admitted),
            rejected: a.rejected.max(b.rejected),
        }
    }

    fn capacity(&self) -> u64 {
        self.first.capacity().min(self.second.capacity())
    }
}

fn combine(a: Lease, b: Lease, n: u64) -> Lease {
    let meta = tightest(a.meta(), b.meta());
    let at = a.acquired_at.max(b.acquired_at);
    Lease::combine(meta, n, at, vec![a, b])
}
