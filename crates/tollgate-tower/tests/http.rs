//! Real HTTP: an axum server on a free port, a hyper client, limiters on a ManualClock.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use support::{serve, streamed};
use tokio::sync::{mpsc, oneshot};
use tollgate::{AtKeyLimit, Concurrency, Keyed, Limiter, ManualClock, Quota, SlidingLog, TokenBucket};
use tollgate_tower::{ClientIp, Global, Header, MissingKey, Policy, RateLimitLayer};

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn get_with(c: &HttpClient, addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> http::Response<Bytes> {
    let mut req = Request::get(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = c.request(req.body(Empty::new()).unwrap()).await.unwrap();
    let (parts, body) = res.into_parts();
    http::Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

fn keyed_bucket(clock: &ManualClock, quota: Quota) -> Keyed<Bytes, TokenBucket, ManualClock> {
    Keyed::builder(TokenBucket::new(quota)).clock(clock.clone()).build()
}

#[tokio::test]
async fn limits_are_per_key_and_headers_match_the_limiter() {
    let clock = ManualClock::new();
    let policy = Policy::new(
        "per-key",
        Header::new("x-api-key".parse().unwrap()),
        keyed_bucket(&clock, Quota::per_minute(3).unwrap()),
    );
    let app =
        Router::new().route("/", get(|| async { "ok" })).layer(RateLimitLayer::new(policy).headers_on_success(true));
    let addr = serve(app).await;
    let c = client();
    for remaining in (0..3).rev() {
        let res = get_with(&c, addr, "/", &[("x-api-key", "alice")]).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["ratelimit-policy"], r#""per-key";q=3;w=60"#);
        // One permit per 20 s; after k permits the bucket is full again in 20·k s.
        let t = 20 * (3 - remaining);
        assert_eq!(res.headers()["ratelimit"], format!(r#""per-key";r={remaining};t={t}"#).as_str());
        assert!(res.headers().get("retry-after").is_none());
    }
    let res = get_with(&c, addr, "/", &[("x-api-key", "alice")]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "20");
    assert_eq!(res.headers()["ratelimit"], r#""per-key";r=0;t=60"#);
    assert_eq!(res.body(), "Too Many Requests\n");
    // Bob has his own bucket.
    assert_eq!(get_with(&c, addr, "/", &[("x-api-key", "bob")]).await.status(), StatusCode::OK);
    // No key: 400 by default, the service is not called.
    assert_eq!(get_with(&c, addr, "/", &[]).await.status(), StatusCode::BAD_REQUEST);
    clock.advance(Duration::from_secs(20));
    assert_eq!(get_with(&c, addr, "/", &[("x-api-key", "alice")]).await.status(), StatusCode::OK);
}

/// Per-IP limits under a flood of new addresses: at the key cap a new client gets 429 with the
/// time a stored key goes idle (not "never"), and `evict` makes room for it instead.
#[tokio::test]
async fn at_the_key_cap_new_clients_are_told_when_to_retry_or_make_room() {
    let clock = ManualClock::new();
    let layer = |policy: AtKeyLimit| {
        let limit: Keyed<Bytes, _, _> = Keyed::builder(TokenBucket::new(Quota::per_minute(3).unwrap()))
            .clock(clock.clone())
            .shards(std::num::NonZeroUsize::MIN)
            .max_keys(std::num::NonZeroUsize::new(2).unwrap())
            .at_key_limit(policy)
            .build();
        RateLimitLayer::new(Policy::new("per-key", Header::new("x-api-key".parse().unwrap()), limit))
    };
    let reject = serve(Router::new().route("/", get(|| async { "ok" })).layer(layer(AtKeyLimit::Reject))).await;
    let evict =
        serve(Router::new().route("/", get(|| async { "ok" })).layer(layer(AtKeyLimit::EvictNearestIdle))).await;
    let c = client();
    for addr in [reject, evict] {
        assert_eq!(get_with(&c, addr, "/", &[("x-api-key", "a")]).await.status(), StatusCode::OK);
        assert_eq!(get_with(&c, addr, "/", &[("x-api-key", "b")]).await.status(), StatusCode::OK);
    }
    clock.advance(Duration::from_secs(5));
    let res = get_with(&c, reject, "/", &[("x-api-key", "c")]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // Key "a" is idle 20 s after its one permit (3 per minute): 15 s from now.
    assert_eq!(res.headers()["retry-after"], "15");
    assert_eq!(get_with(&c, evict, "/", &[("x-api-key", "c")]).await.status(), StatusCode::OK);
    clock.advance(Duration::from_secs(15));
    assert_eq!(get_with(&c, reject, "/", &[("x-api-key", "c")]).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn retry_after_is_rounded_up_never_zero() {
    let clock = ManualClock::new();
    let limit = Limiter::builder(TokenBucket::new(Quota::per_second(10).unwrap())).clock(clock.clone()).build();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(Policy::new("global", Global, limit)).problem_json());
    let addr = serve(app).await;
    let c = client();
    for _ in 0..10 {
        assert_eq!(get_with(&c, addr, "/", &[]).await.status(), StatusCode::OK);
    }
    clock.advance(Duration::from_millis(99)); // 1 ms until the next permit
    let res = get_with(&c, addr, "/", &[]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let body = String::from_utf8(res.body().to_vec()).unwrap();
    assert!(body.contains(r#""status":429"#) && body.contains(r#""retry_after_ms":1"#), "{body}");
}

#[tokio::test]
async fn spoofed_forwarded_for_from_an_untrusted_peer_is_ignored() {
    let clock = ManualClock::new();
    let per_ip = |key: ClientIp| {
        let limit: Keyed<std::net::IpAddr, _, _> =
            Keyed::builder(TokenBucket::new(Quota::per_minute(1).unwrap())).clock(clock.clone()).build();
        RateLimitLayer::new(Policy::new("per-ip", key, limit))
    };
    let untrusting = serve(Router::new().route("/", get(|| async { "ok" })).layer(per_ip(ClientIp::new()))).await;
    let trusting = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(per_ip(ClientIp::new().trust_proxies(["127.0.0.1/32"]).unwrap())),
    )
    .await;
    let c = client();
    // Untrusted peer: each spoofed address still counts as 127.0.0.1.
    assert_eq!(get_with(&c, untrusting, "/", &[("x-forwarded-for", "1.1.1.1")]).await.status(), StatusCode::OK);
    let res = get_with(&c, untrusting, "/", &[("x-forwarded-for", "2.2.2.2")]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // Trusted proxy: the forwarded client addresses are the keys.
    assert_eq!(get_with(&c, trusting, "/", &[("x-forwarded-for", "1.1.1.1")]).await.status(), StatusCode::OK);
    assert_eq!(get_with(&c, trusting, "/", &[("forwarded", "for=2.2.2.2")]).await.status(), StatusCode::OK);
    let res = get_with(&c, trusting, "/", &[("x-forwarded-for", "9.9.9.9, 1.1.1.1")]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "the right-most untrusted hop (1.1.1.1) is the client");
}

#[tokio::test]
async fn concurrency_permit_is_held_for_the_whole_streaming_body() {
    let limit = Keyed::builder(Concurrency::new(1).unwrap()).clock(ManualClock::new()).build();
    let limit = Arc::new(limit);
    let (bodies_tx, bodies_rx) = mpsc::unbounded_channel::<(mpsc::Sender<Frame<Bytes>>, oneshot::Receiver<()>)>();
    let bodies_tx = Arc::new(bodies_tx);
    let app = Router::new()
        .route(
            "/stream",
            get(move || {
                let bodies_tx = bodies_tx.clone();
                async move {
                    let (tx, dropped, body) = streamed();
                    bodies_tx.send((tx, dropped)).unwrap();
                    body
                }
            }),
        )
        .layer(RateLimitLayer::new(Policy::shared("in-flight", ClientIp::new(), limit.clone())));
    let addr = serve(app).await;
    let mut bodies_rx = bodies_rx;
    let c = client();

    // 1. A complete streamed response holds the slot until its last chunk.
    let res = c.request(Request::get(format!("http://{addr}/stream")).body(Empty::new()).unwrap()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let (tx, dropped) = bodies_rx.recv().await.unwrap();
    tx.send(Frame::data(Bytes::from_static(b"first"))).await.unwrap();
    let busy = get_with(&c, addr, "/stream", &[]).await;
    assert_eq!(busy.status(), StatusCode::TOO_MANY_REQUESTS, "headers were sent but the body is still streaming");
    assert!(busy.headers().get("retry-after").is_none(), "a concurrency limit frees on release, not with time");
    drop(tx); // end of body
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "first");
    dropped.await.unwrap();
    assert!(limit.check(&"127.0.0.1".parse().unwrap(), 1).is_ok(), "slot released at the end of the body");

    // 2. A client that goes away mid-body frees the slot.
    let res =
        client().request(Request::get(format!("http://{addr}/stream")).body(Empty::new()).unwrap()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let (tx, dropped) = bodies_rx.recv().await.unwrap();
    tx.send(Frame::data(Bytes::from_static(b"partial"))).await.unwrap();
    drop(res); // disconnect without reading the rest
    // hyper notices the closed connection when it next writes; keep offering chunks.
    let feeder = tokio::spawn(async move { while tx.send(Frame::data(Bytes::from_static(b"more"))).await.is_ok() {} });
    tokio::time::timeout(Duration::from_secs(10), dropped).await.expect("server dropped the body").unwrap();
    feeder.abort();
    assert!(limit.check(&"127.0.0.1".parse().unwrap(), 1).is_ok(), "slot released on disconnect");
}

#[tokio::test]
async fn routes_with_different_layers_and_a_chain_of_policies() {
    let clock = ManualClock::new();
    let strict = Limiter::builder(SlidingLog::new(Quota::per_minute(1).unwrap())).clock(clock.clone()).build();
    let per_tenant: Keyed<Bytes, _, _> = keyed_bucket(&clock, Quota::per_minute(3).unwrap());
    let global = Limiter::builder(TokenBucket::new(Quota::per_minute(4).unwrap())).clock(clock.clone()).build();
    let app = Router::new()
        .route(
            "/strict",
            get(|| async { "strict" }).route_layer(RateLimitLayer::new(Policy::new("strict", Global, strict))),
        )
        .route("/open", get(|| async { "open" }))
        .layer(
            RateLimitLayer::new(
                Policy::new("tenant", Header::new("x-tenant".parse().unwrap()), per_tenant)
                    .on_missing_key(MissingKey::Shared(Bytes::from_static(b"anonymous"))),
            )
            .and(Policy::new("global", Global, global)),
        );
    let addr = serve(app).await;
    let c = client();
    assert_eq!(get_with(&c, addr, "/strict", &[("x-tenant", "a")]).await.status(), StatusCode::OK);
    let res = get_with(&c, addr, "/strict", &[("x-tenant", "a")]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers()["ratelimit"].to_str().unwrap().starts_with("\"strict\""));
    // Tenant a has used 2 of 3 (the outer layer counted both /strict calls), global 2 of 4.
    assert_eq!(get_with(&c, addr, "/open", &[("x-tenant", "a")]).await.status(), StatusCode::OK);
    let res = get_with(&c, addr, "/open", &[("x-tenant", "a")]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers()["ratelimit"].to_str().unwrap().starts_with("\"tenant\""));
    // Requests without a tenant share one bucket; the tenant rejection above took nothing from global.
    assert_eq!(get_with(&c, addr, "/open", &[]).await.status(), StatusCode::OK);
    let res = get_with(&c, addr, "/open", &[("x-tenant", "b")]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "global (4/min) is spent");
    assert!(res.headers()["ratelimit"].to_str().unwrap().starts_with("\"global\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_layer_shared_by_many_connections_admits_exactly_the_limit() {
    let clock = ManualClock::new();
    let limit = Limiter::builder(TokenBucket::new(Quota::per_minute(20).unwrap())).clock(clock.clone()).build();
    let app =
        Router::new().route("/", get(|| async { "ok" })).layer(RateLimitLayer::new(Policy::new("g", Global, limit)));
    let addr = serve(app).await;
    let tasks: Vec<_> =
        (0..50).map(|_| tokio::spawn(async move { get_with(&client(), addr, "/", &[]).await.status() })).collect();
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(ok, 20);
}

#[tokio::test]
async fn cost_closure_weights_requests() {
    let clock = ManualClock::new();
    let limit = Limiter::builder(TokenBucket::new(Quota::per_minute(10).unwrap())).clock(clock.clone()).build();
    let policy = Policy::new("cost", Global, limit)
        .cost(|req| req.headers.get("x-weight").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1));
    let addr = serve(Router::new().route("/", get(|| async { "ok" })).layer(RateLimitLayer::new(policy))).await;
    let c = client();
    assert_eq!(get_with(&c, addr, "/", &[("x-weight", "7")]).await.status(), StatusCode::OK);
    assert_eq!(get_with(&c, addr, "/", &[("x-weight", "4")]).await.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(get_with(&c, addr, "/", &[("x-weight", "3")]).await.status(), StatusCode::OK);
    // More than the limiter can ever grant: 429 without Retry-After (waiting cannot help).
    let res = get_with(&c, addr, "/", &[("x-weight", "11")]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().get("retry-after").is_none());
}
