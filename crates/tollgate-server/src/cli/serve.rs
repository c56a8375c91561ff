//! `tollgate serve`: load the limits, bind the RLS (gRPC) and HTTP listeners, serve until Ctrl-C
//! or SIGTERM.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tollgate::{AtKeyLimit, SystemClock};
use tollgate_server::serve::{
    CounterCap, HeaderDraft, Mode, RequestBounds, RlqsConfig, ServeConfig, ServeError, Storage, TlsFiles, start,
};
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use super::LimitsFormat;

/// Arguments of `tollgate serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The limits file (Limitador's YAML format; see `tollgate check-config`), or with
    /// `--format envoy` envoy/ratelimit's configuration: a directory of YAML files (or one file).
    #[arg(long, value_name = "PATH")]
    limits: PathBuf,

    /// The format of --limits: `limitador` (a limits file) or `envoy` (envoy/ratelimit's
    /// `domain` and `descriptors` files, read from a directory; `tollgate convert` shows the limits
    /// they make).
    #[arg(long, value_enum, default_value = "limitador")]
    format: LimitsFormat,

    #[arg(long, help = super::MERGE_DOMAINS)]
    merge_domains: bool,

    /// Address of Envoy's rate limit service (gRPC, `envoy.service.ratelimit.v3`) and gRPC health.
    #[arg(long, default_value = "127.0.0.1:8081", value_name = "ADDR")]
    grpc: SocketAddr,

    /// Address of the HTTP API (`/check`, `/report`, `/check_and_report`, `/limits/{ns}`,
    /// `/counters/{ns}`, `/status`) and Prometheus `/metrics`.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    http: SocketAddr,

    /// Serve the endpoints for operators (`/limits/{ns}`, `/counters/{ns}` with its `DELETE`
    /// that resets counters, `/metrics`, `/status`) on this address instead, in plaintext; the
    /// --http listener then serves only `/check`, `/report`, `/check_and_report` and `/status`.
    /// Keep this port out of the Service Envoy and the callers use.
    #[arg(long, value_name = "ADDR")]
    admin: Option<SocketAddr>,

    /// TLS on the --grpc and --http listeners: the server's certificate chain (PEM, leaf
    /// first). Needs --tls-key. Read again when the file changes (a rotated Kubernetes Secret).
    #[arg(long, value_name = "PATH", requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Require a client certificate signed by a CA in this PEM file on every connection (mTLS:
    /// Envoy's `transport_socket` to the rate-limit cluster); a caller without one cannot connect.
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,

    /// Where counters live: `memory` (this process) or `redis` (shared by every server on the
    /// same Redis and prefix; fixed_window limits only).
    #[arg(long, value_enum, default_value = "memory")]
    storage: StorageKind,

    /// Redis URL for `--storage redis` and `redis-cached`: `redis://host:6379/0`, or with TLS
    /// `rediss://host:6380/0` (optional `?tls_ca=CA.pem&tls_cert=CERT.pem&tls_key=KEY.pem`).
    #[arg(long, default_value = "redis://127.0.0.1:6379", value_name = "URL")]
    redis_url: String,

    /// With counters in Redis: longest a decision waits for Redis before the call is answered
    /// unavailable (gRPC UNAVAILABLE, HTTP 503); consecutive misses back off (25 ms doubling to
    /// 500 ms) before Redis is asked again. RLQS assignment rounds, off the request path, wait
    /// at least 1 s.
    #[arg(long, default_value = "50ms", value_name = "DURATION", value_parser = tollgate::parse_duration)]
    redis_deadline: Duration,

    /// Prefix of the Redis keys.
    #[arg(long, default_value = "tollgate:", value_name = "PREFIX")]
    redis_prefix: String,

    /// How long an HTTP connection may take to send a request whole (a decision call's head and
    /// body; another request's head): the first within this of its opening, each next one within
    /// one to two times this of the last answer. Past it the connection closes, as a kept-alive
    /// one idle that long does, and one whose answers stay unread that long (an HTTP/2 one: that
    /// sends nothing that long). 0 for no limit.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = tollgate::parse_duration_or_zero)]
    http_read_timeout: Duration,

    /// How long a gRPC connection may take to send HTTP/2's preface after it opens (or it
    /// closes), and stay silent before its peer is probed (TCP keep-alive: a peer that is gone is
    /// reset about twice this after its last packet). 0 for neither.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = tollgate::parse_duration_or_zero)]
    grpc_read_timeout: Duration,

    /// With `--storage redis-cached`: how often local counts are flushed to Redis.
    #[arg(long, default_value = "100ms", value_name = "DURATION", value_parser = tollgate::parse_duration)]
    flush_every: Duration,

    /// accuracy: all counters of a request are checked and updated together (no overshoot);
    /// throughput: each counter on its own (faster, may briefly overshoot under contention).
    #[arg(long, value_enum, default_value = "accuracy")]
    mode: ModeArg,

    /// Decide and count, report in metrics and logs what would have been limited, allow everything.
    #[arg(long)]
    shadow: bool,

    /// Do not reload the limits file when it changes.
    #[arg(long)]
    no_watch: bool,

    /// Most in-memory counters per limit (one per distinct combination of its variables'
    /// values); a limit's `max_counters` in the file wins. Idle counters are removed as new
    /// ones come; this bounds the live ones, so a flood of distinct values cannot take the
    /// server's memory.
    #[arg(long, default_value = "10000000", value_name = "N")]
    max_counters: NonZeroUsize,

    /// What a new counter gets when its limit keeps --max-counters and none is idle; a limit's
    /// `at_max_counters` in the file wins. `reject` (the default: nobody gets an uncounted
    /// window by flooding new values; the answer says when one goes idle), `evict` (the counter
    /// nearest to idle makes room: its holder may get up to max_value more), `admit` (allowed
    /// without counting: fail open).
    #[arg(long, value_enum, default_value = "reject")]
    at_max_counters: AtMaxCounters,

    /// Most bytes the in-memory counters of one limit take: the text of their variables'
    /// values and their table entries (`4096`, `64KiB`, `1GiB`). Past it, a new counter gets
    /// what --at-max-counters says, as past --max-counters: long values cannot take the
    /// server's memory any more than many values can.
    #[arg(long, default_value = "1GiB", value_name = "BYTES", value_parser = bytes)]
    max_counter_bytes: NonZeroUsize,

    /// Most bytes in one descriptor entry's key or value; a request with a longer one is
    /// refused (HTTP 400, gRPC INVALID_ARGUMENT) before anything is counted.
    #[arg(long, default_value = "4KiB", value_name = "BYTES", value_parser = bytes)]
    max_value_bytes: NonZeroUsize,

    /// Most bytes in one request's namespace and descriptor entries together (refused past it).
    #[arg(long, default_value = "64KiB", value_name = "BYTES", value_parser = bytes)]
    max_request_bytes: NonZeroUsize,

    /// Most entries in one descriptor (refused past it).
    #[arg(long, default_value = "64", value_name = "N")]
    max_entries: NonZeroUsize,

    /// Most descriptors in one request (refused past it).
    #[arg(long, default_value = "64", value_name = "N")]
    max_descriptors: NonZeroUsize,

    /// RateLimit headers in Envoy RLS replies (`response_headers_to_add`), as the HTTP API
    /// sends them when asked: draft03 (`X-RateLimit-Limit`, `-Remaining`, `-Reset`, as
    /// Limitador's `DRAFT_VERSION_03`) or draft10 (`RateLimit-Policy`, `RateLimit`). None by
    /// default.
    #[arg(long, value_enum, value_name = "DRAFT")]
    rate_limit_headers: Option<DraftArg>,

    /// Describe each RLS request in the reply's `dynamic_metadata` (its domain, descriptors and
    /// hits_addend) with the `metadata` of the rules it passed, as envoy/ratelimit's
    /// `RESPONSE_DYNAMIC_METADATA=true`. Off by default (the names of exceeded quotas are sent
    /// either way).
    #[arg(long)]
    response_dynamic_metadata: bool,

    /// How long an RLQS assignment lasts in Envoy unless the next report renews it, in whole
    /// seconds (Envoy reads no more). Envoy reports every 5 s; past this after the last answer
    /// (a server gone, a stream broken) Envoy falls back to the filter's
    /// `expired_assignment_behavior`, and the server hands the share to the others.
    #[arg(long, default_value = "15s", value_name = "DURATION", value_parser = whole_seconds)]
    rlqs_assignment_ttl: Duration,

    /// Most RLQS buckets one stream (one Envoy) may report on; reports on more are left
    /// without an assignment (tollgate_rlqs_ignored_buckets_total).
    #[arg(long, default_value = "10000", value_name = "N")]
    rlqs_max_buckets_per_stream: NonZeroUsize,

    /// Most RLQS buckets of all streams together.
    #[arg(long, default_value = "1000000", value_name = "N")]
    rlqs_max_buckets: NonZeroUsize,

    /// Threads answering requests [default: the cores this process may run on]. With 1, one
    /// thread does everything (no work stealing between threads): the least CPU per decision
    /// when the server has a single core, as a 1-CPU container does.
    #[arg(long, value_name = "N")]
    threads: Option<NonZeroUsize>,

    /// Export a span per decision (`ratelimit.decide`: protocol, namespace, hits, outcome, the
    /// limits touched and those without room) to this OpenTelemetry collector, over OTLP/gRPC
    /// (`http://host:4317`), each the child of the caller's span when the request carries a W3C
    /// `traceparent`. Off by default. Service name: `OTEL_SERVICE_NAME`, else `tollgate`.
    #[cfg(feature = "otlp")]
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
}

