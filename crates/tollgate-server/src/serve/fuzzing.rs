//! The code that reads bytes off sockets, driven by arbitrary input over in-memory streams, with
//! the properties every input must keep checked: one place, used by the cargo-fuzz targets in
//! `fuzz/` (`http_connection`, `grpc_unary`) and, in a short form CI runs, by proptests in
//! `tests/http_connections.rs` and `tests/grpc_connections.rs`. Not part of the API.
//!
//! Both entry points panic when a property fails, and must run on a current-thread tokio runtime
//! with time paused (`start_paused`): timeouts then pass in virtual time, at once.

use std::convert::Infallible;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use http_body_util::BodyExt;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tollgate::ManualClock;
use tollgate_policy::Policy;

use super::engine::Engine;
use super::model::Mode;
use super::net::grpc::Unary;
use super::ops::metrics::Metrics;
use super::protocol::http::{Api, routes};
use super::protocol::rls::Rls;

/// The limits inputs are decided on: one counter in `fz` that every call there counts on, so
/// large it never limits; the gRPC one per `descriptors[0].k`.
const LIMITS: &str = r#"
- namespace: fz
  max_value: 1000000000
  seconds: 3600
- namespace: grpc
  max_value: 1000000000
  seconds: 3600
  variables: ["descriptors[0].k"]
"#;

/// The limits' `max_value`.
const MAX: u64 = 1_000_000_000;

/// The HTTP connections' read timeout.
const TIMEOUT: Duration = Duration::from_secs(5);

static POLICY: LazyLock<Policy> = LazyLock::new(|| Policy::parse(LIMITS, "fuzz.yaml").expect("the fuzz limits parse"));

/// One recorder for every input: the properties do not read it, and a recorder dropped after
/// each input leaves its histograms' epoch-deferred blocks to LeakSanitizer.
static METRICS: LazyLock<Arc<Metrics>> = LazyLock::new(|| Arc::new(Metrics::new()));

/// A fresh engine (counters from zero) on the fuzz limits.
fn engine() -> (Arc<Engine<ManualClock>>, Arc<Metrics>) {
    let engine = Engine::new(POLICY.clone(), Mode::Accuracy, false, ManualClock::new());
    (Arc::new(engine), METRICS.clone())
}

/// Hits counted in `namespace`, over all its counters.
async fn counted(engine: &Engine<ManualClock>, namespace: &str) -> u64 {
    let list = engine.list_counters(namespace, 1000).await.expect("in-memory counters list");
    list.counters.iter().map(|c| MAX - c.meta.remaining).sum()
}

/// The input, read as choices; once it runs out, every choice is 0.
struct Choices<'a>(&'a [u8]);

impl Choices<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else { return 0 };
        self.0 = rest;
        b
    }

    fn below(&mut self, n: usize) -> usize {
        usize::from(self.byte()) % n
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max + 1).min(self.0.len());
        let (taken, rest) = self.0.split_at(n);
        self.0 = rest;
        taken.to_vec()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One request of the stream an HTTP input makes: what a client sends as it is, or with one of
