//! # tollgate-load: load a rate-limit server and measure it
//!
//! The library behind `tollgate bench`: load a rate-limit server (`tollgate serve`, or anything
//! speaking Envoy's RLS v3 or Limitador's HTTP API) and measure its throughput, latency and
//! decisions.
//!
//! ```
//! # // A stand-in for `tollgate serve`: POST /check_and_report allows the first 50, then 429.
//! # async fn server(allowed: u64) -> String {
//! #     use std::sync::{Arc, atomic::{AtomicU64, Ordering}};
//! #     use axum::http::StatusCode;
//! #     let hits = Arc::new(AtomicU64::new(0));
//! #     let check = move || {
//! #         let first = hits.fetch_add(1, Ordering::Relaxed) < allowed;
//! #         async move { if first { StatusCode::OK } else { StatusCode::TOO_MANY_REQUESTS } }
//! #     };
//! #     let app = axum::Router::new().route("/check_and_report", axum::routing::post(check));
//! #     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
//! #     let target = listener.local_addr().unwrap().to_string();
//! #     tokio::spawn(async move { axum::serve(listener, app).await });
//! #     target
//! # }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tollgate_load::BenchError> {
//! # let target = server(50).await;
//! use std::time::Duration;
//! use tollgate_load::{BenchConfig, Protocol, run};
//!
//! let mut config = BenchConfig::new(Protocol::Http, target); // e.g. "127.0.0.1:8080"
//! config.connections = 2;
//! config.duration = Duration::from_millis(100);
//! config.warmup = Duration::ZERO;
//! let report = run(config).await?;
//!
//! assert_eq!(report.allowed, 50);
//! assert_eq!(report.requests, report.allowed + report.limited + report.errors);
//! println!("{:.0} req/s, p99 {} µs", report.rps, report.p99_us);
//! # Ok(()) }
//! ```
//!
//! [`run`] opens [`BenchConfig::connections`] connections to the target, keeps at most
//! [`BenchConfig::concurrency`] requests in flight on each, and sends for [`BenchConfig::warmup`]
//! plus [`BenchConfig::duration`]: [`Protocol::Grpc`] calls `ShouldRateLimit`, each request an
//! HTTP/2 stream; [`Protocol::Http`] posts `/check_and_report` on HTTP/1.1 keep-alive connections.
//! Two [engines](Engine) do it:
//!
//! - [`Engine::Raw`] (the default) writes each request's bytes, encoded from parts made once, on
//!   plain TCP connections and reads the answers with the least parsing that tells them apart
//!   (for gRPC, HTTP/2 frames written and read by this crate; for HTTP, requests pipelined up to
//!   the concurrency). [`BenchConfig::threads`] threads share the connections. In open loop each
//!   looks at its sockets once per [tick](BenchConfig::tick) (100 µs) and sleeps in between, so answers do not wake it one
//!   by one: on a 2-core VM, about a third to a half of the client engine's CPU per request
//!   (measured: docs/benchmarks.md, "Server CPU per decision"), so the load tool keeps spare capacity at half a
//!   server's peak. Latencies read high by up to a tick.
//! - [`Engine::Client`]: tonic's client (one channel per connection, a task per stream) and
//!   hyper's (a task per connection, so the HTTP concurrency must be 1) on the caller's runtime;
//!   about one core at 48,000 RLS calls/s on that VM. Kept to compare with.
//!
//! Request `i` (numbered across all tasks) has `req.method` = `POST` when `i % 3 == 0`, `GET`
//! otherwise, and `user_id` = `user-{i % keys}`: the RLS request's first descriptor, or the HTTP
//! body's `values`. An RLS request has [`BenchConfig::descriptors`] descriptors, the others being
//! `{"k{d}": "v{i % keys}"}`; the domain (the HTTP `namespace`) is [`BenchConfig::namespace`], the
//! hits 1.
//!
//! **Closed loop** (no [`BenchConfig::rate`]): each request in flight is followed by the next as
//! soon as it is answered: the most the server does at that concurrency. **Open loop** (a rate
//! `R`): request `i` is due at `i / R` seconds after the start, whoever answers when. A request
//! that finds no room when due (every request in flight on its connection, or every connection's,
//! still waiting for an answer) goes out late, and its latency is counted from when it was due, so
//! a slow server is not hidden by the load slowing down with it (no coordinated omission). One
//! that had room counts from when it was sent: the load tool's own lateness is not the server's.
//! Requests go out when due rather than in bursts: the raw engine at the first of its 100 µs ticks
//! at or after the due time, and the client engine's tasks sleep until 1 ms before a request is
//! due and then yield until it is.
//!
//! What counts: the requests due (closed loop: sent) after the warmup and before the end of the
//! duration, every one of them waited for: `requests == allowed + limited + errors` is everything
//! the server decided in the measured window. `seconds` runs from the end of the warmup to the
//! later of the end of the duration and the last answer. Latencies are those of the answered
//! requests (allowed or limited), not of the errors.
#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub, missing_debug_implementations)]
#![forbid(unsafe_code)]

