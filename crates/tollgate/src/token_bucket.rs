//! Token bucket with continuous refill, as GCRA: the whole state is one atomic word, the
//! theoretical arrival time (TAT) of the next permit, and a decision is one compare-and-swap.
//!
//! A bucket of `burst` permits refills one permit every `emission_interval`. The state records
//! the time at which the bucket would be full again (`tat`); `n` permits fit when
//! `max(tat, now) + n·T <= now + burst·T`.

use crate::algorithm::{Algorithm, quota_cell_members};
use crate::quota::Quota;
use crate::seqlock::SeqCell;
use crate::snapshot::Snapshot;
use crate::sync::{AtomicU64, Ordering};

/// Token bucket with continuous refill (GCRA), lock-free.
///
/// Allows bursts of up to `quota.burst()`, then one permit per `quota.emission_interval()`.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Limiter, ManualClock, Quota, TokenBucket};
/// let clock = ManualClock::new();
/// let limiter = Limiter::builder(TokenBucket::new(Quota::per_second(10)?)).clock(clock.clone()).build();
/// assert!(limiter.try_acquire(10).is_ok());                 // the whole burst at once
/// let no = limiter.try_acquire(1).unwrap_err();
/// assert_eq!(no.retry_after(), Some(Duration::from_millis(100)));
/// clock.advance(Duration::from_millis(100));
/// assert!(limiter.try_acquire(1).is_ok());                  // one more permit per 100 ms
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
///
/// Quota changes ([`crate::Limiter::set_quota`]) keep the permits already taken: a bucket that
/// was short of `k` permits is short of `k` permits under the new quota.
pub struct TokenBucket {
    quota: SeqCell<Quota>,
}

/// The state of one [`TokenBucket`]: the theoretical arrival time, in clock nanoseconds.
#[derive(Debug, Default)]
pub struct TokenBucketState(AtomicU64);

impl TokenBucket {
    /// A bucket for `quota`.
    pub fn new(quota: Quota) -> TokenBucket {
        TokenBucket { quota: SeqCell::new(quota) }
    }
}

/// The bucket at `now` with arrival time `tat`; `cost` is what the request `retry_after` is about
/// adds (the next permit, or a rejected request's permits).
#[inline]
fn snapshot(q: &Quota, now: u64, tat: u64, cost: u64) -> Snapshot {
    Snapshot::gcra(now, tat, q.emission_ns(), q.burst(), cost)
}

impl Algorithm for TokenBucket {
    type State = TokenBucketState;
    type Config = Quota;

    fn new_state(&self, _now: u64) -> TokenBucketState {
        TokenBucketState(AtomicU64::new(0))
    }

    quota_cell_members!(burst);

    #[inline]
    fn decide(&self, state: &TokenBucketState, now: u64, n: u64, commit: bool) -> Result<Snapshot, Snapshot> {
        let q = self.quota.load();
        let horizon = now.saturating_add(q.tau_ns());
        // Saturating: more than the burst (even u64::MAX) must be rejected, not overflow.
        let cost = n.saturating_mul(q.emission_ns());
        let mut tat = state.0.load(Ordering::Relaxed);
        loop {
            let base = tat.max(now);
            let new_tat = base.saturating_add(cost);
            // `n > 0`: a probe answers even past the horizon (a settled debt).
            if new_tat > horizon && n > 0 {
                return Err(snapshot(&q, now, base, cost));
            }
            if n == 0 || !commit {
                return Ok(snapshot(&q, now, base, q.emission_ns()));
            }
            match state.0.compare_exchange_weak(tat, new_tat, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(snapshot(&q, now, new_tat, q.emission_ns())),
                Err(actual) => tat = actual,
            }
        }
    }

    fn give_back(&self, state: &TokenBucketState, now: u64, n: u64, _acquired_at: u64) {
        let cost = n.saturating_mul(self.quota.load().emission_ns());
        let _ = state.0.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
            (tat > now).then(|| tat.saturating_sub(cost).max(now))
        });
    }

    /// The arrival time moves `n` emission intervals on, past the burst's horizon if need be:
    /// nothing is admitted until it is back within it.
    fn charge(&self, state: &TokenBucketState, now: u64, n: u64) -> Result<(), &'static str> {
        if n > 0 {
            let cost = n.saturating_mul(self.quota.load().emission_ns());
            let _ = state
                .0
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| Some(tat.max(now).saturating_add(cost)));
        }
        Ok(())
    }

    fn is_idle(&self, state: &TokenBucketState, now: u64) -> bool {
        state.0.load(Ordering::Relaxed) <= now
    }

    fn idle_at(&self, state: &TokenBucketState, now: u64) -> u64 {
        state.0.load(Ordering::Relaxed).max(now)
    }

    fn wait_estimate(&self, state: &TokenBucketState, now: u64, permits: u64) -> Option<u64> {
        let q = self.quota.load();
        let base = state.0.load(Ordering::Relaxed).max(now) as u128;
        let ready = base + permits as u128 * q.emission_ns() as u128;
        let horizon = now as u128 + q.tau_ns() as u128;
        Some(u64::try_from(ready.saturating_sub(horizon)).unwrap_or(u64::MAX))
    }

    fn carry_over(&self, state: &TokenBucketState, now: u64, old: Quota) {
        let new_t = self.quota.load().emission_ns();
        let _ = state.0.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
            let used = tat.saturating_sub(now).div_ceil(old.emission_ns());
            Some(now.saturating_add(used.saturating_mul(new_t)))
        });
    }
}

impl std::fmt::Debug for TokenBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenBucket").field("quota", &self.config()).finish()
    }
}
