//! Decisions as data: a [`Lease`] when admitted, a [`Rejected`] when not; both carry the metadata a
//! caller needs to tell its own client what happened (limit, remaining, reset, retry-after).

use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::Duration;

use crate::snapshot::{Meta, Snapshot};

/// Why a decision came out the way it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// Admitted: the permits were taken.
    Granted,
    /// A probe (`n == 0`): nothing was taken, the metadata reports the current state.
    Probe,
    /// Not enough permits right now; `retry_after` says when there will be.
    Exhausted,
    /// More permits were asked for than the limiter can ever grant at once; retrying cannot help.
    ExceedsCapacity,
    /// The wait queue's permit limit was reached.
    QueueFull,
    /// Pushed out of a newest-first (LIFO) queue by a newer waiter when the queue was full.
    Evicted,
    /// The wait would have been longer than the configured `max_wait`.
    MaxWait,
    /// The limiter was closed or dropped.
    Closed,
    /// A keyed limiter is at its `max_keys` cap and no idle key could make room.
    KeyLimit,
    /// A distributed backend could not decide in time and its failure policy is to deny.
    Unavailable,
    /// Admitted without a decision: the backend failed and its failure policy is to allow.
    FailOpen,
    /// Decided by a local fallback limiter because the distributed backend failed.
    Fallback,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::Granted => "granted",
            Reason::Probe => "probe",
            Reason::Exhausted => "rate limit exhausted",
            Reason::ExceedsCapacity => "request exceeds the limiter's capacity and can never be granted",
            Reason::QueueFull => "wait queue is full",
            Reason::Evicted => "evicted from the wait queue by a newer request",
            Reason::MaxWait => "wait would exceed max_wait",
            Reason::Closed => "limiter closed",
            Reason::KeyLimit => "too many keys",
            Reason::Unavailable => "rate-limit backend unavailable (failure policy: deny)",
            Reason::FailOpen => "rate-limit backend unavailable (failure policy: allow)",
            Reason::Fallback => "decided by the local fallback limiter (backend unavailable)",
        })
    }
}

