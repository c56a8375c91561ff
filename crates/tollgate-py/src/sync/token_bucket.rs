//! `tollgate.sync.TokenBucket`: the async `TokenBucket`'s core, waited for by blocking the
//! calling thread (never the GIL).

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::blocking::wait;
use crate::decision::Decision;
use crate::token_bucket::{BucketCore, bucket_methods};

/// A token bucket in Redis, with blocking methods: the key of the async `TokenBucket` of the
/// same `name`, so sync and async processes drain one bucket. `with bucket:` blocks until a
/// token is there (the token is reserved in the round trip that computes the wait).
#[pyclass(module = "tollgate.sync", name = "TokenBucket")]
pub struct SyncTokenBucket(BucketCore);

bucket_methods! {
    SyncTokenBucket, "tollgate.sync.TokenBucket";
    /// Blocks until one token is there (at most `max_sleep` seconds), without holding the GIL.
    /// Raises `MaxSleepExceededError` at once, taking nothing, when the wait would be longer;
    /// `RedisUnavailableError` when Redis fails.
    fn acquire(&self, py: Python<'_>) -> PyResult<()> {
        wait(py, self.0.acquire())
    }

    /// Takes `n` tokens now if the bucket has them; never waits for tokens. Returns a `Decision`
    /// (`retry_after`: seconds until `n` tokens would be there).
    #[pyo3(signature = (n=1))]
    fn try_acquire(&self, py: Python<'_>, n: i64) -> PyResult<Decision> {
        wait(py, self.0.try_acquire(n)?)
    }

    /// Reserves `estimate` tokens for work whose cost is known only afterwards (an LLM call's
    /// tokens), blocking for Redis's answer (never for tokens): `with bucket.reserve(500) as r:
    /// ...; r.settle(used)`. Raises `RejectedError` (its `decision` has `retry_after`) when they
    /// are not there now, `RedisUnavailableError` when Redis fails.
    fn reserve(&self, py: Python<'_>, estimate: i64) -> PyResult<crate::reservation::SyncReservation> {
        self.0.reserve(estimate)?.wait(py)
    }

    fn __enter__(&self, py: Python<'_>) -> PyResult<()> {
        self.acquire(py)
    }

    /// Nothing to give back (tokens are spent); never suppresses the body's exception.
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, PyTuple>) -> bool {
        false
    }

}
