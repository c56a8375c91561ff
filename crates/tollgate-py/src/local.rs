//! The in-process limiters: for one Python process, no Redis. Thread-safe and lock-free where
//! the Rust limiter is; `try_acquire` is synchronous and never waits.

use std::num::NonZeroUsize;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tollgate::{AtKeyLimit, Keyed, Limiter, SlidingWindow, TokenBucket, WeightedWindow};

use crate::args::{self, Seconds};
use crate::clock::{AnyClock, ManualClock};
use crate::decision::Decision;

/// Segments of the in-process sliding window (its error is about `limit / segments`).
const DEFAULT_SEGMENTS: i64 = 10;
const DEFAULT_MAX_KEYS: i64 = 100_000;

fn sliding_window(limit: i64, window: &Seconds, segments: i64) -> PyResult<SlidingWindow> {
    let quota = args::window_quota(limit, window)?;
    let segments = args::count("segments", segments)?;
    SlidingWindow::new(quota, segments).map_err(|e| PyValueError::new_err(format!("segments={segments}: {e}")))
}

fn max_keys(value: i64) -> PyResult<NonZeroUsize> {
    let n = args::count("max_keys", value)?;
    usize::try_from(n)
        .ok()
        .and_then(NonZeroUsize::new)
        .ok_or_else(|| PyValueError::new_err(format!("max_keys is too large: {value}")))
}

/// `at_max_keys`: what a new key gets when `max_keys` are stored and none is idle.
fn at_max_keys(name: &str) -> PyResult<AtKeyLimit> {
    AtKeyLimit::from_name(name)
        .ok_or_else(|| PyValueError::new_err(format!("at_max_keys must be 'reject', 'evict' or 'admit', got {name:?}")))
}

/// An in-process token bucket (GCRA): `capacity` tokens, `refill_amount` more every
/// `refill_frequency` seconds, spread evenly.
///
/// >>> bucket = LocalTokenBucket(capacity=2, refill_frequency=1.0, refill_amount=2)
/// >>> bool(bucket.try_acquire()), bool(bucket.try_acquire()), bool(bucket.try_acquire())
/// (True, True, False)
#[pyclass(module = "tollgate._tollgate", name = "LocalTokenBucket")]
pub struct LocalTokenBucket(Limiter<TokenBucket, AnyClock>);

#[pymethods]
impl LocalTokenBucket {
    #[new]
    #[pyo3(signature = (capacity, refill_frequency, refill_amount, clock=None))]
    fn new(
        capacity: i64,
        refill_frequency: Seconds,
        refill_amount: i64,
        clock: Option<PyRef<'_, ManualClock>>,
    ) -> PyResult<Self> {
        let quota = args::bucket_quota(capacity, &refill_frequency, refill_amount)?;
        Ok(Self(Limiter::builder(TokenBucket::new(quota)).clock(AnyClock::from_arg(clock)).build()))
    }

    /// Takes `n` tokens if there are that many now.
    #[pyo3(signature = (n=1))]
    fn try_acquire(&self, n: i64) -> PyResult<Decision> {
        Ok(Decision::from(self.0.try_acquire(args::count("n", n)?)))
    }
}

/// An in-process sliding window: at most about `limit` permits in any `window` seconds (counted
/// in `segments` slices; the error is at most `limit / segments`).
#[pyclass(module = "tollgate._tollgate", name = "LocalSlidingWindow")]
pub struct LocalSlidingWindow(Limiter<SlidingWindow, AnyClock>);

#[pymethods]
impl LocalSlidingWindow {
    #[new]
    #[pyo3(signature = (limit, window, segments=DEFAULT_SEGMENTS, clock=None))]
    fn new(limit: i64, window: Seconds, segments: i64, clock: Option<PyRef<'_, ManualClock>>) -> PyResult<Self> {
        let algo = sliding_window(limit, &window, segments)?;
        Ok(Self(Limiter::builder(algo).clock(AnyClock::from_arg(clock)).build()))
    }

    /// Takes `n` permits if the window has room for them now.
    #[pyo3(signature = (n=1))]
    fn try_acquire(&self, n: i64) -> PyResult<Decision> {
        Ok(Decision::from(self.0.try_acquire(args::count("n", n)?)))
    }
}

/// One in-process token bucket per key (e.g. per user), at most `max_keys` keys in memory (idle
/// ones are evicted first). When that many are stored and none is idle, a new key is rejected
/// with the time one goes idle (`at_max_keys="reject"`, the default), evicts the key nearest to
/// idle (`"evict"`: that key may get its burst again) or is allowed without being stored
/// (`"admit"`: fail open).
#[pyclass(module = "tollgate._tollgate", name = "KeyedTokenBucket")]
pub struct KeyedTokenBucket(Keyed<String, TokenBucket, AnyClock>);

