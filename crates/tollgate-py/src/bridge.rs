//! Rust futures as asyncio futures.
//!
//! Rust threads never take the GIL here. A finished future's outcome goes into its event loop's
//! [`Channel`] (a queue plus a pipe the loop watches with `add_reader`); the loop's thread drains
//! it and sets the asyncio futures' results. That is one wake-up of the loop per batch of
//! completions, no GIL hand-over between threads, and nothing a tokio thread could be doing in
//! Python when the interpreter finalizes (with pyo3-async-runtimes' `call_soon_threadsafe` from
//! tokio threads, worker processes here segfaulted at exit about one run in six).

use std::fs::File;
use std::future::Future;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::connection::runtime;

/// Turns a finished future's output into the Python value (needs the GIL, so runs on the loop).
type Outcome = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

struct Done {
    fut: Py<PyAny>,
    outcome: Outcome,
}

struct Shared {
    queue: Mutex<Vec<Done>>,
    read: File,
    write: File,
}

impl Shared {
    fn push(&self, done: Done) {
        let was_empty = {
            let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            queue.push(done);
            queue.len() == 1
        };
        if was_empty {
            // One byte per batch: the pipe cannot fill, and a failed write means the loop's end
            // is gone (the loop was closed), when nobody awaits anything any more.
            let _ = (&self.write).write(&[1]);
        }
    }
}

/// The completion queue of one event loop; its `drain` is the loop's reader callback.
#[pyclass]
struct Channel(Arc<Shared>);

#[pymethods]
impl Channel {
    /// Sets the results of every finished future (skipping the cancelled ones).
    fn drain(&self, py: Python<'_>) {
        let mut wakes = [0u8; 64];
        // Readable (the loop said so): one read returns at once.
        let _ = (&self.0.read).read(&mut wakes);
        let batch = std::mem::take(&mut *self.0.queue.lock().unwrap_or_else(|e| e.into_inner()));
        for done in batch {
            let fut = done.fut.bind(py);
            let result = (|| -> PyResult<()> {
                if fut.call_method0("done")?.is_truthy()? {
                    return Ok(());
                }
                match (done.outcome)(py) {
                    Ok(value) => fut.call_method1("set_result", (value,))?,
                    Err(error) => fut.call_method1("set_exception", (error.into_value(py),))?,
                };
                Ok(())
            })();
            if let Err(error) = result {
                // Only if the future's own methods fail; the others in the batch still complete.
                error.write_unraisable(py, Some(fut));
            }
        }
    }
}

/// The channel of `event_loop`, made and registered with it on first use.
fn channel(event_loop: &Bound<'_, PyAny>) -> PyResult<Arc<Shared>> {
    static CHANNELS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let py = event_loop.py();
    let channels = CHANNELS
        .get_or_try_init(py, || py.import("weakref")?.getattr("WeakKeyDictionary")?.call0().map(Bound::unbind))?
        .bind(py);
    if let Ok(existing) = channels.call_method1("get", (event_loop,))?.cast::<Channel>() {
        return Ok(existing.borrow().0.clone());
    }
    let os = py.import("os")?;
    let (read_fd, write_fd): (i32, i32) = os.call_method0("pipe")?.extract()?;
    // SAFETY: both descriptors were just created by os.pipe() and nothing else holds them; from
    // here on they are owned (and closed) by `Shared` alone.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(read_fd), OwnedFd::from_raw_fd(write_fd)) };
    os.call_method1("set_blocking", (write.as_raw_fd(), false))?;
    let shared = Arc::new(Shared { queue: Mutex::default(), read: File::from(read), write: File::from(write) });
    let channel = Bound::new(py, Channel(shared.clone()))?;
    event_loop.call_method1("add_reader", (shared.read.as_raw_fd(), channel.getattr("drain")?))?;
    channels.set_item(event_loop, channel)?;
    Ok(shared)
}

/// Runs `fut` on the tokio runtime; returns an asyncio future of the running loop that gets
/// its result. Cancelling the asyncio future drops the Rust future.
pub(crate) fn spawn<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
    let shared = channel(&event_loop)?;
    let py_fut = event_loop.call_method0("create_future")?;
    let target = py_fut.clone().unbind();
    let task = runtime().spawn(async move {
        let result = fut.await;
        let outcome: Outcome = Box::new(move |py| result.and_then(|v| v.into_py_any(py)));
        shared.push(Done { fut: target, outcome });
    });
    py_fut.call_method1("add_done_callback", (AbortOnCancel(task.abort_handle()),))?;
    Ok(py_fut)
}

/// The done-callback that drops the Rust future when its asyncio future is cancelled.
#[pyclass]
struct AbortOnCancel(tokio::task::AbortHandle);

#[pymethods]
impl AbortOnCancel {
    fn __call__(&self, fut: &Bound<'_, PyAny>) -> PyResult<()> {
        if fut.call_method0("cancelled")?.is_truthy()? {
            self.0.abort();
        }
        Ok(())
    }
}

/// Times the bridge alone: a future that completes at once (for `bench/bench.py`).
#[pyfunction]
pub(crate) fn _noop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    spawn(py, async { Ok(()) })
}
