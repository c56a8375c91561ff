//! `Semaphore` (a [`RedisSemaphore`]) and the `Permit` it grants, over [`SemaphoreCore`], which
//! `tollgate.sync.Semaphore` shares.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tollgate_redis::{RedisSemaphore, SemaphoreState};

use crate::args::{self, Seconds};
use crate::connection::{Lazy, Target};
use crate::errors;
use crate::held::Held;

/// What the async `Semaphore` and `tollgate.sync.Semaphore` share: the checked configuration
/// and the Redis semaphore, built on the connection at first use. Both classes on one name use
/// the same Redis keys, so sync and async holders count against one capacity.
pub(crate) struct SemaphoreCore {
    name: String,
    /// "semaphore \"name\"", for messages.
    label: Arc<str>,
    capacity: u64,
    lease_ttl: Duration,
    max_sleep: Option<f64>,
    lazy: Arc<Lazy<RedisSemaphore>>,
}

impl SemaphoreCore {
    /// Checks every argument (a `ValueError` names the bad one); connects nothing.
    pub(crate) fn new(
        name: String,
        capacity: i64,
        max_sleep: Option<Seconds>,
        redis_url: Option<&Bound<'_, PyAny>>,
        lease_ttl: Seconds,
    ) -> PyResult<SemaphoreCore> {
        args::redis_name(&name)?;
        let capacity = args::count("capacity", capacity)?;
        let ttl = args::seconds("lease_ttl", &lease_ttl, false)?;
        if ttl < RedisSemaphore::MIN_LEASE_TTL {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "lease_ttl must be at least {} seconds, got {lease_ttl}",
                RedisSemaphore::MIN_LEASE_TTL.as_secs_f64()
            )));
        }
        let max_wait = args::max_sleep(max_sleep.as_ref())?;
        let target = Target::from_arg(redis_url)?;
        let key = name.clone();
        let lazy = Lazy::new(target, move |redis| {
            let mut builder = RedisSemaphore::builder(redis, &key, capacity).lease_ttl(ttl);
            if let Some(max_wait) = max_wait {
                builder = builder.max_wait(max_wait);
            }
            builder.build().expect("name, capacity and lease_ttl were checked by the constructor")
        });
        let label = format!("semaphore {name:?}").into();
        let max_sleep = max_wait.map(|d| d.as_secs_f64());
        Ok(SemaphoreCore { name, label, capacity, lease_ttl: ttl, max_sleep, lazy })
    }

    /// Joins the queue now (this call's place in line is taken before it returns); the future
    /// yields the slot, or `MaxSleepExceededError` (nothing taken) or `RedisUnavailableError`.
    pub(crate) fn acquire(&self) -> impl Future<Output = PyResult<Held>> + Send + 'static {
        let what = self.label.clone();
        let max_sleep = self.max_sleep;
        let url = self.lazy.url().clone();
        let queued = self.lazy.then(|sem, redis| (sem.acquire(), redis.clone()));
        async move {
            let (acquiring, redis) = queued.await?;
            match acquiring.await {
                Ok(guard) => Ok(Held::new(guard)),
                Err(no) => Err(errors::rejection(&what, &no, max_sleep, &url, redis.last_error())),
            }
        }
    }

    /// A free slot nobody queued is entitled to, or `None`; never waits.
    pub(crate) fn try_acquire(&self) -> impl Future<Output = PyResult<Option<Held>>> + Send + 'static {
        let url = self.lazy.url().clone();
        let ready = self.lazy.then(|sem, redis| (sem.clone(), redis.clone()));
        async move {
            let (sem, redis) = ready.await?;
            match sem.try_acquire().await {
                Ok(guard) => Ok(Some(Held::new(guard))),
                Err(no) if no.reason() == tollgate::Reason::Unavailable => {
                    Err(errors::unavailable(&url, redis.last_error()))
                }
                Err(_) => Ok(None),
            }
        }
    }

    /// Capacity, holders and waiters as Redis sees them now (expired leases purged).
    pub(crate) fn state(&self) -> impl Future<Output = PyResult<SemaphoreState>> + Send + 'static {
        let url = self.lazy.url().clone();
        let ready = self.lazy.then(|sem, _| sem.clone());
        async move {
            let sem = ready.await?;
            sem.state().await.map_err(|e| errors::unavailable(&url, Some(e.to_string())))
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    pub(crate) fn lease_ttl(&self) -> f64 {
        self.lease_ttl.as_secs_f64()
    }

    pub(crate) fn max_sleep(&self) -> Option<f64> {
        self.max_sleep
    }

    /// `class(name=…, …)` with the URL's credentials hidden.
    pub(crate) fn repr(&self, class: &str) -> String {
        format!(
            "{class}(name={:?}, capacity={}, max_sleep={}, redis_url={:?}, lease_ttl={})",
            self.name,
            self.capacity,
            args::py_option(self.max_sleep),
            self.lazy.url().clone(),
            self.lease_ttl.as_secs_f64()
        )
    }
}

/// `{"capacity": …, "holders": …, "waiting": …}`.
pub(crate) fn state_dict(py: Python<'_>, state: &SemaphoreState) -> PyResult<Py<PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("capacity", state.capacity)?;
    dict.set_item("holders", state.holders)?;
    dict.set_item("waiting", state.waiting)?;
    Ok(dict.unbind())
}

