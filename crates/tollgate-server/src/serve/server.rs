//! Binding the listeners and running the protocols on one multi-thread runtime.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use tollgate::{Clock, SystemClock};
use tollgate_policy::{Format, PolicyError};

use super::engine::Engine;
use super::model::{CounterCap, Mode, RequestBounds, StorageError, StorageKind};
use super::net::grpc::Unary;
use super::net::rlqs::RlqsService;
use super::net::tls::{Tls, TlsError, TlsFiles};
use super::net::{http1, preface, stopped};
use super::ops::metrics::Metrics;
use super::ops::reload::Reloader;
use super::ops::trace::TraceParent;
use super::ops::watch;
use super::protocol::headers::HeaderDraft;
use super::protocol::methods;
use super::protocol::rlqs::{Rlqs, RlqsConfig};
use super::protocol::{http, rls::Rls};
use super::store::{RedisStore, TimeSource};

/// What `tollgate serve` runs.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The limits file (or, in envoy/ratelimit's format, a directory of them).
    pub limits: PathBuf,
    /// The format of `limits`: Limitador's (the default) or envoy/ratelimit's.
    pub format: Format,
    /// Where Envoy's RLS (gRPC) listens.
    pub grpc: SocketAddr,
    /// Where the HTTP API listens (and, without [`ServeConfig::admin`], `/metrics` and the
    /// counters' and limits' endpoints).
    pub http: SocketAddr,
    /// Where the endpoints for operators listen apart (`--admin`): `/limits/{ns}`,
    /// `/counters/{ns}` (listing, and resetting with `DELETE`), `/metrics` and `/status`, in
    /// plaintext. When set, the HTTP listener serves only the decision calls and `/status`, so
    /// a client of the decisions cannot reset counters. `None` (the default): all on `http`.
    pub admin: Option<SocketAddr>,
    /// TLS on the gRPC and HTTP listeners, and client certificates required when it names a CA
    /// (`--tls-cert`, `--tls-key`, `--tls-client-ca`); the files are read again when they change.
    /// `None` (the default): plaintext.
    pub tls: Option<TlsFiles>,
    /// Accuracy or throughput.
    pub mode: Mode,
    /// Count and report, but allow everything.
    pub shadow: bool,
    /// Reload the limits file when it changes.
    pub watch: bool,
    /// Where counters live.
    pub storage: Storage,
    /// Whose clock times the windows of counters kept in Redis.
    pub time: TimeSource,
    /// How many counters each limit keeps in memory, and what a new one gets past that.
    pub counters: CounterCap,
    /// How large a request's descriptors may be.
    pub bounds: RequestBounds,
    /// RateLimit headers in RLS replies (`--rate-limit-headers`); none by default.
    pub rate_limit_headers: Option<HeaderDraft>,
    /// Describe the request and the `metadata` of the rules it passed in RLS replies'
    /// `dynamic_metadata` (`--response-dynamic-metadata`, envoy/ratelimit's
    /// `RESPONSE_DYNAMIC_METADATA`); off by default.
    pub response_dynamic_metadata: bool,
    /// Links each decision span to the caller's trace from the request's headers (see
    /// [`super::trace`]; `tollgate serve --otlp-endpoint` sets one); none by default.
    pub trace_parent: Option<Arc<dyn TraceParent>>,
    /// How long an HTTP/1 connection may take to send a request: its head, and its body too when
    /// the call is one the server reads itself (`POST /check`, `/report`, `/check_and_report` as
    /// they usually come) — the first within this of the opening, each next one within one to
    /// two times this of the last answer (exactly this for the head of a request hyper reads,
    /// and this again for its body, or it is answered 408; the first request hyper reads on a
    /// connection handed to it must arrive whole by when the server's own reading would have
    /// given up, so no connection is held past twice this). A connection
    /// that does not closes, as a kept-alive one idle that long does, and one whose answers
    /// stay unread that long; an HTTP/2 (prior knowledge) connection closes once it has sent
    /// nothing for this long. `None`: no limit. Default 30 s (hyper's header timeout).
    pub http_read_timeout: Option<Duration>,
    /// How long a gRPC connection may take to open its HTTP/2 session (send the preface) after
    /// it is accepted, and stay silent before the kernel probes its peer (TCP keep-alive: three
    /// probes, a third of this apart, so a peer that is gone is reset about twice this after
    /// its last packet). A connection that does not send its preface in time closes, so a
    /// client that opens connections and sends nothing holds each, and a graceful shutdown,
    /// this long at most. `None`: neither. Default 30 s.
    pub grpc_read_timeout: Option<Duration>,
    /// Envoy's Rate Limit Quota Service on the gRPC port: assignments' time to live and the
    /// bounds on buckets (`--rlqs-*`).
    pub rlqs: RlqsConfig,
    /// With counters in Redis: longest a decision waits for it before the call is answered
    /// unavailable (`--redis-deadline`). Default 50 ms.
    pub redis_deadline: Duration,
}

