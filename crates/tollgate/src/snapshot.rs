//! [`Snapshot`]: what a decision saw, kept as the few words the algorithm already had; the
//! metadata a caller may read ([`Meta`]: remaining, reset, retry-after) is computed from them
//! only when read, so a caller that only asks "yes or no?" never pays for a division.

use std::fmt;

/// Limiter state attached to a decision, in integer nanoseconds (no rounding to seconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Meta {
    /// Most permits the limiter grants at once (a token bucket's burst, a window's limit).
    pub limit: u64,
    /// Permits available right after this decision.
    pub remaining: u64,
    /// Nanoseconds until the limiter is back to full capacity.
    pub reset_ns: u64,
    /// Nanoseconds until a retry of the same request can succeed; `None` when waiting alone cannot
    /// make it succeed (the reason says why).
    pub retry_ns: Option<u64>,
}

impl Meta {
    /// The tighter of two limits' states, as several limits decided together report them: the
    /// smaller `remaining` (with its `limit`), the later reset, and the longer retry-after
    /// (`None`, "waiting cannot help", only when both say so).
    ///
    /// ```
    /// use tollgate::Meta;
    /// let per_second = Meta { limit: 10, remaining: 4, reset_ns: 600, retry_ns: Some(0) };
    /// let per_minute = Meta { limit: 100, remaining: 2, reset_ns: 50_000, retry_ns: Some(0) };
    /// let both = per_second.tightest(per_minute);
    /// assert_eq!((both.limit, both.remaining, both.reset_ns), (100, 2, 50_000));
    /// ```
    #[must_use]
    pub fn tightest(self, other: Meta) -> Meta {
        let (limit, remaining) = if other.remaining < self.remaining {
            (other.limit, other.remaining)
        } else {
            (self.limit, self.remaining)
        };
        let retry_ns = match (self.retry_ns, other.retry_ns) {
            (Some(x), Some(y)) => Some(x.max(y)),
            (x, y) => x.and(y),
        };
        Meta { limit, remaining, reset_ns: self.reset_ns.max(other.reset_ns), retry_ns }
    }
}

/// The state a decision saw, from which its [`Meta`] is computed when read.
///
/// Algorithms return one from [`crate::Algorithm::decide`]; an algorithm outside this crate
/// builds it from a [`Meta`]:
///
/// ```
/// use tollgate::{Meta, Snapshot};
/// let meta = Meta { limit: 10, remaining: 3, reset_ns: 700, retry_ns: Some(0) };
/// assert_eq!(Snapshot::from(meta).meta(), meta);
/// ```
///
/// Two snapshots are equal when their metadata is.
#[derive(Clone, Copy)]
pub struct Snapshot(Repr);

#[derive(Clone, Copy)]
enum Repr {
    Meta(Meta),
    /// A GCRA token bucket at `now` whose theoretical arrival time is `tat`; `cost` is what the
    /// next request (one permit, or the rejected request's permits) would add to `tat`.
    Gcra {
        now: u64,
        tat: u64,
        emission: u64,
        burst: u64,
        cost: u64,
    },
}

impl Snapshot {
    /// A GCRA bucket of `burst` permits, one per `emission` ns, at `now` with theoretical arrival
    /// time `tat`; `cost` ns is what the request that `retry_after` is about adds to `tat`.
    #[inline]
    pub(crate) fn gcra(now: u64, tat: u64, emission: u64, burst: u64, cost: u64) -> Snapshot {
        Snapshot(Repr::Gcra { now, tat, emission, burst, cost })
    }

    /// The metadata: limit, remaining, reset and retry-after.
    pub fn meta(&self) -> Meta {
        match self.0 {
            Repr::Meta(meta) => meta,
            Repr::Gcra { now, tat, emission, burst, cost } => {
                // burst * emission cannot overflow: checked when the quota was made.
                let horizon = now.saturating_add(burst * emission);
                Meta {
                    limit: burst,
                    remaining: horizon.saturating_sub(tat) / emission,
                    reset_ns: tat.saturating_sub(now),
                    retry_ns: Some(tat.saturating_add(cost).saturating_sub(horizon)),
                }
            }
        }
    }

    /// Most permits the limiter grants at once (cheap: no computation).
    pub fn limit(&self) -> u64 {
        match self.0 {
            Repr::Meta(meta) => meta.limit,
            Repr::Gcra { burst, .. } => burst,
        }
    }

    /// The same snapshot with another retry-after.
    pub(crate) fn with_retry(self, retry_ns: Option<u64>) -> Snapshot {
        Meta { retry_ns, ..self.meta() }.into()
    }
}

impl From<Meta> for Snapshot {
    #[inline]
    fn from(meta: Meta) -> Snapshot {
        Snapshot(Repr::Meta(meta))
    }
}

impl PartialEq for Snapshot {
    fn eq(&self, other: &Snapshot) -> bool {
        self.meta() == other.meta()
    }
}

impl Eq for Snapshot {}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.meta().fmt(f)
    }
}
