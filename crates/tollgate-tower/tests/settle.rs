//! Costs known after the response (`Policy::settle_from`), over real HTTP: an axum server on a
//! free port, a hyper client, limiters on a ManualClock. A request reserves its estimate
//! (`x-max-tokens`); the handler reports what it used in a header, a trailer or a `UsedCost`
//! extension; the reservation is settled when the response body ends.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::{Extension, Router};
use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use metrics_exporter_prometheus::PrometheusBuilder;
use support::{serve, streamed};
use tokio::sync::{mpsc, oneshot};
use tollgate::{
    Answer, Check, Decision, FixedWindow, Lease, Limiter, ManualClock, Quota, RateLimiter, Refund, Settle, TokenBucket,
};
use tollgate_tower::{Global, Policy, RateLimitLayer, SettleFrom, UsedCost};

type HttpClient = Client<HttpConnector, Empty<Bytes>>;
type Tokens = Arc<Limiter<TokenBucket, ManualClock>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

fn request(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Request<Empty<Bytes>> {
    let mut req = Request::get(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(Empty::new()).unwrap()
}

/// The response with its whole body read (so the server has sent it to its end).
async fn fetch(c: &HttpClient, addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response<Bytes> {
    let res = c.request(request(addr, path, headers)).await.unwrap();
    let (parts, body) = res.into_parts();
    Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

/// 60 tokens a minute (one a second), all 60 at once.
fn tokens(clock: &ManualClock) -> Tokens {
    Arc::new(Limiter::builder(TokenBucket::new(Quota::per_minute(60).unwrap())).clock(clock.clone()).build())
}

fn left(tokens: &Tokens) -> u64 {
    tokens.statistics().available
}

/// A policy on `tokens` whose estimate is the request's `x-max-tokens`.
fn estimated(name: &str, tokens: &Tokens, from: SettleFrom) -> Policy<Global, Limiter<TokenBucket, ManualClock>> {
    Policy::shared(name, Global, tokens.clone())
        .cost(|req| req.headers.get("x-max-tokens").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1))
        .settle_from(from)
}

fn used_header() -> SettleFrom {
    SettleFrom::Header("x-tokens-used".parse().unwrap())
}

/// A handler that reports in `x-tokens-used` the request's `x-used`, as it is.
async fn echo_used(headers: HeaderMap) -> Response<Body> {
    let mut res = Response::new(Body::from("ok"));
    if let Some(used) = headers.get("x-used") {
        res.headers_mut().insert("x-tokens-used", used.clone());
    }
    res
}

#[tokio::test]
async fn a_smaller_cost_gives_the_difference_back_and_a_larger_one_is_a_debt_paid_first() {
    let clock = ManualClock::new();
    let tokens = tokens(&clock);
    let app = Router::new().route("/", get(echo_used)).layer(RateLimitLayer::new(estimated(
        "tokens",
        &tokens,
        used_header(),
    )));
    let (addr, c) = (serve(app).await, client());

    let res = fetch(&c, addr, "/", &[("x-max-tokens", "50"), ("x-used", "10")]).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.body(), "ok");
    assert_eq!(left(&tokens), 50, "50 reserved, 10 used: 40 given back");

    // 50 fit only because 40 were given back: never settled, this would be a 429.
    let res = fetch(&c, addr, "/", &[("x-max-tokens", "50"), ("x-used", "80")]).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(left(&tokens), 0);

    // 80 used of 50 reserved: 30 past the limit, paid before the next token (one a second).
    let res = fetch(&c, addr, "/", &[("x-max-tokens", "1"), ("x-used", "1")]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "31");
    clock.advance(Duration::from_secs(30));
    let res = fetch(&c, addr, "/", &[("x-max-tokens", "1"), ("x-used", "1")]).await;
    assert_eq!(res.headers()["retry-after"], "1", "the debt is paid, the next token is a second away");
    clock.advance(Duration::from_secs(1));
    assert_eq!(fetch(&c, addr, "/", &[("x-max-tokens", "1"), ("x-used", "1")]).await.status(), StatusCode::OK);
}

type Streams = mpsc::UnboundedSender<(mpsc::Sender<Frame<Bytes>>, oneshot::Receiver<()>, UsedCost)>;

/// A streaming handler: hands the test its body's sender, and counts the bytes of the data sent
/// in a `UsedCost` extension as they are streamed.
fn streaming(streams: Streams) -> axum::routing::MethodRouter {
    get(move || {
        let streams = streams.clone();
        async move {
            let (tx, dropped, body) = streamed();
            let used = UsedCost::new();
            streams.send((tx, dropped, used.clone())).unwrap();
            let counter = used.clone();
            let counted = body.into_data_stream().map(move |chunk| {
                let chunk = chunk?;
                counter.add(chunk.len() as u64);
                Ok::<_, axum::Error>(chunk)
            });
            (Extension(used), Body::from_stream(counted))
        }
    })
}

fn trailers(used: &'static str) -> Frame<Bytes> {
    let mut trailers = HeaderMap::new();
    trailers.insert("x-tokens-used", HeaderValue::from_static(used));
    Frame::trailers(trailers)
}

#[tokio::test]
async fn a_streamed_body_is_settled_from_its_trailer_when_it_ends_and_keeps_the_estimate_when_dropped() {
    let clock = ManualClock::new();
    let tokens = tokens(&clock);
    let (streams_tx, mut streams) = mpsc::unbounded_channel();
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let streams_tx = streams_tx.clone();
                async move {
                    let (tx, dropped, body) = streamed();
                    streams_tx.send((tx, dropped)).unwrap();
                    // HTTP/1.1 sends the trailers declared.
                    ([("trailer", "x-tokens-used")], body)
                }
            }),
        )
        .layer(RateLimitLayer::new(estimated(
            "tokens",
            &tokens,
            SettleFrom::Trailer("x-tokens-used".parse().unwrap()),
        )));
    let (addr, c) = (serve(app).await, client());

    // `te: trailers`: the client takes trailers, so the server sends them (the estimate is
    // settled from the trailer frame whether it is sent or not).
    let res = c.request(request(addr, "/", &[("x-max-tokens", "50"), ("te", "trailers")])).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let (tx, _dropped) = streams.recv().await.unwrap();
    tx.send(Frame::data(Bytes::from_static(b"first"))).await.unwrap();
    let mut body = res.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "first");
    assert_eq!(left(&tokens), 10, "streaming: the estimate is held, not settled");
    tx.send(Frame::data(Bytes::from_static(b" second"))).await.unwrap();
    tx.send(trailers("5")).await.unwrap();
    drop(tx);
    let rest = body.collect().await.unwrap();
    assert_eq!(rest.trailers().map(|t| &t["x-tokens-used"]), Some(&HeaderValue::from_static("5")));
    assert_eq!(rest.to_bytes(), " second");
    assert_eq!(left(&tokens), 55, "settled at the trailer for 5 of 50");

    // A client gone mid-stream: the body is dropped before its trailer; the estimate stands.
    let res = client().request(request(addr, "/", &[("x-max-tokens", "20"), ("te", "trailers")])).await.unwrap();
    let (tx, dropped) = streams.recv().await.unwrap();
    tx.send(Frame::data(Bytes::from_static(b"partial"))).await.unwrap();
    assert_eq!(left(&tokens), 35);
    drop(res);
    // The server notices the closed connection when it next writes; keep offering chunks.
    let feeder = tokio::spawn(async move { while tx.send(Frame::data(Bytes::from_static(b"more"))).await.is_ok() {} });
    tokio::time::timeout(Duration::from_secs(10), dropped).await.expect("server dropped the body").unwrap();
    feeder.abort();
    assert_eq!(left(&tokens), 35, "dropped mid-stream: the 20 estimated stay taken");
}