mod grpc;
mod http;
mod raw;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// The most connections (and tasks per connection) accepted.
const MAX_CONNECTIONS: usize = 10_000;
/// The most tasks in all.
const MAX_TASKS: usize = 100_000;
/// The most descriptors per RLS request.
const MAX_DESCRIPTORS: usize = 64;
/// How long a task waits after a connection-level error before trying again.
const BACKOFF: Duration = Duration::from_millis(10);
/// The most threads of the raw engine.
const MAX_THREADS: usize = 1024;

/// What sends the requests and reads the answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// Requests as bytes on plain TCP connections, answers read with the least parsing that tells
    /// them apart (HTTP/2 frames written and read by this crate for gRPC, HTTP/1.1 pipelined), on
    /// [`BenchConfig::threads`] threads of its own that look at their sockets in 100 µs ticks (open
    /// loop): less CPU per request than [`Engine::Client`]. Latencies read high by up to a tick.
    #[default]
    Raw,
    /// tonic's gRPC client (a channel per connection, a task per stream) and hyper's HTTP/1.1
    /// client (a task per connection, one request at a time), on the caller's runtime: the
    /// engine before [`Engine::Raw`], kept to compare with.
    Client,
}

impl Engine {
    /// `raw` or `client`.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Raw => "raw",
            Engine::Client => "client",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which API to load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// Envoy's rate limit service v3 (`ShouldRateLimit`) over gRPC.
    Grpc,
    /// The HTTP API's `POST /check_and_report`.
    Http,
}

impl Protocol {
    /// Connections opened when not told: 4 for gRPC (each multiplexes), 32 for HTTP.
    pub fn default_connections(self) -> usize {
        match self {
            Protocol::Grpc => 4,
            Protocol::Http => 32,
        }
    }

    /// Requests in flight per connection when not told: 16 HTTP/2 streams for gRPC, 1 for
    /// HTTP/1.1.
    pub fn default_concurrency(self) -> usize {
        match self {
            Protocol::Grpc => 16,
            Protocol::Http => 1,
        }
    }

