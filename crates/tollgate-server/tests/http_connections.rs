//! The HTTP API's connections as raw bytes on a socket: calls sent back to back, trickled, handed
//! to hyper midway, closed; the same answers whichever path frames them; the heads RFC 9112 has
//! a server refuse, refused on both paths; and the fuzz target's properties, in a short form.

mod support;

use std::time::Duration;

use support::server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate_server::serve::Mode;

const LIMITS: &str = r#"
- namespace: ns
  name: per app
  max_value: 3
  seconds: 60
  variables: ["descriptors[0].app_id"]
"#;

/// One answer: status, headers (lower-case names, in order), body.
#[derive(Debug, PartialEq)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Headers as a set, without `date` (it moves with the second).
    fn dateless(&self) -> Vec<(String, String)> {
        let mut headers: Vec<_> = self.headers.iter().filter(|(n, _)| n != "date").cloned().collect();
        headers.sort();
        headers
    }
}

/// A `POST` of `body` to `path`, sized by `Content-Length` (the form this path takes).
fn sized(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The same `POST` in one chunk (the form hyper's path takes).
fn chunked(path: &str, body: &str) -> String {
    let chunk = if body.is_empty() { String::new() } else { format!("{:x}\r\n{body}\r\n", body.len()) };
    format!("POST {path} HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n{chunk}0\r\n\r\n")
}

fn call(app: &str, delta: u64) -> String {
    format!(r#"{{"namespace":"ns","values":{{"app_id":"{app}"}},"delta":{delta},"response_headers":"DraftVersion03"}}"#)
}

/// Reads `n` answers from `tcp` (bodies sized by `Content-Length`, as both paths write them).
async fn read_replies(tcp: &mut TcpStream, n: usize) -> Vec<Reply> {
    let mut input = Vec::new();
    let mut replies = Vec::new();
    while replies.len() < n {
        let mut lines = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut lines);
        if let httparse::Status::Complete(head) = response.parse(&input).unwrap() {
            let headers: Vec<(String, String)> = response
                .headers
                .iter()
                .map(|h| (h.name.to_ascii_lowercase(), String::from_utf8(h.value.to_vec()).unwrap()))
                .collect();
            let length: usize =
                headers.iter().find(|(n, _)| n == "content-length").expect("content-length").1.parse().unwrap();
            if input.len() >= head + length {
                let body = String::from_utf8(input[head..head + length].to_vec()).unwrap();
                replies.push(Reply { status: response.code.unwrap(), headers, body });
                input.drain(..head + length);
                continue;
            }
        }
        let mut chunk = [0; 4096];
        let n = tcp.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the connection closed after {} answers: {:?}", replies.len(), String::from_utf8_lossy(&input));
        input.extend_from_slice(&chunk[..n]);
    }
    assert!(input.is_empty(), "more than asked for: {:?}", String::from_utf8_lossy(&input));
    replies
}

async fn connect(server: &support::Server) -> TcpStream {
    TcpStream::connect(server.running.http).await.unwrap()
}

/// Reads until the server closes the connection; fails on anything read.
async fn assert_closed(tcp: &mut TcpStream) {
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut rest)).await;
    assert!(matches!(read, Ok(Ok(0))), "{read:?} {:?}", String::from_utf8_lossy(&rest));
}

#[tokio::test]
async fn calls_sent_back_to_back_are_answered_in_order() {
    let server = server(LIMITS, Mode::Accuracy, false, false).await;
    let mut tcp = connect(&server).await;
    let calls: String = (0..4).map(|_| sized("/check_and_report", &call("a", 1))).collect();
    tcp.write_all(calls.as_bytes()).await.unwrap();
    let replies = read_replies(&mut tcp, 4).await;
    let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    let remaining: Vec<_> = replies.iter().map(|r| r.header("x-ratelimit-remaining").unwrap()).collect();
    assert_eq!(remaining, ["2", "1", "0", "0"]);
    for reply in &replies {
        assert_eq!((reply.header("content-type"), reply.body.as_str()), (Some("application/json"), "null"));
    }
}