impl ServeConfig {
    /// `tollgate serve --limits FILE` with every other flag at its default: Limitador's format,
    /// RLS on 127.0.0.1:8081, HTTP on 127.0.0.1:8080, accuracy mode, no shadow, the file watched,
    /// counters in memory (10 million per limit at most, new ones rejected past that), no RateLimit
    /// headers nor request description in RLS replies, no trace parent, HTTP connections given 30 s per request, gRPC
    /// connections 30 s to open. Change
    /// fields to taste.
    ///
    /// ```
    /// use tollgate_server::serve::{ServeConfig, Storage};
    /// let config = ServeConfig { grpc: "127.0.0.1:0".parse()?, watch: false, ..ServeConfig::new("limits.yaml") };
    /// assert_eq!(config.http.to_string(), "127.0.0.1:8080");
    /// assert!(matches!(config.storage, Storage::Memory));
    /// # Ok::<(), std::net::AddrParseError>(())
    /// ```
    pub fn new(limits: impl Into<PathBuf>) -> ServeConfig {
        ServeConfig {
            limits: limits.into(),
            format: Format::default(),
            grpc: SocketAddr::from(([127, 0, 0, 1], 8081)),
            http: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin: None,
            tls: None,
            mode: Mode::Accuracy,
            shadow: false,
            watch: true,
            storage: Storage::default(),
            time: TimeSource::default(),
            counters: CounterCap::default(),
            bounds: RequestBounds::default(),
            rate_limit_headers: None,
            response_dynamic_metadata: false,
            trace_parent: None,
            http_read_timeout: Some(DEFAULT_HTTP_READ_TIMEOUT),
            grpc_read_timeout: Some(DEFAULT_GRPC_READ_TIMEOUT),
            rlqs: RlqsConfig::default(),
            redis_deadline: tollgate_redis::RedisOptions::default().deadline,
        }
    }
}

/// [`ServeConfig::http_read_timeout`]'s default.
pub const DEFAULT_HTTP_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// [`ServeConfig::grpc_read_timeout`]'s default.
pub const DEFAULT_GRPC_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Where counters live. Its `Debug` shows Redis URLs without credentials.
#[derive(Clone, Default)]
pub enum Storage {
    /// In the server's memory (lost on restart; one server per limit).
    #[default]
    Memory,
    /// In Redis, shared by every server using the same Redis and prefix; fixed windows only.
    Redis {
        /// `redis://host:port/db` (or `rediss://`).
        url: String,
        /// Prefix of every key.
        prefix: String,
    },
    /// Decided in memory, flushed to Redis every `flush`: one round trip per new counter instead
    /// of per call; replicas may overshoot until they hear of each other (docs/server.md, "Storages and their guarantees").
    RedisCached {
        /// `redis://host:port/db`.
        url: String,
        /// Prefix of every key.
        prefix: String,
        /// How often local counts are sent.
        flush: std::time::Duration,
    },
    /// In Redis (the keys of `Redis`), spent from slices leased to this server: one round trip
    /// per slice instead of per call on a hot counter, and replicas never admit more than a limit
    /// together; hits leased and not spent before their window ends are lost (under-admission).
    RedisLeased {
        /// `redis://host:port/db`.
        url: String,
        /// Prefix of every key.
        prefix: String,
    },
}

