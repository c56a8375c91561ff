//! Rust futures as blocking calls, for the synchronous classes of `tollgate.sync`.
//!
//! The future runs on the same tokio runtime as the asyncio classes' futures (so the two share
//! one connection per URL and the semaphore's in-process FIFO), and the calling thread waits
//! for its result with the GIL released: other Python threads run meanwhile. The wait wakes
//! every [`SIGNAL_CHECK`] to let Python run its signal handlers, so Ctrl-C interrupts a long
//! `acquire()`; the exception drops the future, which leaves the queue and takes nothing.

use std::future::Future;
use std::sync::mpsc;
use std::time::Duration;

use pyo3::prelude::*;

use crate::connection::runtime;
use crate::errors::TollgateError;

/// How long a blocked caller may go without running Python's signal handlers. Short enough for
/// Ctrl-C to feel immediate, long enough that an idle waiter costs nothing measurable.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// Runs `fut` on the tokio runtime and waits for its result without holding the GIL.
///
/// A signal handler that raises while waiting (KeyboardInterrupt) aborts the future and the
/// exception propagates.
pub(crate) fn wait<F, T>(py: Python<'_>, fut: F) -> PyResult<T>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: Send + 'static,
{
    // Capacity 1: the task's one send never blocks a runtime thread, even after the caller left.
    let (tx, mut rx) = mpsc::sync_channel(1);
    let task = runtime().spawn(async move {
        let _ = tx.send(fut.await);
    });
    loop {
        // The receiver goes into the detached closure and back (it is Send, not Sync).
        let (back, received) = py.detach(move || {
            let received = rx.recv_timeout(SIGNAL_CHECK);
            (rx, received)
        });
        rx = back;
        match received {
            Ok(result) => return result,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Err(interrupted) = py.check_signals() {
                    // A result sent in the meantime (a permit) is dropped with the channel, which
                    // gives it back in the background.
                    task.abort();
                    return Err(interrupted);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // The task ended without sending: it panicked, or the runtime is shutting down.
                return Err(TollgateError::new_err("the Redis call was abandoned before it finished"));
            }
        }
    }
}