/// The accessors and `Debug` of [`Lease`] and [`Rejected`], which hold the same three things (the
/// limiter's state as the decision saw it, the permits, the reason); the docs that differ
/// between an admission and a rejection are given per type.
macro_rules! decision_accessors {
    (
        $decision:ident;
        $(#[$permits:meta])* permits;
        $(#[$remaining:meta])* remaining;
        $(#[$retry_after:meta])* retry_after;
        $(#[$reason:meta])* reason;
    ) => {
        impl $decision {
            $(#[$permits])*
            pub fn permits(&self) -> u64 {
                self.permits
            }
            /// Most permits the limiter grants at once.
            pub fn limit(&self) -> u64 {
                self.meta.limit()
            }
            $(#[$remaining])*
            pub fn remaining(&self) -> u64 {
                self.meta.meta().remaining
            }
            /// Time until the limiter is back to full capacity.
            pub fn reset_after(&self) -> Duration {
                Duration::from_nanos(self.meta.meta().reset_ns)
            }
            $(#[$retry_after])*
            pub fn retry_after(&self) -> Option<Duration> {
                self.meta.meta().retry_ns.map(Duration::from_nanos)
            }
            $(#[$reason])*
            pub fn reason(&self) -> Reason {
                self.reason
            }
            /// All metadata at once (computed now from what the decision saw).
            pub fn meta(&self) -> Meta {
                self.meta.meta()
            }
        }

        impl fmt::Debug for $decision {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($decision))
                    .field("permits", &self.permits)
                    .field("reason", &self.reason)
                    .field("meta", &self.meta)
                    .finish()
            }
        }
    };
}

/// Returns permits to the limiter they came from (concurrency limits).
pub(crate) trait PermitPool: Send + Sync {
    fn release(self: Arc<Self>, n: u64);
}

/// What a lease gives back when dropped. An `Option<Hold>` that is `None` (a rate limit's lease)
/// costs one test to drop.
enum Hold {
    Permits(Arc<dyn PermitPool>),
    /// A chain's two parts.
    Pair(Box<[Lease; 2]>),
}

/// Permits that were granted, with the limiter's state at the time.
///
/// For concurrency limiters the permits go back when the lease is dropped or
/// [released](Lease::release); for rate limiters they were spent and dropping changes nothing.
#[must_use = "a Lease holds its permits until dropped; bind it to a variable for as long as the work runs"]
pub struct Lease {
    meta: Snapshot,
    permits: u64,
    reason: Reason,
    pub(crate) acquired_at: u64,
    // Dropped by hand (in `Drop for Lease`): a rate limit's lease, which holds nothing, then
    // drops with one inlined test instead of a call into the glue of every `Hold`.
    hold: ManuallyDrop<Option<Hold>>,
}

impl Lease {
    /// A lease for `permits` granted at `granted_at` (clock nanoseconds), for limiters outside
    /// this crate (e.g. a Redis backend). Nothing is released on drop.
    pub fn new(meta: Meta, permits: u64, granted_at: u64) -> Lease {
        Lease::of(meta.into(), permits, granted_at)
    }

    /// A lease whose metadata is computed from `snapshot` when read.
    #[inline]
    pub(crate) fn of(meta: Snapshot, permits: u64, granted_at: u64) -> Lease {
        Lease::held_by(meta, permits, granted_at, None)
    }

    /// A lease that gives its permits back to `pool` when dropped. Built whole, in place: a lease
    /// built and then given its pool was copied through memory in between, and reading the copy
    /// back stalled on store forwarding (an owned concurrency permit cost 1.2x-3x tokio's).
    #[inline]
    pub(crate) fn held_by(meta: Snapshot, permits: u64, granted_at: u64, pool: Option<Arc<dyn PermitPool>>) -> Lease {
        let reason = if permits == 0 { Reason::Probe } else { Reason::Granted };
        let hold = match pool {
            Some(pool) if permits > 0 => Some(Hold::Permits(pool)),
            _ => None,
        };
        Lease { meta, permits, reason, acquired_at: granted_at, hold: ManuallyDrop::new(hold) }
    }

    /// The same lease with another reason ([`Reason::FailOpen`], [`Reason::Fallback`]).
    pub fn with_reason(mut self, reason: Reason) -> Lease {
        self.reason = reason;
        self
    }

    pub(crate) fn combine(meta: Meta, permits: u64, acquired_at: u64, parts: [Lease; 2]) -> Lease {
        let mut lease = Lease::new(meta, permits, acquired_at);
        *lease.hold = Some(Hold::Pair(Box::new(parts)));
        lease
    }

    /// A chain's two parts; `None` for a lease that is not a chain's.
    pub(crate) fn take_parts(mut self) -> Option<[Lease; 2]> {
        match self.hold.take() {
            Some(Hold::Pair(parts)) => Some(*parts),
            _ => None,
        }
    }

    /// The same permits, grant time, reason and metadata, holding nothing (a concurrency permit
    /// stays with this lease, a chain's parts too): what a distributed limiter keeps of a lease
    /// to settle it after the call that lent it has returned.
    pub fn detached(&self) -> Lease {
        Lease {
            meta: self.meta,
            permits: self.permits,
            reason: self.reason,
            acquired_at: self.acquired_at,
            hold: ManuallyDrop::new(None),
        }
    }

    /// A chain's two parts, left in place; `None` for a lease that is not a chain's.
    pub(crate) fn parts(&self) -> Option<&[Lease; 2]> {
        match &*self.hold {
            Some(Hold::Pair(parts)) => Some(parts),
            _ => None,
        }
    }

    /// When the permits were granted, in nanoseconds of the limiter's [`crate::Clock`]; 0 for
    /// limits that never read the clock (concurrency).
    pub fn granted_at(&self) -> u64 {
        self.acquired_at
    }
    /// True when dropping this lease gives permits back (a concurrency limit, or a chain with one),
    /// so it must be kept for as long as the work runs.
    #[inline]
    pub fn releases_on_drop(&self) -> bool {
        match &*self.hold {
            None => false,
            Some(Hold::Permits(_)) => true,
            Some(Hold::Pair(parts)) => parts.iter().any(Lease::releases_on_drop),
        }
    }

    /// Gives concurrency permits back now rather than at the end of scope.
    pub fn release(self) {}
}

impl Lease {
    #[cold]
    #[inline(never)]
    fn drop_hold(&mut self) {
        match self.hold.take() {
            Some(Hold::Permits(pool)) => pool.release(self.permits),
            other => drop(other),
        }
    }
}

impl Drop for Lease {
    #[inline]
    fn drop(&mut self) {
        if self.hold.is_some() {
            self.drop_hold();
        }
    }
}

decision_accessors! {
    Lease;
    /// Permits this lease holds (0 for a probe).
    permits;
    /// Permits still available right after this lease was granted.
    remaining;
    /// Time until one more permit is available (zero while `remaining > 0`); `None` when only a
    /// release can free one (concurrency limits).
    retry_after;
    /// [`Reason::Granted`], or [`Reason::Probe`] for `n == 0`.
    reason;
}

/// A request the limiter did not admit. Nothing was taken.
///
/// ```
/// use tollgate::{Limiter, Quota, Reason, TokenBucket};
/// let limiter = Limiter::new(TokenBucket::new(Quota::per_second(2)?));
/// let _a = limiter.try_acquire(2).unwrap();
/// let no = limiter.try_acquire(1).unwrap_err();
/// assert_eq!(no.reason(), Reason::Exhausted);
/// assert!(no.retry_after().unwrap() > std::time::Duration::ZERO);
/// let never = limiter.try_acquire(3).unwrap_err();
/// assert_eq!(never.reason(), Reason::ExceedsCapacity);
/// assert_eq!(never.retry_after(), None);
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("rejected {permits} permit(s): {reason} (limit {}, remaining {}, retry after {:?})", self.limit(), self.remaining(), self.retry_after())]
pub struct Rejected {
    meta: Snapshot,
    permits: u64,
    reason: Reason,
}

impl Rejected {
    /// A rejection of `permits`, for limiters outside this crate.
    pub fn new(meta: Meta, permits: u64, reason: Reason) -> Rejected {
        Rejected::of(meta.into(), permits, reason)
    }

    /// A rejection whose metadata is computed from `snapshot` when read.
    #[inline]
    pub(crate) fn of(meta: Snapshot, permits: u64, reason: Reason) -> Rejected {
        Rejected { meta, permits, reason }
    }

    pub(crate) fn with_reason(mut self, reason: Reason, retry_ns: Option<u64>) -> Rejected {
        self.reason = reason;
        self.meta = self.meta.with_retry(retry_ns);
        self
    }

    /// The same rejection with another reason.
    pub fn because(mut self, reason: Reason) -> Rejected {
        self.reason = reason;
        self
    }

    pub(crate) fn with_meta(mut self, meta: Meta) -> Rejected {
        self.meta = meta.into();
        self
    }
}

decision_accessors! {
    Rejected;
    /// Permits that were asked for.
    permits;
    /// Permits available now (fewer than were asked for).
    remaining;
    /// Time until the same request can succeed, exact to the nanosecond; `None` when waiting
    /// alone cannot make it succeed (see [`Rejected::reason`]).
    retry_after;
    /// Why the request was rejected.
    reason;
}