#[pymethods]
impl KeyedTokenBucket {
    #[new]
    #[pyo3(signature = (capacity, refill_frequency, refill_amount, max_keys=DEFAULT_MAX_KEYS, clock=None, at_max_keys="reject"))]
    fn new(
        capacity: i64,
        refill_frequency: Seconds,
        refill_amount: i64,
        max_keys: i64,
        clock: Option<PyRef<'_, ManualClock>>,
        at_max_keys: &str,
    ) -> PyResult<Self> {
        let quota = args::bucket_quota(capacity, &refill_frequency, refill_amount)?;
        let keyed = Keyed::builder(TokenBucket::new(quota))
            .max_keys(self::max_keys(max_keys)?)
            .at_key_limit(self::at_max_keys(at_max_keys)?)
            .clock(AnyClock::from_arg(clock))
            .build();
        Ok(Self(keyed))
    }

    /// Takes `n` tokens from `key`'s bucket if it has them now.
    #[pyo3(signature = (key, n=1))]
    fn try_acquire(&self, key: &str, n: i64) -> PyResult<Decision> {
        Ok(Decision::from(self.0.try_acquire(key, args::count("n", n)?)))
    }

    fn __len__(&self) -> usize {
        self.0.len()
    }
}

/// One in-process sliding window per key, at most `max_keys` keys in memory (`at_max_keys` as
/// for [`KeyedTokenBucket`]).
#[pyclass(module = "tollgate._tollgate", name = "KeyedSlidingWindow")]
pub struct KeyedSlidingWindow(Keyed<String, SlidingWindow, AnyClock>);

#[pymethods]
impl KeyedSlidingWindow {
    #[new]
    #[pyo3(signature = (limit, window, segments=DEFAULT_SEGMENTS, max_keys=DEFAULT_MAX_KEYS, clock=None, at_max_keys="reject"))]
    fn new(
        limit: i64,
        window: Seconds,
        segments: i64,
        max_keys: i64,
        clock: Option<PyRef<'_, ManualClock>>,
        at_max_keys: &str,
    ) -> PyResult<Self> {
        let algo = sliding_window(limit, &window, segments)?;
        let keyed = Keyed::builder(algo)
            .max_keys(self::max_keys(max_keys)?)
            .at_key_limit(self::at_max_keys(at_max_keys)?)
            .clock(AnyClock::from_arg(clock))
            .build();
        Ok(Self(keyed))
    }

    /// Takes `n` permits from `key`'s window if it has room for them now.
    #[pyo3(signature = (key, n=1))]
    fn try_acquire(&self, key: &str, n: i64) -> PyResult<Decision> {
        Ok(Decision::from(self.0.try_acquire(key, args::count("n", n)?)))
    }

    fn __len__(&self) -> usize {
        self.0.len()
    }
}

/// An in-process weighted window (the two-window approximation of a sliding window, Cloudflare's):
/// the previous window's count weighted by how much of it still overlaps the last `window`
/// seconds, plus the current window's. Two counters, smooth, approximate.
///
/// >>> clock = ManualClock()
/// >>> w = LocalWeightedWindow(limit=10, window=1.0, clock=clock)
/// >>> bool(w.try_acquire(10)), bool(w.try_acquire())
/// (True, False)
#[pyclass(module = "tollgate._tollgate", name = "LocalWeightedWindow")]
pub struct LocalWeightedWindow(Limiter<WeightedWindow, AnyClock>);

#[pymethods]
impl LocalWeightedWindow {
    #[new]
    #[pyo3(signature = (limit, window, clock=None))]
    fn new(limit: i64, window: Seconds, clock: Option<PyRef<'_, ManualClock>>) -> PyResult<Self> {
        let algo = WeightedWindow::new(args::window_quota(limit, &window)?);
        Ok(Self(Limiter::builder(algo).clock(AnyClock::from_arg(clock)).build()))
    }

    /// Takes `n` permits if the window has room for them now.
    #[pyo3(signature = (n=1))]
    fn try_acquire(&self, n: i64) -> PyResult<Decision> {
        Ok(Decision::from(self.0.try_acquire(args::count("n", n)?)))
    }
}

/// One in-process weighted window per key, at most `max_keys` keys in memory (`at_max_keys` as
/// for [`KeyedTokenBucket`]).
#[pyclass(module = "tollgate._tollgate", name = "KeyedWeightedWindow")]
pub struct KeyedWeightedWindow(Keyed<String, WeightedWindow, AnyClock>);

#[pymethods]
impl KeyedWeightedWindow {
    #[new]
    #[pyo3(signature = (limit, window, max_keys=DEFAULT_MAX_KEYS, clock=None, at_max_keys="reject"))]
    fn new(
        limit: i64,
        window: Seconds,
        max_keys: i64,
        clock: Option<PyRef<'_, ManualClock>>,
        at_max_keys: &str,
    ) -> PyResult<Self> {
        let algo = WeightedWindow::new(args::window_quota(limit, &window)?);
        let keyed = Keyed::builder(algo)
            .max_keys(self::max_keys(max_keys)?)
            .at_key_limit(self::at_max_keys(at_max_keys)?)
            .clock(AnyClock::from_arg(clock))
            .build();
        Ok(Self(keyed))
    }

    /// Takes `n` permits from `key`'s window if it has room for them now.
    #[pyo3(signature = (key, n=1))]
    fn try_acquire(&self, key: &str, n: i64) -> PyResult<Decision> {
        Ok(Decision::from(self.0.try_acquire(key, args::count("n", n)?)))
    }

    fn __len__(&self) -> usize {
        self.0.len()
    }
}