    /// `grpc` or `http`.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::Http => "http",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What to load and how.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchConfig {
    /// The API.
    pub protocol: Protocol,
    /// The server, `host:port` (an `http://` in front is accepted).
    pub target: String,
    /// What sends the requests.
    pub engine: Engine,
    /// Connections to open.
    pub connections: usize,
    /// Requests in flight on each connection at most: HTTP/2 streams for gRPC; for HTTP, requests
    /// pipelined with [`Engine::Raw`], and 1 with [`Engine::Client`].
    pub concurrency: usize,
    /// Threads of [`Engine::Raw`] (at most one per connection); [`Engine::Client`] runs on the
    /// caller's runtime and ignores it.
    pub threads: usize,
    /// How long to measure.
    pub duration: Duration,
    /// How long to send before measuring (not counted; the server does count these hits).
    pub warmup: Duration,
    /// The namespace (the RLS domain).
    pub namespace: String,
    /// Descriptors per RLS request (gRPC only; the HTTP API has one).
    pub descriptors: usize,
    /// Distinct `user_id` values.
    pub keys: u64,
    /// Offered load in requests per second, open loop; `None`: closed loop, max throughput.
    pub rate: Option<f64>,
    /// How long to wait for a connection or an answer; an answer later than that is an error.
    pub timeout: Duration,
    /// How often a thread of [`Engine::Raw`] looks at its sockets in open loop while requests are
    /// in flight: answers are timed when the tick that reads them starts (latencies read high by
    /// up to a tick), and the requests due within a tick go out together. Shorter ticks time
    /// answers closer and cost the load tool more CPU per request (each tick is a wake-up).
    pub tick: Duration,
}

impl BenchConfig {
    /// The defaults for `protocol` against `target`: [`Engine::Raw`] on as many threads as the
    /// process may use cores, ticking every 100 µs, the protocol's connections and concurrency,
    /// 10 s after 1 s of warmup, namespace `example.org`, 2 descriptors, 1000 keys, closed loop,
    /// 5 s timeout.
    pub fn new(protocol: Protocol, target: impl Into<String>) -> BenchConfig {
        BenchConfig {
            protocol,
            target: target.into(),
            engine: Engine::Raw,
            connections: protocol.default_connections(),
            concurrency: protocol.default_concurrency(),
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(1),
            namespace: "example.org".to_string(),
            descriptors: 2,
            keys: 1000,
            rate: None,
            timeout: Duration::from_secs(5),
            tick: Duration::from_micros(100),
        }
    }
}

/// What a run measured (see the [crate docs](crate) for what counts).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BenchReport {
    /// Requests in the measured window: `allowed + limited + errors`.
    pub requests: u64,
    /// Length of the measured window, in seconds.
    pub seconds: f64,
    /// `requests / seconds`.
    pub rps: f64,
    /// Median latency, in microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, in microseconds.
    pub p99_us: f64,
    /// 99.9th percentile latency, in microseconds.
    pub p999_us: f64,
    /// Highest latency, in microseconds.
    pub max_us: f64,
    /// Mean latency, in microseconds.
    pub mean_us: f64,
    /// Requests allowed (RLS `OK`, HTTP 200).
    pub allowed: u64,
    /// Requests limited (RLS `OVER_LIMIT`, HTTP 429).
    pub limited: u64,
    /// Requests that failed: transport errors, timeouts, other statuses.
    pub errors: u64,
    /// The first error's message.
    pub first_error: Option<String>,
}

impl BenchReport {
    /// True when no request in the measured window got an answer (all failed, or none was sent).
    pub fn all_failed(&self) -> bool {
        self.errors == self.requests
    }
}

