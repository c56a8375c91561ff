//! Argument checks: every error is a `ValueError` naming the parameter and the value given.

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::{FromPyObject, PyResult};

/// A count of at least 1.
pub(crate) fn count(param: &str, value: i64) -> PyResult<u64> {
    u64::try_from(value)
        .ok()
        .filter(|v| *v >= 1)
        .ok_or_else(|| PyValueError::new_err(format!("{param} must be an integer >= 1, got {value}")))
}

/// A duration as Python passes it: a number of seconds (`0.25`), or text in the core's duration
/// syntax (`"250ms"`, `"1m30s"`), read by [`tollgate::parse_duration`] as on the command line.
#[derive(Clone, Debug, FromPyObject)]
pub(crate) enum Seconds {
    /// Seconds, int or float.
    Number(f64),
    /// `"250ms"`, `"10s"`, `"1m30s"`.
    Text(String),
}

impl std::fmt::Display for Seconds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Seconds::Number(v) => write!(f, "{v}"),
            Seconds::Text(s) => write!(f, "{s:?}"),
        }
    }
}

/// A finite number of seconds, or a duration string; zero only where `zero_ok`.
pub(crate) fn seconds(param: &str, value: &Seconds, zero_ok: bool) -> PyResult<Duration> {
    let value = match value {
        Seconds::Number(v) => *v,
        Seconds::Text(text) => {
            let parsed = if zero_ok { tollgate::parse_duration_or_zero(text) } else { tollgate::parse_duration(text) };
            return parsed.map_err(|e| PyValueError::new_err(format!("{param}: {e}")));
        }
    };
    let bad = |rule: &str| PyValueError::new_err(format!("{param} must be {rule} seconds, got {value}"));
    if !value.is_finite() || value < 0.0 || (!zero_ok && value == 0.0) {
        return Err(bad(if zero_ok { "a finite number >= 0" } else { "a finite number > 0" }));
    }
    Duration::try_from_secs_f64(value).map_err(|_| bad("a representable number of"))
}

/// Optional seconds (`None` = unbounded).
pub(crate) fn max_sleep(value: Option<&Seconds>) -> PyResult<Option<Duration>> {
    value.map(|v| seconds("max_sleep", v, true)).transpose()
}

/// A name used as the Redis Cluster hash tag of every key: non-empty, no braces.
pub(crate) fn redis_name(value: &str) -> PyResult<()> {
    if value.is_empty() || value.contains(['{', '}']) {
        return Err(PyValueError::new_err(format!(
            "name must be non-empty and contain no '{{' or '}}' (it is the Redis keys' hash tag), got {value:?}"
        )));
    }
    Ok(())
}

/// A token bucket of `capacity` tokens gaining `refill_amount` every `refill_frequency` seconds
/// (spread evenly: one token every `refill_frequency / refill_amount` seconds).
pub(crate) fn bucket_quota(capacity: i64, refill_frequency: &Seconds, refill_amount: i64) -> PyResult<tollgate::Quota> {
    let capacity = count("capacity", capacity)?;
    let every = seconds("refill_frequency", refill_frequency, false)?;
    let amount = count("refill_amount", refill_amount)?;
    tollgate::Quota::per(every, amount).and_then(|q| q.with_burst(capacity)).map_err(|e| {
        PyValueError::new_err(format!(
            "capacity={capacity}, refill_frequency={refill_frequency}, refill_amount={amount}: {e}"
        ))
    })
}

/// `limit` permits in any `window` seconds.
pub(crate) fn window_quota(limit: i64, window: &Seconds) -> PyResult<tollgate::Quota> {
    let limit = count("limit", limit)?;
    let period = seconds("window", window, false)?;
    tollgate::Quota::per(period, limit)
        .map_err(|e| PyValueError::new_err(format!("limit={limit}, window={window}: {e}")))
}

/// `None` or the number, as Python writes it (for `__repr__`).
pub(crate) fn py_option(value: Option<f64>) -> String {
    value.map_or_else(|| "None".to_owned(), |v| v.to_string())
}
