//! Rust futures as asyncio futures, safe at interpreter exit.
//!
//! pyo3-async-runtimes' `future_into_py` completes futures from tokio threads at any time; one
//! still inside `call_soon_threadsafe` when the interpreter finalizes is killed mid-call
//! (CPython ends threads that take the GIL during finalization), and its unwinding touches freed
//! objects: a segfault at exit, seen here once in a few runs. So completions pass a gate that
//! [`shutdown`] (registered with `atexit` by the package) closes, after waiting for those in
//! flight.

use std::future::Future;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;

use crate::connection::runtime;

#[derive(Default)]
struct Gate {
    closing: bool,
    in_flight: usize,
}

static GATE: Mutex<Gate> = Mutex::new(Gate { closing: false, in_flight: 0 });
static IDLE: Condvar = Condvar::new();

fn gate() -> std::sync::MutexGuard<'static, Gate> {
    GATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `fut` on the tokio runtime; returns an asyncio future of the running loop that gets
/// its result. Cancelling the asyncio future drops the Rust future.
pub(crate) fn spawn<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
    let py_fut = event_loop.call_method0("create_future")?;
    let (target_loop, target) = (event_loop.unbind(), py_fut.clone().unbind());
    let task = runtime().spawn(async move {
        let result = fut.await;
        // Taking the GIL may block: not on a worker thread.
        let _ = tokio::task::spawn_blocking(move || complete(target_loop, target, result)).await;
    });
    py_fut.call_method1("add_done_callback", (AbortOnCancel(task.abort_handle()),))?;
    Ok(py_fut)
}

fn complete<T>(event_loop: Py<PyAny>, fut: Py<PyAny>, result: PyResult<T>)
where
    T: for<'a> IntoPyObject<'a>,
{
    {
        let mut gate = gate();
        if gate.closing {
            return;
        }
        gate.in_flight += 1;
    }
    Python::attach(|py| {
        let outcome = result.and_then(|v| v.into_py_any(py));
        let resolve = Resolve { fut, outcome: Mutex::new(Some(outcome)) };
        // Fails only when the loop is closed: nobody is waiting any more.
        let _ = event_loop.call_method1(py, "call_soon_threadsafe", (resolve,));
    });
    let mut gate = gate();
    gate.in_flight -= 1;
    IDLE.notify_all();
}

/// Called by `atexit`: completes no more futures, after waiting (at most 1 s) for those being
/// completed.
#[pyfunction]
pub(crate) fn _shutdown(py: Python<'_>) {
    py.detach(|| {
        let mut gate = gate();
        gate.closing = true;
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        while gate.in_flight > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            gate = IDLE.wait_timeout(gate, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    });
}

/// Sets the asyncio future's outcome on its loop, unless it was cancelled meanwhile.
#[pyclass]
struct Resolve {
    fut: Py<PyAny>,
    outcome: Mutex<Option<PyResult<Py<PyAny>>>>,
}

#[pymethods]
impl Resolve {
    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        let fut = self.fut.bind(py);
        let outcome = self.outcome.lock().unwrap_or_else(|e| e.into_inner()).take();
        if fut.call_method0("done")?.is_truthy()? {
            return Ok(());
        }
        match outcome {
            Some(Ok(value)) => fut.call_method1("set_result", (value,)).map(drop),
            Some(Err(error)) => fut.call_method1("set_exception", (error.into_value(py),)).map(drop),
            None => Ok(()),
        }
    }
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