/// Why a run could not happen. A setting is named as its [`BenchConfig`] field, which is also
/// its `tollgate bench` flag, and the error carries the value refused.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use tollgate_load::{BenchConfig, BenchError, Protocol, run};
///
/// let mut config = BenchConfig::new(Protocol::Grpc, "127.0.0.1:8081");
/// config.connections = 0;
/// let error = run(config).await.unwrap_err();      // refused before connecting
/// assert!(matches!(error, BenchError::OutOfRange { setting: "connections", value: 0, .. }));
/// assert_eq!(error.to_string(), "--connections must be between 1 and 10000, not 0");
/// assert!(error.is_usage());
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// [`BenchConfig::target`] is not `HOST:PORT` (an `http://` in front is accepted).
    #[error("invalid --target `{target}`: expected HOST:PORT, e.g. 127.0.0.1:8081")]
    Target {
        /// The target as given (trimmed).
        target: String,
    },
    /// A count out of its range: `connections`, `concurrency`, `threads` or `descriptors`.
    #[error("--{setting} must be between {min} and {max}, not {value}")]
    OutOfRange {
        /// The setting.
        setting: &'static str,
        /// The value given.
        value: usize,
        /// The least accepted.
        min: usize,
        /// The most accepted.
        max: usize,
    },
    /// [`Protocol::Http`] on [`Engine::Client`] with more than one request in flight per
    /// connection.
    #[error(
        "--concurrency must be 1 for http on the client engine, not {concurrency}: hyper's HTTP/1.1 \
         client carries one request at a time; open more --connections, or use --engine raw (pipelined)"
    )]
    HttpConcurrency {
        /// The concurrency given.
        concurrency: usize,
    },
    /// More tasks (`connections * concurrency`) than one run accepts.
    #[error("--connections times --concurrency must be at most {max}, not {connections} x {concurrency}")]
    TooManyTasks {
        /// The connections given.
        connections: usize,
        /// The concurrency given.
        concurrency: usize,
        /// The most tasks accepted.
        max: usize,
    },
    /// A duration that must not be zero is: `duration`, `timeout` or `tick`.
    #[error("--{setting} must be longer than zero")]
    ZeroDuration {
        /// The setting.
        setting: &'static str,
    },
    /// `warmup + duration` from now is past any time the clock can represent.
    #[error("--warmup plus --duration is too long: {warmup:?} + {duration:?}")]
    TooLong {
        /// The warmup given.
        warmup: Duration,
        /// The duration given.
        duration: Duration,
    },
    /// [`BenchConfig::namespace`] is empty.
    #[error("--namespace must not be empty")]
    EmptyNamespace,
    /// [`BenchConfig::keys`] is 0.
    #[error("--keys must be at least 1")]
    ZeroKeys,
    /// [`BenchConfig::rate`] is not a positive, finite number.
    #[error("--rate must be a positive number of requests per second, not {rate}")]
    Rate {
        /// The rate given.
        rate: f64,
    },
    /// A connection to the target could not be opened.
    #[error("cannot connect to {target} over {protocol}: {message}")]
    Connect {
        /// The target.
        target: String,
        /// The protocol.
        protocol: Protocol,
        /// Why.
        message: String,
    },
    /// A task of the run (connecting or sending) panicked or was cancelled.
    #[error("a bench task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
    /// A latency histogram could not be created.
    #[error("latency histogram: {0}")]
    Histogram(#[source] hdrhistogram::CreationError),
    /// The tasks' latency histograms could not be merged.
    #[error("latency histogram: {0}")]
    Merge(#[source] hdrhistogram::AdditionError),
    /// The raw engine could not set up or poll its sockets.
    #[error("the raw engine: {0}")]
    Engine(#[source] std::io::Error),
}

impl BenchError {
    /// True for a bad configuration (the user's to fix; exit code 2).
    pub fn is_usage(&self) -> bool {
        match self {
            BenchError::Target { .. }
            | BenchError::OutOfRange { .. }
            | BenchError::HttpConcurrency { .. }
            | BenchError::TooManyTasks { .. }
            | BenchError::ZeroDuration { .. }
            | BenchError::TooLong { .. }
            | BenchError::EmptyNamespace
            | BenchError::ZeroKeys
            | BenchError::Rate { .. } => true,
            BenchError::Connect { .. }
            | BenchError::Task(_)
            | BenchError::Histogram(_)
            | BenchError::Merge(_)
            | BenchError::Engine(_) => false,
        }
    }
}

/// Connects to the target, loads it for `config.warmup + config.duration` on the current tokio
/// runtime, and reports the measured window. Fails before sending anything on a bad configuration
/// or if a connection cannot be opened.
pub async fn run(config: BenchConfig) -> Result<BenchReport, BenchError> {
    let authority = validate(&config)?;
    let shape = Shape { namespace: config.namespace.clone(), descriptors: config.descriptors, keys: config.keys };
    match config.engine {
        Engine::Raw => raw::run(&config, &authority, shape).await,
        Engine::Client => run_client(config, authority, Arc::new(shape)).await,
    }
}

/// [`run`] on [`Engine::Client`].
async fn run_client(config: BenchConfig, authority: String, shape: Arc<Shape>) -> Result<BenchReport, BenchError> {
    let tasks = config.connections * config.concurrency;
    let clients = connect(&config, &authority, &shape).await?;

    let mut histograms = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        histograms.push(histogram()?);
    }
    let (start, measure_start, deadline) = run_times(&config)?;
    let plan = Arc::new(Plan {
        start,
        measure_start,
        deadline,
        tasks: tasks as u64,
        rate: config.rate,
        timeout: config.timeout,
    });
    let mut running = JoinSet::new();
    for (index, (client, latency)) in clients.into_iter().zip(histograms).enumerate() {
        running.spawn(worker(client, index as u64, plan.clone(), latency));
    }

    let mut stats = Vec::with_capacity(tasks);
    while let Some(joined) = running.join_next().await {
        stats.push(joined.map_err(BenchError::Task)?);
    }
    merge(stats, measure_start.into_std(), deadline.into_std())
}

/// The report of a run whose tasks or threads measured `stats`.
fn merge(
    stats: Vec<Stats>,
    measure_start: std::time::Instant,
    deadline: std::time::Instant,
) -> Result<BenchReport, BenchError> {
    let mut total = Stats::new(histogram()?);
    let mut end = deadline;
    for stats in stats {
        if let Some(last) = stats.last_answer {
            end = end.max(last);
        }
        total.latency.add(&stats.latency).map_err(BenchError::Merge)?;
        total.allowed += stats.allowed;
        total.limited += stats.limited;
        total.errors += stats.errors;
        if total.first_error.is_none() {
            total.first_error = stats.first_error;
        }
    }
    Ok(total.report(end.saturating_duration_since(measure_start)))
}

/// Checks everything before connecting; returns the target as `host:port`.
fn validate(config: &BenchConfig) -> Result<String, BenchError> {
    let target = config.target.trim();
    let authority = target.strip_prefix("http://").unwrap_or(target).trim_end_matches('/');
    let valid_authority =
        format!("http://{authority}/").parse::<hyper::Uri>().ok().and_then(|uri| uri.authority().cloned()).is_some_and(
            |a| a.as_str() == authority && a.port_u16().is_some() && !a.host().is_empty() && !authority.contains('@'),
        );
    if !valid_authority {
        return Err(BenchError::Target { target: target.to_string() });
    }
    let in_range = |setting: &'static str, value: usize, max: usize| {
        if (1..=max).contains(&value) { Ok(()) } else { Err(BenchError::OutOfRange { setting, value, min: 1, max }) }
    };
    in_range("connections", config.connections, MAX_CONNECTIONS)?;
    in_range("concurrency", config.concurrency, MAX_CONNECTIONS)?;
    in_range("threads", config.threads, MAX_THREADS)?;
    if config.protocol == Protocol::Http && config.engine == Engine::Client && config.concurrency != 1 {
        return Err(BenchError::HttpConcurrency { concurrency: config.concurrency });
    }
    if config.connections * config.concurrency > MAX_TASKS {
        return Err(BenchError::TooManyTasks {
            connections: config.connections,
            concurrency: config.concurrency,
            max: MAX_TASKS,
        });
    }
    if config.duration.is_zero() {
        return Err(BenchError::ZeroDuration { setting: "duration" });
    }
    if config.timeout.is_zero() {
        return Err(BenchError::ZeroDuration { setting: "timeout" });
    }
    if config.tick.is_zero() {
        return Err(BenchError::ZeroDuration { setting: "tick" });
    }
    if config.namespace.is_empty() {
        return Err(BenchError::EmptyNamespace);
    }
    in_range("descriptors", config.descriptors, MAX_DESCRIPTORS)?;
    if config.keys == 0 {
        return Err(BenchError::ZeroKeys);
    }
    match config.rate {
        Some(rate) if !(rate.is_finite() && rate > 0.0) => Err(BenchError::Rate { rate }),
        _ => Ok(authority.to_string()),
    }
}

