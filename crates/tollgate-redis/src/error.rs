//! What can go wrong talking to Redis, each naming what it was about.

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};

/// A failure of the Redis backend (not a rate-limit decision: being limited is a `Rejected`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The URL could not be parsed.
    #[error("invalid redis URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why it is invalid.
        reason: String,
    },
    /// Could not connect (or the first PING failed) within the deadline.
    #[error("cannot reach redis at {url}: {source}")]
    Connect {
        /// Where.
        url: String,
        /// The client's error.
        #[source]
        source: RedisError,
    },
    /// Authentication failed.
    #[error("redis at {url} refused our credentials: {source}")]
    Auth {
        /// Where.
        url: String,
        /// The server's answer.
        #[source]
        source: RedisError,
    },
    /// A key Tollgate uses holds a value of another type (another program writes to it).
    #[error(
        "redis key {key:?} holds a value of another type (WRONGTYPE); is another program using the prefix? {source}"
    )]
    WrongType {
        /// The key (the first one of the decision).
        key: String,
        /// The server's answer.
        #[source]
        source: RedisError,
    },
    /// No answer within the deadline.
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    /// Recent calls failed; not asking again until the back-off has passed.
    #[error("redis is unavailable (backing off after: {last_error})")]
    BackingOff {
        /// The error that opened the back-off.
        last_error: String,
    },
    /// Any other error from the server or the connection.
    #[error("redis error: {0}")]
    Redis(#[source] RedisError),
}

impl BackendError {
    pub(crate) fn classify(err: RedisError, url: &str, key: Option<&str>) -> BackendError {
        match err.kind() {
            ErrorKind::AuthenticationFailed => BackendError::Auth { url: url.to_owned(), source: err },
            ErrorKind::Server(ServerErrorKind::NoPerm) => BackendError::Auth { url: url.to_owned(), source: err },
            _ if err.code() == Some("WRONGTYPE") => {
                BackendError::WrongType { key: key.unwrap_or_default().to_owned(), source: err }
            }
            _ if err.code() == Some("NOAUTH") || err.code() == Some("WRONGPASS") => {
                BackendError::Auth { url: url.to_owned(), source: err }
            }
            _ => BackendError::Redis(err),
        }
    }
}
