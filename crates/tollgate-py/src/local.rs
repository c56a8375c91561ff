//! The in-process limiters: for one Python process, no Redis. Thread-safe and lock-free where
//! the Rust limiter is; `try_acquire` is synchronous and never waits.

use std::num::NonZeroUsize;
use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tollgate::{AtKeyLimit, Keyed, Limiter, SlidingWindow, TokenBucket, WeightedWindow};

use crate::args::{self, Seconds};
use crate::clock::{AnyClock, ManualClock};
use crate::decision::Decision;
use crate::reservation::{self, SyncReservation};

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

/// For one algorithm, its two classes: `Local*` (one limiter, a [`Limiter`]) and `Keyed*` (one
/// limiter per key, a [`Keyed`] with `max_keys`, `at_max_keys` and its `__len__`). The arguments
/// that build the algorithm come first in both constructors, `clock` and the keyed settings
/// after them; `try_acquire` and `reserve` are the same calls but for the key.
macro_rules! limiter_classes {
    (
        $algo:ident($($arg:ident: $ty:ty $(= $default:tt)?),*) => $build:expr;
        $(#[$local_meta:meta])* local $local:ident: $local_take:literal;
        $(#[$keyed_meta:meta])* keyed $keyed:ident: $keyed_take:literal;
    ) => {
        $(#[$local_meta])*
        #[pyclass(module = "tollgate._tollgate")]
        pub struct $local(Arc<Limiter<$algo, AnyClock>>);

        #[pymethods]
        impl $local {
            #[new]
            #[pyo3(signature = ($($arg $(= $default)?,)* clock=None))]
            fn new($($arg: $ty,)* clock: Option<PyRef<'_, ManualClock>>) -> PyResult<Self> {
                Ok(Self(Arc::new(Limiter::builder($build).clock(AnyClock::from_arg(clock)).build())))
            }

            #[doc = $local_take]
            #[pyo3(signature = (n=1))]
            fn try_acquire(&self, n: i64) -> PyResult<Decision> {
                Ok(Decision::from(self.0.try_acquire(args::count("n", n)?)))
            }

            /// Reserves `estimate` permits for work whose cost is known only afterwards; returns a
            /// `tollgate.sync.Reservation` to settle for the actual cost (`with ... as r:
            /// r.settle(actual)`). Raises `RejectedError` (its `decision`) when they are not there
            /// now; never waits.
            #[pyo3(signature = (estimate))]
            fn reserve(&self, py: Python<'_>, estimate: i64) -> PyResult<SyncReservation> {
                reservation::in_process::<(), _, _>(py, stringify!($local).to_owned(), &self.0, (), estimate)
            }
        }

        $(#[$keyed_meta])*
        #[pyclass(module = "tollgate._tollgate")]
        pub struct $keyed(Arc<Keyed<String, $algo, AnyClock>>);

        #[pymethods]
        impl $keyed {
            #[new]
            #[pyo3(signature = ($($arg $(= $default)?,)* max_keys=DEFAULT_MAX_KEYS, clock=None, at_max_keys="reject"))]
            fn new(
                $($arg: $ty,)*
                max_keys: i64,
                clock: Option<PyRef<'_, ManualClock>>,
                at_max_keys: &str,
            ) -> PyResult<Self> {
                let keyed = Keyed::builder($build)
                    .max_keys(self::max_keys(max_keys)?)
                    .at_key_limit(self::at_max_keys(at_max_keys)?)
                    .clock(AnyClock::from_arg(clock))
                    .build();
                Ok(Self(Arc::new(keyed)))
            }

            #[doc = $keyed_take]
            #[pyo3(signature = (key, n=1))]
            fn try_acquire(&self, key: &str, n: i64) -> PyResult<Decision> {
                Ok(Decision::from(self.0.try_acquire(key, args::count("n", n)?)))
            }

            /// Reserves `estimate` permits from `key`'s limit for work whose cost is known only
            /// afterwards; returns a `tollgate.sync.Reservation` to settle for the actual cost.
            /// Raises `RejectedError` (its `decision`) when they are not there now; never waits.
            #[pyo3(signature = (key, estimate))]
            fn reserve(&self, py: Python<'_>, key: &str, estimate: i64) -> PyResult<SyncReservation> {
                let what = format!("{} key {key:?}", stringify!($keyed));
                reservation::in_process::<str, _, _>(py, what, &self.0, key.to_owned(), estimate)
            }

            fn __len__(&self) -> usize {
                self.0.len()
            }
        }
    };
}

limiter_classes! {
    TokenBucket(capacity: i64, refill_frequency: Seconds, refill_amount: i64)
        => TokenBucket::new(args::bucket_quota(capacity, &refill_frequency, refill_amount)?);
    /// An in-process token bucket (GCRA): `capacity` tokens, `refill_amount` more every
    /// `refill_frequency` seconds, spread evenly.
    ///
    /// >>> bucket = LocalTokenBucket(capacity=2, refill_frequency=1.0, refill_amount=2)
    /// >>> bool(bucket.try_acquire()), bool(bucket.try_acquire()), bool(bucket.try_acquire())
    /// (True, True, False)
    local LocalTokenBucket: "Takes `n` tokens if there are that many now.";
    /// One in-process token bucket per key (e.g. per user), at most `max_keys` keys in memory (idle
    /// ones are evicted first). When that many are stored and none is idle, a new key is rejected
    /// with the time one goes idle (`at_max_keys="reject"`, the default), evicts the key nearest to
    /// idle (`"evict"`: that key may get its burst again) or is allowed without being stored
    /// (`"admit"`: fail open).
    keyed KeyedTokenBucket: "Takes `n` tokens from `key`'s bucket if it has them now.";
}

limiter_classes! {
    SlidingWindow(limit: i64, window: Seconds, segments: i64 = DEFAULT_SEGMENTS) => sliding_window(limit, &window, segments)?;
    /// An in-process sliding window: at most about `limit` permits in any `window` seconds (counted
    /// in `segments` slices; the error is at most `limit / segments`).
    local LocalSlidingWindow: "Takes `n` permits if the window has room for them now.";
    /// One in-process sliding window per key, at most `max_keys` keys in memory (`at_max_keys` as
    /// for [`KeyedTokenBucket`]).
    keyed KeyedSlidingWindow: "Takes `n` permits from `key`'s window if it has room for them now.";
}

limiter_classes! {
    WeightedWindow(limit: i64, window: Seconds) => WeightedWindow::new(args::window_quota(limit, &window)?);
    /// An in-process weighted window (the two-window approximation of a sliding window, Cloudflare's):
    /// the previous window's count weighted by how much of it still overlaps the last `window`
    /// seconds, plus the current window's. Two counters, smooth, approximate.
    ///
    /// >>> clock = ManualClock()
    /// >>> w = LocalWeightedWindow(limit=10, window=1.0, clock=clock)
    /// >>> bool(w.try_acquire(10)), bool(w.try_acquire())
    /// (True, False)
    local LocalWeightedWindow: "Takes `n` permits if the window has room for them now.";
    /// One in-process weighted window per key, at most `max_keys` keys in memory (`at_max_keys` as
    /// for [`KeyedTokenBucket`]).
    keyed KeyedWeightedWindow: "Takes `n` permits from `key`'s window if it has room for them now.";
}
