//! [`Chain`]: two limiters as one, all-or-nothing, whatever each is (in-process or distributed).
//! Nest chains for more (`Chain::new(a, Chain::new(b, c))`). This is all-or-nothing over
//! limiters that share a key, decided by [`AllOrNothing`] as every other all-or-nothing call is.

use std::borrow::Borrow;
use std::sync::Arc;
use std::time::Duration;

use crate::all_or_nothing::{AllOrNothing, Outcome, PartAnswer, Reply, Step};
use crate::answer::{Answer, Check, Decision, Refund};
use crate::decision::{Lease, Rejected};
use crate::rate_limiter::{Acquire, RateLimiter};
use crate::reservation::Settle;
use crate::snapshot::Meta;

/// Both limits must admit; when the second rejects, what the first granted is given back (a real
/// refund, awaited before the rejection is answered), so nothing is taken from either, by the
/// rules of [`AllOrNothing`]. Metadata is the tightest of the two as the call left them (a part
/// given back reports its state after the refund): the smaller `remaining` (with its `limit`),
/// the later reset, and the longer retry-after.
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

impl<A, B> Chain<A, B> {
    /// Runs one step of the chain's call on the part it names.
    fn run<K>(&self, step: Step, key: &K, n: u64) -> Answer<Reply>
    where
        K: ?Sized,
        A: RateLimiter<K>,
        B: RateLimiter<K>,
    {
        match step.part() {
            0 => step.run(&*self.first, key, n),
            _ => step.run(&*self.second, key, n),
        }
    }

    fn shared(&self) -> Chain<A, B> {
        Chain { first: self.first.clone(), second: self.second.clone() }
    }
}

/// The chain's answer from its parts': the parts' leases as one, or the rejection of the part
/// that denied the call with the tightest state of all parts (each as the call left it).
fn answer(outcome: Outcome, n: u64) -> Result<Lease, Rejected> {
    let meta = outcome.parts().iter().map(PartAnswer::meta).reduce(Meta::tightest).unwrap_or_default();
    let denied_by = outcome.denied_by();
    let mut parts = outcome.into_parts();
    match (denied_by, parts.next(), parts.next()) {
        (None, Some(PartAnswer::Taken(a)), Some(PartAnswer::Taken(b))) => {
            let at = a.acquired_at.max(b.acquired_at);
            Ok(Lease::combine(meta, n, at, [a, b]))
        }
        (Some(i), a, b) => {
            let Some(PartAnswer::NoRoom(rejected) | PartAnswer::Checked(Err(rejected))) =
                [a, b].into_iter().nth(i).flatten()
            else {
                unreachable!("the part that denied a call had no room")
            };
            let mut meta = meta;
            if rejected.retry_after().is_none() {
                // Waiting cannot help this part, so it cannot help the chain.
                meta.retry_ns = None;
            }
            Err(rejected.with_meta(meta))
        }
        _ => unreachable!("a granted chain took from both parts"),
    }
}

impl<K, A, B> RateLimiter<K> for Chain<A, B>
where
    K: ToOwned + Sync + ?Sized,
    K::Owned: Send + Sync + 'static,
    A: RateLimiter<K> + 'static,
    B: RateLimiter<K> + 'static,
{
    fn decide(&self, key: &K, n: u64) -> Decision {
        let mut call = AllOrNothing::new([true, true]);
        while let Some(step) = call.step() {
            match self.run(step, key, n).now() {
                Ok(reply) => call.reply(reply),
                Err(pending) => {
                    // A distributed part answers later: the rest of the call runs when it has.
                    let (chain, key) = (self.shared(), key.to_owned());
                    return Answer::Pending(Box::pin(async move {
                        call.reply(pending.await);
                        while let Some(step) = call.step() {
                            call.reply(chain.run(step, key.borrow(), n).await);
                        }
                        answer(call.finish(), n)
                    }));
                }
            }
        }
        Answer::Ready(answer(call.finish(), n))
    }

    fn check(&self, key: &K, n: u64) -> Check {
        match (self.first.check(key, n), self.second.check(key, n)) {
            (Answer::Ready(a), Answer::Ready(b)) => Answer::Ready(both_checked(a, b)),
            (a, b) => Answer::Pending(Box::pin(async move { both_checked(a.await, b.await) })),
        }
    }

    fn give_back(&self, key: &K, lease: Lease) -> Refund {
        let Some([a, b]) = lease.take_parts() else { return Answer::Ready(()) };
        self.second.give_back(key, b).and(self.first.give_back(key, a))
    }

    /// Each part settles its own lease. A part that cannot settle fails the chain's settle with
    /// its error, and the other part is settled all the same: a chain meant for reservations is
    /// built of limiters that can carry a debt.
    fn settle(&self, key: &K, lease: &Lease, actual: u64, id: u64) -> Settle {
        let Some([a, b]) = lease.parts() else { return Answer::Ready(Ok(())) };
        match (self.second.settle(key, b, actual, id), self.first.settle(key, a, actual, id)) {
            (Answer::Ready(second), Answer::Ready(first)) => Answer::Ready(second.and(first)),
            (second, first) => Answer::Pending(Box::pin(async move {
                let second = second.await;
                second.and(first.await)
            })),
        }
    }

    fn capacity(&self) -> u64 {
        self.first.capacity().min(self.second.capacity())
    }

    /// The longer of the two windows.
    fn window(&self) -> Option<Duration> {
        self.first.window().max(self.second.window())
    }
}

/// Waits on the first part, then on the second, by the same rules as a decision.
// Wherever the chain decides and both parts can wait: the key's and the parts' other bounds are
// the decision's, so they are stated once, on that impl.
impl<K, A, B> Acquire<K> for Chain<A, B>
where
    Self: RateLimiter<K>,
    K: Sync + ?Sized,
    A: Acquire<K>,
    B: Acquire<K>,
{
    async fn acquire(&self, key: &K, n: u64) -> Result<Lease, Rejected> {
        let mut call = AllOrNothing::new([true, true]);
        while let Some(step) = call.step() {
            let reply = match step {
                Step::Take(0) => Reply::Took(self.first.acquire(key, n).await),
                Step::Take(_) => Reply::Took(self.second.acquire(key, n).await),
                step => self.run(step, key, n).await,
            };
            call.reply(reply);
        }
        answer(call.finish(), n)
    }
}

fn both_checked(a: Result<Meta, Rejected>, b: Result<Meta, Rejected>) -> Result<Meta, Rejected> {
    match (a, b) {
        (Ok(a), Ok(b)) => Ok(a.tightest(b)),
        (Err(r), other) | (other @ Ok(_), Err(r)) => {
            let mut meta = r.meta().tightest(other.unwrap_or_else(|o| o.meta()));
            if r.retry_after().is_none() {
                meta.retry_ns = None;
            }
            Err(r.with_meta(meta))
        }
    }
}
