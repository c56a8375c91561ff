//! [`SemaphoreGuard`]: a held slot, renewed in the background, released on drop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tollgate::Meta;

use super::Inner;
use crate::error::BackendError;

/// A slot of a [`super::RedisSemaphore`], held until dropped or [released](SemaphoreGuard::release).
///
/// While it is held, a background task renews the lease every TTL/3. If a renewal finds the
/// lease gone (it expired during a stall longer than the TTL, or Redis lost it), or Redis cannot
/// be reached until the lease would have expired, the guard is *lost*: [`is_lost`] turns true and
/// [`lost`] completes. A lost lease is never taken back — its slot may already be someone else's.
///
/// Dropping the guard releases the slot in a spawned task (drop cannot wait); outside a tokio
/// runtime nothing can be sent and the slot returns when the lease expires.
///
/// [`is_lost`]: SemaphoreGuard::is_lost
/// [`lost`]: SemaphoreGuard::lost
#[must_use = "a SemaphoreGuard holds its slot until dropped; bind it to a variable for as long as the work runs"]
pub struct SemaphoreGuard {
    inner: Arc<Inner>,
    id: String,
    token: u64,
    meta: Meta,
    granted_at: Instant,
    lost: watch::Receiver<bool>,
    renewer: Option<JoinHandle<()>>,
    released: bool,
}

impl SemaphoreGuard {
    pub(super) fn new(inner: Arc<Inner>, id: String, token: u64, meta: Meta, sent: Instant) -> SemaphoreGuard {
        let (tx, lost) = watch::channel(false);
        let renewer = tokio::spawn(renew(inner.clone(), id.clone(), sent, tx));
        SemaphoreGuard { inner, id, token, meta, granted_at: sent, lost, renewer: Some(renewer), released: false }
    }

    /// The fencing token: strictly greater than the token of every lease granted before this one
    /// by this semaphore (taken from a counter in Redis, floored at Redis `TIME` in µs so it keeps
    /// growing even after the semaphore's keys expired or Redis restarted empty). Pass it to the
    /// protected resource so it can refuse a holder whose lease was lost.
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// The lease id in Redis (`<instance>:<n>`), for logs.
    pub fn lease_id(&self) -> &str {
        &self.id
    }

    /// True once the lease is known to be gone: a renewal was refused because it had expired, or
    /// Redis could not be reached before it would expire. The work should stop.
    pub fn is_lost(&self) -> bool {
        // A renewer that ended without saying (its runtime shut down) renews no more.
        *self.lost.borrow() || self.lost.has_changed().is_err()
    }

    /// Completes when the lease is lost (never, while it is renewed) — e.g. to cancel the work:
    /// `tokio::select! { r = work => r, _ = guard.lost() => abort() }`.
    pub async fn lost(&self) {
        let mut rx = self.lost.clone();
        // Err: the renewer is gone, so the lease is no longer renewed.
        let _ = rx.wait_for(|lost| *lost).await;
    }

    /// Gives the slot back now. `Ok(true)` when the lease was still held, `Ok(false)` when it had
    /// already expired. On an error the slot returns when the lease expires (nobody renews it).
    pub async fn release(mut self) -> Result<bool, BackendError> {
        self.stop_renewing();
        self.released = true;
        self.inner.release(&self.id).await
    }

    /// The semaphore's state right after the grant: `limit` is the capacity, `remaining` the slots
    /// neither held nor promised to queued waiters.
    pub fn meta(&self) -> Meta {
        self.meta
    }

    /// The semaphore's capacity.
    pub fn limit(&self) -> u64 {
        self.meta.limit
    }

    /// Slots neither held nor promised to waiters right after this grant.
    pub fn remaining(&self) -> u64 {
        self.meta.remaining
    }

    /// How long the slot has been held (local clock; from when the granting call was sent).
    pub fn held_for(&self) -> Duration {
        self.granted_at.elapsed()
    }

    fn stop_renewing(&mut self) {
        if let Some(renewer) = self.renewer.take() {
            // A renewal already sent cannot revive a released lease: it only extends a live one.
            renewer.abort();
        }
    }
}

impl Drop for SemaphoreGuard {
    fn drop(&mut self) {
        self.stop_renewing();
        if !self.released {
            self.inner.clone().release_in_background(std::mem::take(&mut self.id));
        }
    }
}

impl std::fmt::Debug for SemaphoreGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SemaphoreGuard")
            .field("semaphore", &self.inner.name)
            .field("lease_id", &self.id)
            .field("fencing_token", &self.token)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

/// Renews every TTL/3 until aborted or the lease is lost. The lease is surely valid until one
/// TTL after the last successful renewal was *sent*; past that, failing calls mean lost.
async fn renew(inner: Arc<Inner>, id: String, granted: Instant, lost: watch::Sender<bool>) {
    let ttl = inner.lease_ttl;
    let every = inner.heartbeat();
    let mut valid_until = granted + ttl;
    let mut next = granted + every;
    loop {
        tokio::time::sleep_until(next.into()).await;
        let sent = Instant::now();
        match inner.renew(&id).await {
            Ok(true) => {
                valid_until = sent + ttl;
                next = sent + every;
            }
            Ok(false) => {
                tracing::warn!(semaphore = %inner.name, lease = %id, "lease expired before it was renewed; it is lost");
                let _ = lost.send(true);
                return;
            }
            Err(error) => {
                let now = Instant::now();
                if now >= valid_until {
                    tracing::warn!(semaphore = %inner.name, lease = %id, %error, "could not renew the lease before it expired; it is lost");
                    let _ = lost.send(true);
                    return;
                }
                tracing::debug!(semaphore = %inner.name, lease = %id, %error, "renewal failed; retrying");
                // Retry sooner, and once more at the moment the lease would expire.
                next = (now + every / 4).min(valid_until).max(now + Duration::from_millis(1));
            }
        }
    }
}
