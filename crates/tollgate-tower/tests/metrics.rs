//! The layer's metrics after real requests through an axum app: decisions by policy and outcome,
//! read back from a Prometheus recorder installed for the test alone.

mod support;

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use support::serve;
use tollgate::{Keyed, ManualClock, Quota, TokenBucket};
use tollgate_tower::{Global, Header, Policy, RateLimitLayer};

async fn status(addr: SocketAddr, key: Option<&str>) -> StatusCode {
    let c = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut req = Request::get(format!("http://{addr}/"));
    if let Some(key) = key {
        req = req.header("x-key", key);
    }
    let res = c.request(req.body(Empty::new()).unwrap()).await.unwrap();
    let status = res.status();
    res.into_body().collect().await.unwrap();
    status
}

/// The value of the series `name{labels}` in the Prometheus text, `None` when it is not there.
fn value(metrics: &PrometheusHandle, name: &str, labels: &str) -> Option<f64> {
    let series = format!("{name}{{{labels}}}");
    metrics.render().lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (s, v) = line.rsplit_once(' ')?;
        (s == series).then(|| v.parse().unwrap())
    })
}

fn decisions(metrics: &PrometheusHandle, policy: &str, outcome: &str) -> Option<f64> {
    value(metrics, "tollgate_layer_decisions_total", &format!("policy=\"{policy}\",outcome=\"{outcome}\""))
}

#[tokio::test]
async fn decisions_are_counted_by_policy_and_outcome_and_never_by_key() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let clock = ManualClock::new();
    // Built under the recorder: the policies register their counters with it.
    let app = metrics::with_local_recorder(&recorder, || {
        let per_key = Keyed::builder(TokenBucket::new(Quota::per_minute(2).unwrap())).clock(clock.clone()).build();
        let global = TokenBucket::new(Quota::per_minute(100).unwrap());
        Router::new().route("/", get(|| async { "ok" })).layer(
            RateLimitLayer::new(Policy::new("per-key", Header::new("x-key".parse().unwrap()), per_key))
                .and(Policy::new("global", Global, tollgate::Limiter::builder(global).clock(clock.clone()).build())),
        )
    });
    assert_eq!(decisions(&metrics, "per-key", "allowed"), Some(0.0), "series exist before any request");
    let addr = serve(app).await;

    for _ in 0..2 {
        assert_eq!(status(addr, Some("alice")).await, StatusCode::OK);
    }
    assert_eq!(status(addr, Some("alice")).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status(addr, None).await, StatusCode::BAD_REQUEST);
    assert_eq!(status(addr, Some("bob")).await, StatusCode::OK);

    assert_eq!(decisions(&metrics, "per-key", "allowed"), Some(3.0));
    assert_eq!(decisions(&metrics, "per-key", "limited"), Some(1.0));
    assert_eq!(decisions(&metrics, "per-key", "no_key"), Some(1.0));
    assert_eq!(decisions(&metrics, "per-key", "unavailable"), Some(0.0));
    // The second counts only what the first admitted (after the first says no it is only checked).
    assert_eq!(decisions(&metrics, "global", "allowed"), Some(3.0));
    assert_eq!(decisions(&metrics, "global", "limited"), Some(0.0));
    let text = metrics.render();
    assert!(!text.contains("alice") && !text.contains("bob"), "a key leaked into a label:\n{text}");
}

/// A later policy's rejection: the earlier policy gave its permit back and counts nothing.
#[tokio::test]
async fn a_request_a_later_policy_limits_is_not_counted_as_allowed_by_the_earlier_one() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let app = metrics::with_local_recorder(&recorder, || {
        let first = TokenBucket::new(Quota::per_minute(100).unwrap());
        let second = TokenBucket::new(Quota::per_minute(1).unwrap());
        Router::new().route("/", get(|| async { "ok" })).layer(
            RateLimitLayer::new(Policy::new("first", Global, tollgate::Limiter::new(first))).and(Policy::new(
                "second",
                Global,
                tollgate::Limiter::new(second),
            )),
        )
    });
    let addr = serve(app).await;
    assert_eq!(status(addr, None).await, StatusCode::OK);
    assert_eq!(status(addr, None).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(decisions(&metrics, "first", "allowed"), Some(1.0));
    assert_eq!(decisions(&metrics, "second", "allowed"), Some(1.0));
    assert_eq!(decisions(&metrics, "second", "limited"), Some(1.0));
}

/// A Redis policy whose Redis is gone, failure policy Deny: `unavailable`, not `limited`.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_cannot_decide_is_counted_unavailable() {
    use std::time::Duration;
    use tollgate_redis::{AlgorithmKind, Redis, RedisLimiter, RedisOptions};

    let mut server = tollgate_testkit::RedisServer::start();
    let options = RedisOptions { deadline: Duration::from_millis(50), ..Default::default() };
    let redis = Redis::connect_with(&server.url(), options).await.unwrap();
    let recorder = PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let app = metrics::with_local_recorder(&recorder, || {
        let limiter = RedisLimiter::builder(&redis, "tower-metrics", AlgorithmKind::TokenBucket)
            .limit("key", Quota::per_minute(1).unwrap())
            .build()
            .unwrap();
        let policy = Policy::new("per-key", Header::new("x-key".parse().unwrap()), limiter);
        Router::new().route("/", get(|| async { "ok" })).layer(RateLimitLayer::new(policy))
    });
    let addr = serve(app).await;
    assert_eq!(status(addr, Some("a")).await, StatusCode::OK);
    assert_eq!(status(addr, Some("a")).await, StatusCode::TOO_MANY_REQUESTS);
    server.kill();
    assert_eq!(status(addr, Some("a")).await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(decisions(&metrics, "per-key", "allowed"), Some(1.0));
    assert_eq!(decisions(&metrics, "per-key", "limited"), Some(1.0));
    assert_eq!(decisions(&metrics, "per-key", "unavailable"), Some(1.0));
}
