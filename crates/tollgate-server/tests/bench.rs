//! `tollgate bench` against an in-process `tollgate serve`, through the library (tollgate-load)
//! and through the binary.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use tollgate::SystemClock;
use tollgate_load::{BenchConfig, BenchReport, Engine, Protocol, run};
use tollgate_server::serve::{Running, ServeConfig, start};

const NAMESPACE: &str = "bench.test";
const LIMIT: u64 = 50;

/// A server on ports chosen by the OS, with one counter: `LIMIT` hits per minute in `NAMESPACE`.
async fn server(name: &str) -> Running {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let limits = dir.join(format!("{name}-{}.yaml", std::process::id()));
    let yaml =
        format!("- namespace: {NAMESPACE}\n  max_value: {LIMIT}\n  seconds: 60\n  conditions: []\n  variables: []\n");
    std::fs::write(&limits, yaml).expect("limits file");
    let config = ServeConfig {
        grpc: "127.0.0.1:0".parse().unwrap(),
        http: "127.0.0.1:0".parse().unwrap(),
        watch: false,
        ..ServeConfig::new(limits)
    };
    start(&config, SystemClock::new()).await.expect("the server starts")
}

fn config(protocol: Protocol, target: String) -> BenchConfig {
    let mut config = BenchConfig::new(protocol, target);
    config.duration = Duration::from_millis(300);
    config.warmup = Duration::ZERO;
    config.namespace = NAMESPACE.to_string();
    if protocol == Protocol::Grpc {
        config.connections = 2;
        config.concurrency = 4;
    } else {
        config.connections = 8;
    }
    config
}

/// Exactly `LIMIT` allowed, everything else limited, nothing failed.
fn assert_limit_held(report: &BenchReport) {
    assert_eq!(report.errors, 0, "{report:?}");
    assert!(report.requests > LIMIT, "{report:?}");
    assert_eq!(report.allowed, LIMIT, "{report:?}");
    assert_eq!(report.limited, report.requests - LIMIT, "{report:?}");
    assert!(report.seconds >= 0.3, "{report:?}");
    assert!(report.rps > 0.0, "{report:?}");
    // A round trip over loopback takes microseconds, not nanoseconds.
    assert!(1.0 <= report.p50_us && report.p50_us <= report.p99_us, "{report:?}");
    assert!(report.mean_us >= 1.0, "{report:?}");
    assert!(report.p99_us <= report.p999_us && report.p999_us <= report.max_us, "{report:?}");
    assert!(report.first_error.is_none(), "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_over_grpc_sees_the_limit_exactly() {
    for engine in [Engine::Raw, Engine::Client] {
        let running = server(&format!("grpc-{engine}")).await;
        let mut config = config(Protocol::Grpc, running.grpc.to_string());
        config.engine = engine;
        let report = run(config).await.expect("the bench runs");
        assert_limit_held(&report);
        running.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_over_http_sees_the_limit_exactly() {
    for engine in [Engine::Raw, Engine::Client] {
        let running = server(&format!("http-{engine}")).await;
        let mut config = config(Protocol::Http, running.http.to_string());
        config.engine = engine;
        let report = run(config).await.expect("the bench runs");
        assert_limit_held(&report);
        running.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_on_the_raw_engine_sees_the_limit_exactly() {
    for protocol in [Protocol::Grpc, Protocol::Http] {
        let running = server(&format!("raw-{protocol}")).await;
        let target = match protocol {
            Protocol::Grpc => running.grpc,
            Protocol::Http => running.http,
        };
        // 1000/s for 300 ms on 2 threads, HTTP pipelined: 300 requests, the first 50 allowed.
        let mut config = config(protocol, target.to_string());
        (config.engine, config.rate, config.threads) = (Engine::Raw, Some(1000.0), 2);
        if protocol == Protocol::Http {
            (config.connections, config.concurrency) = (2, 8);
        }
        let report = run(config).await.expect("the bench runs");
        assert_limit_held(&report);
        assert!((299..=301).contains(&report.requests), "{protocol}: {report:?}");
        running.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_sends_the_rate_and_the_warmup_is_not_counted() {
    let running = server("rate").await;
    for protocol in [Protocol::Grpc, Protocol::Http] {
        let target = match protocol {
            Protocol::Grpc => running.grpc,
            Protocol::Http => running.http,
        };
        // 1000/s: 100 requests due in the warmup (taking the first 50 hits of the shared counter:
        // the limit is spent for both protocols after the first), 200 in the window.
        let mut config = config(protocol, target.to_string());
        config.rate = Some(1000.0);
        config.warmup = Duration::from_millis(100);
        config.duration = Duration::from_millis(200);
        let report = run(config).await.expect("the bench runs");
        assert_eq!(report.errors, 0, "{protocol}: {report:?}");
        assert!((199..=201).contains(&report.requests), "{protocol}: {report:?}");
        assert_eq!(report.allowed, 0, "{protocol}: {report:?}");
        assert_eq!(report.limited, report.requests, "{protocol}: {report:?}");
        assert!(report.seconds >= 0.2, "{protocol}: {report:?}");
    }
    running.shutdown().await;
}

/// A port nothing listens on (bound, then released).
fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    addr.to_string()
}

fn tollgate(args: Vec<String>) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate")).args(args).output().expect("the tollgate binary runs")
}

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_prints_json_and_a_summary() {
    let running = server("binary").await;
    let http = running.http;
    let line = format!(
        "bench --protocol http --target {http} --connections 4 --duration 300ms --warmup 0s \
         --namespace {NAMESPACE} --threads 1 --json"
    );
    let out = tokio::task::spawn_blocking(move || tollgate(args(&line))).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON object");
    assert_eq!(json["protocol"], "http");
    assert_eq!(json["engine"], "raw");
    assert_eq!(json["target"], http.to_string());
    assert_eq!(json["connections"], 4);
    assert_eq!(json["allowed"], LIMIT);
    assert_eq!(json["errors"], 0);
    let requests = json["requests"].as_u64().expect("requests");
    assert_eq!(json["limited"].as_u64(), Some(requests - LIMIT));
    assert!(json["seconds"].as_f64().is_some_and(|s| s >= 0.3), "{json}");
    for field in ["rps", "p50_us", "p99_us", "p999_us", "max_us"] {
        assert!(json[field].as_f64().is_some_and(|v| v >= 1.0), "{field}: {json}");
    }
    assert!(json["first_error"].is_null());

    let grpc = running.grpc;
    let line = format!(
        "bench --target {grpc} --duration 200ms --warmup 0s --namespace {NAMESPACE} --threads 1 --engine client"
    );
    let out = tokio::task::spawn_blocking(move || tollgate(args(&line))).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    for part in ["grpc", "client engine", "requests", "req/s", "allowed   0", "errors    0", "p99.9"] {
        assert!(stdout.contains(part), "{part}: {stdout}");
    }
    running.shutdown().await;
}

#[test]
fn the_binary_exits_1_when_nothing_listens_and_2_on_bad_arguments() {
    let target = closed_port();
    let out = tollgate(args(&format!("bench --protocol http --target {target} --duration 300ms")));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&target), "{stderr}");

    for bad in [
        "bench --protocol http --concurrency 4 --engine client",
        "bench --engine tonic",
        "bench --connections 0",
        "bench --duration soon",
        "bench --rate -5",
        "bench --target nowhere",
        "bench --threads 0",
        "bench --tick 0s",
        "bench --protocol udp",
    ] {
        let out = tollgate(args(bad));
        assert_eq!(out.status.code(), Some(2), "{bad}: {out:?}");
    }
}