#[tokio::test]
async fn a_streamed_body_counted_in_an_extension_is_settled_for_the_count_when_it_ends() {
    let clock = ManualClock::new();
    let tokens = tokens(&clock);
    let (streams_tx, mut streams) = mpsc::unbounded_channel();
    let app = Router::new().route("/", streaming(streams_tx)).layer(RateLimitLayer::new(estimated(
        "tokens",
        &tokens,
        SettleFrom::Extension,
    )));
    let (addr, c) = (serve(app).await, client());

    let res = c.request(request(addr, "/", &[("x-max-tokens", "40")])).await.unwrap();
    let (tx, _dropped, used) = streams.recv().await.unwrap();
    tx.send(Frame::data(Bytes::from_static(b"abc"))).await.unwrap();
    let mut body = res.into_body();
    assert_eq!(body.frame().await.unwrap().unwrap().into_data().unwrap(), "abc");
    assert_eq!(used.get(), Some(3));
    assert_eq!(left(&tokens), 20, "3 counted so far, but not settled before the end");
    tx.send(Frame::data(Bytes::from_static(b"defgh"))).await.unwrap();
    drop(tx);
    assert_eq!(body.collect().await.unwrap().to_bytes(), "defgh");
    assert_eq!(left(&tokens), 52, "settled for the 8 bytes counted, not the 40 estimated");

    // Dropped mid-stream with 4 counted: the estimate stands, not the count.
    let res = client().request(request(addr, "/", &[("x-max-tokens", "30")])).await.unwrap();
    let (tx, dropped, used) = streams.recv().await.unwrap();
    tx.send(Frame::data(Bytes::from_static(b"wxyz"))).await.unwrap();
    drop(res);
    let feeder = tokio::spawn(async move { while tx.send(Frame::data(Bytes::from_static(b"more"))).await.is_ok() {} });
    tokio::time::timeout(Duration::from_secs(10), dropped).await.expect("server dropped the body").unwrap();
    feeder.abort();
    assert!(used.get().is_some_and(|n| n >= 4));
    assert_eq!(left(&tokens), 22);
}

