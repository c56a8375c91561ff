//! The load generator against stand-in servers (HTTP with axum, gRPC with tonic) and against
//! nothing; the runs against a real `tollgate serve` (both protocols, both engines, closed and open
//! loop) are in tollgate-server's tests/bench.rs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::http::StatusCode;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_load::{BenchConfig, BenchError, Engine, Protocol, run};

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
    (bad.engine, bad.concurrency) = (Engine::Client, 4);
    let error = run(bad).await.expect_err("hyper's http/1.1 client has one request in flight");
    assert!(error.is_usage(), "{error}");
    assert!(matches!(error, BenchError::HttpConcurrency { concurrency: 4 }), "{error:?}");
    assert!(error.to_string().contains("--concurrency must be 1 for http on the client engine, not 4"), "{error}");
}

/// An RLS server (tonic's, as `tollgate serve` is): `OK` for the first `allowed` calls, then
/// `OVER_LIMIT`, or every call failing with `fail`.
struct Rls {
    allowed: u64,
    hits: AtomicU64,
    fail: Option<tonic::Code>,
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        if let Some(code) = self.fail {
            return Err(tonic::Status::new(code, "storage down"));
        }
        // The request is the one the client engine sends: checked here, as the server reads it.
        let request = request.into_inner();
        assert_eq!((request.domain.as_str(), request.descriptors.len(), request.hits_addend), ("example.org", 2, 1));
        let first = self.hits.fetch_add(1, Ordering::Relaxed) < self.allowed;
        let code = if first { Code::Ok } else { Code::OverLimit };
        Ok(tonic::Response::new(RateLimitResponse { overall_code: code as i32, ..Default::default() }))
    }
}

async fn rls(allowed: u64, fail: Option<tonic::Code>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let target = listener.local_addr().expect("addr").to_string();
    let service = RateLimitServiceServer::new(Rls { allowed, hits: AtomicU64::new(0), fail });
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming));
    target
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_answers_are_read_from_tonics_frames_on_both_engines() {
    for engine in [Engine::Raw, Engine::Client] {
        let mut config = config(Protocol::Grpc, rls(30, None).await);
        config.engine = engine;
        let report = run(config).await.expect("runs");
        assert_eq!((report.allowed, report.errors), (30, 0), "{engine}: {report:?}");
        assert!(report.limited > 0, "{engine}: {report:?}");
        assert!(report.p50_us > 0.0 && report.p50_us <= report.p99_us, "{engine}: {report:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_status_is_an_error_naming_the_code() {
    for (engine, expected) in [(Engine::Raw, "gRPC Unavailable"), (Engine::Client, "gRPC Unavailable: storage down")] {
        let mut config = config(Protocol::Grpc, rls(0, Some(tonic::Code::Unavailable)).await);
        config.engine = engine;
        config.rate = Some(500.0);
        let report = run(config).await.expect("runs");
        assert!(report.requests > 50 && report.all_failed(), "{engine}: {report:?}");
        let first = report.first_error.expect("the first error");
        assert!(first.starts_with(expected), "{engine}: {first}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_pipelines_on_the_raw_engine() {
    let mut config = config(Protocol::Http, server(40, StatusCode::TOO_MANY_REQUESTS).await);
    (config.connections, config.concurrency, config.threads) = (2, 8, 2);
    let report = run(config).await.expect("runs");
    assert_eq!((report.allowed, report.errors), (40, 0), "{report:?}");
    assert!(report.limited > 0, "{report:?}");
}