/// the edges that are refused, or handed to hyper, or raw bytes.
fn http_request(c: &mut Choices<'_>, out: &mut Vec<u8>) {
    let body = format!(
        r#"{}{{"namespace":"fz","values":{{"k":"v"}},"delta":1,"response_headers":"DraftVersion03"}}"#,
        " ".repeat(c.below(3) * 7)
    );
    let path = ["/check_and_report", "/report"][c.below(2)];
    let host = ["host: t\r\n", "", "host: t\r\nhost: t\r\n", "host: a b\r\n", "Host: [::1]:80\r\n", "host:\r\n"]
        [if c.below(4) == 0 { c.below(6) } else { 0 }];
    let pad = match c.below(16) {
        0 => format!("x-pad: {}\r\n", "a".repeat(16 * 1024)),
        1 => format!("x-pad: {}\r\n", "a".repeat(c.below(256) * 8)),
        _ => String::new(),
    };
    let head = |framing: &str| format!("POST {path} HTTP/1.1\r\n{host}{pad}{framing}");
    let request = match c.below(12) {
        0..=3 => format!("{}content-length: {}\r\n\r\n{body}", head(""), body.len()),
        4 => format!("{}transfer-encoding: chunked\r\n\r\n{}", head(""), chunks(c, &body)),
        5 => format!("{}connection: close\r\ncontent-length: {}\r\n\r\n{body}", head(""), body.len()),
        6 => format!("{}expect: 100-continue\r\ncontent-length: {}\r\n\r\n{body}", head(""), body.len()),
        7 => format!("POST {path} HTTP/1.0\r\n{pad}content-length: {}\r\n\r\n{body}", body.len()),
        8 => {
            let coding = ["gzip, chunked", "chunked, chunked", "chunked,", "identity"][c.below(4)];
            format!("{}transfer-encoding: {coding}\r\n\r\n{}", head(""), chunks(c, &body))
        }
        9 => {
            let length = ["2097153", "18446744073709551615", "18446744073709551616", "1, 1", "-1"][c.below(5)];
            format!("{}content-length: {length}\r\n\r\n{body}", head(""))
        }
        10 => {
            // A length that does not match the body: the rest is read as the next request.
            let length = body.len().saturating_sub(c.below(4)) + c.below(3);
            format!("{}content-length: {length}\r\n\r\n{body}", head(""))
        }
        _ => ["GET /status HTTP/1.1\r\nhost: t\r\n\r\n", "GET /limits/fz HTTP/1.1\r\nhost: t\r\n\r\n"][c.below(2)]
            .to_string(),
    };
    out.extend_from_slice(request.as_bytes());
}

/// `body` in chunks of sizes the input picks, then the last chunk.
fn chunks(c: &mut Choices<'_>, body: &str) -> String {
    let mut rest = body;
    let mut out = String::new();
    while !rest.is_empty() {
        let n = (c.below(40) + 1).min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        out += &format!("{n:x}\r\n{chunk}\r\n");
        rest = tail;
    }
    out + "0\r\n\r\n"
}

/// Raw bytes from the input that cannot make a call in `fz` by themselves (no `z`, no escape)
/// nor a `HEAD` request (whose answer has a length and no body, which `responses` would misread).
fn junk(c: &mut Choices<'_>, out: &mut Vec<u8>) {
    out.extend(c.bytes(64).into_iter().filter(|&b| b != b'z' && b != b'\\'));
}

/// No `HEAD ` anywhere in `stream`, even across pieces.
fn no_head(stream: &mut [u8]) {
    while let Some(at) = stream.windows(5).position(|w| w == b"HEAD ") {
        stream[at + 3] = b'P';
    }
}

/// What the client sends: pieces of the stream, each written whole, then after a pause or not.
struct Write {
    bytes: Vec<u8>,
    pause: bool,
}

