//! [`Redis`]: the connection every distributed limiter shares, with a deadline on every call and a
//! back-off after failures so a dead server is not asked again on every request.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Script, Value};

use crate::error::BackendError;

/// Connection settings.
#[derive(Clone, Debug)]
pub struct RedisOptions {
    /// Longest a decision may wait for Redis before the failure policy decides (default 50 ms).
    pub deadline: Duration,
    /// Longest `connect` may take (default 2 s).
    pub connect_timeout: Duration,
    /// First back-off after a failure (default 25 ms); doubles per consecutive failure.
    pub backoff_min: Duration,
    /// Longest back-off (default 500 ms): a restarted server is used again within this.
    pub backoff_max: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            deadline: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(2),
            backoff_min: Duration::from_millis(25),
            backoff_max: Duration::from_millis(500),
        }
    }
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// A shared Redis connection (single server or cluster). Cheap to clone.
///
/// ```no_run
/// # async fn f() -> Result<(), tollgate_redis::BackendError> {
/// let redis = tollgate_redis::Redis::connect("redis://127.0.0.1:6379/").await?;
/// # let _ = redis; Ok(()) }
/// ```
#[derive(Clone)]
pub struct Redis {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    client: Option<redis::Client>,
    /// The URL(s) without credentials: what errors, logs, `Debug` and [`Redis::url`] show.
    shown: String,
    options: RedisOptions,
    health: Mutex<Health>,
}

#[derive(Default)]
struct Health {
    failures: u32,
    /// When the last failure was counted: calls already in flight then fail of the same cause
    /// and must not grow the back-off (8 callers cut by one reset are one failure, not 8).
    failed_at: Option<Instant>,
    retry_at: Option<Instant>,
    last_error: Option<String>,
}

impl Redis {
    /// Checks that `url` parses as a Redis URL, without connecting — to report a bad address
    /// where it is configured rather than at first use.
    ///
    /// The error shows the URL without credentials.
    pub fn check_url(url: &str) -> Result<(), BackendError> {
        redis::Client::open(url)
            .map(drop)
            .map_err(|e| BackendError::InvalidUrl { url: redact_url(url), reason: e.to_string() })
    }

