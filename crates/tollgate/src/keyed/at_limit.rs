//! [`AtKeyLimit`]: what a [`Keyed`](crate::Keyed) limiter does with a new key at its cap.

/// What a [`Keyed`](crate::Keyed) limiter does with a new key when its shard holds
/// `max_keys / shards` keys and none of them is idle.
///
/// Keys are sharded, so "the cap" is reached shard by shard: a new key is compared with the keys
/// of its own shard only.
///
/// ```
/// use std::num::NonZeroUsize;
/// use std::time::Duration;
/// use tollgate::{AtKeyLimit, Keyed, ManualClock, Quota, Reason, TokenBucket};
///
/// let clock = ManualClock::new();
/// let per_ip: Keyed<u64, _, _> = Keyed::builder(TokenBucket::new(Quota::per_minute(10)?))
///     .clock(clock.clone())
///     .shards(NonZeroUsize::MIN)
///     .max_keys(NonZeroUsize::new(2).unwrap())
///     .at_key_limit(AtKeyLimit::Reject) // the default
///     .build();
/// per_ip.try_acquire(&1, 1).unwrap();
/// clock.advance(Duration::from_secs(1));
/// per_ip.try_acquire(&2, 1).unwrap();
/// // Key 1 is idle again 6 s after its permit (10 per minute): a new key is told so.
/// let no = per_ip.try_acquire(&3, 1).unwrap_err();
/// assert_eq!((no.reason(), no.retry_after()), (Reason::KeyLimit, Some(Duration::from_secs(5))));
/// clock.advance(Duration::from_secs(5));
/// assert!(per_ip.try_acquire(&3, 1).is_ok());
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AtKeyLimit {
    /// Reject the new key with [`Reason::KeyLimit`](crate::Reason::KeyLimit), telling it when a
    /// stored key of its shard goes idle (`retry_after`; `None` only when no key goes idle by
    /// time, as with [`crate::Concurrency`], where only a release makes room). The default: under
    /// a flood of new keys (rotating source addresses) every stored key keeps its limit and
    /// nobody is admitted uncounted, so the flood can deny service to new keys only, never buy
    /// permits; the other two policies trade that for availability.
    ///
    /// The retry time is exact (a retry then finds room if no other new key took it first,
    /// one tick earlier does not) unless the keys of more than [`SWEEP`](crate::SWEEP) of the
    /// shard's groups nearest to idle took permits since the shard last looked at them; it is
    /// then the idle time of a key that was looked at, which is later than the exact time, never
    /// earlier, and a retry then finds that key idle (the shard looks at it first).
    #[default]
    Reject,
    /// Evict the stored key closest to idle (as [`AtKeyLimit::Reject`] finds it) and store the
    /// new key. This over-admits: if the evicted key comes back, it starts from a fresh state,
    /// so it is granted again what it had spent and not yet earned back: at most its burst (its
    /// `limit` for windows) per eviction. Choose it when new keys must never be turned away and
    /// that excess is acceptable.
    ///
    /// Keys of an algorithm whose permits are held ([`crate::Concurrency`]) are never evicted
    /// while they hold permits (their leases would release into the next key of that name):
    /// there, a new key at the cap is rejected as with [`AtKeyLimit::Reject`].
    EvictNearestIdle,
    /// Decide the new key on a fresh state and do not store it (fail open): it gets up to its
    /// burst on every request while the shard is full, so the limit does not hold for new keys.
    /// Choose it only when the limit protects nothing that matters more than availability.
    AdmitUnstored,
}

impl AtKeyLimit {
    /// Reads `reject`, `evict` (or `evict-nearest-idle`) or `admit` (or `admit-unstored`), the
    /// names the server's `--at-max-counters` and the Python bindings use.
    ///
    /// ```
    /// use tollgate::AtKeyLimit;
    /// assert_eq!(AtKeyLimit::from_name("evict"), Some(AtKeyLimit::EvictNearestIdle));
    /// assert_eq!(AtKeyLimit::EvictNearestIdle.name(), "evict");
    /// assert_eq!(AtKeyLimit::from_name("drop"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<AtKeyLimit> {
        match name {
            "reject" => Some(AtKeyLimit::Reject),
            "evict" | "evict-nearest-idle" => Some(AtKeyLimit::EvictNearestIdle),
            "admit" | "admit-unstored" => Some(AtKeyLimit::AdmitUnstored),
            _ => None,
        }
    }

    /// The short name [`AtKeyLimit::from_name`] reads.
    pub fn name(self) -> &'static str {
        match self {
            AtKeyLimit::Reject => "reject",
            AtKeyLimit::EvictNearestIdle => "evict",
            AtKeyLimit::AdmitUnstored => "admit",
        }
    }
}
