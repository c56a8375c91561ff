//! Concurrency limit: at most `max` permits held at once; a [`crate::Lease`] gives its permits
//! back when dropped. The state is one atomic counter.

use std::num::NonZeroU64;

use crate::algorithm::Algorithm;
use crate::quota::QuotaError;
use crate::seqlock::SeqCell;
use crate::snapshot::{Meta, Snapshot};
use crate::sync::{AtomicU64, Ordering};

/// At most `max` permits held at once (a semaphore).
///
/// ```
/// use tollgate::{Concurrency, Limiter};
/// let limiter = Limiter::new(Concurrency::new(2)?);
/// let a = limiter.try_acquire(2).unwrap();
/// assert!(limiter.try_acquire(1).is_err());
/// drop(a);                                   // releases both permits
/// assert!(limiter.try_acquire(1).is_ok());
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
///
/// Lowering the limit below what is held keeps every lease valid; new requests wait until enough
/// have been released.
pub struct Concurrency {
    max: SeqCell<u64>,
}

/// The state of one [`Concurrency`] limit: permits currently held.
#[derive(Debug, Default)]
pub struct ConcurrencyState(AtomicU64);

impl ConcurrencyState {
    /// Permits currently held.
    pub fn held(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Concurrency {
    /// At most `max` permits at once; `max == 0` is an error.
    pub fn new(max: u64) -> Result<Concurrency, QuotaError> {
        if max == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        Ok(Concurrency { max: SeqCell::new(max) })
    }
}

fn meta(max: u64, held: u64) -> Meta {
    let remaining = max.saturating_sub(held);
    Meta { limit: max, remaining, reset_ns: 0, retry_ns: (remaining > 0).then_some(0) }
}

impl Concurrency {
    #[inline]
    fn decide_meta(&self, state: &ConcurrencyState, n: u64, commit: bool) -> Result<Meta, Meta> {
        let max = self.max.load();
        let mut held = state.0.load(Ordering::Relaxed);
        loop {
            if held.saturating_add(n) > max {
                // Only a release can make this request fit: no retry time.
                return Err(Meta { retry_ns: None, ..meta(max, held) });
            }
            if n == 0 || !commit {
                return Ok(meta(max, held));
            }
            // Acquire pairs with the Release of `give_back`: work done under the previous lease
            // happens-before work under this one.
            match state.0.compare_exchange_weak(held, held + n, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Ok(meta(max, held + n)),
                Err(actual) => held = actual,
            }
        }
    }
}

impl Algorithm for Concurrency {
    type State = ConcurrencyState;
    type Config = NonZeroU64;

    fn new_state(&self, _now: u64) -> ConcurrencyState {
        ConcurrencyState(AtomicU64::new(0))
    }

    fn capacity(&self) -> u64 {
        self.max.load()
    }

    #[inline]
    fn decide(&self, state: &ConcurrencyState, _now: u64, n: u64, commit: bool) -> Result<Snapshot, Snapshot> {
        self.decide_meta(state, n, commit).map(Snapshot::from).map_err(Snapshot::from)
    }

    fn give_back(&self, state: &ConcurrencyState, _now: u64, n: u64, _acquired_at: u64) {
        // SeqCst, not just Release (which hands the work under this lease to the next holder):
        // see `Algorithm::releases_on_drop`.
        let prev = state.0.fetch_sub(n, Ordering::SeqCst);
        assert!(prev >= n, "released {n} permits but only {prev} were held");
    }

    fn charge(&self, _state: &ConcurrencyState, _now: u64, _n: u64) -> Result<(), &'static str> {
        Err(
            "a concurrency permit is held while the work runs and given back after it, never spent: there is no cost to settle",
        )
    }

    fn is_idle(&self, state: &ConcurrencyState, _now: u64) -> bool {
        state.0.load(Ordering::Relaxed) == 0
    }

    fn idle_at(&self, state: &ConcurrencyState, now: u64) -> u64 {
        if self.is_idle(state, now) { now } else { u64::MAX }
    }

    fn wait_estimate(&self, _state: &ConcurrencyState, _now: u64, _permits: u64) -> Option<u64> {
        None
    }

    fn config(&self) -> NonZeroU64 {
        NonZeroU64::new(self.max.load()).expect("the limit is never zero")
    }

    fn set_config(&self, max: NonZeroU64) -> NonZeroU64 {
        NonZeroU64::new(self.max.store(max.get())).expect("the limit is never zero")
    }

    fn carry_over(&self, _state: &ConcurrencyState, _now: u64, _old: NonZeroU64) {}

    fn releases_on_drop(&self) -> bool {
        true
    }

    fn reads_clock(&self) -> bool {
        false
    }
}

impl std::fmt::Debug for Concurrency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Concurrency").field("max", &self.config()).finish()
    }
}