impl Storage {
    /// What `--storage` calls it.
    ///
    /// ```
    /// use tollgate_server::serve::{Storage, StorageKind};
    /// let leased = Storage::RedisLeased { url: "redis://127.0.0.1/".into(), prefix: "rl:".into() };
    /// assert_eq!(leased.kind(), StorageKind::RedisLeased);
    /// assert_eq!(Storage::Memory.kind(), StorageKind::Memory);
    /// ```
    pub fn kind(&self) -> StorageKind {
        match self {
            Storage::Memory => StorageKind::Memory,
            Storage::Redis { .. } => StorageKind::Redis,
            Storage::RedisCached { .. } => StorageKind::RedisCached,
            Storage::RedisLeased { .. } => StorageKind::RedisLeased,
        }
    }

    /// The Redis URL and key prefix, for the storages in Redis.
    fn redis(&self) -> Option<(&str, &str)> {
        match self {
            Storage::Memory => None,
            Storage::Redis { url, prefix }
            | Storage::RedisCached { url, prefix, .. }
            | Storage::RedisLeased { url, prefix } => Some((url, prefix)),
        }
    }
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use tollgate_redis::redact_url;
        match self {
            Storage::Memory => f.write_str("Memory"),
            Storage::Redis { url, prefix } => {
                f.debug_struct("Redis").field("url", &redact_url(url)).field("prefix", prefix).finish()
            }
            Storage::RedisLeased { url, prefix } => {
                f.debug_struct("RedisLeased").field("url", &redact_url(url)).field("prefix", prefix).finish()
            }
            Storage::RedisCached { url, prefix, flush } => f
                .debug_struct("RedisCached")
                .field("url", &redact_url(url))
                .field("prefix", prefix)
                .field("flush", flush)
                .finish(),
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The limits file is missing or wrong.
    #[error("{0}")]
    Limits(#[from] PolicyError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Redis (for `Storage::Redis` or `Storage::RedisCached`) could not be reached; the message
    /// shows its URL without credentials.
    #[error("{0}")]
    Redis(#[from] tollgate_redis::BackendError),
    /// A limit of the file cannot be counted by the storage: `file:line:column: message`.
    #[error("{}:{}:{}: {}", file.display(), source.position.line, source.position.column, source.message())]
    Storage {
        /// The limits file the limit is in.
        file: PathBuf,
        /// Which limit, which algorithm, which storage.
        #[source]
        source: StorageError,
    },
    /// The file watcher could not start.
    #[error("cannot watch the limits file: {0}")]
    Watch(#[from] notify::Error),
    /// A TLS file is missing or wrong (the message names it).
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
}

/// A started server: its addresses (with the ports the OS chose for port 0) and its parts.
pub struct Running<C: Clock = SystemClock> {
    /// The gRPC (RLS) address.
    pub grpc: SocketAddr,
    /// The HTTP address.
    pub http: SocketAddr,
    /// The admin address, when [`ServeConfig::admin`] is set.
    pub admin: Option<SocketAddr>,
    /// The engine deciding.
    pub engine: Arc<Engine<C>>,
    /// The reloader of the limits.
    pub reloader: Arc<Reloader<C>>,
    shutdown: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _watchers: Vec<notify::RecommendedWatcher>,
}

impl<C: Clock + Clone> Running<C> {
    /// Stops accepting, finishes calls in flight, and returns when both listeners are closed.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        if let Err(e) = self.engine.close().await {
            tracing::warn!("closing the storage failed: {e}");
        }
    }
}

/// Loads the limits, binds both listeners and starts serving on the current tokio runtime.
pub async fn start<C: Clock + Clone>(config: &ServeConfig, clock: C) -> Result<Running<C>, ServeError> {
    let storage_error = |source: StorageError| ServeError::Storage { file: PathBuf::from(&source.source_name), source };
    let text = config.format.read(&config.limits)?;
    let policy = config.format.parse(&text)?;
    let time = config.time.redis_time(&clock);
    let mut engine = Engine::new(policy, config.mode, config.shadow, clock.clone())
        .with_counter_cap(config.counters)
        .with_request_bounds(config.bounds);
    let metrics = Arc::new(Metrics::new());
    let mut redis_store = None;
    if let Some((url, prefix)) = config.storage.redis() {
        let options = tollgate_redis::RedisOptions { deadline: config.redis_deadline, ..Default::default() };
        let redis = tollgate_redis::Redis::connect_with(url, options).await?;
        let store = RedisStore { redis, prefix: prefix.to_owned(), time };
        redis_store = Some(store.clone());
        // The Redis stores register their metrics in this server's recorder, not the global one.
        let kind = config.storage.kind();
        engine = metrics.recording(|| engine.with_redis_storage(kind, store)).map_err(storage_error)?;
    }
    let flush_every = match config.storage {
        Storage::RedisCached { flush, .. } => Some(flush),
        _ => None,
    };
    let engine = Arc::new(engine);
    let reloader = Arc::new(Reloader::new(&config.limits, config.format, text, engine.clone(), metrics.clone()));
    let mut watchers = Vec::new();
    if config.watch {
        watchers.push(reloader.clone().watch()?);
    }
    // One set-up per listener (they offer different protocols), both read again on a change.
    let tls = match &config.tls {
        None => None,
        Some(files) => Some(metrics.recording(|| {
            let grpc = Arc::new(Tls::load(files.clone(), "grpc", &[b"h2"])?);
            let http = Arc::new(Tls::load(files.clone(), "http", &[b"h2", b"http/1.1"])?);
            Ok::<_, TlsError>((grpc, http))
        })?),
    };
    if let Some((grpc, http)) = &tls {
        let (grpc, http) = (grpc.clone(), http.clone());
        watchers.push(watch::on_change(grpc.dirs(), move || {
            grpc.reload();
            http.reload();
        })?);
    }

    let bind = |addr: SocketAddr| async move {
        tokio::net::TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { addr, source })
    };
    let grpc_listener = bind(config.grpc).await?;
    let http_listener = bind(config.http).await?;
    let admin_listener = match config.admin {
        Some(addr) => Some(bind(addr).await?),
        None => None,
    };
    let grpc = grpc_listener.local_addr().map_err(|source| ServeError::Bind { addr: config.grpc, source })?;
    let http = http_listener.local_addr().map_err(|source| ServeError::Bind { addr: config.http, source })?;
    let admin = match (&admin_listener, config.admin) {
        (Some(listener), Some(addr)) => {
            Some(listener.local_addr().map_err(|source| ServeError::Bind { addr, source })?)
        }
        _ => None,
    };
    let (shutdown, signal) = tokio::sync::watch::channel(false);

    let (health, health_service) = tonic_health::server::health_reporter();
    for service in [methods::ENVOY, methods::KUADRANT, methods::RLQS] {
        health.set_service_status(service, tonic_health::ServingStatus::Serving).await;
    }
    let rls = Arc::new(
        Rls::new(engine.clone(), metrics.clone())
            .with_headers(config.rate_limit_headers)
            .with_dynamic_metadata(config.response_dynamic_metadata)
            .with_trace_parent(config.trace_parent.clone()),
    );
    let mut rlqs = Rlqs::new(engine.clone(), metrics.clone(), clock.clone(), config.rlqs);
    if let Some(store) = redis_store {
        // Replicas on one Redis share each limit among all their streams.
        rlqs = rlqs.with_redis(store);
    }
    let rlqs = Arc::new(rlqs);
    // On Redis, the windows of the limits other servers' Envoys hold are watched here too.
    let mut stop = signal.clone();
    let learn = Rlqs::learn_held_limits(Arc::downgrade(&rlqs));
    let learn_task = tokio::spawn(async move {
        tokio::select! {
            () = learn => {}
            () = stopped(&mut stop) => {}
        }
    });
    let rlqs = RateLimitQuotaServiceServer::new(RlqsService(rlqs));
    // The rate-limit calls are answered by `Unary`; tonic's routes serve health and RLQS.
    let routes = tonic::service::Routes::new(health_service).add_service(rlqs).prepare();
    let service = Unary::new(rls, routes);
    let timeout = config.grpc_read_timeout;
    let grpc_task = match &tls {
        None => tokio::spawn(serve_grpc(service, preface::incoming(grpc_listener, timeout), signal.clone())),
        Some((tls, _)) => {
            let incoming = preface::incoming_tls(grpc_listener, timeout, tls.clone());
            tokio::spawn(serve_grpc(service, incoming, signal.clone()))
        }
    };

    let upkeep_metrics = metrics.clone();
    let mut stop = signal.clone();
    let upkeep_task = tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = every.tick() => upkeep_metrics.upkeep(),
                () = stopped(&mut stop) => return,
            }
        }
    });

    let mut tasks = Vec::new();
    if let Some(every) = flush_every {
        let (engine, mut stop) = (engine.clone(), signal.clone());
        tasks.push(tokio::spawn(async move {
            // The first flush is one interval away (a plain interval ticks at once).
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.changed() => break,
                }
                if let Err(e) = engine.flush().await {
                    tracing::warn!("flush to Redis failed, the hits stay pending: {e}");
                }
            }
            // What was allowed before stopping is counted.
            if let Err(e) = engine.flush().await {
                tracing::warn!("last flush to Redis failed: {e}");
            }
        }));
    }

    let api = http::Api::new(engine.clone(), metrics.clone(), config.trace_parent.clone(), config.http_read_timeout);
    let read_timeout = config.http_read_timeout;
    let http_tls = tls.map(|(_, http)| http);
    let decisions = match admin_listener {
        None => http::routes(api.clone()),
        Some(listener) => {
            let admin = http1::Listener { routes: http::admin_routes(api.clone()), decides: false, tls: None };
            tasks.push(tokio::spawn(http1::serve(listener, api.clone(), admin, read_timeout, signal.clone())));
            http::decision_routes(api.clone())
        }
    };
    let serves = http1::Listener { routes: decisions, decides: true, tls: http_tls };
    let http_task = tokio::spawn(http1::serve(http_listener, api, serves, read_timeout, signal.clone()));
    tasks.extend([grpc_task, http_task, upkeep_task, learn_task]);
    Ok(Running { grpc, http, admin, engine, reloader, shutdown, tasks, _watchers: watchers })
}

