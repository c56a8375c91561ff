//! What can go wrong talking to Redis, each naming what it was about.

use std::time::Duration;

use std::sync::Arc;

use redis::{ErrorKind, RedisError, ServerErrorKind};

/// A failure of the Redis backend (not a rate-limit decision: being limited is a `Rejected`).
///
/// Every URL it holds or prints is shown without credentials (`redis://***@host:6379/0`, see
/// [`redact_url`](crate::redact_url)), so an error can be logged or returned to a caller as is.
/// [`BackendError::is_transient`] tells an outage that may pass (retry later, let the failure
/// policy decide meanwhile) from a fault that will not (a bad URL, wrong credentials, a key of
/// the wrong type).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The URL could not be parsed.
    #[error("invalid redis URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given, without credentials.
        url: String,
        /// Why it is invalid.
        reason: String,
    },
    /// Could not connect (or the first PING failed) within the deadline.
    #[error("cannot reach redis at {url}: {source}")]
    Connect {
        /// Where, without credentials.
        url: String,
        /// The client's error.
        #[source]
        source: RedisError,
    },
    /// No sentinel of a `redis+sentinel://` URL monitors a master of that name.
    #[error(
        "no sentinel at {url} monitors a master named {master:?} (they monitor {monitored:?}): check the name after the hosts"
    )]
    UnknownMaster {
        /// The URL, without credentials.
        url: String,
        /// The master name the URL gives.
        master: String,
        /// The names the sentinels do monitor.
        monitored: Vec<String>,
    },
    /// The sentinels of a `redis+sentinel://` URL monitor the master name, but name no master
    /// that is up (it is down and no replica has been promoted yet, or a failover is under way).
    #[error("the sentinels at {url} name no master for {master:?} that is up (down, or a failover is under way)")]
    MasterDown {
        /// The URL, without credentials.
        url: String,
        /// The master name.
        master: String,
    },
    /// Authentication failed.
    #[error("redis at {url} refused our credentials: {source}")]
    Auth {
        /// Where, without credentials.
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
        /// The key: the first one of the decision; for a command, its first key (the first
        /// argument after its name, or the first stream after `STREAMS`); for a pipeline, the
        /// failing command's.
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
    /// True when the failure may pass by itself, so the same call can succeed later: Redis could
    /// not be reached or did not answer in time, the connection dropped, Redis is backing off,
    /// loading, failing over or resharding. False for faults that need someone to act: a bad URL
    /// (or a master name no sentinel monitors), rejected credentials, a certificate refused in the
    /// TLS handshake, a key holding another type, or a script or protocol error.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_redis::BackendError;
    ///
    /// assert!(BackendError::Timeout(Duration::from_millis(50)).is_transient());
    /// let bad = tollgate_redis::Redis::check_url("http://nope").unwrap_err();
    /// assert!(!bad.is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        match self {
            // A certificate refused in the TLS handshake fails the same way until someone acts.
            BackendError::Connect { source, .. } => !is_tls_rejection(source),
            BackendError::Timeout(_) | BackendError::BackingOff { .. } | BackendError::MasterDown { .. } => true,
            BackendError::InvalidUrl { .. }
            | BackendError::Auth { .. }
            | BackendError::WrongType { .. }
            | BackendError::UnknownMaster { .. } => false,
            BackendError::Redis(e) => redis_error_is_transient(e),
        }
    }

    /// True when the failure says Redis cannot serve anyone right now (an outage, or credentials
    /// it refuses), as opposed to refusing one request: what opens the back-off.
    pub(crate) fn is_outage(&self) -> bool {
        self.is_transient() || matches!(self, BackendError::Auth { .. })
    }

    /// True when Redis did not answer within a deadline (a kind of transient failure).
    pub fn is_timeout(&self) -> bool {
        match self {
            BackendError::Timeout(_) => true,
            BackendError::Redis(e) | BackendError::Connect { source: e, .. } => e.is_timeout(),
            _ => false,
        }
    }

    /// `url` is shown as is: callers pass it through [`redact_url`](crate::redact_url) first.
    pub(crate) fn classify(err: RedisError, url: &str, key: Option<&str>) -> BackendError {
        let code = server_code(&err);
        match err.kind() {
            ErrorKind::AuthenticationFailed => BackendError::Auth { url: url.to_owned(), source: err },
            ErrorKind::Server(ServerErrorKind::NoPerm) => BackendError::Auth { url: url.to_owned(), source: err },
            _ if code.as_deref() == Some("WRONGTYPE") => {
                BackendError::WrongType { key: key.unwrap_or_default().to_owned(), source: err }
            }
            _ if matches!(code.as_deref(), Some("NOAUTH" | "WRONGPASS")) => {
                BackendError::Auth { url: url.to_owned(), source: err }
            }
            _ => BackendError::Redis(err),
        }
    }
}

