//! [`Redis`]: the connection every distributed limiter shares, with a deadline on every call and a
//! back-off after failures so a dead server is not asked again on every request.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{
    Arg, Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, RedisFuture, RedisResult, Script, ServerErrorKind, Value,
};

use crate::error::{BackendError, failed_command};
use crate::scripts::Batched;
use crate::sentinel::{Master, SentinelUrl};
use crate::tls::TlsUrl;

/// Connection settings.
#[derive(Clone, Debug)]
pub struct RedisOptions {
    /// Longest a decision may wait for Redis before the failure policy decides (default 50 ms):
    /// the deadline of every call, unless a handle from [`Redis::with_deadline`] sets its own.
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
    /// The master named by Sentinel, whichever node that is now.
    Sentinel(Arc<Master>),
}

/// One type for scripts, commands and pipelines on every kind of connection; a cluster routes
/// each by its key's slot, Sentinel to the master as last known.
impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(m) => {
                let mut c = m.manager();
                Box::pin(async move { c.req_packed_command(cmd).await })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(m) => {
                let mut c = m.manager();
                Box::pin(async move { c.req_packed_commands(pipeline, offset, count).await })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(m) => m.manager().get_db(),
        }
    }
}

/// Runs `cmd`; an `EVALSHA` of `script` the server does not have (NOSCRIPT) loads it, then runs
/// again once.
async fn query_loading<T: FromRedisValue>(conn: &mut Conn, script: &Script, cmd: &Cmd) -> RedisResult<T> {
    match cmd.query_async::<T>(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            cmd.query_async::<T>(conn).await
        }
        other => other,
    }
}

/// A shared Redis connection (one server, a master found through Sentinel, or a cluster). Cheap to
/// clone.
///
/// Every call ([`Redis::invoke`] for scripts, [`Redis::query`] for commands,
/// [`Redis::pipeline`] for pipelines) has a deadline and shares one back-off: after a failure
/// the calls fail at once ([`BackendError::BackingOff`]) until the back-off has passed, so a dead
/// server is not asked again by every caller.
///
/// ```no_run
/// # async fn f() -> Result<(), tollgate_redis::BackendError> {
/// let redis = tollgate_redis::Redis::connect("redis://127.0.0.1:6379/").await?;
/// # let _ = redis; Ok(()) }
/// ```
#[derive(Clone)]
pub struct Redis {
    inner: Arc<Inner>,
    /// This handle's deadline per call: [`RedisOptions::deadline`] unless set by
    /// [`Redis::with_deadline`].
    deadline: Duration,
}