#[tokio::test]
async fn a_call_trickled_byte_by_byte_is_answered() {
    let server = server(LIMITS, Mode::Accuracy, false, false).await;
    let mut tcp = connect(&server).await;
    for _ in 0..2 {
        for byte in sized("/check_and_report", &call("a", 1)).bytes() {
            tcp.write_all(&[byte]).await.unwrap();
            tcp.flush().await.unwrap();
        }
        let reply = read_replies(&mut tcp, 1).await.remove(0);
        assert_eq!(reply.header("x-ratelimit-limit"), Some("3, 3;w=60;name=\"per app\""));
    }
    // Both trickled calls counted, once each: 1 more fits in 3, 2 more do not.
    assert_eq!(server.post("/check", &call("a", 1)).await.0, 200);
    assert_eq!(server.post("/check", &call("a", 2)).await.0, 429);
}

#[tokio::test]
async fn hyper_takes_the_connection_at_the_first_request_not_taken_with_what_was_read() {
    let server = server(LIMITS, Mode::Accuracy, false, false).await;
    let mut tcp = connect(&server).await;
    // In one write: a call taken, one chunked (not taken), a GET, then calls hyper answers.
    let mut requests = sized("/check_and_report", &call("a", 1));
    requests += &chunked("/check_and_report", &call("a", 1));
    requests += "GET /status HTTP/1.1\r\nhost: t\r\n\r\n";
    requests += &sized("/check_and_report", &call("a", 1));
    requests += &sized("/check_and_report", &call("a", 1));
    tcp.write_all(requests.as_bytes()).await.unwrap();
    let replies = read_replies(&mut tcp, 5).await;
    let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 429], "{replies:#?}");
    assert!(replies[2].body.contains("\"status\":\"ok\""), "{:?}", replies[2].body);
    let remaining = [0, 1, 3, 4].map(|i| replies[i].header("x-ratelimit-remaining").unwrap());
    assert_eq!(remaining, ["2", "1", "0", "0"], "one counter, whichever path counted");
}