/// What every request shares.
#[derive(Debug)]
struct Shape {
    namespace: String,
    descriptors: usize,
    keys: u64,
}

impl Shape {
    /// Request `i`'s `req.method`: a third are POSTs.
    fn method(i: u64) -> &'static str {
        if i % 3 == 0 { "POST" } else { "GET" }
    }
}

/// Opens the connections (all at once) and returns one client per task.
async fn connect(config: &BenchConfig, authority: &str, shape: &Arc<Shape>) -> Result<Vec<Client>, BenchError> {
    let connect_error =
        |message: String| BenchError::Connect { target: authority.to_string(), protocol: config.protocol, message };
    let mut clients = Vec::with_capacity(config.connections * config.concurrency);
    match config.protocol {
        Protocol::Grpc => {
            let mut connecting = JoinSet::new();
            for _ in 0..config.connections {
                connecting.spawn(grpc::Client::connect(authority.to_string(), shape.clone(), config.timeout));
            }
            while let Some(joined) = connecting.join_next().await {
                let client = joined.map_err(BenchError::Task)?.map_err(connect_error)?;
                // The tasks of one connection share its channel: each clone is a stream on it.
                for _ in 0..config.concurrency {
                    clients.push(Client::Grpc(client.clone()));
                }
            }
        }
        Protocol::Http => {
            let host = hyper::header::HeaderValue::from_str(authority)
                .map_err(|_| BenchError::Target { target: authority.to_string() })?;
            let mut connecting = JoinSet::new();
            for _ in 0..config.connections * config.concurrency {
                let mut client = http::Client::new(authority.to_string(), host.clone(), shape, config.timeout);
                connecting.spawn(async move { client.connect().await.map(|()| client) });
            }
            while let Some(joined) = connecting.join_next().await {
                clients.push(Client::Http(joined.map_err(BenchError::Task)?.map_err(connect_error)?));
            }
        }
    }
    Ok(clients)
}