/// A duration of whole seconds, at least one: `15s`, `1m`.
fn whole_seconds(text: &str) -> Result<Duration, String> {
    let duration = tollgate::parse_duration(text).map_err(|e| e.to_string())?;
    if duration.subsec_nanos() != 0 || duration.is_zero() {
        return Err(format!("`{text}`: Envoy reads whole seconds only; give 1s or more, in whole seconds"));
    }
    Ok(duration)
}

/// A size in bytes, with an optional unit (`4096`, `4KiB`, `1 GB`), above zero.
fn bytes(text: &str) -> Result<NonZeroUsize, String> {
    let size: bytesize::ByteSize = text.parse().map_err(|_| format!("`{text}` is not a size (4096, 64KiB, 1GiB)"))?;
    let size = usize::try_from(size.as_u64()).map_err(|_| format!("`{text}` is more than this machine addresses"))?;
    NonZeroUsize::new(size).ok_or_else(|| format!("`{text}`: the size must be above zero"))
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum AtMaxCounters {
    /// Reject the request, with the time a counter goes idle.
    Reject,
    /// Evict the counter nearest to idle.
    Evict,
    /// Allow the request without counting it.
    Admit,
}

impl From<AtMaxCounters> for AtKeyLimit {
    fn from(a: AtMaxCounters) -> AtKeyLimit {
        match a {
            AtMaxCounters::Reject => AtKeyLimit::Reject,
            AtMaxCounters::Evict => AtKeyLimit::EvictNearestIdle,
            AtMaxCounters::Admit => AtKeyLimit::AdmitUnstored,
        }
    }
}

/// `--mode`: [`Mode`]'s values as flags.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum ModeArg {
    /// All counters of a request checked and updated together, under locks on those counters.
    Accuracy,
    /// Each counter on its own; a rejection gives back what was taken.
    Throughput,
}

