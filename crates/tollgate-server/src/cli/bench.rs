//! `tollgate bench`: load a running server over gRPC (Envoy RLS) or HTTP, print requests per
//! second, latency percentiles and the decisions (or one JSON object with `--json`).

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tollgate_load::{BenchConfig, BenchReport, Engine, Protocol, run};

/// The most runtime threads accepted.
const MAX_THREADS: usize = 1024;

/// Arguments of `tollgate bench`.
#[derive(Debug, Args)]
#[command(after_long_help = AFTER_HELP)]
pub(crate) struct BenchArgs {
    /// grpc: Envoy's RLS `ShouldRateLimit`; http: `POST /check_and_report`.
    #[arg(long, value_enum, default_value = "grpc")]
    protocol: ProtocolArg,

    /// The server [default: 127.0.0.1:8081 for grpc, 127.0.0.1:8080 for http, as `tollgate serve`].
    #[arg(long, value_name = "HOST:PORT")]
    target: Option<String>,

    /// Connections to open [default: 4 for grpc, 32 for http].
    #[arg(long, value_name = "N")]
    connections: Option<usize>,

    /// Requests in flight on each connection at most: HTTP/2 streams for grpc [default: 16]; for
    /// http [default: 1], requests pipelined (raw engine; must be 1 on the client engine).
    #[arg(long, value_name = "M")]
    concurrency: Option<usize>,

    /// raw: requests written as bytes on plain TCP; client: tonic's and hyper's clients (the engine
    /// before raw; about 2-3 times raw's CPU per request, measured on a 2-core VM).
    #[arg(long, value_enum, default_value = "raw")]
    engine: EngineArg,

    /// How long to measure, e.g. 10s, 500ms, 1m.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = tollgate::parse_duration)]
    duration: Duration,

    /// How long to send before measuring (not counted, though the server counts those hits); 0s
    /// for none.
    #[arg(long, default_value = "1s", value_name = "DURATION", value_parser = tollgate::parse_duration_or_zero)]
    warmup: Duration,

    /// The namespace (the RLS domain).
    #[arg(long, default_value = "example.org")]
    namespace: String,

    /// Descriptors per RLS request (grpc only): req.method and user_id, then {"k1": "v…"}, ...
    #[arg(long, default_value_t = 2, value_name = "D")]
    descriptors: usize,

    /// Distinct users: request i has user_id user-{i % keys}.
    #[arg(long, default_value_t = 1000, value_name = "K")]
    keys: u64,

    /// Offered load in requests per second, open loop, latency counted from when each request was
    /// due. Without it: closed loop, as fast as the server answers.
    #[arg(long, value_name = "REQ/S")]
    rate: Option<f64>,

    /// Give up on a connection or an answer after this long (an error).
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = tollgate::parse_duration)]
    timeout: Duration,

    /// raw: engine threads, each with its share of the connections (at most one per connection);
    /// client: the runtime's worker threads [default: the cores this process may use, e.g. 1 under
    /// `taskset -c 1`].
    #[arg(long, value_name = "N")]
    threads: Option<usize>,

    /// raw engine, open loop: how often it reads its connections while requests are in flight.
    /// Answers are timed at the tick that reads them (latencies read high by up to a tick);
    /// shorter ticks cost more CPU per request.
    #[arg(long, default_value = "100us", value_name = "DURATION", value_parser = tollgate::parse_duration)]
    tick: Duration,

    /// Print one JSON object (parameters and results) instead of the summary.
    #[arg(long)]
    json: bool,
}

/// `--protocol`: the library's [`Protocol`], spelled for the command line.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum ProtocolArg {
    /// Envoy's rate limit service v3 (`ShouldRateLimit`) over gRPC.
    Grpc,
    /// The HTTP API's `POST /check_and_report`.
    Http,
}

/// `--engine`: the library's [`Engine`], spelled for the command line.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum EngineArg {
    /// Requests written as bytes on plain TCP connections.
    Raw,
    /// tonic's gRPC client and hyper's HTTP/1.1 client.
    Client,
}

impl From<EngineArg> for Engine {
    fn from(engine: EngineArg) -> Engine {
        match engine {
            EngineArg::Raw => Engine::Raw,
            EngineArg::Client => Engine::Client,
        }
    }
}

impl From<ProtocolArg> for Protocol {
    fn from(protocol: ProtocolArg) -> Protocol {
        match protocol {
            ProtocolArg::Grpc => Protocol::Grpc,
            ProtocolArg::Http => Protocol::Http,
        }
    }
}

const AFTER_HELP: &str = "\
Request i has req.method POST when i % 3 == 0 (GET otherwise) and user_id user-{i % keys}, and
counts 1 hit. Counted: the requests sent (with --rate: due) after the warmup and before the end of
--duration, each waited for. Exits 1 if no request got an answer, 2 on bad arguments.