/// One task's client.
enum Client {
    Grpc(grpc::Client),
    Http(http::Client),
}

impl Client {
    async fn call(&mut self, i: u64) -> Result<Verdict, CallError> {
        match self {
            Client::Grpc(client) => client.call(i).await,
            Client::Http(client) => client.call(i).await,
        }
    }
}

/// The server's decision.
enum Verdict {
    Allowed,
    Limited,
}

/// A request that got no decision.
struct CallError {
    message: String,
    /// The connection failed (rather than the request): wait a little before the next.
    connection: bool,
}

/// The timing of a run, shared by its tasks.
struct Plan {
    start: Instant,
    measure_start: Instant,
    deadline: Instant,
    tasks: u64,
    rate: Option<f64>,
    timeout: Duration,
}

impl Plan {
    /// When request `i` is due in open loop (`None` past any representable time).
    fn due(&self, i: u64, rate: f64) -> Option<Instant> {
        let offset = Duration::try_from_secs_f64(i as f64 / rate).ok()?;
        self.start.checked_add(offset)
    }
}

/// The timer wakes a task up to its granularity (1 ms) late, and every task due in the same
/// millisecond at once: at R requests/s the server would get bursts of R/1000 and the latency
/// would measure their queueing, not the server.
const TIMER_SLACK: Duration = Duration::from_millis(1);

