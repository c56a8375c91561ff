//! `Held`: a slot of a Redis semaphore as both permit classes (async `tollgate.Permit` and
//! `tollgate.sync.Permit`) keep it.

use std::future::Future;
use std::sync::Mutex;

use pyo3::prelude::*;
use tollgate_redis::SemaphoreGuard;

use crate::connection::runtime;
use crate::errors;

/// A held slot, renewed in the background (on the tokio runtime, so whatever the holder's
/// thread does with the GIL) until released; dropped unreleased, it is released in the background.
pub(crate) struct Held {
    guard: Mutex<Option<SemaphoreGuard>>,
    fencing_token: u64,
    lease_id: String,
}

impl Held {
    pub(crate) fn new(guard: SemaphoreGuard) -> Held {
        Held {
            fencing_token: guard.fencing_token(),
            lease_id: guard.lease_id().to_owned(),
            guard: Mutex::new(Some(guard)),
        }
    }

    /// Starts the release now; the future reports how it went: `true` if the lease was still
    /// held, `false` if it had expired or was already released.
    pub(crate) fn releasing(&self) -> impl Future<Output = PyResult<bool>> + Send + use<> {
        let lease = self.lease_id.clone();
        // Spawned, not awaited in place: cancelling (or interrupting) the caller must not cancel
        // the release.
        let released = self.take().map(|g| runtime().spawn(g.release()));
        async move {
            let Some(released) = released else { return Ok(false) };
            match released.await {
                Ok(Ok(held)) => Ok(held),
                Ok(Err(e)) => Err(errors::RedisUnavailableError::new_err(format!(
                    "could not release lease {lease}: {e}; the slot returns when the lease expires"
                ))),
                Err(e) => Err(errors::TollgateError::new_err(format!("release of lease {lease} failed: {e}"))),
            }
        }
    }

    fn take(&self) -> Option<SemaphoreGuard> {
        self.guard.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// True once the lease is known to be lost; false after a release.
    pub(crate) fn is_lost(&self) -> bool {
        self.guard.lock().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(SemaphoreGuard::is_lost)
    }

    /// False once released.
    pub(crate) fn held(&self) -> bool {
        self.guard.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    pub(crate) fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    pub(crate) fn lease_id(&self) -> &str {
        &self.lease_id
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Python may drop it on a thread outside the runtime; the guard's release needs one.
        let _runtime = runtime().enter();
        drop(self.take());
    }
}