/// The stream an input makes, and how it is cut into writes: a quarter of inputs are raw bytes
/// (but for what [`junk`] leaves out) cut every few bytes, the rest requests built from the
/// input, some with edges, and raw bytes between them, cut where the input says.
fn http_stream(input: &[u8]) -> Vec<Write> {
    let mut c = Choices(input);
    let mode = c.byte();
    if mode < 64 {
        let mut stream: Vec<u8> = c.0.iter().copied().filter(|&b| b != b'z' && b != b'\\').collect();
        let cut = usize::from(mode % 32) + 1;
        no_head(&mut stream);
        return stream.chunks(cut).map(|bytes| Write { bytes: bytes.to_vec(), pause: false }).collect();
    }
    let mut stream = Vec::new();
    if mode == 255 {
        stream.extend_from_slice(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    }
    for _ in 0..16 {
        if c.is_empty() {
            break;
        }
        match c.below(8) {
            0..=5 => http_request(&mut c, &mut stream),
            _ => junk(&mut c, &mut stream),
        }
    }
    no_head(&mut stream);
    let mut writes = Vec::new();
    let mut rest = &stream[..];
    while !rest.is_empty() {
        let n = match c.below(4) {
            0 => c.below(8) + 1,
            1 => c.below(256) + 1,
            _ => rest.len(),
        }
        .min(rest.len());
        let (bytes, tail) = rest.split_at(n);
        writes.push(Write { bytes: bytes.to_vec(), pause: c.below(16) == 0 });
        rest = tail;
    }
    writes
}

/// Drives one HTTP connection (the fast path of `http1.rs`, and hyper behind it once handed
/// over) with the byte stream `input` makes, cut at the points it picks, and checks:
///
/// - no panic;
/// - the answers are whole HTTP/1 responses (each sized, or without a body), in order:
///   every call in `fz` answered 200 reports one hit fewer remaining than the one before it;
/// - every call is counted at most once, and only if it was answered 200: the hits counted are
///   the calls so answered;
/// - nothing follows an answer that says `connection: close`, and the server closes the
///   connection within twice the read timeout of the last byte it was sent.
pub async fn http_connection(input: &[u8]) {
    let writes = http_stream(input);
    let stream: Vec<u8> = writes.iter().flat_map(|w| w.bytes.iter().copied()).collect();
    let (engine, metrics) = engine();
    let api = Api::new(engine.clone(), metrics, None, Some(TIMEOUT));
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let (client, server) = tokio::io::duplex(8 * 1024);
    let serving = super::net::http1::connection(api.clone(), routes(api), Some(TIMEOUT), stop, server);
    let (mut read, mut write) = tokio::io::split(client);
    let sending = async {
        for w in writes {
            if w.pause {
                tokio::time::sleep(TIMEOUT / 3).await;
            }
            if write.write_all(&w.bytes).await.is_err() {
                break;
            }
            // The server reads what it can before the next piece comes.
            tokio::task::yield_now().await;
        }
        Instant::now()
    };
    let receiving = async {
        let mut output = Vec::new();
        let read = tokio::time::timeout(20 * TIMEOUT, read.read_to_end(&mut output)).await;
        assert!(read.is_ok(), "the connection was never closed: {:?}", String::from_utf8_lossy(&stream));
        (output, Instant::now())
    };
    let ((), last_write, (output, closed)) = tokio::join!(serving, sending, receiving);
    let held = closed.saturating_duration_since(last_write);
    assert!(held <= 2 * TIMEOUT + Duration::from_millis(50), "held {held:?} after the last byte");

    if !output.starts_with(b"HTTP/1.") {
        // An HTTP/2 connection answers in frames; hyper's, not read here.
        let http2 = stream.starts_with(b"PRI * HTTP/2");
        assert!(output.is_empty() || http2, "not HTTP/1: {:?}", String::from_utf8_lossy(&output));
        if http2 {
            return;
        }
    }
    let answers = responses(&output);
    // In order, each counted once: the counter's remaining hits go down one per answer.
    let mut decided = 0;
    for answer in &answers {
        let Some(remaining) = &answer.remaining else { continue };
        assert_eq!(answer.status, 200, "a call in fz is never limited");
        decided += 1;
        assert_eq!(remaining, &(MAX - decided).to_string(), "answers out of order, or a call counted twice");
    }
    assert_eq!(counted(&engine, "fz").await, decided, "hits counted without their answer");
}

/// An answer as the client reads it.
struct Answer {
    status: u16,
    /// `x-ratelimit-remaining`, on a decided call's answer.
    remaining: Option<String>,
}

/// The responses in `output`, which must be nothing else, none cut short, none after one that
/// closes the connection.
fn responses(output: &[u8]) -> Vec<Answer> {
    let text = || String::from_utf8_lossy(output).into_owned();
    let mut rest = output;
    let mut answers = Vec::new();
    while !rest.is_empty() {
        let mut lines = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut lines);
        let head = match response.parse(rest) {
            Ok(httparse::Status::Complete(head)) => head,
            other => panic!("not a whole response ({other:?}) at {} of {:?}", output.len() - rest.len(), text()),
        };
        let status = response.code.expect("a parsed status");
        let header = |name: &str| response.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value);
        let length = match header("content-length") {
            Some(length) => std::str::from_utf8(length).ok().and_then(|l| l.parse::<usize>().ok()),
            None if (100..200).contains(&status) || status == 204 || status == 304 => Some(0),
            None => None,
        };
        let length = length.unwrap_or_else(|| panic!("an answer without a length: {:?}", text()));
        assert!(status != 101, "no upgrade is served: {:?}", text());
        assert!(rest.len() >= head + length, "an answer cut short: {:?}", text());
        let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case(b"close"));
        let remaining = header("x-ratelimit-remaining").map(|v| String::from_utf8_lossy(v).into_owned());
        answers.push(Answer { status, remaining });
        rest = &rest[head + length..];
        assert!(!close || rest.is_empty(), "bytes after an answer that closes: {:?}", text());
    }
    answers
}

