//! [`Reservation`]: permits taken for an estimate of a cost known only after the work (LLM tokens,
//! bytes sent, a query's cost), then settled for the actual cost.
//!
//! A reservation is an ordinary decision for the estimate, all-or-nothing over a [`Chain`] as
//! any decision. Settling it for `actual`:
//! - `actual < estimate` gives the difference back (what still counts, as a give-back does);
//! - `actual > estimate` charges the rest **even past the limit**, as a debt that later requests
//!   pay before any is admitted (a token bucket's arrival time moves on; a window's count goes
//!   over its limit and later requests wait for the window to move; a fixed window forgets what
//!   is owed when it ends, as it forgets its count);
//! - [`Reservation::cancel`] gives the whole estimate back;
//! - a reservation dropped unsettled keeps the estimate: the cost is taken as estimated.
//!
//! **The bound.** Over any window, the cost admitted is at most the limit plus, summed over the
//! reservations settled above their estimate in it, `actual − estimate`; and no request is
//! admitted while a debt is unpaid. Checking first and charging after (what envoy/ratelimit's
//! `hits_addend: 0` then `apply_on_stream_done` does) has no such bound: every request in flight
//! passes the check. `tests/model.rs` holds every algorithm to its reference model through
//! reserves and settles; `tests/settle.rs` checks the bound. One gap, a token bucket's: what a
//! settle gives back is credited up to a full bucket, and a bucket that refilled to full while
//! the reservation was out (idle longer than its burst takes to refill) has already made up for
//! those permits, so in the moment the refund lands it may admit up to the refund above its burst.
//! Telling the two apart would take a second word of state per key; an interval bucket and a
//! fixed window instead drop what comes back after the step or window it was taken in ends.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Limiter, ManualClock, Quota, RateLimiter, TokenBucket};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = ManualClock::new();
//! // 1,000 LLM tokens a second, up to 1,000 at once.
//! let budget = Limiter::builder(TokenBucket::new(Quota::per_second(1_000)?)).clock(clock.clone()).build();
//!
//! let r = budget.reserve(&(), 600).await?;      // the request's max_tokens
//! r.settle(&budget, &(), 1_300).await?;         // the response used 1,300: 300 past the budget
//! let no = budget.decide(&(), 1).await.unwrap_err();
//! assert_eq!(no.retry_after(), Some(Duration::from_millis(301)), "the debt is paid first");
//!
//! clock.advance(Duration::from_millis(301));
//! let r = budget.reserve(&(), 1).await?;
//! r.cancel(&budget, &()).await?;                // nothing was used: all given back
//! # Ok(()) }
//! ```
//!
//! [`Chain`]: crate::Chain

use std::hash::{BuildHasher, RandomState};
// Not the loom shim: a counter of names, no state another thread's decision reads.
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::answer::Answer;
use crate::decision::Lease;

/// Permits taken for an estimate, to be settled for the actual cost ([`RateLimiter::reserve`](crate::RateLimiter::reserve)).
///
/// Settle it once with [`Reservation::settle`] (or [`Reservation::cancel`]); a settle that fails
/// hands the reservation back ([`SettleFailed::reservation`]) to be settled again: a distributed
/// limiter applies a reservation's settle once, whatever the retries (its [`id`](Reservation::id)
/// names it). Dropped unsettled, the estimate stays taken.
#[derive(Debug)]
#[must_use = "a reservation is settled for the actual cost; dropped, the estimate stays taken"]
pub struct Reservation {
    pub(crate) lease: Lease,
    pub(crate) id: u64,
}

/// The answer to a settle: done, or why not (the reservation handed back).
pub type Settled = Answer<Result<(), SettleFailed>>;

/// What a [`RateLimiter::settle`](crate::RateLimiter::settle) answers.
pub type Settle = Answer<Result<(), SettleError>>;

impl Reservation {
    /// A reservation of `lease`'s permits with a fresh id: unique in this process, and drawn from
    /// a random start so that processes sharing a distributed limiter do not collide.
    pub fn new(lease: Lease) -> Reservation {
        Reservation::with_id(lease, next_id())
    }

    /// A reservation with the given id (tests, or ids from the caller's own source): settles of
    /// one id are applied once by a distributed limiter, so ids must not repeat.
    pub fn with_id(lease: Lease, id: u64) -> Reservation {
        Reservation { lease, id }
    }

    /// The permits reserved.
    pub fn estimate(&self) -> u64 {
        self.lease.permits()
    }

    /// The lease the reservation took (its metadata is the state the reserve left).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The id that makes a settle idempotent in a distributed limiter.
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// Why a settle was not applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SettleError {
    /// The limiter cannot settle a reservation (a concurrency limit; an algorithm or a storage
    /// that cannot carry a debt). Nothing was changed.
    #[error("{limiter} cannot settle a reservation: {why}")]
    Unsupported {
        /// The limiter or algorithm.
        limiter: &'static str,
        /// Why not.
        why: &'static str,
    },
    /// A keyed limiter at its key cap could not store the key to charge its debt to (the key
    /// was evicted between the reserve and the settle). What the estimate exceeded is lost.
    #[error("the debt of {debt} permits could not be charged: the keyed limiter is at its key cap")]
    KeyLimit {
        /// The permits not charged.
        debt: u64,
    },
    /// A distributed backend did not confirm the settle in time. It may or may not have been
    /// applied; settling the same reservation again applies it exactly once.
    #[error("the settle of reservation {id:#x} was not confirmed: {cause}; settle it again (it is applied once)")]
    Unavailable {
        /// The reservation's id.
        id: u64,
        /// What the backend said.
        cause: String,
    },
}

/// A settle that was not applied, with the reservation to settle again.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct SettleFailed {
    /// Why.
    #[source]
    pub error: SettleError,
    /// The reservation, unchanged: settle it again, or drop it to keep the estimate.
    pub reservation: Reservation,
}

/// Ids for [`Reservation::new`]: a random start (std's per-process hasher keys), then one by one.
fn next_id() -> u64 {
    static NEXT: OnceLock<AtomicU64> = OnceLock::new();
    NEXT.get_or_init(|| AtomicU64::new(RandomState::new().hash_one(std::process::id()))).fetch_add(1, Ordering::Relaxed)
}
