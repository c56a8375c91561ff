//! The one interface every rate-limiting algorithm implements.
//!
//! An algorithm is configuration plus rules; the state it decides on is separate
//! ([`Algorithm::State`]) so one configuration can serve one limiter ([`crate::Limiter`]) or a
//! million keys ([`crate::Keyed`]) without copying itself per key.

use crate::snapshot::Snapshot;

/// A rate-limiting algorithm: how a state answers "may `n` permits go now?".
///
/// Implementations must be exact: the same sequence of calls with the same times gives the same
/// decisions, whatever the thread interleaving (each call is linearizable).
pub trait Algorithm: Send + Sync + 'static {
    /// Per-limiter (or per-key) state.
    type State: Send + Sync + 'static;
    /// What [`Algorithm::set_config`] changes: a [`crate::Quota`] for rate limits, a permit count
    /// for concurrency.
    type Config: Copy + Send + Sync + std::fmt::Debug + 'static;

    /// A fresh state (full capacity) at time `now`.
    fn new_state(&self, now: u64) -> Self::State;

    /// The most permits one request can ever be granted; more is rejected with
    /// [`crate::Reason::ExceedsCapacity`]. Every decision's metadata reports it as `limit`
    /// (limiters tell "never" from "not now" by it without reading the configuration again).
    fn capacity(&self) -> u64;

    /// Decides whether `n` permits may be taken at `now`; takes them if `commit` and admitted.
    /// `n == 0` reports the state and never takes anything. `n` above
    /// [`Algorithm::capacity`] must be rejected (never overflow): limiters rely on it to read the
    /// capacity only on the rejection path.
    /// The [`Snapshot`] is what the decision saw; its metadata is computed only if read.
    fn decide(&self, state: &Self::State, now: u64, n: u64, commit: bool) -> Result<Snapshot, Snapshot>;

    /// Returns `n` permits taken at `acquired_at` (a cancelled waiter, a chain's rollback, the end
    /// of a concurrency lease). Rate algorithms give back only what still counts at `now`.
    fn give_back(&self, state: &Self::State, now: u64, n: u64, acquired_at: u64);

    /// Takes `n` permits at `now` whatever the state, past the limit if need be: what a
    /// [`crate::Reservation`] settled for more than it reserved costs. The excess is a debt that
    /// later requests pay before any is admitted (each algorithm says how). `n == 0` takes
    /// nothing and tells whether this algorithm can carry a debt.
    ///
    /// `Err` says why this algorithm cannot (it then takes nothing). The default, for algorithms
    /// outside this crate, cannot.
    fn charge(&self, state: &Self::State, now: u64, n: u64) -> Result<(), &'static str> {
        let _ = (state, now, n);
        Err("the algorithm does not implement Algorithm::charge")
    }

    /// True when the state holds no information: it is back at full capacity and a fresh state
    /// would decide identically. Keyed limiters evict such keys.
    fn is_idle(&self, state: &Self::State, now: u64) -> bool;

    /// The earliest time, at or after `now`, at which the state will be idle if nothing else
    /// happens to it (no decision, no give-back): `now` when it is idle already, `u64::MAX` when
    /// only a release, not time, can make it idle. Exact: `is_idle(state, t)` holds at
    /// `t = idle_at(state, now)` and, when `t > now`, not at `t - 1`.
    ///
    /// Keyed limiters order their keys by it to find idle keys without scanning (see
    /// [`crate::Keyed`]); a decision that takes permits must never move it earlier.
    fn idle_at(&self, state: &Self::State, now: u64) -> u64;

    /// Nanoseconds from `now` until `permits` permits (possibly more than the capacity, as when
    /// several waiters are queued) will have become available one request after another; `None`
    /// when only a release, not time, frees permits.
    fn wait_estimate(&self, state: &Self::State, now: u64, permits: u64) -> Option<u64>;

    /// The current configuration.
    fn config(&self) -> Self::Config;

    /// Replaces the configuration, returning the old one. The caller then calls
    /// [`Algorithm::carry_over`] on every state.
    fn set_config(&self, config: Self::Config) -> Self::Config;

    /// Rewrites a state decided under `old` so that it keeps its meaning under the current
    /// configuration (each algorithm documents its rule).
    fn carry_over(&self, state: &Self::State, now: u64, old: Self::Config);

    /// The period a quota is counted over (what HTTP's `RateLimit-Policy` calls the window);
    /// `None` for limits that are not counted over time (concurrency).
    fn window(&self) -> Option<std::time::Duration> {
        None
    }

    /// False when decisions never depend on time (a concurrency limit): limiters then skip the
    /// clock read, and leases report `granted_at() == 0`.
    fn reads_clock(&self) -> bool {
        true
    }

    /// True when permits come back only through [`Algorithm::give_back`] (a concurrency limit), so a
    /// [`crate::Lease`] must release them on drop.
    ///
    /// Such an algorithm's `give_back` must write its state with a `SeqCst` read-modify-write:
    /// the limiter then checks its wait queue with a `SeqCst` load instead of a fence, and a
    /// waiter queueing at the same moment relies on one of the two seeing the other.
    fn releases_on_drop(&self) -> bool {
        false
    }
}

/// The algorithm's type name without its path (`TokenBucket`), for errors.
pub(crate) fn algorithm_name<A: ?Sized>() -> &'static str {
    let name = std::any::type_name::<A>();
    name.rsplit("::").next().unwrap_or(name)
}

/// What `algo` would answer for `n` permits on `state` at `now`, taking nothing, whichever way
/// it goes (`n == 0`: the state as a probe reports it).
#[inline]
pub(crate) fn peek<A: Algorithm>(algo: &A, state: &A::State, now: u64, n: u64) -> Snapshot {
    algo.decide(state, now, n, false).unwrap_or_else(|m| m)
}

/// The members of [`Algorithm`] that an algorithm configured by one [`crate::Quota`] answers from
/// its quota cell alone (a field `quota: SeqCell<Quota>`): the configuration, its window, and the
/// capacity as the quota's `$capacity` (`limit` for windows, `burst` for buckets). Written once so
/// that the algorithms cannot drift apart on what a quota change means for these.
macro_rules! quota_cell_members {
    ($capacity:ident) => {
        fn capacity(&self) -> u64 {
            self.quota.load().$capacity()
        }

        fn config(&self) -> $crate::quota::Quota {
            self.quota.load()
        }

        fn window(&self) -> Option<std::time::Duration> {
            Some(self.quota.load().period())
        }

        fn set_config(&self, quota: $crate::quota::Quota) -> $crate::quota::Quota {
            self.quota.store(quota)
        }
    };
}
pub(crate) use quota_cell_members;