/// gRPC's methods, the first three answered by `net/grpc.rs`.
const METHODS: [&str; 4] = [
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    "/kuadrant.service.ratelimit.v1.RateLimitService/CheckRateLimit",
    "/kuadrant.service.ratelimit.v1.RateLimitService/Report",
    "/grpc.health.v1.Health/Check",
];

/// One gRPC request an input makes: the method, headers, and a body (one framed message, or
/// framed wrong, or raw bytes) cut into frames at the points it picks; with the most hits its
/// message could count.
fn grpc_request(c: &mut Choices<'_>) -> (usize, http::Request<tonic::body::Body>, u64) {
    let method = c.below(4);
    let message = match c.below(4) {
        0 => c.bytes(64),
        _ => {
            let domain = ["grpc", "fz", "", "other"][if c.below(4) == 0 { c.below(4) } else { 0 }];
            let descriptors = (0..c.below(3) + 1)
                .map(|_| RateLimitDescriptor {
                    entries: vec![Entry { key: "k".into(), value: ["v", "w", ""][c.below(3)].into() }],
                    ..Default::default()
                })
                .collect();
            let hits_addend = [0, 1, 2, u32::MAX][c.below(4)];
            RateLimitRequest { domain: domain.into(), descriptors, hits_addend }.encode_to_vec()
        }
    };
    let most = RateLimitRequest::decode(&message[..]).map_or(0, |request| {
        let hits = u64::from(request.hits_addend.max(1));
        request.descriptors.iter().map(|d| d.hits_addend.map_or(hits, |h| h.value)).fold(0u64, u64::saturating_add)
    });
    let length = u32::try_from(message.len()).unwrap_or(u32::MAX);
    let mut body = Vec::new();
    match c.below(8) {
        0 => body = message,
        1 => body.extend([1].into_iter().chain(length.to_be_bytes()).chain(message)),
        2 => body.extend([0].into_iter().chain((length + 1).to_be_bytes()).chain(message)),
        3 => {
            // Two messages in a unary call.
            let framed: Vec<u8> = [0].into_iter().chain(length.to_be_bytes()).chain(message).collect();
            body.extend(framed.iter().chain(&framed));
        }
        _ => body.extend([0].into_iter().chain(length.to_be_bytes()).chain(message)),
    }
    let mut frames = Vec::new();
    let mut rest = &body[..];
    while !rest.is_empty() {
        let n = if c.below(2) == 0 { rest.len() } else { (c.below(16) + 1).min(rest.len()) };
        frames.push(Ok(http_body::Frame::data(Bytes::copy_from_slice(&rest[..n]))));
        rest = &rest[n..];
    }
    match c.below(8) {
        0 => frames.push(Err(tonic::Status::cancelled("the client went away"))),
        1 => frames.push(Ok(http_body::Frame::trailers(http::HeaderMap::new()))),
        _ => {}
    }
    let body = tonic::body::Body::new(http_body_util::StreamBody::new(futures::stream::iter(frames)));
    let mut request = http::Request::post(METHODS[method]);
    let content_type = ["application/grpc", "application/grpc+proto", "application/json", ""][c.below(4)];
    if !content_type.is_empty() {
        request = request.header("content-type", content_type);
    }
    if let Some(encoding) = [None, Some("identity"), Some("gzip")][c.below(3)] {
        request = request.header("grpc-encoding", encoding);
    }
    (method, request.body(body).expect("a valid request"), most)
}