/// The `#[pymethods]` of a Python class over a [`SemaphoreCore`] (the async `Semaphore` and
/// `tollgate.sync.Semaphore`): the constructor, the getters and `repr` (named `$repr`), written
/// once, around the class's own (waiting) methods.
macro_rules! semaphore_methods {
    ($class:ident, $repr:literal; $($methods:tt)*) => {
        $crate::methods::core_methods! {
            $class, $repr, $crate::semaphore::SemaphoreCore;
            new (name, capacity, max_sleep=None, redis_url=None, lease_ttl=$crate::args::Seconds::Number(10.0)) (
                name: String,
                capacity: i64,
                max_sleep: Option<$crate::args::Seconds>,
                redis_url: Option<&::pyo3::Bound<'_, ::pyo3::PyAny>>,
                lease_ttl: $crate::args::Seconds,
            );
            getters {
                /// The name (shared by every process using this semaphore).
                name -> &str;
                /// Most holders at once.
                capacity -> u64;
                /// Seconds a lease lives without renewal.
                lease_ttl -> f64;
                /// Longest `acquire` waits, in seconds (`None`: unbounded).
                max_sleep -> Option<f64>;
            }
            $($methods)*
        }
    };
}
pub(crate) use semaphore_methods;

/// The `#[pymethods]` of a held slot's Python class (the async `Permit` and
/// `tollgate.sync.Permit`): what it tells of its lease, written once, around the class's own
/// `release` and context-manager methods.
macro_rules! permit_methods {
    ($class:ident; $($methods:tt)*) => {
        #[::pyo3::pymethods]
        impl $class {
            $($methods)*

            /// True once the lease is known to be lost (it expired during a stall longer than the TTL):
            /// stop the work. False after a release.
            fn is_lost(&self) -> bool {
                self.0.is_lost()
            }

            /// False once `release()` was called (or the permit was used as a context manager and exited).
            #[getter]
            fn held(&self) -> bool {
                self.0.held()
            }

            /// Strictly greater than the token of every lease granted before this one: pass it to a
            /// resource that must refuse a holder whose lease was lost.
            #[getter]
            fn fencing_token(&self) -> u64 {
                self.0.fencing_token()
            }

            /// The lease id in Redis, for logs.
            #[getter]
            fn lease_id(&self) -> &str {
                self.0.lease_id()
            }
        }
    };
}
pub(crate) use permit_methods;

/// A counting semaphore in Redis shared by every process that uses the same `name`: at most
/// `capacity` holders at once, granted first come, first served (in call order within a process).
///
/// Each slot is a lease renewed in the background every `lease_ttl / 3`; a holder that dies
/// (SIGKILL, lost network) frees its slot at most `lease_ttl` seconds after its last renewal.
/// Keys are those of the Rust `RedisSemaphore::new(&redis, name, capacity)`, so Rust and Python
/// processes can share one semaphore.
#[pyclass(subclass, module = "tollgate._tollgate", name = "Semaphore")]
pub struct Semaphore(SemaphoreCore);

semaphore_methods! {
    Semaphore, "Semaphore";
    /// Waits for a slot (at most `max_sleep` seconds) and returns its `Permit`. Raises
    /// `MaxSleepExceededError` (nothing taken) or `RedisUnavailableError`. Cancelling the wait
    /// leaves the queue.
    fn acquire<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        // `acquire()` is called here, synchronously, so the call takes its place in line now.
        let acquiring = self.0.acquire();
        crate::bridge::spawn(py, async move { acquiring.await.map(Permit) })
    }

    /// Takes a slot now if one is free and nobody queued is entitled to it; returns its `Permit`,
    /// or `None`. Never waits.
    fn try_acquire<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let trying = self.0.try_acquire();
        crate::bridge::spawn(py, async move { trying.await.map(|held| held.map(Permit)) })
    }

    /// `{"capacity": …, "holders": …, "waiting": …}` as Redis sees it now (expired leases purged).
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let reading = self.0.state();
        crate::bridge::spawn(py, async move {
            let state = reading.await?;
            Python::attach(|py| state_dict(py, &state))
        })
    }

}

/// A held slot of a `Semaphore`, renewed in the background until released. An async context
/// manager itself (`async with await sem.acquire():`); dropped without `release()`, it is released
/// in the background.
#[pyclass(module = "tollgate._tollgate", name = "Permit")]
pub struct Permit(Held);

permit_methods! {
    Permit;
    /// Gives the slot back. Resolves to `True` if the lease was still held, `False` if it had
    /// expired or was already released. The release runs to completion even if the awaiting task
    /// is cancelled.
    fn release<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        crate::bridge::spawn(py, self.0.releasing())
    }

    fn __aenter__<'py>(slf: Py<Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        crate::bridge::spawn(py, async move { Ok(slf) })
    }

    /// Releases; never suppresses the body's exception.
    #[pyo3(signature = (*_exc))]
    fn __aexit__<'py>(&self, py: Python<'py>, _exc: &Bound<'py, pyo3::types::PyTuple>) -> PyResult<Bound<'py, PyAny>> {
        let releasing = self.0.releasing();
        crate::bridge::spawn(py, async move { releasing.await.map(|_| false) })
    }

    fn __repr__(&self) -> String {
        format!("Permit(lease_id={:?}, fencing_token={})", self.0.lease_id(), self.0.fencing_token())
    }
}