/// Returns at `due`: asleep until the last [`TIMER_SLACK`] before it, then yielding to the other
/// tasks until it comes, so requests go out when due and not in the timer's bursts.
async fn send_at(due: Instant) {
    if let Some(early) = due.checked_sub(TIMER_SLACK)
        && early > Instant::now()
    {
        tokio::time::sleep_until(early).await;
    }
    while Instant::now() < due {
        tokio::task::yield_now().await;
    }
}

/// One task: send requests `index`, `index + tasks`, ... until the deadline.
async fn worker(mut client: Client, index: u64, plan: Arc<Plan>, latency: Histogram<u64>) -> Stats {
    let mut stats = Stats::new(latency);
    let mut previous_answer = plan.start;
    let mut round: u64 = 0;
    loop {
        let i = index.saturating_add(round.saturating_mul(plan.tasks));
        round += 1;
        // `due` decides the window the request belongs to; `from` is where its latency starts.
        let (due, from) = match plan.rate {
            None => {
                let now = Instant::now();
                (now, now)
            }
            Some(rate) => {
                let Some(due) = plan.due(i, rate) else { break };
                if due >= plan.deadline {
                    break;
                }
                send_at(due).await;
                // Late because the server was still answering the previous request: that wait
                // counts. Idle until now: only the timer was late, and that does not.
                (due, if previous_answer > due { due } else { Instant::now() })
            }
        };
        if due >= plan.deadline {
            break;
        }
        let result = tokio::time::timeout(plan.timeout, client.call(i)).await;
        let answered = Instant::now();
        previous_answer = answered;
        let measured = due >= plan.measure_start;
        if measured {
            stats.last_answer = Some(answered.into_std());
        }
        let error = match result {
            Ok(Ok(verdict)) => {
                if measured {
                    let ns = u64::try_from(answered.saturating_duration_since(from).as_nanos()).unwrap_or(u64::MAX);
                    if stats.latency.record(ns).is_err() {
                        stats.latency.saturating_record(ns);
                    }
                    match verdict {
                        Verdict::Allowed => stats.allowed += 1,
                        Verdict::Limited => stats.limited += 1,
                    }
                }
                continue;
            }
            Ok(Err(error)) => error,
            Err(_) => CallError { message: format!("no answer within {:?}", plan.timeout), connection: false },
        };
        if measured {
            stats.errors += 1;
            if stats.first_error.is_none() {
                stats.first_error = Some(error.message);
            }
        }
        if error.connection && plan.rate.is_none() {
            tokio::time::sleep(BACKOFF).await;
        }
    }
    stats
}

/// A latency histogram in nanoseconds, 3 significant digits, growing as values need (`record`
/// resizes; `saturating_record` would clamp to the current range).
fn histogram() -> Result<Histogram<u64>, BenchError> {
    Histogram::new(3).map_err(BenchError::Histogram)
}

/// What one task (or all of them, merged) measured.
struct Stats {
    latency: Histogram<u64>,
    allowed: u64,
    limited: u64,
    errors: u64,
    first_error: Option<String>,
    last_answer: Option<std::time::Instant>,
}

impl Stats {
    fn new(latency: Histogram<u64>) -> Stats {
        Stats { latency, allowed: 0, limited: 0, errors: 0, first_error: None, last_answer: None }
    }

    fn report(self, window: Duration) -> BenchReport {
        let requests = self.allowed + self.limited + self.errors;
        let seconds = window.as_secs_f64();
        let rps = if seconds > 0.0 { requests as f64 / seconds } else { 0.0 };
        let us = |ns: u64| ns as f64 / 1000.0;
        let at = |q: f64| if self.latency.is_empty() { 0.0 } else { us(self.latency.value_at_quantile(q)) };
        BenchReport {
            requests,
            seconds: (seconds * 1e6).round() / 1e6,
            rps: (rps * 100.0).round() / 100.0,
            p50_us: at(0.5),
            p99_us: at(0.99),
            p999_us: at(0.999),
            max_us: if self.latency.is_empty() { 0.0 } else { us(self.latency.max()) },
            mean_us: (self.latency.mean()).round() / 1000.0,
            allowed: self.allowed,
            limited: self.limited,
            errors: self.errors,
            first_error: self.first_error,
        }
    }
}

