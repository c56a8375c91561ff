//! [`Permit`]: concurrency permits borrowed from a [`Limiter`], given back when dropped.

use std::fmt;
use std::sync::Arc;

use crate::clock::{Clock, SystemClock};
use crate::concurrency::Concurrency;
use crate::decision::{Lease, Rejected};
use crate::limiter::Limiter;
use crate::shared::Shared;
use crate::snapshot::{Meta, Snapshot};

/// Permits of a [`Concurrency`] limit that borrow their limiter: taking and releasing them costs
/// no reference count (the shape of `tokio::sync::Semaphore::try_acquire`). Use a [`Lease`]
/// ([`Limiter::try_acquire`]) when the permits must outlive the borrow, e.g. move into a task.
///
/// ```
/// use tollgate::{Concurrency, Limiter};
/// let limiter = Limiter::new(Concurrency::new(2)?);
/// let permit = limiter.try_permit(2).unwrap();
/// assert_eq!(permit.remaining(), 0);
/// assert!(limiter.try_permit(1).is_err());
/// drop(permit);                              // both permits are back
/// assert_eq!(limiter.held(), 0);
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[must_use = "a Permit holds its permits until dropped; bind it to a variable for as long as the work runs"]
pub struct Permit<'a, C: Clock = SystemClock> {
    shared: &'a Arc<Shared<Concurrency, C>>,
    permits: u64,
    meta: Snapshot,
}

impl<C: Clock> Limiter<Concurrency, C> {
    /// Takes `n` permits now or rejects, never waits; the [`Permit`] borrows the limiter and gives
    /// them back when dropped. `n == 0` reports the state and holds nothing.
    #[inline]
    pub fn try_permit(&self, n: u64) -> Result<Permit<'_, C>, Rejected> {
        self.shared.try_take(n, |meta, _| {
            if n > 0 {
                self.shared.counts.admitted();
            }
            Permit { shared: &self.shared, permits: n, meta }
        })
    }
}

impl<C: Clock> Permit<'_, C> {
    /// Permits held.
    pub fn permits(&self) -> u64 {
        self.permits
    }

    /// Permits still available right after these were taken.
    pub fn remaining(&self) -> u64 {
        self.meta.meta().remaining
    }

    /// All metadata at once.
    pub fn meta(&self) -> Meta {
        self.meta.meta()
    }

    /// The same permits as a [`Lease`], which owns a reference to the limiter (so it can move
    /// into a task); nothing is released or taken again.
    pub fn into_lease(self) -> Lease {
        let this = std::mem::ManuallyDrop::new(self);
        // A concurrency limit never reads the clock: its leases are granted at 0.
        this.shared.lease_held(this.meta, this.permits, 0)
    }
}

impl<C: Clock> Drop for Permit<'_, C> {
    #[inline]
    fn drop(&mut self) {
        if self.permits > 0 {
            self.shared.release_permits(self.permits);
        }
    }
}

impl<C: Clock> fmt::Debug for Permit<'_, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit").field("permits", &self.permits).field("meta", &self.meta).finish()
    }
}
