//! `tollgate.sync.Semaphore` and its `Permit`: the async `Semaphore`'s core, waited for by
//! blocking the calling thread (never the GIL).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::blocking::wait;
use crate::held::Held;
use crate::semaphore::{SemaphoreCore, permit_methods, semaphore_methods, state_dict};

/// A counting semaphore in Redis, with blocking methods: the keys and queue of the async
/// `Semaphore` of the same `name`, so threads, sync processes and asyncio tasks share one
/// capacity. Leases are renewed on Tollgate's own threads while held, whatever the holder does.
#[pyclass(subclass, module = "tollgate.sync", name = "Semaphore")]
pub struct SyncSemaphore(SemaphoreCore);

semaphore_methods! {
    SyncSemaphore, "tollgate.sync.Semaphore";
    /// Blocks until a slot is free (at most `max_sleep` seconds), without holding the GIL, and
    /// returns its `Permit`. Raises `MaxSleepExceededError` (nothing taken) or
    /// `RedisUnavailableError`; Ctrl-C leaves the queue.
    fn acquire(&self, py: Python<'_>) -> PyResult<SyncPermit> {
        wait(py, self.0.acquire()).map(SyncPermit)
    }

    /// Takes a slot now if one is free and nobody queued is entitled to it; returns its `Permit`,
    /// or `None`. Never waits for a slot (only for Redis's answer).
    fn try_acquire(&self, py: Python<'_>) -> PyResult<Option<SyncPermit>> {
        wait(py, self.0.try_acquire()).map(|held| held.map(SyncPermit))
    }

    /// `{"capacity": …, "holders": …, "waiting": …}` as Redis sees it now (expired leases purged).
    fn state(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        let state = wait(py, self.0.state())?;
        state_dict(py, &state)
    }

}

/// A held slot of a `tollgate.sync.Semaphore`, renewed in the background until released. A
/// context manager itself (`with sem.acquire():`); dropped without `release()`, it is released
/// in the background.
#[pyclass(module = "tollgate.sync", name = "Permit")]
pub struct SyncPermit(Held);

permit_methods! {
    SyncPermit;
    /// Gives the slot back, blocking until Redis answers. Returns `True` if the lease was still
    /// held, `False` if it had expired or was already released.
    fn release(&self, py: Python<'_>) -> PyResult<bool> {
        wait(py, self.0.releasing())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Releases; never suppresses the body's exception.
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.release(py).map(|_| false)
    }

    fn __repr__(&self) -> String {
        format!("tollgate.sync.Permit(lease_id={:?}, fencing_token={})", self.0.lease_id(), self.0.fencing_token())
    }
}
