//! The exceptions the package raises, and how a rejection becomes one.

use pyo3::PyErr;
use pyo3::create_exception;
use pyo3::exceptions::{PyConnectionError, PyException};
use tollgate::{Reason, Rejected};

create_exception!(
    tollgate,
    TollgateError,
    PyException,
    "Base class of the exceptions Tollgate raises (except ValueError for bad arguments and RedisUnavailableError)."
);
create_exception!(
    tollgate,
    MaxSleepExceededError,
    TollgateError,
    "Waiting would take longer than `max_sleep` seconds. Nothing was taken: the caller left the queue."
);
create_exception!(
    tollgate,
    RejectedError,
    TollgateError,
    "A `reserve` was rejected: nothing was taken. Its `decision` (a `Decision`) says why and when to retry (`retry_after`)."
);
create_exception!(
    tollgate,
    RedisUnavailableError,
    PyConnectionError,
    "Redis could not be reached or did not answer in time; the message names the URL. Never a silent 'allowed'."
);

/// Why a waiting call on `what` gave up, as the exception to raise.
pub(crate) fn rejection(
    what: &str,
    no: &Rejected,
    max_sleep: Option<f64>,
    url: &str,
    last_error: Option<String>,
) -> PyErr {
    match no.reason() {
        Reason::MaxWait => {
            let wait = match no.retry_after() {
                Some(after) => format!(" (the wait would be {:.3}s)", after.as_secs_f64()),
                None => String::new(),
            };
            MaxSleepExceededError::new_err(format!(
                "{what}: no permit within max_sleep={}s{wait}; nothing was taken",
                max_sleep.unwrap_or(0.0)
            ))
        }
        Reason::Unavailable => unavailable(url, last_error),
        other => TollgateError::new_err(format!("{what}: rejected ({other})")),
    }
}

/// Redis failed: names the URL and the last error seen on it.
pub(crate) fn unavailable(url: &str, last_error: Option<String>) -> PyErr {
    let why = last_error.unwrap_or_else(|| "no answer within the deadline".to_owned());
    RedisUnavailableError::new_err(format!("Redis at {url} is unavailable: {why}"))
}