#[tokio::test]
async fn a_cost_missing_or_not_a_number_keeps_the_estimate_and_the_response_is_sent() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let clock = ManualClock::new();
    let tokens = tokens(&clock);
    let app = metrics::with_local_recorder(&recorder, || {
        Router::new().route("/", get(echo_used)).layer(RateLimitLayer::new(estimated("tokens", &tokens, used_header())))
    });
    let (addr, c) = (serve(app).await, client());

    for used in [Some("lots"), Some("-3"), Some("1e3"), None] {
        let headers: Vec<_> = [("x-max-tokens", "10")].into_iter().chain(used.map(|u| ("x-used", u))).collect();
        let res = fetch(&c, addr, "/", &headers).await;
        assert_eq!((res.status(), &res.body()[..]), (StatusCode::OK, &b"ok"[..]), "{used:?}");
    }
    assert_eq!(left(&tokens), 20, "4 estimates of 10 stand");
    let res = fetch(&c, addr, "/", &[("x-max-tokens", "10"), ("x-used", " 2 ")]).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(left(&tokens), 18, "a count, blanks around it allowed, is settled");

    let settles = |outcome: &str| {
        let series = format!("tollgate_layer_settles_total{{policy=\"tokens\",outcome=\"{outcome}\"}} ");
        let text = metrics.render();
        text.lines().find_map(|l| l.strip_prefix(&series)?.parse::<f64>().ok())
    };
    assert_eq!(settles("unparseable"), Some(3.0));
    assert_eq!(settles("missing"), Some(1.0));
    assert_eq!(settles("settled"), Some(1.0));
    assert_eq!(settles("dropped"), Some(0.0));
    assert_eq!(settles("failed"), Some(0.0));
}