struct Inner {
    conn: Conn,
    client: Option<redis::Client>,
    /// The URL(s) without credentials: what errors, logs, `Debug` and [`Redis::url`] show.
    shown: String,
    options: RedisOptions,
    health: Mutex<Health>,
    /// Script calls waiting to go together ([`Redis::batched`]).
    batches: crate::batch::Batches,
    /// Decision scripts run as functions (`FCALL`); false once the server refused them
    /// ([`Redis::eval`]).
    functions: AtomicBool,
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
        let shown = redact_url(url);
        if SentinelUrl::is_sentinel(url) {
            let invalid = |reason: String| BackendError::InvalidUrl { url: shown.clone(), reason };
            return SentinelUrl::parse(url).map_err(invalid)?.client().map(drop).map_err(|e| invalid(e.to_string()));
        }
        Self::open_client(url, &shown).map(drop)
    }

    /// The client for `url`, with its TLS parameters (see [`crate::tls`]) applied.
    fn open_client(url: &str, shown: &str) -> Result<redis::Client, BackendError> {
        let invalid = |reason: String| BackendError::InvalidUrl { url: shown.to_owned(), reason };
        TlsUrl::parse(url).map_err(invalid)?.client().map_err(|e| invalid(e.to_string()))
    }

    /// Connects with the default options (50 ms deadline per decision), to whatever `url` names:
    /// one server (`redis://`, `rediss://` for TLS) or the master of a Sentinel deployment
    /// (`redis+sentinel://sentinel1:26379,sentinel2/MASTER_NAME`, followed through failovers).
    /// [`Redis::connect_with`] describes each kind of URL and its parameters.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), tollgate_redis::BackendError> {
    /// use tollgate_redis::Redis;
    /// let one = Redis::connect("redis://127.0.0.1:6379/0").await?;
    /// let managed = Redis::connect("redis+sentinel://10.0.0.1,10.0.0.2,10.0.0.3/cache").await?;
    /// # let _ = (one, managed); Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Redis, BackendError> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connects to one server, or to the master of a Sentinel deployment. Errors show the URL
    /// without credentials.
    ///
    /// `rediss://` connects with TLS, verifying the server against the system's root
    /// certificates, or against the CA of `?tls_ca=/path/ca.pem`; `&tls_cert=…&tls_key=…` add a
    /// client certificate (PEM files, read now). A certificate the server does not accept, or a
    /// server certificate the CA did not sign, fails here with a [`BackendError::Connect`] that
    /// says so.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), tollgate_redis::BackendError> {
    /// use tollgate_redis::{Redis, RedisOptions};
    /// let url = "rediss://app:s3cret@cache.internal:6380/0?tls_ca=/etc/ssl/redis-ca.pem";
    /// let redis = Redis::connect_with(url, RedisOptions::default()).await?;
    /// assert_eq!(redis.url(), "rediss://***@cache.internal:6380/0");
    /// # Ok(()) }
    /// ```
    ///
    /// `redis+sentinel://[user:password@]host[:port][,host[:port]...]/MASTER_NAME[/DB]` asks the
    /// sentinels at those hosts (port 26379 when left out) for the master they monitor under
    /// `MASTER_NAME`, and connects to it; the user and password are the master's. Sentinels that
    /// ask for a password get `?sentinel_password=…` (and `&sentinel_username=…`).
    /// `rediss+sentinel://` speaks TLS to the sentinels and the master, with the same `tls_*`
    /// parameters as `rediss://`. When the master changes (a failover), later calls reach the new
    /// one: the sentinels are asked again after a call fails as an outage, and every second in the
    /// background (an old master that is still up would otherwise keep answering until Sentinel
    /// demotes it); in between, calls fail as they do on one server, within the same deadline and
    /// back-off. A master name the sentinels do not monitor fails here with
    /// [`BackendError::UnknownMaster`], which lists the names they do.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), tollgate_redis::BackendError> {
    /// use tollgate_redis::{Redis, RedisOptions};
    /// let url = "redis+sentinel://app:s3cret@10.0.0.1:26379,10.0.0.2,10.0.0.3/cache/0";
    /// let redis = Redis::connect_with(url, RedisOptions::default()).await?;
    /// assert_eq!(redis.url(), "redis+sentinel://***@10.0.0.1:26379,10.0.0.2,10.0.0.3/cache/0");
    /// # Ok(()) }
    /// ```
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Redis, BackendError> {
        let shown = redact_url(url);
        let (conn, client) = if SentinelUrl::is_sentinel(url) {
            (Conn::Sentinel(Master::connect(url, &shown, &options).await?), None)
        } else {
            let client = Self::open_client(url, &shown)?;
            (Conn::Single(open_manager(client.clone(), &options, &shown).await?), Some(client))
        };
        let redis = Redis::from_parts(conn, client, shown, options);
        redis.ping().await?;
        Ok(redis)
    }

    /// Connects to a Redis Cluster through any of its nodes. Errors show the URLs without
    /// credentials.
    pub async fn connect_cluster(urls: &[&str], options: RedisOptions) -> Result<Redis, BackendError> {
        let joined = redact_url(&urls.join(","));
        let invalid = |reason: String| BackendError::InvalidUrl { url: joined.clone(), reason };
        // Each node's URL may carry TLS parameters (the same for every node: the first found win).
        let nodes = urls.iter().map(|u| TlsUrl::parse(u)).collect::<Result<Vec<_>, _>>().map_err(invalid)?;
        let certs = nodes.iter().find_map(|n| n.certs.clone());
        let mut builder = redis::cluster::ClusterClient::builder(nodes.into_iter().map(|n| n.url))
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.connect_timeout);
        if let Some(certs) = certs {
            builder = builder.certs(certs);
        }
        let client = builder.build().map_err(|e| invalid(e.to_string()))?;
        let conn = tokio::time::timeout(options.connect_timeout, client.get_async_connection())
            .await
            .map_err(|_| BackendError::Timeout(options.connect_timeout))?
            .map_err(|e| BackendError::Connect { url: joined.clone(), source: e })?;
        let redis = Redis::from_parts(Conn::Cluster(conn), None, joined, options);
        redis.ping().await?;
        Ok(redis)
    }

    fn from_parts(conn: Conn, client: Option<redis::Client>, shown: String, options: RedisOptions) -> Redis {
        let deadline = options.deadline;
        Redis {
            inner: Arc::new(Inner {
                conn,
                client,
                shown,
                options,
                health: Mutex::new(Health::default()),
                batches: Default::default(),
                functions: AtomicBool::new(true),
            }),
            deadline,
        }
    }

    async fn ping(&self) -> Result<(), BackendError> {
        let url = &self.inner.shown;
        let timeout = self.inner.options.connect_timeout;
        let fut = async {
            let mut conn = self.inner.conn.clone();
            redis::cmd("PING").query_async::<Value>(&mut conn).await
        };
        match tokio::time::timeout(timeout, fut).await {
            Err(_) => Err(BackendError::Timeout(timeout)),
            Ok(Err(e)) => Err(connect_error(e, url)),
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

    /// The same connection, with `deadline` for each call made through the returned handle
    /// instead of [`RedisOptions::deadline`]. The connection, and the back-off after failures,
    /// stay shared with every other handle: only how long a call may wait changes.
    ///
    /// For commands that legitimately take longer than a rate-limit decision (reading a batch
    /// from a queue, scanning), without giving the decisions on the same connection a longer
    /// deadline. A call that misses it counts as a failure of Redis like any other timeout.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), tollgate_redis::BackendError> {
    /// use std::time::Duration;
    /// use tollgate_redis::{Redis, redis};
    /// let redis = Redis::connect("redis://127.0.0.1:6379/").await?;
    /// let patient = redis.with_deadline(Duration::from_secs(2));
    /// assert_eq!((redis.deadline(), patient.deadline()), (Duration::from_millis(50), Duration::from_secs(2)));
    /// let pending: u64 = patient.query(redis::cmd("XLEN").arg("orders")).await?;
    /// # let _ = pending; Ok(()) }
    /// ```
    pub fn with_deadline(&self, deadline: Duration) -> Redis {
        Redis { inner: self.inner.clone(), deadline }
    }

    /// Longest a call through this handle waits for Redis (see [`Redis::with_deadline`]).
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// A client for the server (for dedicated blocking connections): the one server's, or the
    /// master's as last known behind Sentinel (ask again after a failover); `None` on a cluster.
    pub fn client(&self) -> Option<redis::Client> {
        match &self.inner.conn {
            Conn::Sentinel(m) => Some(m.client()),
            _ => self.inner.client.clone(),
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.inner.conn, Conn::Cluster(_))
    }

    /// Changes when a connection from an earlier [`Redis::client`] reaches a node that is no
    /// longer the master (behind Sentinel, after a failover); always 0 otherwise.
    /// `err` as this handle's callers see it (see [`BackendError::classify`]); `key`: the key
    /// of the command that failed.
    pub(crate) fn classify(&self, err: redis::RedisError, key: Option<&str>) -> BackendError {
        BackendError::classify(err, &self.inner.shown, key)
    }

    pub(crate) fn batches(&self) -> &crate::batch::Batches {
        &self.inner.batches
    }

    pub(crate) fn master_generation(&self) -> u64 {
        match &self.inner.conn {
            Conn::Sentinel(m) => m.generation(),
            _ => 0,
        }
    }

    /// The last error seen, while Redis is considered down; `None` when healthy.
    pub fn last_error(&self) -> Option<String> {
        let h = self.inner.health.lock().unwrap_or_else(|e| e.into_inner());
        h.retry_at.is_some().then(|| h.last_error.clone()).flatten()
    }

    /// Runs `script` with `keys` and `args` (EVALSHA; the script is loaded only on NOSCRIPT, then
    /// retried once) within the deadline. While backing off after failures, fails at once.
    ///
    /// On a cluster, `keys` must share one hash tag (they go to one slot).
    pub async fn invoke<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
    ) -> Result<T, BackendError> {
        let mut invocation = script.prepare_invoke();
        for k in keys {
            invocation.key(k);
        }
        for a in args {
            invocation.arg(a);
        }
        let call = async {
            let mut conn = self.inner.conn.clone();
            invocation.invoke_async::<T>(&mut conn).await
        };
        self.call(call, |_| keys.first().cloned()).await
    }

    /// How `script` is called on this connection, the first two words of its command: `FCALL`
    /// and its function, or `EVALSHA` and its hash once the server was found not to run
    /// functions for this user ([`Redis::eval`]).
    pub(crate) fn script_head<'s>(&self, script: &'s Batched) -> (&'static str, &'s str) {
        if self.inner.functions.load(Ordering::Relaxed) {
            ("FCALL", &script.function)
        } else {
            ("EVALSHA", script.script.get_hash())
        }
    }

    /// Runs `cmd`, a call of `script` its caller wrote after [`Redis::script_head`] (its words
    /// as bytes, in buffers it reuses), within the deadline. A function or script the server
    /// does not have (a restart, a failover, a node that never had it) is loaded, then the call
    /// is retried once. A server that cannot run functions for this user (before Redis 7, or an
    /// ACL without `FCALL` or `FUNCTION LOAD`) gets this call, and every later one on this
    /// connection, as `EVALSHA`. `key` names the script's first key, computed only on error.
    pub(crate) async fn eval<T: FromRedisValue>(
        &self,
        script: &Batched,
        cmd: &Cmd,
        key: impl FnOnce() -> Option<String>,
    ) -> Result<T, BackendError> {
        let call = async {
            let mut conn = self.inner.conn.clone();
            let is_fcall = matches!(cmd.args_iter().next(), Some(Arg::Simple(b"FCALL")));
            let refused = |e: &RedisError| {
                matches!(e.kind(), ErrorKind::Server(ServerErrorKind::ResponseError | ServerErrorKind::NoPerm))
            };
            let evalsha = match query_loading::<T>(&mut conn, &script.script, cmd).await {
                Err(e) if e.detail().is_some_and(|d| d.starts_with("Function not found")) => {
                    let mut load = redis::cmd("FUNCTION");
                    load.arg("LOAD").arg("REPLACE").arg(&script.library);
                    match load.query_async::<Value>(&mut conn).await {
                        Ok(_) => return cmd.query_async::<T>(&mut conn).await,
                        Err(e) if !refused(&e) => return Err(e),
                        Err(e) => self.without_functions(script, cmd, &e),
                    }
                }
                // FCALL unknown (before Redis 7) or not allowed.
                Err(e)
                    if is_fcall
                        && (e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
                            || refused(&e) && e.detail().is_some_and(|d| d.starts_with("unknown command"))) =>
                {
                    self.without_functions(script, cmd, &e)
                }
                other => return other,
            };
            query_loading::<T>(&mut conn, &script.script, &evalsha).await
        };
        self.call(call, |_| key()).await
    }

    /// `cmd`, an `FCALL` of `script`, as an `EVALSHA`; from now on this connection calls
    /// `script`s so (`why`: the server's refusal, logged once).
    fn without_functions(&self, script: &Batched, cmd: &Cmd, why: &RedisError) -> Cmd {
        if self.inner.functions.swap(false, Ordering::Relaxed) {
            tracing::info!(redis = %self.inner.shown, reason = %why, "Redis functions unavailable: decision scripts run with EVALSHA");
        }
        let mut evalsha = Cmd::new();
        evalsha.arg("EVALSHA").arg(script.script.get_hash());
        for arg in cmd.args_iter().skip(2) {
            if let Arg::Simple(bytes) = arg {
                evalsha.arg(bytes);
            }
        }
        evalsha
    }

    /// Runs one command within the deadline, as [`Redis::invoke`] runs a script: the same deadline,
    /// back-off and error classification ([`BackendError::is_transient`]), on one server or a
    /// cluster (which routes the command by its key). A refusal of the command itself (a wrong
    /// type, `BUSYGROUP`, a reply of another type than `T`) is returned as an error but says
    /// nothing about the server's health: it opens no back-off.
    ///
    /// Never send a blocking command (`BLPOP`, `XREADGROUP ... BLOCK`) through it: the connection
    /// is shared, and every other caller's commands would wait behind it. Open a dedicated
    /// connection from [`Redis::client`] for those.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), tollgate_redis::BackendError> {
    /// use tollgate_redis::{Redis, redis};
    /// let redis = Redis::connect("redis://127.0.0.1:6379/").await?;
    /// let id: String = redis.query(redis::cmd("XADD").arg("orders").arg("*").arg("sku").arg(42)).await?;
    /// let length: u64 = redis.query(redis::cmd("XLEN").arg("orders")).await?;
    /// # let _ = (id, length); Ok(()) }
    /// ```
    pub async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, BackendError> {
        let call = async {
            let mut conn = self.inner.conn.clone();
            cmd.query_async::<T>(&mut conn).await
        };
        self.call(call, |_| command_key(cmd)).await
    }

    /// Runs a pipeline (one round trip; `MULTI`/`EXEC` around it if it is
    /// [atomic](Pipeline::atomic)) within the deadline, as [`Redis::query`] runs one command.
    /// `T` reads the replies of the commands not marked [ignored](Pipeline::ignore), as a tuple
    /// or a `Vec`.
    ///
    /// On a cluster, every key of the pipeline must share one hash tag (`{orders}:items`,
    /// `{orders}:attempts`): the pipeline goes to one node, and a pipeline over several slots is
    /// refused (`CROSSSLOT`, not transient).
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), tollgate_redis::BackendError> {
    /// use tollgate_redis::{Redis, redis};
    /// let redis = Redis::connect("redis://127.0.0.1:6379/").await?;
    /// let mut pipe = redis::pipe();
    /// pipe.atomic().cmd("INCR").arg("{orders}:sent").cmd("HINCRBY").arg("{orders}:by-sku").arg(42).arg(1);
    /// let (sent, of_sku): (u64, u64) = redis.pipeline(&pipe).await?;
    /// # let _ = (sent, of_sku); Ok(()) }
    /// ```
    pub async fn pipeline<T: FromRedisValue>(&self, pipe: &Pipeline) -> Result<T, BackendError> {
        let call = async {
            let mut conn = self.inner.conn.clone();
            pipe.query_async::<T>(&mut conn).await
        };
        self.call(call, |failed| pipe.cmd_iter().nth(failed.unwrap_or(0)).and_then(command_key)).await
    }

    /// One call: fails at once while backing off, else waits for `request` within this handle's
    /// deadline, classifies its error and records the outcome for the back-off. `key` names the
    /// key of the command that failed (given its index in a pipeline), computed only on error.
    async fn call<T>(
        &self,
        request: impl Future<Output = RedisResult<T>>,
        key: impl FnOnce(Option<usize>) -> Option<String>,
    ) -> Result<T, BackendError> {
        if let Err(backing_off) = self.check_backoff() {
            // Failing at once never yields: a caller looping on decisions would hold its worker
            // thread (and the timers and reconnection that would end the outage) forever.
            tokio::task::consume_budget().await;
            return Err(backing_off);
        }
        let deadline = self.deadline;
        let started = Instant::now();
        let outcome = match tokio::time::timeout(deadline, request).await {
            Err(_) => Err(BackendError::Timeout(deadline)),
            Ok(Err(e)) => {
                let key = key(failed_command(&e));
                Err(self.classify(e, key.as_deref()))
            }
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
        if let (Err(e), Conn::Sentinel(master)) = (outcome, &self.inner.conn) {
            // The master may have moved: the sentinels know (the lookup runs in the background).
            if e.is_outage() {
                master.follow();
            }
        }
        let mut h = self.inner.health.lock().unwrap_or_else(|e| e.into_inner());
        match outcome {
            Ok(_) => {
                if h.retry_at.take().is_some() {
                    tracing::info!(url = %self.inner.shown, "redis is answering again");
                }
                h.failures = 0;
                h.failed_at = None;
            }
            // An answer that refuses this one request (a key of another type, a script error,
            // BUSYGROUP, a reply of an unexpected type) says nothing about the server's health.
            Err(e) if !e.is_outage() => {}
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
            .field(
                "sentinel",
                &match &i.conn {
                    Conn::Sentinel(m) => Some(m),
                    _ => None,
                },
            )
            .field("deadline", &self.deadline)
            .field("options", &i.options)
            .finish_non_exhaustive()
    }
}

/// A connection to one server that reconnects by itself, within `options.connect_timeout`.
pub(crate) async fn open_manager(
    client: redis::Client,
    options: &RedisOptions,
    shown: &str,
) -> Result<ConnectionManager, BackendError> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(Some(options.connect_timeout))
        .set_number_of_retries(1)
        .set_max_delay(options.backoff_max);
    tokio::time::timeout(options.connect_timeout, ConnectionManager::new_with_config(client, config))
        .await
        .map_err(|_| BackendError::Timeout(options.connect_timeout))?
        .map_err(|e| connect_error(e, shown))
}

/// A failure to connect to `shown` (without credentials): refused credentials stay
/// [`BackendError::Auth`], anything else not more specific is [`BackendError::Connect`].
pub(crate) fn connect_error(e: redis::RedisError, shown: &str) -> BackendError {
    match BackendError::classify(e, shown, None) {
        BackendError::Redis(e) => BackendError::Connect { url: shown.to_owned(), source: e },
        other => other,
    }
}

/// The key a command is about, for [`BackendError::WrongType`]: its first argument after the
/// name, or the first stream after `STREAMS` for `XREAD`/`XREADGROUP`; `None` for a bare command.
fn command_key(cmd: &Cmd) -> Option<String> {
    let mut args = cmd.args_iter().filter_map(|arg| match arg {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let name = args.next()?;
    let key = if name.eq_ignore_ascii_case(b"XREAD") || name.eq_ignore_ascii_case(b"XREADGROUP") {
        args.skip_while(|arg| !arg.eq_ignore_ascii_case(b"STREAMS")).nth(1)
    } else {
        args.next()
    }?;
    Some(String::from_utf8_lossy(key).into_owned())
}

/// `url` (or a comma-separated list of them) with what may hold a secret left out: the user info
/// (`user:password@`) becomes `***@`, and the query (`?pass=...` on unix sockets,
/// `?sentinel_password=...`) is dropped. Everything Tollgate prints about a Redis address goes
/// through it; use it for your own messages too.
///
/// ```
/// use tollgate_redis::redact_url;
/// assert_eq!(redact_url("redis://app:s3cret@10.0.0.1:6379/2"), "redis://***@10.0.0.1:6379/2");
/// assert_eq!(redact_url("redis://127.0.0.1:6379/0"), "redis://127.0.0.1:6379/0");
/// assert_eq!(
///     redact_url("redis+sentinel://:s3cret@s1,s2:26380/cache?sentinel_password=s3cret"),
///     "redis+sentinel://***@s1,s2:26380/cache"
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    // A sentinel URL separates its hosts with commas too: a piece without a scheme goes on with
    // the URL before it.
    let mut urls: Vec<String> = Vec::new();
    for piece in url.split(',') {
        match urls.last_mut() {
            Some(last) if !piece.contains("://") => {
                last.push(',');
                last.push_str(piece);
            }
            _ => urls.push(piece.to_owned()),
        }
    }
    urls.iter()
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
        assert_eq!(
            redact_url("redis+sentinel://u:p@ss@h1:26379,h2,[::1]:26380/mymaster/1?sentinel_password=x"),
            "redis+sentinel://***@h1:26379,h2,[::1]:26380/mymaster/1"
        );
        assert_eq!(redact_url("rediss+sentinel://h1,h2/m?tls_ca=/ca.pem"), "rediss+sentinel://h1,h2/m");
    }
}
