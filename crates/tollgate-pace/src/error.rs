//! What can go wrong pacing, each error naming the setting, value, stream or name it is about.

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
/// (Connecting is [`tollgate_redis::Redis`]'s: its errors show URLs without credentials.)
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The queue's name is the hash tag of its keys: it must be non-empty and free of braces.
    ///
    /// ```
    /// # async fn f(redis: tollgate_redis::Redis) {
    /// use std::time::Duration;
    /// use tollgate_pace::{PaceError, QueueError, RedisStreams};
    /// let err = RedisStreams::open(&redis, "{orders}", Duration::from_secs(30), 5).await.unwrap_err();
    /// assert!(matches!(&err, PaceError::Queue(QueueError::BadName { name }) if name == "{orders}"));
    /// assert!(!err.is_transient());
    /// # }
    /// ```
    #[error("queue name {name:?} must be non-empty and contain no '{{' or '}}' (it is the keys' hash tag)")]
    BadName {
        /// The name as given.
        name: String,
    },
    /// A command on the stream failed.
    #[error("cannot {action} on stream {stream:?}: {source}")]
    Command {
        /// What was being done (e.g. `create the consumer group`, `read new items`).
        action: &'static str,
        /// The stream's key (`{name}`).
        stream: String,
        /// Redis's error: an outage, a timeout, a refusal.
        #[source]
        source: tollgate_redis::BackendError,
    },
}

impl QueueError {
    /// True when the failure may pass by itself (no connection, a dropped one, a timeout, Redis
    /// backing off, loading or failing over: see [`tollgate_redis::BackendError::is_transient`]);
    /// false for a bad name or a command Redis refuses.
    pub fn is_transient(&self) -> bool {
        match self {
            QueueError::BadName { .. } => false,
            QueueError::Command { source, .. } => source.is_transient(),
        }
    }
}
