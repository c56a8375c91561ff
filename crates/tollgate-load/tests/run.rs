//! The load generator against a stand-in HTTP server and against nothing; the runs against a real
//! `tollgate serve` (both protocols, open loop) are in tollgate-server's tests/bench.rs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::http::StatusCode;
use tollgate_load::{BenchConfig, BenchError, Protocol, run};

/// A server answering `POST /check_and_report`: 200 for the first `allowed` requests, then
/// `after`. Returns its `host:port`.
async fn server(allowed: u64, after: StatusCode) -> String {
    let hits = Arc::new(AtomicU64::new(0));
    let check = move || {
        let first = hits.fetch_add(1, Ordering::Relaxed) < allowed;
        async move { if first { StatusCode::OK } else { after } }
    };
    let app = axum::Router::new().route("/check_and_report", axum::routing::post(check));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let target = listener.local_addr().expect("addr").to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    target
}

fn config(protocol: Protocol, target: String) -> BenchConfig {
    let mut config = BenchConfig::new(protocol, target);
    config.connections = 4;
    config.duration = Duration::from_millis(200);
    config.warmup = Duration::ZERO;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_in_the_window_is_counted_once() {
    let report = run(config(Protocol::Http, server(30, StatusCode::TOO_MANY_REQUESTS).await)).await.expect("runs");
    assert_eq!((report.allowed, report.errors), (30, 0), "{report:?}");
    assert!(report.limited > 0, "{report:?}");
    assert_eq!(report.requests, report.allowed + report.limited, "{report:?}");
    assert!(report.seconds >= 0.2 && report.rps > 0.0, "{report:?}");
    assert!(report.p50_us <= report.p99_us && report.p99_us <= report.max_us, "{report:?}");
    assert!(!report.all_failed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_statuses_are_errors_with_the_first_one_kept() {
    let report = run(config(Protocol::Http, server(0, StatusCode::INTERNAL_SERVER_ERROR).await)).await.expect("runs");
    assert!(report.requests > 0 && report.all_failed(), "{report:?}");
    let first = report.first_error.expect("the first error");
    assert!(first.starts_with("HTTP 500"), "{first}");
}

/// A port nothing listens on (bound, then released).
fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listening_is_an_error_naming_the_target() {
    for protocol in [Protocol::Grpc, Protocol::Http] {
        let target = closed_port();
        let error = run(config(protocol, target.clone())).await.expect_err("nothing listens");
        assert!(!error.is_usage(), "{protocol}: {error}");
        assert!(matches!(&error, BenchError::Connect { target: t, protocol: p, .. } if *t == target && *p == protocol));
        let message = error.to_string();
        assert!(message.contains(&target), "{protocol}: {message}");
        assert!(message.contains(protocol.name()), "{protocol}: {message}");
    }
}

#[tokio::test]
async fn bad_settings_fail_before_connecting() {
    let mut bad = config(Protocol::Http, closed_port());
    bad.concurrency = 4;
    let error = run(bad).await.expect_err("http/1.1 has one request in flight");
    assert!(error.is_usage(), "{error}");
    assert!(matches!(error, BenchError::HttpConcurrency { concurrency: 4 }), "{error:?}");
    assert!(error.to_string().contains("--concurrency must be 1 for http, not 4"), "{error}");
}