impl From<ModeArg> for Mode {
    fn from(mode: ModeArg) -> Mode {
        match mode {
            ModeArg::Accuracy => Mode::Accuracy,
            ModeArg::Throughput => Mode::Throughput,
        }
    }
}

/// `--rate-limit-headers`: [`HeaderDraft`]'s values as flags.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum DraftArg {
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (draft 03, as Limitador).
    Draft03,
    /// `RateLimit-Policy` and `RateLimit` (draft 10).
    Draft10,
}

impl From<DraftArg> for HeaderDraft {
    fn from(draft: DraftArg) -> HeaderDraft {
        match draft {
            DraftArg::Draft03 => HeaderDraft::Draft03,
            DraftArg::Draft10 => HeaderDraft::Draft10,
        }
    }
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum StorageKind {
    /// In this process: no other service needed; counters are lost on restart.
    Memory,
    /// In Redis: counters shared by several servers, kept across restarts.
    Redis,
    /// Decided in memory, flushed to Redis in batches (`--flush-every`): faster; replicas may
    /// overshoot a limit until they hear of each other's counts.
    RedisCached,
    /// In Redis, spent from slices each server leases: a round trip per slice, not per call;
    /// replicas never overshoot a limit together (hits leased and unspent at a window's end are
    /// lost).
    RedisLeased,
}

pub(crate) fn main(args: ServeArgs) -> ExitCode {
    let format = match args.format.read_as(args.merge_domains) {
        Ok(format) => format,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let threads = args.threads.or_else(|| std::thread::available_parallelism().ok()).map_or(1, NonZeroUsize::get);
    let mut builder = match threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(n);
            builder
        }
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    #[cfg(feature = "otlp")]
    let otlp = match args.otlp_endpoint.as_deref().map(|endpoint| {
        let _inside = runtime.enter();
        super::otlp::Otlp::start(endpoint)
    }) {
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
        Some(Ok(otlp)) => Some(otlp),
        None => None,
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(log_filter());
    let logging = tracing_subscriber::registry().with(fmt);
    #[cfg(feature = "otlp")]
    let logging = logging.with(otlp.as_ref().map(super::otlp::Otlp::layer));
    let _ = logging.try_init();
    #[cfg(feature = "otlp")]
    let trace_parent = otlp.as_ref().map(|_| super::otlp::W3cParent::shared());
    #[cfg(not(feature = "otlp"))]
    let trace_parent = None;
    let config = ServeConfig {
        limits: args.limits,
        format,
        grpc: args.grpc,
        http: args.http,
        admin: args.admin,
        tls: match (args.tls_cert, args.tls_key) {
            (Some(cert), Some(key)) => {
                let files = TlsFiles::new(cert, key);
                Some(match args.tls_client_ca {
                    Some(ca) => files.with_client_ca(ca),
                    None => files,
                })
            }
            _ => None,
        },
        mode: args.mode.into(),
        shadow: args.shadow,
        watch: !args.no_watch,
        time: Default::default(),
        counters: CounterCap {
            max: args.max_counters,
            max_bytes: args.max_counter_bytes,
            at_max: args.at_max_counters.into(),
        },
        bounds: RequestBounds {
            max_value_bytes: args.max_value_bytes.get(),
            max_request_bytes: args.max_request_bytes.get(),
            max_entries: args.max_entries.get(),
            max_descriptors: args.max_descriptors.get(),
        },
        rate_limit_headers: args.rate_limit_headers.map(HeaderDraft::from),
        response_dynamic_metadata: args.response_dynamic_metadata,
        http_read_timeout: Some(args.http_read_timeout).filter(|t| !t.is_zero()),
        grpc_read_timeout: Some(args.grpc_read_timeout).filter(|t| !t.is_zero()),
        storage: match args.storage {
            StorageKind::Memory => Storage::Memory,
            StorageKind::Redis => Storage::Redis { url: args.redis_url, prefix: args.redis_prefix },
            StorageKind::RedisCached => {
                Storage::RedisCached { url: args.redis_url, prefix: args.redis_prefix, flush: args.flush_every }
            }
            StorageKind::RedisLeased => Storage::RedisLeased { url: args.redis_url, prefix: args.redis_prefix },
        },
        trace_parent,
        redis_deadline: args.redis_deadline,
        rlqs: RlqsConfig {
            assignment_ttl: args.rlqs_assignment_ttl,
            max_buckets_per_stream: args.rlqs_max_buckets_per_stream.get(),
            max_buckets: args.rlqs_max_buckets.get(),
        },
    };
    runtime.block_on(async move {
        let running = match start(&config, SystemClock::new()).await {
            Ok(running) => running,
            Err(e) => {
                eprintln!("error: {e}");
                return match e {
                    ServeError::Limits(_) => ExitCode::from(2),
                    _ => ExitCode::FAILURE,
                };
            }
        };
        let loaded = running.engine.loaded();
        tracing::info!(
            limits = loaded.policy.len(),
            path = %config.limits.display(),
            format = %config.format,
            mode = ?config.mode,
            threads,
            storage = ?config.storage,
            shadow = config.shadow,
            "limits loaded"
        );
        let (tls, scheme) = match &config.tls {
            Some(files) if files.client_ca.is_some() => (" over TLS, client certificates required", "https"),
            Some(_) => (" over TLS", "https"),
            None => ("", "http"),
        };
        tracing::info!("Envoy RLS and RLQS (gRPC) listening on {}{tls}", running.grpc);
        match running.admin {
            None => tracing::info!("HTTP API listening on {scheme}://{} (metrics on /metrics)", running.http),
            Some(admin) => {
                tracing::info!("HTTP decisions listening on {scheme}://{}", running.http);
                tracing::info!("admin (limits, counters, /metrics) listening on http://{admin}");
            }
        }
        #[cfg(feature = "otlp")]
        if let Some(endpoint) = &args.otlp_endpoint {
            tracing::info!("decision spans exported to {endpoint} (OTLP/gRPC)");
        }
        wait_for_stop().await;
        tracing::info!("stopping");
        running.shutdown().await;
        #[cfg(feature = "otlp")]
        if let Some(otlp) = otlp {
            otlp.shutdown().await;
        }
        ExitCode::SUCCESS
    })
}

async fn wait_for_stop() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// The log's filter: `RUST_LOG`, else `info`. It is the log's own (a per-layer filter), so that
/// the OpenTelemetry layer sees the decision spans (level TRACE) while the log does not.
fn log_filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
}