/// The first server error of a pipeline (or transaction) that failed, with its command's index;
/// `None` for any other error.
pub(crate) fn failed_command(err: &RedisError) -> Option<usize> {
    err.clone().into_server_errors().and_then(|errors| errors.first().map(|(index, _)| *index))
}

/// The server's error code (`WRONGTYPE`, `BUSY`): the error's own, or a failed pipeline's first.
fn server_code(err: &RedisError) -> Option<String> {
    err.code().map(str::to_owned).or_else(|| {
        err.clone().into_server_errors().and_then(|errors| errors.first().map(|(_, e)| e.code().to_owned()))
    })
}

/// A client error that a later call may not see: I/O (refused, reset, timed out), a cluster in
/// motion (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, a missing node connection), or a server that is
/// loading, busy with a script, without its master or demoted to a replica during failover.
fn redis_error_is_transient(e: &RedisError) -> bool {
    use ServerErrorKind as S;
    !is_tls_rejection(e) && e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(S::BusyLoading | S::MasterDown | S::ReadOnly | S::TryAgain | S::ClusterDown)
        )
        || server_code(e).as_deref() == Some("BUSY")
}

/// A TLS handshake that failed on a certificate (the server's, not signed by the CA given; or
/// ours, refused): it fails the same way until the configuration changes.
fn is_tls_rejection(e: &RedisError) -> bool {
    // redis keeps an I/O error as `Arc<dyn Error>`; tokio-rustls puts rustls's error inside it.
    let Some(source) = std::error::Error::source(e) else { return false };
    let io = match source.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>() {
        Some(arc) => arc.downcast_ref::<std::io::Error>(),
        None => source.downcast_ref::<std::io::Error>(),
    };
    io.and_then(std::io::Error::get_ref).is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use redis::{ErrorKind, RedisError, ServerErrorKind};

    use super::BackendError;

    fn server(kind: ServerErrorKind, detail: &str) -> RedisError {
        RedisError::from((ErrorKind::Server(kind), "server error", detail.to_owned()))
    }

    #[test]
    fn outages_are_transient_and_faults_are_not() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let transient = [
            BackendError::Timeout(Duration::from_millis(50)),
            BackendError::BackingOff { last_error: "connection refused".into() },
            BackendError::Connect { url: "redis://h/".into(), source: refused },
            BackendError::Redis(RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset))),
            BackendError::Redis(server(ServerErrorKind::BusyLoading, "loading")),
            BackendError::Redis(server(ServerErrorKind::TryAgain, "resharding")),
            BackendError::Redis(server(ServerErrorKind::ClusterDown, "down")),
            BackendError::Redis(server(ServerErrorKind::ReadOnly, "failover")),
        ];
        for e in &transient {
            assert!(e.is_transient(), "{e:?} should be transient");
        }
        let permanent = [
            BackendError::InvalidUrl { url: "http://nope".into(), reason: "not a redis URL".into() },
            BackendError::Auth {
                url: "redis://h/".into(),
                source: RedisError::from((ErrorKind::AuthenticationFailed, "WRONGPASS")),
            },
            BackendError::WrongType { key: "k".into(), source: server(ServerErrorKind::ResponseError, "WRONGTYPE") },
            BackendError::Redis(server(ServerErrorKind::NoScript, "no such script")),
            BackendError::Redis(RedisError::from((ErrorKind::UnexpectedReturnType, "not an integer"))),
        ];
        for e in &permanent {
            assert!(!e.is_transient(), "{e:?} should not be transient");
        }
        assert!(BackendError::Timeout(Duration::from_millis(1)).is_timeout());
        assert!(!permanent[0].is_timeout());
    }
}