/// `e` and its sources, `: `-separated (tonic's and hyper's errors say little on their own).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = inner.source();
    }
    message
}

/// When a run starts, when measuring starts (after the warm-up), and when it ends.
pub(crate) fn run_times(config: &BenchConfig) -> Result<(Instant, Instant, Instant), BenchError> {
    let start = Instant::now();
    let too_long = || BenchError::TooLong { warmup: config.warmup, duration: config.duration };
    let measure_start = start.checked_add(config.warmup).ok_or_else(too_long)?;
    let deadline = measure_start.checked_add(config.duration).ok_or_else(too_long)?;
    Ok((start, measure_start, deadline))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_must_be_host_and_port() {
        let ok = |t: &str| validate(&BenchConfig::new(Protocol::Grpc, t));
        assert_eq!(ok("127.0.0.1:8081").unwrap(), "127.0.0.1:8081");
        assert_eq!(ok("http://localhost:8081/").unwrap(), "localhost:8081");
        assert_eq!(ok("[::1]:8081").unwrap(), "[::1]:8081");
        for bad in ["", "127.0.0.1", "127.0.0.1:", "a b:80", "host:80/path", "https://host:80", "u@host:80"] {
            assert!(ok(bad).is_err_and(|e| e.is_usage()), "{bad:?}");
        }
    }

    #[test]
    fn bad_settings_are_usage_errors_naming_the_setting_and_value() {
        let base = BenchConfig::new(Protocol::Http, "127.0.0.1:8080");
        // A change to the base configuration, and what the error says.
        type Case = (fn(&mut BenchConfig), &'static str);
        let cases: [Case; 14] = [
            (|c| c.target = "nowhere".into(), "invalid --target `nowhere`: expected HOST:PORT"),
            (|c| c.connections = 0, "--connections must be between 1 and 10000, not 0"),
            (
                |c| (c.engine, c.concurrency) = (Engine::Client, 2),
                "--concurrency must be 1 for http on the client engine, not 2",
            ),
            (|c| c.duration = Duration::ZERO, "--duration must be longer than zero"),
            (|c| c.timeout = Duration::ZERO, "--timeout must be longer than zero"),
            (|c| c.tick = Duration::ZERO, "--tick must be longer than zero"),
            (|c| c.namespace.clear(), "--namespace must not be empty"),
            (|c| c.descriptors = 65, "--descriptors must be between 1 and 64, not 65"),
            (|c| c.threads = 0, "--threads must be between 1 and 1024, not 0"),
            (|c| c.keys = 0, "--keys must be at least 1"),
            (|c| c.rate = Some(0.0), "--rate must be a positive number of requests per second, not 0"),
            (|c| c.rate = Some(f64::NAN), "not NaN"),
            (|c| c.rate = Some(f64::INFINITY), "not inf"),
            (
                |c| (c.protocol, c.connections, c.concurrency) = (Protocol::Grpc, 1000, 1000),
                "--connections times --concurrency must be at most 100000, not 1000 x 1000",
            ),
        ];
        for (n, (case, message)) in cases.iter().enumerate() {
            let mut config = base.clone();
            case(&mut config);
            let error = validate(&config).expect_err("refused");
            assert!(error.is_usage(), "case {n}: {config:?}");
            assert!(error.to_string().contains(message), "case {n}: {error}");
        }
        assert!(validate(&base).is_ok());
        let mut config = base.clone();
        config.descriptors = 0;
        assert!(matches!(
            validate(&config),
            Err(BenchError::OutOfRange { setting: "descriptors", value: 0, min: 1, max: MAX_DESCRIPTORS })
        ));
    }
}