Examples:
  tollgate serve --limits examples/limits.yaml &
  tollgate bench --duration 10s
  tollgate bench --protocol http --connections 64 --json
  tollgate bench --rate 20000 --duration 30s
  taskset -c 1 tollgate bench --protocol http --connections 4 --concurrency 16 --rate 69000 --json
  tollgate bench --engine client --rate 20000   # tonic's / hyper's clients, to compare";

pub(crate) fn main(args: BenchArgs) -> ExitCode {
    let threads = match args.threads {
        Some(n) if (1..=MAX_THREADS).contains(&n) => n,
        Some(n) => {
            eprintln!("error: --threads must be between 1 and {MAX_THREADS}, not {n}");
            return ExitCode::from(2);
        }
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let protocol = Protocol::from(args.protocol);
    let default_target = match protocol {
        Protocol::Grpc => "127.0.0.1:8081",
        Protocol::Http => "127.0.0.1:8080",
    };
    let config = BenchConfig {
        protocol,
        target: args.target.unwrap_or_else(|| default_target.to_string()),
        engine: Engine::from(args.engine),
        connections: args.connections.unwrap_or(protocol.default_connections()),
        concurrency: args.concurrency.unwrap_or(protocol.default_concurrency()),
        threads,
        duration: args.duration,
        warmup: args.warmup,
        namespace: args.namespace,
        descriptors: args.descriptors,
        keys: args.keys,
        rate: args.rate,
        timeout: args.timeout,
        tick: args.tick,
    };
    // The raw engine runs its own threads; the caller's runtime only connects and waits for them.
    let runtime = match config.engine {
        Engine::Raw => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        Engine::Client => tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build(),
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = match runtime.block_on(run(config.clone())) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(if e.is_usage() { 2 } else { 1 });
        }
    };
    if args.json {
        println!("{}", json(&config, threads, &report));
    } else {
        print!("{}", summary(&config, threads, &report));
    }
    if report.all_failed() {
        match &report.first_error {
            Some(first) => eprintln!(
                "error: all {} requests to {} ({}) failed; the first: {first}",
                report.requests, config.target, config.protocol
            ),
            None => eprintln!("error: no request to {} ({}) was answered", config.target, config.protocol),
        }
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The parameters, then the report's fields.
fn json(config: &BenchConfig, threads: usize, report: &BenchReport) -> serde_json::Value {
    let mut object = serde_json::json!({
        "protocol": config.protocol,
        "engine": config.engine,
        "target": config.target,
        "connections": config.connections,
        "concurrency": config.concurrency,
        "threads": threads,
        "duration_s": config.duration.as_secs_f64(),
        "warmup_s": config.warmup.as_secs_f64(),
        "namespace": config.namespace,
        "descriptors": config.descriptors,
        "keys": config.keys,
        "rate": config.rate,
        "tick_us": config.tick.as_secs_f64() * 1e6,
    });
    if let (Some(object), Ok(serde_json::Value::Object(fields))) =
        (object.as_object_mut(), serde_json::to_value(report))
    {
        object.extend(fields);
    }
    object
}

fn summary(config: &BenchConfig, threads: usize, report: &BenchReport) -> String {
    let mut out = String::new();
    let load = match config.rate {
        Some(rate) => format!("open loop at {rate} req/s"),
        None => "closed loop".to_string(),
    };
    let descriptors = match config.protocol {
        Protocol::Grpc => format!(", {} descriptors", config.descriptors),
        Protocol::Http => String::new(),
    };
    let _ = writeln!(
        out,
        "{} {}: {} connections x {} in flight, {load}, {} after {} warmup, {} engine, threads {threads}",
        config.protocol,
        config.target,
        config.connections,
        config.concurrency,
        humantime::format_duration(config.duration),
        humantime::format_duration(config.warmup),
        config.engine,
    );
    let _ = writeln!(out, "namespace {}{descriptors}, {} keys", config.namespace, config.keys);
    let _ = writeln!(out);
    let _ = writeln!(out, "  requests  {} in {:.3} s: {:.1} req/s", report.requests, report.seconds, report.rps);
    let _ = writeln!(out, "  allowed   {}", report.allowed);
    let _ = writeln!(out, "  limited   {}", report.limited);
    let _ = writeln!(out, "  errors    {}", report.errors);
    if let Some(first) = &report.first_error {
        let _ = writeln!(out, "            first: {first}");
    }
    let _ = writeln!(
        out,
        "  latency   p50 {}  p99 {}  p99.9 {}  max {}  (mean {})",
        micros(report.p50_us),
        micros(report.p99_us),
        micros(report.p999_us),
        micros(report.max_us),
        micros(report.mean_us),
    );
    out
}

/// `us` microseconds, in a readable unit.
fn micros(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.1} µs")
    } else if us < 1_000_000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{:.2} s", us / 1_000_000.0)
    }
}
