//! The layer over a Redis-backed limiter: the same 429s and headers, one round trip per request,
//! and the failure policy (with its own status) when Redis is down.
#![cfg(feature = "redis")]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::serve;
use tollgate::{Keyed, ManualClock, Quota, TokenBucket};
use tollgate_redis::{AlgorithmKind, FailurePolicy, Redis, RedisLimiter, RedisOptions, RedisTime};
use tollgate_tower::{ClientIp, Header, Policy, RateLimitLayer};

async fn fetch(addr: SocketAddr, key: &str) -> http::Response<Bytes> {
    let c = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let req = Request::get(format!("http://{addr}/")).header("x-key", key).body(Empty::new()).unwrap();
    let (parts, body) = c.request(req).await.unwrap().into_parts();
    http::Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_limits_through_the_layer_and_its_failure_policy_answers_when_it_is_down() {
    let mut server = tollgate_testkit::RedisServer::start();
    let options = RedisOptions { deadline: Duration::from_millis(50), ..Default::default() };
    let redis = Redis::connect_with(&server.url(), options).await.unwrap();
    let clock = ManualClock::new();
    let build = |policy: FailurePolicy| {
        RedisLimiter::builder(&redis, "tower", AlgorithmKind::TokenBucket)
            .limit("key", Quota::per_minute(2).unwrap())
            .time(RedisTime::clock(clock.clone()))
            .failure_policy(policy)
            .build()
            .unwrap()
    };
    let deny = Policy::new("per-key", Header::new("x-key".parse().unwrap()), build(FailurePolicy::Deny));
    let allow = Policy::new("per-key", Header::new("x-key".parse().unwrap()), build(FailurePolicy::Allow));
    // A local limit chained after the distributed one: all-or-nothing across both kinds.
    let local: Keyed<std::net::IpAddr, _, _> =
        Keyed::builder(TokenBucket::new(Quota::per_minute(100).unwrap())).clock(clock.clone()).build();
    let strict =
        serve(Router::new().route("/", get_ok()).layer(
            RateLimitLayer::new(deny).and(Policy::new("per-ip", ClientIp::new(), local)).headers_on_success(true),
        ))
        .await;
    let open = serve(Router::new().route("/", get_ok()).layer(RateLimitLayer::new(allow))).await;

    let ok = fetch(strict, "a").await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(ok.headers()["ratelimit"], r#""per-key";r=1;t=30, "per-ip";r=99;t=1"#);
    assert_eq!(fetch(strict, "a").await.status(), StatusCode::OK);
    let limited = fetch(strict, "a").await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers()["retry-after"], "30");
    assert_eq!(fetch(strict, "b").await.status(), StatusCode::OK, "keys are separate in Redis too");

    server.kill();
    let t = Instant::now();
    let down = fetch(strict, "c").await;
    assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE, "deny policy: 503, not a fake 429");
    assert!(down.headers().get("retry-after").is_none());
    assert_eq!(fetch(open, "c").await.status(), StatusCode::OK, "allow policy lets it through");
    assert!(t.elapsed() < Duration::from_secs(1), "decisions during the outage took {:?}", t.elapsed());
}

fn get_ok() -> axum::routing::MethodRouter {
    axum::routing::get(|| async { "ok" })
}

/// A Redis policy, then a local policy that rejects: the layer refunds what Redis took, so the
/// counter read back from Redis is what the admitted requests alone left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_local_rejection_gives_the_redis_permits_back() {
    let server = tollgate_testkit::RedisServer::start();
    let redis = Redis::connect(&server.url()).await.unwrap();
    let clock = ManualClock::new();
    let shared = RedisLimiter::builder(&redis, "refund", AlgorithmKind::FixedWindow)
        .limit("key", Quota::per_minute(10).unwrap())
        .time(RedisTime::clock(clock.clone()))
        .build()
        .unwrap();
    let local: Keyed<std::net::IpAddr, _, _> =
        Keyed::builder(TokenBucket::new(Quota::per_minute(1).unwrap())).clock(clock.clone()).build();
    let app = serve(Router::new().route("/", get_ok()).layer(
        RateLimitLayer::new(Policy::new("shared", Header::new("x-key".parse().unwrap()), shared)).and(Policy::new(
            "per-ip",
            ClientIp::new(),
            local,
        )),
    ))
    .await;
    let count = || server.cli(&["GET", "refund:{a}:key"]);

    assert_eq!(fetch(app, "a").await.status(), StatusCode::OK);
    assert_eq!(count(), "1");
    for _ in 0..3 {
        let limited = fetch(app, "a").await;
        assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(limited.headers()["ratelimit"], r#""per-ip";r=0;t=60"#, "the local policy said no");
    }
    assert_eq!(count(), "1", "Redis still counts only the admitted request");
}