/// Serves the gRPC services on `incoming` until `stop` says so.
async fn serve_grpc<C, S, IO>(
    service: Unary<C, tonic::service::Routes>,
    incoming: S,
    mut stop: tokio::sync::watch::Receiver<bool>,
) where
    C: Clock + Clone,
    S: futures::Stream<Item = std::io::Result<IO>> + Send + 'static,
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + tonic::transport::server::Connected + Unpin + Send + 'static,
{
    let stopping = async move { stopped(&mut stop).await };
    let served = tonic::transport::Server::builder()
        .layer(tower::util::MapResponseLayer::new(decode_errors_are_invalid_argument))
        .serve_with_incoming_shutdown(service, incoming, stopping)
        .await;
    if let Err(e) = served {
        tracing::error!("gRPC server stopped: {e}");
    }
}

/// tonic answers a request it cannot decode with INTERNAL; it is the caller's mistake, so say
/// INVALID_ARGUMENT (keeping tonic's message, which names the problem).
fn decode_errors_are_invalid_argument<B>(mut response: ::http::Response<B>) -> ::http::Response<B> {
    let headers = response.headers_mut();
    let internal = headers.get("grpc-status").is_some_and(|v| v.as_bytes() == b"13");
    let decode = headers.get("grpc-message").is_some_and(|v| v.as_bytes().starts_with(b"failed%20to%20decode"));
    if internal && decode {
        headers.insert("grpc-status", ::http::HeaderValue::from_static("3"));
    }
    response
}

impl<C: Clock> std::fmt::Debug for Running<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("grpc", &self.grpc)
            .field("http", &self.http)
            .field("admin", &self.admin)
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}
