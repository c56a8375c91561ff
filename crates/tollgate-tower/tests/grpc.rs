//! A gRPC service behind the layer, called by a real tonic client: a limited call is
//! RESOURCE_EXHAUSTED with `grpc-retry-pushback-ms`, a backend that cannot decide UNAVAILABLE,
//! never an HTTP error status (which gRPC clients read as a broken transport).

use std::time::Duration;

use tollgate::{FixedWindow, Limiter, Quota};
use tollgate_redis::{AlgorithmKind, FailurePolicy, Redis, RedisLimiter, RedisOptions};
use tollgate_testkit::RedisServer;
use tollgate_tower::{Global, Policies, Policy, RateLimitLayer};
use tonic::transport::server::TcpIncoming;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// gRPC health behind `layer` on 127.0.0.1, and a client of it.
async fn serve<P: Policies>(layer: RateLimitLayer<P>) -> HealthClient<tonic::transport::Channel> {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder().layer(layer).add_service(health);
    tokio::spawn(server.serve_with_incoming(TcpIncoming::from(listener)));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    HealthClient::new(channel)
}

fn check() -> HealthCheckRequest {
    HealthCheckRequest { service: String::new() }
}

#[tokio::test]
async fn a_limited_grpc_call_is_resource_exhausted_with_a_retry_pushback() {
    let limiter = Limiter::new(FixedWindow::new(Quota::per_minute(2).unwrap()));
    let mut client = serve(RateLimitLayer::new(Policy::new("calls", Global, limiter))).await;
    for i in 0..2 {
        client.check(check()).await.unwrap_or_else(|s| panic!("call {i} is within the limit: {s:?}"));
    }
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.message(), "rate limited by calls");
    let pushback: u64 = status.metadata().get("grpc-retry-pushback-ms").unwrap().to_str().unwrap().parse().unwrap();
    assert!((59_000..=60_000).contains(&pushback), "the window ends in about a minute: {pushback} ms");
}

#[tokio::test]
async fn a_grpc_call_whose_backend_cannot_decide_is_unavailable() {
    let mut server = RedisServer::start();
    let options = RedisOptions { deadline: Duration::from_millis(200), ..Default::default() };
    let redis = Redis::connect_with(&server.url(), options).await.unwrap();
    let limiter = RedisLimiter::builder(&redis, "grpc", AlgorithmKind::FixedWindow)
        .limit("calls", Quota::per_minute(100).unwrap())
        .failure_policy(FailurePolicy::Deny)
        .build()
        .unwrap();
    let mut client = serve(RateLimitLayer::new(Policy::new("calls", Global, limiter))).await;
    client.check(check()).await.unwrap();
    server.kill();
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.metadata().get("grpc-retry-pushback-ms").is_none(), "waiting is not known to help");
}