#[tokio::test]
async fn both_paths_answer_alike() {
    // Two servers on the same limits and clock time: one is sent each request sized, the other
    // chunked, in the same order; every answer must match but for the date.
    let (taken, handed) =
        (server(LIMITS, Mode::Accuracy, false, false).await, server(LIMITS, Mode::Accuracy, false, false).await);
    let draft10 = r#"{"namespace":"ns","values":{"app_id":"b"},"delta":1,"response_headers":"draft10"}"#;
    let requests = [
        ("/check_and_report", call("a", 2)),
        ("/check", call("a", 2)),
        ("/report", call("a", 5)),
        ("/check_and_report", call("a", 1)),
        ("/check_and_report", draft10.to_string()),
        ("/check_and_report", r#"{"namespace":"ns","delta":1}"#.to_string()),
        ("/check_and_report", "{not json".to_string()),
        ("/check", r#"{"namespace":"ns","delta":4294967296}"#.to_string()),
        ("/report", r#"{"namespace":"ns","delta":1,"response_headers":"v99"}"#.to_string()),
        ("/check_and_report", String::new()),
    ];
    for (path, body) in &requests {
        let mut first = connect(&taken).await;
        first.write_all(sized(path, body).as_bytes()).await.unwrap();
        let mut second = connect(&handed).await;
        second.write_all(chunked(path, body).as_bytes()).await.unwrap();
        let (a, b) = (read_replies(&mut first, 1).await.remove(0), read_replies(&mut second, 1).await.remove(0));
        assert_eq!((a.status, a.dateless(), &a.body), (b.status, b.dateless(), &b.body), "{path} {body}");
        assert!(a.header("date").is_some_and(|d| httpdate::parse_http_date(d).is_ok()), "{a:?}");
    }
}

#[tokio::test]
async fn connection_close_is_answered_then_closed() {
    let server = server(LIMITS, Mode::Accuracy, false, false).await;
    let mut tcp = connect(&server).await;
    let body = call("a", 1);
    let request =
        format!("POST /check HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}", body.len());
    // A request after `close` is not answered.
    tcp.write_all(format!("{request}{request}").as_bytes()).await.unwrap();
    let reply = read_replies(&mut tcp, 1).await.remove(0);
    assert_eq!((reply.status, reply.header("connection")), (200, Some("close")));
    assert_closed(&mut tcp).await;
}

#[tokio::test]
async fn shutdown_closes_idle_connections_on_either_path() {
    let server = server(LIMITS, Mode::Accuracy, false, false).await;
    let mut taken = connect(&server).await;
    taken.write_all(sized("/check_and_report", &call("a", 1)).as_bytes()).await.unwrap();
    let mut handed = connect(&server).await;
    handed.write_all(b"GET /status HTTP/1.1\r\nhost: t\r\n\r\n").await.unwrap();
    assert_eq!(read_replies(&mut taken, 1).await[0].status, 200);
    assert_eq!(read_replies(&mut handed, 1).await[0].status, 200);
    // Both connections stay open, idle, while the server stops.
    tokio::time::timeout(Duration::from_secs(10), server.running.shutdown()).await.expect("shutdown waits for nothing");
    assert_closed(&mut taken).await;
    assert_closed(&mut handed).await;
}

#[tokio::test]
async fn shutdown_closes_a_connection_midway_through_a_request() {
    let server = server(LIMITS, Mode::Accuracy, false, false).await;
    let mut tcp = connect(&server).await;
    let next = sized("/check_and_report", &call("a", 1));
    let (half, _) = next.split_at(next.len() / 2);
    tcp.write_all(format!("{next}{half}").as_bytes()).await.unwrap();
    assert_eq!(read_replies(&mut tcp, 1).await[0].status, 200);
    // The rest of the second request never comes: stopping does not wait for it.
    tokio::time::timeout(Duration::from_secs(10), server.running.shutdown()).await.expect("shutdown waits for nothing");
    assert_closed(&mut tcp).await;
}

#[tokio::test]
async fn a_connection_answered_here_stays_http1() {
    let server = server(LIMITS, Mode::Accuracy, false, false).await;
    let mut tcp = connect(&server).await;
    // A call, then HTTP/2's preface and an empty SETTINGS frame on the same connection.
    let mut bytes = sized("/check", &call("a", 1)).into_bytes();
    bytes.extend_from_slice(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0");
    tcp.write_all(&bytes).await.unwrap();
    assert_eq!(read_replies(&mut tcp, 1).await[0].status, 200);
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut rest)).await;
    assert!(matches!(read, Ok(Ok(_))), "{read:?}");
    assert!(rest.is_empty() || rest.starts_with(b"HTTP/1.1 4"), "hyper's HTTP/1 refuses it: {rest:?}");
}

#[tokio::test]
async fn a_large_body_then_small_calls_on_one_connection() {
    let server = server(LIMITS, Mode::Accuracy, false, false).await;
    let mut tcp = connect(&server).await;
    // 1 MiB of JSON whitespace around a call: as valid as the call.
    let padded = format!("{}{}", " ".repeat(1 << 20), call("a", 1));
    let requests = format!("{}{}", sized("/check_and_report", &padded), sized("/check_and_report", &call("a", 1)));
    tcp.write_all(requests.as_bytes()).await.unwrap();
    let remaining: Vec<_> = read_replies(&mut tcp, 2)
        .await
        .iter()
        .map(|r| r.header("x-ratelimit-remaining").unwrap().to_string())
        .collect();
    assert_eq!(remaining, ["2", "1"]);
    tcp.write_all(sized("/check_and_report", &call("a", 1)).as_bytes()).await.unwrap();
    assert_eq!(read_replies(&mut tcp, 1).await[0].header("x-ratelimit-remaining"), Some("0"));
}

/// A server whose HTTP connections get `timeout` to send each request (time paused in these
/// tests: it moves only when every task waits, straight to the next timer).
async fn timed_server(timeout: Duration) -> support::Server {
    support::server_with(LIMITS, |config| config.http_read_timeout = Some(timeout)).await
}

/// Reads until the connection closes, and says how long after `since` it did.
async fn closed_after(tcp: &mut TcpStream, since: tokio::time::Instant) -> Duration {
    assert_closed(tcp).await;
    since.elapsed()
}

const TIMEOUT: Duration = Duration::from_secs(5);

fn within_a_tick(took: Duration, expected: Duration) -> bool {
    took >= expected && took < expected + Duration::from_millis(50)
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_sends_no_whole_request_in_time_is_closed() {
    let server = timed_server(TIMEOUT).await;
    // Nothing at all.
    let opened = tokio::time::Instant::now();
    let mut silent = connect(&server).await;
    let took = closed_after(&mut silent, opened).await;
    assert!(within_a_tick(took, TIMEOUT), "{took:?}");
    // Half a head, then half a body: the timeout counts from the opening, not from the last byte.
    let opened = tokio::time::Instant::now();
    let mut slow = connect(&server).await;
    let request = sized("/check_and_report", &call("a", 1));
    let (head_half, rest) = request.split_at(20);
    slow.write_all(head_half.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    slow.write_all(&rest.as_bytes()[..rest.len() - 5]).await.unwrap();
    let took = closed_after(&mut slow, opened).await;
    assert!(within_a_tick(took, TIMEOUT), "{took:?}");
    // Neither was decided.
    assert_eq!(server.post("/check", &call("a", 3)).await.0, 200);
}

#[tokio::test(start_paused = true)]
async fn the_read_timeout_starts_again_at_each_answer_and_closes_an_idle_connection() {
    let server = timed_server(TIMEOUT).await;
    let mut tcp = connect(&server).await;
    // A call every 4.5 s for 22.5 s, each under the timeout since the last answer: all answered.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(4500)).await;
        tcp.write_all(sized("/check", &call("a", 1)).as_bytes()).await.unwrap();
        assert_eq!(read_replies(&mut tcp, 1).await[0].status, 200);
    }
    // Then idle: closed between one and two timeouts after the last answer (at the timer's
    // second tick after it: 25 s from the opening saw an answer, 30 s none).
    let answered = tokio::time::Instant::now();
    let took = closed_after(&mut tcp, answered).await;
    assert!(within_a_tick(took, Duration::from_millis(7500)), "{took:?}");
}

#[tokio::test(start_paused = true)]
async fn hyper_closes_a_connection_it_was_handed_that_idles_past_the_read_timeout() {
    let server = timed_server(TIMEOUT).await;
    let mut tcp = connect(&server).await;
    // A GET is hyper's: the connection is handed over with it.
    tcp.write_all(b"GET /status HTTP/1.1\r\nhost: t\r\n\r\n").await.unwrap();
    assert_eq!(read_replies(&mut tcp, 1).await[0].status, 200);
    let answered = tokio::time::Instant::now();
    // Half a head after 2 s: hyper's header timeout counts from its last answer too.
    tokio::time::sleep(Duration::from_secs(2)).await;
    tcp.write_all(b"GET /status HTTP/1.1\r\n").await.unwrap();
    let took = closed_after(&mut tcp, answered).await;
    assert!(within_a_tick(took, TIMEOUT), "{took:?}");
}

/// HTTP/2 frames: an empty SETTINGS, a PING with 8 bytes of payload, and the PING's ACK.
const SETTINGS: &[u8] = b"\0\0\0\x04\0\0\0\0\0";
const PING: &[u8] = b"\0\0\x08\x06\0\0\0\0\0tollgate";
const PING_ACK: &[u8] = b"\0\0\x08\x06\x01\0\0\0\0tollgate";

#[tokio::test(start_paused = true)]
async fn an_http2_connection_is_closed_once_it_has_sent_nothing_for_the_read_timeout() {
    let server = timed_server(TIMEOUT).await;
    let mut tcp = connect(&server).await;
    tcp.write_all(&[b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", SETTINGS].concat()).await.unwrap();
    // A PING every 4 s for 20 s, each under the timeout since the last frame: answered each time.
    let mut seen = Vec::new();
    for pings in 1..=5 {
        tokio::time::sleep(Duration::from_secs(4)).await;
        tcp.write_all(PING).await.unwrap();
        while seen.windows(PING_ACK.len()).filter(|w| *w == PING_ACK).count() < pings {
            let mut chunk = [0; 1024];
            let n = tokio::time::timeout(Duration::from_secs(60), tcp.read(&mut chunk)).await.unwrap().unwrap();
            assert!(n > 0, "closed before the answer to PING {pings}");
            seen.extend_from_slice(&chunk[..n]);
        }
    }
    // Then nothing: closed one timeout after the last frame.
    let last = tokio::time::Instant::now();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), tcp.read_to_end(&mut rest)).await;
    assert!(matches!(read, Ok(Ok(_))), "{read:?}");
    let took = last.elapsed();
    assert!(within_a_tick(took, TIMEOUT), "{took:?}");
}

#[tokio::test(start_paused = true)]
async fn without_a_read_timeout_a_connection_may_idle() {
    let server = support::server_with(LIMITS, |config| config.http_read_timeout = None).await;
    let mut tcp = connect(&server).await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    tcp.write_all(sized("/check", &call("a", 1)).as_bytes()).await.unwrap();
    assert_eq!(read_replies(&mut tcp, 1).await[0].status, 200);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_never_reads_its_answers_is_closed_after_the_read_timeout() {
    let server = timed_server(TIMEOUT).await;
    // Calls answered here, then GETs, which are hyper's (the connection is handed over at the
    // first; axum's /metrics text is a few kilobytes, so the socket's buffers fill soon).
    let calls: String = (0..200).map(|_| sized("/check", &call("a", 1))).collect();
    let gets = "GET /metrics HTTP/1.1\r\nhost: t\r\n\r\n".repeat(200);
    for requests in [calls, gets] {
        let (_unread, mut tcp) = connect(&server).await.into_split();
        let started = tokio::time::Instant::now();
        // Sent until the server stops reading them (its answers fill the socket's buffers and
        // are never read), then until it closes the connection.
        let writer = tokio::spawn(async move { while tcp.write_all(requests.as_bytes()).await.is_ok() {} });
        tokio::time::timeout(Duration::from_secs(60), writer).await.expect("the server never closed").unwrap();
        let took = started.elapsed();
        assert!(within_a_tick(took, TIMEOUT), "{took:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_body_hyper_reads_that_stalls_is_answered_408_and_closed() {
    let server = timed_server(TIMEOUT).await;
    // Chunked calls and a DELETE's body are hyper's; each sends half its body, then stalls.
    let stalled = chunked("/check_and_report", &call("a", 1));
    let reset = "DELETE /counters/ns HTTP/1.1\r\nhost: t\r\ncontent-length: 40\r\n\r\n{\"values\":";
    for request in [&stalled[..stalled.len() - 12], reset] {
        let mut tcp = connect(&server).await;
        tcp.write_all(request.as_bytes()).await.unwrap();
        let sent = tokio::time::Instant::now();
        let reply = tokio::time::timeout(Duration::from_secs(60), read_replies(&mut tcp, 1)).await;
        let reply = reply.expect("no answer in a minute").remove(0);
        assert_eq!(reply.status, 408, "{reply:?}");
        assert!(reply.body.contains("within 5s"), "{reply:?}");
        let took = closed_after(&mut tcp, sent).await;
        assert!(within_a_tick(took, TIMEOUT), "{took:?}");
    }
    // The call was not decided: 3 still fit.
    assert_eq!(server.post("/check", &call("a", 3)).await.0, 200);
}

/// Which code reads a request: the fast path (the first request on a connection), or hyper (the
/// connection handed over at a `GET` answered first).
#[derive(Clone, Copy, Debug)]
enum Path {
    Fast,
    Hyper,
}

const PATHS: [Path; 2] = [Path::Fast, Path::Hyper];

/// A connection whose next request `path` reads.
async fn connect_on(server: &support::Server, path: Path) -> TcpStream {
    let mut tcp = connect(server).await;
    if let Path::Hyper = path {
        tcp.write_all(b"GET /status HTTP/1.1\r\nhost: t\r\n\r\n").await.unwrap();
        assert_eq!(read_replies(&mut tcp, 1).await[0].status, 200);
    }
    tcp
}

/// Sends `request` on a fresh connection read by `path`, and reads its one answer, which must
/// close the connection.
async fn refused(server: &support::Server, path: Path, request: &str) -> Reply {
    let mut tcp = connect_on(server, path).await;
    tcp.write_all(request.as_bytes()).await.unwrap();
    let reply = read_replies(&mut tcp, 1).await.remove(0);
    assert_eq!(reply.header("connection"), Some("close"), "{path:?} {request:?}: {reply:?}");
    assert_eq!(reply.header("content-type"), Some("text/plain; charset=utf-8"), "{path:?}: {reply:?}");
    assert_closed(&mut tcp).await;
    reply
}

#[tokio::test]
async fn a_request_without_exactly_one_valid_host_is_400_and_not_counted_on_either_path() {
    let server = server(LIMITS, Mode::Accuracy, false, false).await;
    let body = call("a", 1);
    let head =
        |hosts: &str| format!("POST /check_and_report HTTP/1.1\r\n{hosts}content-length: {}\r\n\r\n{body}", body.len());
    for path in PATHS {
        for (hosts, why) in [
            ("", "needs a Host header"),
            ("host: t\r\nhost: t\r\n", "one Host header, not more"),
            ("Host: t\r\nHost: u\r\n", "one Host header, not more"),
            ("host: a b\r\n", "not host[:port]"),
            ("host: t:http\r\n", "not host[:port]"),
        ] {
            let reply = refused(&server, path, &head(hosts)).await;
            assert_eq!(reply.status, 400, "{path:?} {hosts:?}: {reply:?}");
            assert!(reply.body.contains(why), "{path:?} {hosts:?}: {reply:?}");
        }
    }
    // Nothing was counted: 3 still fit.
    assert_eq!(server.post("/check", &call("a", 3)).await.0, 200);
    // HTTP/1.0 needs no Host (hyper reads it on either path), and an empty one is valid.
    for path in PATHS {
        let mut tcp = connect_on(&server, path).await;
        let request = format!("POST /check_and_report HTTP/1.0\r\ncontent-length: {}\r\n\r\n{body}", body.len());
        tcp.write_all(request.as_bytes()).await.unwrap();
        assert_eq!(read_replies(&mut tcp, 1).await[0].status, 200, "{path:?}");
    }
    let mut tcp = connect(&server).await;
    tcp.write_all(head("host:\r\n").as_bytes()).await.unwrap();
    assert_eq!(read_replies(&mut tcp, 1).await[0].status, 200);
    assert_eq!(server.post("/check", &call("a", 1)).await.0, 429, "three counted");
}

#[tokio::test]
async fn a_transfer_coding_other_than_one_chunked_is_501_and_not_counted_on_either_path() {
    let server = server(LIMITS, Mode::Accuracy, false, false).await;
    let body = call("a", 1);
    let chunk = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    for path in PATHS {
        for codings in
            ["gzip, chunked", "chunked, chunked", "identity, chunked", "Chunked\r\ntransfer-encoding: chunked"]
        {
            let request =
                format!("POST /check_and_report HTTP/1.1\r\nhost: t\r\ntransfer-encoding: {codings}\r\n\r\n{chunk}");
            let reply = refused(&server, path, &request).await;
            assert_eq!(reply.status, 501, "{path:?} {codings:?}: {reply:?}");
            assert!(reply.body.contains("only `chunked`, alone"), "{reply:?}");
        }
        // One `chunked`, in any case, is read and decided.
        let mut tcp = connect_on(&server, path).await;
        let request = format!("POST /check HTTP/1.1\r\nhost: t\r\ntransfer-encoding: CHUNKED\r\n\r\n{chunk}");
        tcp.write_all(request.as_bytes()).await.unwrap();
        assert_eq!(read_replies(&mut tcp, 1).await[0].status, 200, "{path:?}");
    }
    assert_eq!(server.post("/check", &call("a", 3)).await.0, 200, "nothing counted");
}

#[tokio::test(start_paused = true)]
async fn a_declared_length_over_the_body_limit_is_413_at_once_on_either_path() {
    let server = timed_server(TIMEOUT).await;
    // hyper cannot read the largest lengths (it answers 431 to any above u64::MAX - 2): refused
    // here, they never reach it on the fast path; lengths hyper reads are refused on both.
    let cases = [
        (Path::Fast, "18446744073709551615"),
        (Path::Fast, "99999999999999999999999"),
        (Path::Fast, "2097153"),
        (Path::Hyper, "2097153"),
        (Path::Hyper, "1000000000000000000"),
    ];
    for (path, length) in cases {
        let sent = tokio::time::Instant::now();
        // The head and the start of a body that never comes whole.
        let request = format!("POST /check_and_report HTTP/1.1\r\nhost: t\r\ncontent-length: {length}\r\n\r\n{{");
        let reply = refused(&server, path, &request).await;
        assert_eq!(reply.status, 413, "{path:?} {length}: {reply:?}");
        assert!(reply.body.contains("over the body limit"), "{reply:?}");
        assert_eq!(sent.elapsed(), Duration::ZERO, "{path:?} {length}: not waited for");
    }
    // The first request of a connection, whatever it is, is the fast path's to refuse.
    let reply =
        refused(&server, Path::Fast, "GET /status HTTP/1.1\r\nhost: t\r\ncontent-length: 18446744073709551615\r\n\r\n")
            .await;
    assert_eq!(reply.status, 413, "{reply:?}");
}

/// Sends `writes` on `tcp` (each after its delay from the opening, which is now), reading all
/// the while, and says how long after the opening the server closed the connection, with what
/// it answered.
async fn held_for(tcp: TcpStream, writes: Vec<(Duration, Vec<u8>)>) -> (Duration, Vec<u8>) {
    let opened = tokio::time::Instant::now();
    let (mut read, mut write) = tcp.into_split();
    let reader = tokio::spawn(async move {
        let mut answers = Vec::new();
        // An error (a reset, when writes came after the close) is a close too.
        let _ = tokio::time::timeout(Duration::from_secs(600), read.read_to_end(&mut answers)).await;
        (opened.elapsed(), answers)
    });
    for (at, bytes) in writes {
        tokio::time::sleep_until(opened + at).await;
        if write.write_all(&bytes).await.is_err() {
            break;
        }
    }
    reader.await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn slowloris_through_the_hand_over_is_closed_by_the_fast_paths_deadline() {
    let server = timed_server(TIMEOUT).await;
    let body = call("a", 1);
    let tick = Duration::from_millis(100);
    // A head that crosses 16 KiB (the fast path hands it over) a tick before the read timeout,
    // is finished a tick before hyper's header timer would fire had it started afresh, then
    // its body trickles: hyper alone would hold it until its body timer, about 3 read timeouts.
    let writes = vec![
        (Duration::ZERO, b"POST /check_and_report HTTP/1.1\r\nhost: t\r\nx-pad: ".to_vec()),
        (TIMEOUT - tick, vec![b'a'; 17 * 1024]),
        (2 * TIMEOUT - 2 * tick, format!("\r\ncontent-length: {}\r\n\r\n{{", body.len()).into_bytes()),
        (3 * TIMEOUT - 3 * tick, body.as_bytes()[1..10].to_vec()),
    ];
    let (took, answers) = held_for(connect(&server).await, writes).await;
    assert!(within_a_tick(took, TIMEOUT), "held {took:?}: {:?}", String::from_utf8_lossy(&answers));
    assert!(answers.is_empty(), "{:?}", String::from_utf8_lossy(&answers));
    // The head in by then, its body trickling: answered 408 at the deadline, as a route answers
    // a late body (hyper alone: a read timeout after the head).
    let writes = vec![
        (Duration::ZERO, b"POST /check_and_report HTTP/1.1\r\nhost: t\r\nx-pad: ".to_vec()),
        (TIMEOUT - 2 * tick, vec![b'a'; 17 * 1024]),
        (TIMEOUT - tick, format!("\r\ncontent-length: {}\r\n\r\n{{", body.len()).into_bytes()),
        (2 * TIMEOUT - 2 * tick, body.as_bytes()[1..10].to_vec()),
    ];
    let (took, answers) = held_for(connect(&server).await, writes).await;
    let answers = String::from_utf8_lossy(&answers);
    assert!(within_a_tick(took, TIMEOUT), "held {took:?}: {answers:?}");
    assert!(answers.starts_with("HTTP/1.1 408") && answers.contains("within 5s"), "{answers:?}");
    // After answers here, the deadline is the fast path's next one: at most 2 timeouts after the
    // last answer (its timer ticks every timeout from the opening).
    let first = sized("/check", &body).into_bytes();
    let writes = vec![
        (Duration::ZERO, first),
        (Duration::from_secs(1), b"POST /check_and_report HTTP/1.1\r\nhost: t\r\nx-pad: ".to_vec()),
        (2 * TIMEOUT - tick, vec![b'a'; 17 * 1024]),
        (3 * TIMEOUT - 2 * tick, format!("\r\ncontent-length: {}\r\n\r\n{body}", body.len()).into_bytes()),
    ];
    let (took, answers) = held_for(connect(&server).await, writes).await;
    assert!(within_a_tick(took, 2 * TIMEOUT), "held {took:?}");
    assert_eq!(String::from_utf8_lossy(&answers).matches("HTTP/1.1 200").count(), 1, "the /check only");
    assert_eq!(server.post("/check", &call("a", 3)).await.0, 200, "nothing counted");
}

#[tokio::test(start_paused = true)]
async fn a_connection_handed_over_in_time_lives_by_hypers_timers() {
    let server = timed_server(TIMEOUT).await;
    // The first request reaches hyper just before the fast path's deadline; the next ones come
    // after it, each within hyper's header timeout of the last answer.
    let get = b"GET /status HTTP/1.1\r\nhost: t\r\n\r\n".to_vec();
    let chunked_call = chunked("/check_and_report", &call("a", 1)).into_bytes();
    let writes = vec![
        (TIMEOUT - Duration::from_millis(100), get.clone()),
        (2 * TIMEOUT - Duration::from_secs(1), chunked_call.clone()),
        (3 * TIMEOUT - Duration::from_secs(2), get),
    ];
    let (took, answers) = held_for(connect(&server).await, writes).await;
    let answers = String::from_utf8_lossy(&answers);
    assert_eq!(answers.matches("HTTP/1.1 200").count(), 3, "{answers}");
    // Closed by hyper's header timer, a read timeout after its last answer.
    assert!(within_a_tick(took, 4 * TIMEOUT - Duration::from_secs(2)), "{took:?}");
}

/// A paused current-thread runtime, as the fuzz targets run their inputs on.
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 300, ..Default::default() })]

    /// The `http_connection` fuzz target's properties (`serve::fuzzing`), on random inputs:
    /// answers whole and in order, each call counted once and only when answered, the
    /// connection closed in time.
    #[test]
    fn any_byte_stream_keeps_the_connection_properties(
        input in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
    ) {
        paused_runtime().block_on(tollgate_server::serve::fuzzing::http_connection(&input));
    }
}
