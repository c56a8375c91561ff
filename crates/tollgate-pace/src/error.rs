//! What can go wrong pacing, each error naming the setting, value, stream or URL it is about.

use std::time::Duration;

/// What can go wrong pacing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PaceError {
    /// A setting is out of range: which one, what it must be, and what it was.
    ///
    /// ```
    /// use tollgate_pace::{Budget, PaceError};
    /// let err = Budget::per_second(0).unwrap_err();
    /// assert!(matches!(&err, PaceError::Config { setting: "budget units", value, .. } if value == "0"));
    /// assert_eq!(err.to_string(), "budget units must be at least 1, got 0");
    /// ```
    #[error("{setting} must be {expected}, got {value}")]
    Config {
        /// The setting, as its builder method or argument is named.
        setting: &'static str,
        /// What it must be (e.g. `in (0, 1)`).
        expected: String,
        /// The value given.
        value: String,
    },
    /// A budget written as text (`"200/s"`) is not `UNITS/PERIOD` (see [`crate::Budget::parse`]).
    #[error(transparent)]
    Parse(#[from] tollgate::ParseError),
    /// A rate that cannot be released in slices of `granularity` (e.g. more units per slice
    /// than nanoseconds in it).
    #[error("rate {rate}/s with slices of {granularity:?}: {source}")]
    Rate {
        /// Units per second.
        rate: f64,
        /// The slice length.
        granularity: Duration,
        /// Why the slice quota is unusable.
        #[source]
        source: tollgate::QuotaError,
    },
    /// The partitions' semaphore cannot be configured (a bad name or lease TTL).
    #[error("partitions: {0}")]
    Partitions(#[from] tollgate_redis::SemaphoreConfigError),
    /// The pacer's limiter refused to wait (it was closed): the reason it gave.
    #[error("the pacer was closed ({reason})")]
    Closed {
        /// Why the wait ended.
        reason: tollgate::Reason,
    },
    /// The queue could not be used.
    #[error("queue: {0}")]
    Queue(#[from] QueueError),
    /// Redis could not be used.
    #[error(transparent)]
    Backend(#[from] tollgate_redis::BackendError),
}

impl PaceError {
    pub(crate) fn config(setting: &'static str, expected: impl Into<String>, value: impl ToString) -> PaceError {
        PaceError::Config { setting, expected: expected.into(), value: value.to_string() }
    }

    /// True when the failure may pass by itself (Redis or the queue could not be reached or did
    /// not answer in time); false for settings and other faults that need someone to act.
    pub fn is_transient(&self) -> bool {
        match self {
            PaceError::Backend(e) => e.is_transient(),
            PaceError::Queue(e) => e.is_transient(),
            PaceError::Config { .. }
            | PaceError::Parse(_)
            | PaceError::Rate { .. }
            | PaceError::Partitions(_)
            | PaceError::Closed { .. } => false,
        }
    }
}

/// The Redis stream behind a [`RedisStreams`](crate::RedisStreams) queue could not be used.
/// URLs are shown without credentials ([`tollgate_redis::redact_url`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The Redis URL does not parse.
    #[error("invalid Redis URL {url}: {source}")]
    InvalidUrl {
        /// The URL, without credentials.
        url: String,
        /// Why it does not parse.
        #[source]
        source: redis::RedisError,
    },
    /// No connection within the connect timeout.
    #[error("cannot connect to {url}: timed out after {after:?}")]
    ConnectTimeout {
        /// The URL, without credentials.
        url: String,
        /// How long it waited.
        after: Duration,
    },
    /// The connection failed.
    #[error("cannot connect to {url}: {source}")]
    Connect {
        /// The URL, without credentials.
        url: String,
        /// The client's error.
        #[source]
        source: redis::RedisError,
    },
    /// A command on the stream failed.
    #[error("cannot {action} on stream {stream:?}: {source}")]
    Command {
        /// What was being done (e.g. `create the consumer group`, `take items`).
        action: &'static str,
        /// The stream's name.
        stream: String,
        /// The server's or the connection's error.
        #[source]
        source: redis::RedisError,
    },
}

impl QueueError {
    /// True when the failure may pass by itself (no connection, a dropped one, a timeout, a
    /// server loading or failing over); false for a bad URL or a command Redis refuses.
    pub fn is_transient(&self) -> bool {
        match self {
            QueueError::InvalidUrl { .. } => false,
            QueueError::ConnectTimeout { .. } => true,
            QueueError::Connect { source, .. } | QueueError::Command { source, .. } => {
                tollgate_redis::BackendError::Redis(source.clone()).is_transient()
            }
        }
    }
}
