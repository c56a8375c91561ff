//! The native module of the `tollgate` Python package (`tollgate._tollgate`).
//!
//! - `semaphore`: `Semaphore` and `Permit`, over `tollgate_redis::RedisSemaphore`;
//! - `token_bucket`: `TokenBucket`, over `tollgate_redis::RedisLimiter`;
//! - `sync`: `tollgate.sync.Semaphore`, `Permit` and `TokenBucket`, the same cores as the two
//!   above, as blocking calls (`blocking`) that release the GIL while they wait;
//! - `local`: the in-process limiters, with `decision`'s `Decision` and `clock`'s `ManualClock`;
//! - `reservation`: `Reservation` and `tollgate.sync.Reservation`, what `reserve` answers: permits
//!   taken for an estimate, settled for the actual cost;
//! - `connection`: one Redis connection per URL, opened at first use.
//!
//! The Python package (`python/tollgate/__init__.py`) adds `async with` on `Semaphore`, which
//! needs a per-task record of the permits held. Redis futures run on our tokio runtime and are awaited from asyncio through `bridge`; cancelling the asyncio task drops the
//! Rust future.
#![deny(missing_docs)]

mod args;
mod blocking;
mod bridge;
mod clock;
mod connection;
mod decision;
mod errors;
mod held;
mod local;
mod methods;
mod reservation;
mod semaphore;
mod sync;
mod token_bucket;

use pyo3::prelude::*;

/// The module: classes and exceptions.
#[pymodule]
fn _tollgate(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<semaphore::Semaphore>()?;
    m.add_class::<semaphore::Permit>()?;
    m.add_class::<token_bucket::TokenBucket>()?;
    // Named `Semaphore`, `Permit`, `TokenBucket` and `Reservation` in `tollgate.sync`; prefixed
    // here, where the async classes have those names.
    m.add("SyncSemaphore", py.get_type::<sync::semaphore::SyncSemaphore>())?;
    m.add("SyncPermit", py.get_type::<sync::semaphore::SyncPermit>())?;
    m.add("SyncTokenBucket", py.get_type::<sync::token_bucket::SyncTokenBucket>())?;
    m.add_class::<reservation::Reservation>()?;
    m.add("SyncReservation", py.get_type::<reservation::SyncReservation>())?;
    m.add_class::<local::LocalTokenBucket>()?;
    m.add_class::<local::LocalSlidingWindow>()?;
    m.add_class::<local::KeyedTokenBucket>()?;
    m.add_class::<local::KeyedSlidingWindow>()?;
    m.add_class::<local::LocalWeightedWindow>()?;
    m.add_class::<local::KeyedWeightedWindow>()?;
    m.add_class::<decision::Decision>()?;
    m.add_class::<clock::ManualClock>()?;
    m.add("TollgateError", py.get_type::<errors::TollgateError>())?;
    m.add("MaxSleepExceededError", py.get_type::<errors::MaxSleepExceededError>())?;
    m.add("RejectedError", py.get_type::<errors::RejectedError>())?;
    m.add("RedisUnavailableError", py.get_type::<errors::RedisUnavailableError>())?;
    m.add_function(wrap_pyfunction!(bridge::_noop, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