    /// Connects to one server with the default options (50 ms deadline per decision).
    pub async fn connect(url: &str) -> Result<Redis, BackendError> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connects to one server. Errors show the URL without credentials.
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Redis, BackendError> {
        let shown = redact_url(url);
        let client = redis::Client::open(url)
            .map_err(|e| BackendError::InvalidUrl { url: shown.clone(), reason: e.to_string() })?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.connect_timeout))
            .set_number_of_retries(1)
            .set_max_delay(options.backoff_max);
        let manager =
            tokio::time::timeout(options.connect_timeout, ConnectionManager::new_with_config(client.clone(), config))
                .await
                .map_err(|_| BackendError::Timeout(options.connect_timeout))?
                .map_err(|e| match BackendError::classify(e, &shown, None) {
                    BackendError::Redis(e) => BackendError::Connect { url: shown.clone(), source: e },
                    other => other,
                })?;
        let redis = Redis::from_parts(Conn::Single(manager), Some(client), shown, options);
        redis.ping().await?;
        Ok(redis)
    }

    /// Connects to a Redis Cluster through any of its nodes. Errors show the URLs without
    /// credentials.
    pub async fn connect_cluster(urls: &[&str], options: RedisOptions) -> Result<Redis, BackendError> {
        let joined = redact_url(&urls.join(","));
        let client = redis::cluster::ClusterClient::builder(urls.iter().copied())
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.connect_timeout)
            .build()
            .map_err(|e| BackendError::InvalidUrl { url: joined.clone(), reason: e.to_string() })?;
        let conn = tokio::time::timeout(options.connect_timeout, client.get_async_connection())
            .await
            .map_err(|_| BackendError::Timeout(options.connect_timeout))?
            .map_err(|e| BackendError::Connect { url: joined.clone(), source: e })?;
        let redis = Redis::from_parts(Conn::Cluster(conn), None, joined, options);
        redis.ping().await?;
        Ok(redis)
    }

    fn from_parts(conn: Conn, client: Option<redis::Client>, shown: String, options: RedisOptions) -> Redis {
        Redis { inner: Arc::new(Inner { conn, client, shown, options, health: Mutex::new(Health::default()) }) }
    }

    async fn ping(&self) -> Result<(), BackendError> {
        let mut cmd = redis::cmd("PING");
        let url = &self.inner.shown;
        let timeout = self.inner.options.connect_timeout;
        let fut = async {
            match self.inner.conn.clone() {
                Conn::Single(mut c) => cmd.query_async::<Value>(&mut c).await,
                Conn::Cluster(mut c) => {
                    cmd = redis::cmd("PING");
                    cmd.query_async::<Value>(&mut c).await
                }
            }
        };
        match tokio::time::timeout(timeout, fut).await {
            Err(_) => Err(BackendError::Timeout(timeout)),
            Ok(Err(e)) => Err(match BackendError::classify(e, url, None) {
                BackendError::Redis(e) => BackendError::Connect { url: url.clone(), source: e },
                other => other,
            }),
            Ok(Ok(_)) => Ok(()),
        }
    }

    /// Where this connects to, without credentials (`redis://***@host:6379/0`; see
    /// [`redact_url`]): safe to log or show. The URL as given stays inside the connection.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), tollgate_redis::BackendError> {
    /// let redis = tollgate_redis::Redis::connect("redis://app:s3cret@10.0.0.1:6379/0").await?;
    /// assert_eq!(redis.url(), "redis://***@10.0.0.1:6379/0");
    /// # Ok(()) }
    /// ```
    pub fn url(&self) -> &str {
        &self.inner.shown
    }

    /// The settings in use.
    pub fn options(&self) -> &RedisOptions {
        &self.inner.options
    }

    /// The client of a single-server connection (for dedicated blocking connections); `None` on
    /// a cluster.
    pub fn client(&self) -> Option<&redis::Client> {
        self.inner.client.as_ref()
    }

    /// The last error seen, while Redis is considered down; `None` when healthy.
    pub fn last_error(&self) -> Option<String> {
        let h = self.inner.health.lock().unwrap_or_else(|e| e.into_inner());
        h.retry_at.is_some().then(|| h.last_error.clone()).flatten()
    }

    /// Runs `script` with `keys` and `args` (EVALSHA; the script is loaded only on NOSCRIPT, then
    /// retried once) within the deadline. While backing off after failures, fails at once.
    pub async fn invoke<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
    ) -> Result<T, BackendError> {
        if let Err(backing_off) = self.check_backoff() {
            // Failing at once never yields: a caller looping on decisions would hold its worker
            // thread (and the timers and reconnection that would end the outage) forever.
            tokio::task::consume_budget().await;
            return Err(backing_off);
        }
        let mut invocation = script.prepare_invoke();
        for k in keys {
            invocation.key(k);
        }
        for a in args {
            invocation.arg(a);
        }
        let deadline = self.inner.options.deadline;
        let started = Instant::now();
        let call = async {
            match self.inner.conn.clone() {
                Conn::Single(mut c) => invocation.invoke_async::<T>(&mut c).await,
                Conn::Cluster(mut c) => invocation.invoke_async::<T>(&mut c).await,
            }
        };
        let outcome = match tokio::time::timeout(deadline, call).await {
            Err(_) => Err(BackendError::Timeout(deadline)),
            Ok(Err(e)) => Err(BackendError::classify(e, &self.inner.shown, keys.first().map(String::as_str))),
            Ok(Ok(v)) => Ok(v),
        };
        self.record(&outcome, started);
        outcome
    }

    fn check_backoff(&self) -> Result<(), BackendError> {
        let h = self.inner.health.lock().unwrap_or_else(|e| e.into_inner());
        match h.retry_at {
            Some(at) if Instant::now() < at => {
                Err(BackendError::BackingOff { last_error: h.last_error.clone().unwrap_or_default() })
            }
            _ => Ok(()),
        }
    }

    fn record<T>(&self, outcome: &Result<T, BackendError>, started: Instant) {
        let mut h = self.inner.health.lock().unwrap_or_else(|e| e.into_inner());
        match outcome {
            Ok(_) => {
                if h.retry_at.take().is_some() {
                    tracing::info!(url = %self.inner.shown, "redis is answering again");
                }
                h.failures = 0;
                h.failed_at = None;
            }
            // A wrong key type is the caller's data, not the server's health.
            Err(BackendError::WrongType { .. }) => {}
            Err(_) if h.failed_at.is_some_and(|at| started < at) => {}
            Err(e) => {
                h.failures = h.failures.saturating_add(1);
                h.failed_at = Some(Instant::now());
                let o = &self.inner.options;
                let backoff = o.backoff_min.saturating_mul(1 << (h.failures - 1).min(16)).min(o.backoff_max);
                if h.retry_at.is_none() {
                    tracing::warn!(url = %self.inner.shown, error = %e, "redis failed; failure policy decides until it answers");
                }
                h.retry_at = Some(Instant::now() + backoff);
                h.last_error = Some(e.to_string());
            }
        }
    }
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = &self.inner;
        f.debug_struct("Redis")
            .field("url", &i.shown)
            .field("cluster", &matches!(i.conn, Conn::Cluster(_)))
            .field("options", &i.options)
            .finish_non_exhaustive()
    }
}

/// `url` (or a comma-separated list of them) with what may hold a secret left out: the user info
/// (`user:password@`) becomes `***@`, and the query (`?pass=...` on unix sockets) is dropped.
/// Everything Tollgate prints about a Redis address goes through it; use it for your own
/// messages too.
///
/// ```
/// use tollgate_redis::redact_url;
/// assert_eq!(redact_url("redis://app:s3cret@10.0.0.1:6379/2"), "redis://***@10.0.0.1:6379/2");
/// assert_eq!(redact_url("redis://127.0.0.1:6379/0"), "redis://127.0.0.1:6379/0");
/// ```
pub fn redact_url(url: &str) -> String {
    url.split(',')
        .map(|one| {
            let one = one.split(['?', '#']).next().unwrap_or_default();
            let Some((scheme, rest)) = one.split_once("://") else {
                return "<not a URL>".to_owned();
            };
            // The last `@`, not the first one in the authority: a password may hold a raw `/` or `@`.
            match rest.rsplit_once('@') {
                Some((_, host_and_path)) => format!("{scheme}://***@{host_and_path}"),
                None => one.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn redact_url_hides_credentials() {
        assert_eq!(redact_url("redis://127.0.0.1:6379/0"), "redis://127.0.0.1:6379/0");
        assert_eq!(redact_url("redis://:s3cret@10.0.0.1:6379/2"), "redis://***@10.0.0.1:6379/2");
        assert_eq!(redact_url("rediss://app:p@ss@cache.internal"), "rediss://***@cache.internal");
        assert_eq!(redact_url("redis+unix:///tmp/redis.sock?db=1&pass=s3cret"), "redis+unix:///tmp/redis.sock");
        assert_eq!(redact_url("redis://u:a@h1:7000,redis://u:b@h2:7001"), "redis://***@h1:7000,redis://***@h2:7001");
        assert_eq!(redact_url("redis://:pa/ss@host/0"), "redis://***@host/0");
        assert_eq!(redact_url("s3cret"), "<not a URL>");
    }
}