#[tokio::test]
async fn each_settling_policy_settles_its_own_cost_and_a_later_rejection_gives_the_estimates_back() {
    let clock = ManualClock::new();
    let (by_header, by_extension) = (tokens(&clock), tokens(&clock));
    let two_a_minute = Limiter::builder(FixedWindow::new(Quota::per_minute(2).unwrap())).clock(clock.clone()).build();
    let app = Router::new()
        .route(
            "/",
            get(|headers: HeaderMap| async move {
                let used = headers.get("x-used-2").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(0);
                (Extension(UsedCost::from(used)), echo_used(headers).await)
            }),
        )
        .layer(
            RateLimitLayer::new(estimated("by-header", &by_header, used_header()))
                .and(estimated("by-extension", &by_extension, SettleFrom::Extension))
                .and(Policy::new("requests", Global, two_a_minute))
                .headers_on_success(true),
        );
    let (addr, c) = (serve(app).await, client());

    let res = fetch(&c, addr, "/", &[("x-max-tokens", "20"), ("x-used", "5"), ("x-used-2", "25")]).await;
    assert_eq!(res.status(), StatusCode::OK);
    let ratelimit = res.headers()["ratelimit"].to_str().unwrap();
    assert!(ratelimit.starts_with(r#""by-header";r=40;"#), "the reservation's state: {ratelimit}");
    assert_eq!((left(&by_header), left(&by_extension)), (55, 35));
    let res = fetch(&c, addr, "/", &[("x-max-tokens", "10"), ("x-used", "10"), ("x-used-2", "0")]).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!((left(&by_header), left(&by_extension)), (45, 35), "a cost of 0 gives the whole estimate back");

    // The third request of the minute: both reservations are cancelled, nothing is charged.
    let res = fetch(&c, addr, "/", &[("x-max-tokens", "30"), ("x-used", "1"), ("x-used-2", "1")]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers()["ratelimit"].to_str().unwrap().starts_with("\"requests\""));
    assert_eq!((left(&by_header), left(&by_extension)), (45, 35));
}

/// A limiter whose settles are answered later, as a distributed limiter's are: the settle is
/// applied to `inner` only when its future is driven past a yield.
struct Later {
    inner: Tokens,
    settled: Arc<AtomicU64>,
}

impl RateLimiter for Later {
    fn decide(&self, key: &(), n: u64) -> Decision {
        RateLimiter::decide(&*self.inner, key, n)
    }
    fn check(&self, key: &(), n: u64) -> Check {
        RateLimiter::check(&*self.inner, key, n)
    }
    fn give_back(&self, key: &(), lease: Lease) -> Refund {
        RateLimiter::give_back(&*self.inner, key, lease)
    }
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }
    fn window(&self) -> Option<Duration> {
        self.inner.window()
    }
    fn settle(&self, _key: &(), lease: &Lease, actual: u64, _id: u64) -> Settle {
        let (inner, settled) = (self.inner.clone(), self.settled.clone());
        // A token bucket's lease holds nothing: a copy settles as the lease would.
        let lease = Lease::new(lease.meta(), lease.permits(), lease.granted_at());
        Answer::Pending(Box::pin(async move {
            tokio::task::yield_now().await;
            Limiter::settle(&inner, &lease, actual)?;
            settled.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }))
    }
}

#[tokio::test]
async fn a_settle_answered_later_is_awaited_before_the_response_ends_even_an_empty_one() {
    let clock = ManualClock::new();
    let tokens = tokens(&clock);
    let settled = Arc::new(AtomicU64::new(0));
    let later = Later { inner: tokens.clone(), settled: settled.clone() };
    let policy = Policy::new("later", Global, later)
        .cost(|req| req.headers.get("x-max-tokens").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1))
        .settle_from(used_header());
    let app = Router::new()
        .route("/", get(echo_used))
        .route("/empty", get(|| async { (StatusCode::NO_CONTENT, [("x-tokens-used", "4")]) }))
        .layer(RateLimitLayer::new(policy));
    let (addr, c) = (serve(app).await, client());

    let res = fetch(&c, addr, "/", &[("x-max-tokens", "50"), ("x-used", "10")]).await;
    assert_eq!((res.status(), &res.body()[..]), (StatusCode::OK, &b"ok"[..]));
    assert_eq!(settled.load(Ordering::SeqCst), 1, "the last frame waited for the settle");
    assert_eq!(left(&tokens), 50);

    // No body to end: the response itself waits for the settle.
    let res = fetch(&c, addr, "/empty", &[("x-max-tokens", "20")]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(settled.load(Ordering::SeqCst), 2);
    assert_eq!(left(&tokens), 46, "20 reserved, 4 used");
}