/// Drives the fast gRPC path (`net/grpc.rs`) with the calls `input` makes, their bodies cut into
/// frames at the points it picks, and checks for each:
///
/// - no panic;
/// - a call it takes is answered as gRPC says: a trailers-only error (a `grpc-status` other than
///   0, with a message), or one message that decodes, then `grpc-status: 0`;
/// - hits are counted only for a call answered OK, by `ShouldRateLimit` or `Report`, and once:
///   no more than its message asks for, and the least remaining its answer reports is a
///   counter's.
pub async fn grpc_unary(input: &[u8]) {
    use tower::Service;

    let (engine, metrics) = engine();
    let rls = Arc::new(Rls::new(engine.clone(), metrics));
    // What `net/grpc.rs` does not take is tonic's: here, a 404 that says so.
    let routes = tower::service_fn(|_: http::Request<tonic::body::Body>| async {
        let mut response = http::Response::new(tonic::body::Body::empty());
        *response.status_mut() = http::StatusCode::NOT_FOUND;
        Ok::<_, Infallible>(response)
    });
    let mut service = Unary::new(rls, routes);
    let mut c = Choices(input);
    for _ in 0..4 {
        if c.is_empty() {
            break;
        }
        let before = counted(&engine, "grpc").await;
        let (method, request, most) = grpc_request(&mut c);
        let response = service.call(request).await.unwrap_or_else(|e: Infallible| match e {});
        let after = counted(&engine, "grpc").await;
        let (parts, body) = response.into_parts();
        if parts.status == http::StatusCode::NOT_FOUND {
            assert_eq!(after, before, "a call not taken was counted");
            continue;
        }
        assert_eq!(parts.status, http::StatusCode::OK);
        let collected = body.collect().await.expect("the answer's body is infallible");
        let trailers = collected.trailers().cloned();
        let data = collected.to_bytes();
        if let Some(status) = parts.headers.get("grpc-status") {
            // Trailers-only: an error, saying why.
            assert_ne!(status, "0", "a trailers-only OK");
            assert!(parts.headers.contains_key("grpc-message"), "{:?}", parts.headers);
            assert!(data.is_empty() && trailers.is_none(), "more after a trailers-only answer");
            assert_eq!(after, before, "a call refused ({status:?}) was counted");
            continue;
        }
        assert_eq!(parts.headers.get("content-type").map(|v| v.as_bytes()), Some(&b"application/grpc"[..]));
        let trailers = trailers.expect("an answer ends with trailers");
        assert_eq!(trailers.get("grpc-status").map(|v| v.as_bytes()), Some(&b"0"[..]));
        assert!(data.len() >= 5 && data[0] == 0, "a framed, uncompressed message: {data:?}");
        assert_eq!(u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize, data.len() - 5);
        let reply = RateLimitResponse::decode(&data[5..]).expect("the answer decodes");
        let reported = reply.statuses.iter().filter(|s| s.current_limit.is_some()).map(|s| s.limit_remaining).min();
        if method == 1 || after == before {
            assert_eq!(after, before, "CheckRateLimit counted");
            continue;
        }
        assert!(after - before <= most, "{} hits counted for a message of {most}", after - before);
        let reported = u64::from(reported.expect("a call that counted reports its limit"));
        let list = engine.list_counters("grpc", 1000).await.expect("in-memory counters list");
        assert!(
            list.counters.iter().any(|c| c.meta.remaining == reported),
            "the answer and the counters disagree: {reply:?}"
        );
    }
}
