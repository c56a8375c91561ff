//! The HTTP API's connections: decision calls read and answered here, everything else by hyper.
//!
//! `POST /check`, `/report` and `/check_and_report` are answered in memory in a few hundred
//! nanoseconds; hyper's and axum's per-request machinery around them (the request and response
//! types, header maps, routing, the body stream) cost several times that (docs/benchmarks.md,
//! "Where the HTTP figure comes from"). A connection starts here: each request is parsed with
//! `httparse`, and when it is one of those three calls as they usually come — HTTP/1.1, its body
//! sized by `Content-Length` (at most axum's 2 MiB), no `Transfer-Encoding`, `Expect` or
//! `Upgrade`, `Connection` absent, `keep-alive` or `close` — it is decided by
//! [`http::answer`](crate::serve::http::answer), the code axum's route calls, and its answer written by
//! hand. Requests sent back to back are answered with one write. The first request that is not
//! taken hands the connection, with the bytes read so far, to hyper and axum's routes for the
//! rest of its life: they answer it (and any protocol, HTTP/2 with prior knowledge included) as
//! `axum::serve` did before this module existed.
//!
//! A connection has a read timeout T (`--http-read-timeout`): its first request must be read
//! within T of its opening, and each next one within T to 2T of the last answer here (a tick
//! every T, see [`ReadDeadline`]), within T in hyper (its `header_read_timeout`, which starts at
//! its last answer, for the head; a route that reads a body gives it T more, then answers 408)
//! — or the connection closes, as a kept-alive connection idle that long does. A connection
//! handed to hyper keeps this module's deadline for the request it was handed at: hyper's first
//! request must be read whole by then, or the connection closes (a late body is answered 408
//! first, as a route answers it). Without this, hyper's header timer would start afresh at the
//! hand-over, and a head crossing 16 KiB just before the deadline, its body then trickling,
//! could hold the connection three times T. A client that opens connections and trickles bytes
//! (slowloris) holds each for 2T at most; one that leaves answers unread, for T after the
//! socket's buffers fill (here, and in hyper: its socket's writes fail once stalled that long,
//! see [`Socket`]). An HTTP/2 connection (prior knowledge, handed to hyper at its preface) is
//! closed once it has sent nothing for T.
//!
//! What RFC 9112 has a server refuse in a request's head is refused on both paths, by one check
//! ([`HeadCheck`]) before anything is routed, decided or read of the body, and the connection
//! closed: an HTTP/1.1 request without `Host`, any request with two or an invalid one (400, 3.2);
//! a transfer coding other than one `chunked` (501, 6.1); a `Content-Length` over the 2 MiB body
//! limit (413 at once, not after waiting for a body that would be refused).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode, Version, header};
use axum::response::{IntoResponse, Response};
use bytes::{Buf, Bytes, BytesMut};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tollgate::Clock;
use tracing::Instrument;

use super::socket::{Polled, ReadHook, Socket, Transport, timed_out};
use super::stopped;
use super::tls::Tls;
use crate::serve::model::Action;
use crate::serve::ops::trace::{Decision, Protocol};
use crate::serve::protocol::http::{Answer, Api, answer, body_timed_out};

/// A request whose head is larger is not taken (hyper reads it, with its own limits).
const MAX_HEAD: usize = 16 * 1024;

/// A body larger is not taken: axum's default body limit, whose 413 its route answers.
const MAX_BODY: usize = 2 * 1024 * 1024;

/// Header lines parsed at most; a request with more is not taken.
const MAX_HEADERS: usize = 32;

/// What the connection reads at a time, at least.
const READ_CHUNK: usize = 4096;

/// Answers kept before they are written, and buffer room kept between requests, at most.
const MAX_KEPT: usize = 64 * 1024;

/// What one HTTP listener serves, and how.
#[derive(Clone, Debug)]
pub(crate) struct Listener {
    /// The routes hyper answers.
    pub(crate) routes: Router,
    /// Whether the decision calls are answered here before hyper (false on the admin
    /// listener, whose routes have none).
    pub(crate) decides: bool,
    /// TLS on every connection, when set.
    pub(crate) tls: Option<Arc<Tls>>,
}

/// Accepts connections on `listener` until `stop` says so (or its sender is gone), then waits for
/// the connections to finish: whole requests already read are answered, the last answer saying
/// `connection: close`; a connection idle or midway through a request closes at once. With TLS,
/// each connection's handshake must end within `read_timeout`.
pub(crate) async fn serve<C: Clock + Clone>(
    listener: TcpListener,
    api: Arc<Api<C>>,
    serves: Listener,
    read_timeout: Option<Duration>,
    mut stop: watch::Receiver<bool>,
) {
    // Each connection holds a receiver; `closed` resolves when the last one is dropped.
    let (open_tx, open_rx) = watch::channel(());
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stopped(&mut stop) => break,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                accept_failed(e).await;
                continue;
            }
        };
        // No Nagle, as on the gRPC listener: an answer is written whole as soon as it is ready.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY not set on an HTTP connection: {e}");
        }
        let (api, serves, stop, open) = (api.clone(), serves.clone(), stop.clone(), open_rx.clone());
        tokio::spawn(async move {
            let (routes, decides) = (serves.routes, serves.decides);
            match serves.tls {
                None => Connection { api, routes, read_timeout, stop, decides }.run(tcp).await,
                Some(tls) => {
                    // A handshake under way when the server stops is dropped, not waited for.
                    let mut stopping = stop.clone();
                    let handshake = tokio::select! {
                        done = tls.accept(tcp, read_timeout) => done.ok(),
                        () = stopped(&mut stopping) => None,
                    };
                    if let Some(tls) = handshake {
                        Connection { api, routes, read_timeout, stop, decides }.run(tls).await;
                    }
                }
            }
            drop(open);
        });
    }
    drop(open_rx);
    drop(listener);
    open_tx.closed().await;
}

/// As `axum::serve` (and hyper 0.14 before it): a refused or reset connection is the client's
/// business; any other error (out of file descriptors, say) is logged, and accepting pauses a
/// second rather than spin on it.
async fn accept_failed(e: io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset) {
        return;
    }
    tracing::error!("HTTP accept error: {e}");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Serves one connection, `tcp`, until it closes (or `stop` says so, as [`serve`] says).
pub(crate) async fn connection<C: Clock + Clone, T: Transport>(
    api: Arc<Api<C>>,
    routes: Router,
    read_timeout: Option<Duration>,
    stop: watch::Receiver<bool>,
    tcp: T,
) {
    Connection { api, routes, read_timeout, stop, decides: true }.run(tcp).await;
}

/// One connection's state.
struct Connection<C: Clock> {
    api: Arc<Api<C>>,
    routes: Router,
    read_timeout: Option<Duration>,
    stop: watch::Receiver<bool>,
    /// False: every request goes to hyper and the routes.
    decides: bool,
}

impl<C: Clock + Clone> Connection<C> {
    async fn run<T: Transport>(mut self, mut tcp: T) {
        if !self.decides {
            let deadline = self.read_timeout.map(ReadDeadline::new);
            return self.hand_over(tcp, Bytes::new(), false, deadline).await;
        }
        let mut input = BytesMut::with_capacity(READ_CHUNK);
        let mut output = Vec::with_capacity(512);
        // Once a call is answered here, the connection is HTTP/1 for good (no HTTP/2 preface later).
        let mut answered = false;
        let mut deadline = self.read_timeout.map(ReadDeadline::new);
        loop {
            // Every whole request read so far is answered, then the answers written at once. Once
            // the server is stopping, the next answer says `connection: close` and is the last.
            let stopping = *self.stop.borrow();
            let (mut close, mut answered_now) = (false, false);
            while !close {
                let call = match parse(&input, self.api.trace_parent.is_some()) {
                    Parsed::Call(call) => call,
                    Parsed::Partial { wanted } => {
                        input.reserve(wanted.saturating_sub(input.len()).max(READ_CHUNK));
                        break;
                    }
                    Parsed::NotTaken => {
                        if write(&mut tcp, &output, self.read_timeout).await {
                            if let Some(deadline) = deadline.as_mut().filter(|_| answered_now) {
                                deadline.answered();
                            }
                            self.hand_over(tcp, input.freeze(), answered, deadline).await;
                        }
                        return;
                    }
                    Parsed::Refused(refusal) => {
                        tracing::debug!("HTTP request refused: {}", refusal.reason().trim_end());
                        write_response(&mut output, refusal.status(), PLAIN_TEXT, &[], refusal.reason(), true);
                        close = true;
                        break;
                    }
                };
                // A long run of pipelined calls yields to the other tasks now and then.
                tokio::task::consume_budget().await;
                let body = &input[call.head..call.head + call.body];
                let answer = self.decide(call.action, body, &call.headers).await;
                close = call.close || stopping;
                write_answer(&mut output, &answer, close);
                input.advance(call.head + call.body);
                (answered, answered_now) = (true, true);
                if output.len() >= MAX_KEPT && !close {
                    if !write(&mut tcp, &output, self.read_timeout).await {
                        return;
                    }
                    output.clear();
                }
            }
            if !output.is_empty() {
                if !write(&mut tcp, &output, self.read_timeout).await {
                    return;
                }
                output.clear();
            }
            if close {
                let _ = tcp.shutdown().await;
                return;
            }
            if let Some(deadline) = deadline.as_mut().filter(|_| answered_now) {
                deadline.answered();
            }
            // A large body's room is not kept for the connection's life.
            if input.is_empty() && input.capacity() > MAX_KEPT {
                input = BytesMut::with_capacity(READ_CHUNK);
            }
            if output.capacity() > MAX_KEPT {
                output = Vec::with_capacity(512);
            }
            // Stopping: a connection with no whole request closes, idle or midway through one
            // (as hyper closes a kept-alive connection that has not sent a whole head).
            let read = tokio::select! {
                biased;
                read = tcp.read_buf(&mut input) => read,
                () = stopped(&mut self.stop) => return,
                () = expired(&mut deadline) => {
                    tracing::debug!("HTTP connection closed: no whole request within the read timeout");
                    return;
                }
            };
            if !matches!(read, Ok(n) if n > 0) {
                return;
            }
        }
    }

    /// Decides one call in its decision span, as axum's route does.
    async fn decide(&self, action: Action, body: &[u8], headers: &HeaderMap) -> Answer {
        let api = &*self.api;
        let decision = Decision::start(Protocol::Http, action, api.trace_parent.as_deref(), headers);
        let span = decision.span().clone();
        answer(api, body, action, &decision).instrument(span).await
    }

    /// Serves the rest of the connection with hyper and axum's routes behind the [`HeadCheck`],
    /// `read` first; HTTP/1 only once a call was `answered` here. Its first request there must
    /// be read whole by when `deadline` would have closed the connection here.
    async fn hand_over<T: Transport>(mut self, tcp: T, read: Bytes, answered: bool, deadline: Option<ReadDeadline>) {
        let (rewind, first) = Rewind::new(read, deadline);
        let io = TokioIo::new(Socket::new(tcp, rewind, self.read_timeout));
        let service = TowerToHyperService::new(Checked { routes: self.routes, first });
        let mut builder = Builder::new(TokioExecutor::new());
        // hyper applies its header timeout (30 s unless told) only with a timer.
        builder.http1().timer(TokioTimer::new()).header_read_timeout(self.read_timeout);
        if answered {
            builder = builder.http1_only();
        }
        // Without upgrades (the API has no WebSocket or other upgraded route): `http1_only` is
        // honoured only so.
        let connection = builder.serve_connection(io, service);
        tokio::pin!(connection);
        let served = tokio::select! {
            served = connection.as_mut() => served,
            () = stopped(&mut self.stop) => {
                connection.as_mut().graceful_shutdown();
                connection.await
            }
        };
        if let Err(e) = served {
            tracing::trace!("HTTP connection ended: {e}");
        }
    }
}

/// Writes `bytes` whole; false when the connection failed, or when the client has not read them
/// within `timeout` (a client that sends calls and never reads the answers would otherwise hold
/// the connection for ever). The timer is set only when the socket's buffer is full.
async fn write<T: Transport>(tcp: &mut T, mut bytes: &[u8], timeout: Option<Duration>) -> bool {
    while !bytes.is_empty() {
        match tcp.try_write(bytes) {
            Ok(0) => return false,
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    if bytes.is_empty() && !T::BUFFERS {
        return true;
    }
    let rest = async {
        tcp.write_all(bytes).await?;
        if T::BUFFERS {
            tcp.flush().await?;
        }
        io::Result::Ok(())
    };
    match timeout {
        Some(timeout) => match tokio::time::timeout(timeout, rest).await {
            Ok(written) => written.is_ok(),
            Err(_) => {
                tracing::debug!("HTTP connection closed: answers not read within the read timeout");
                false
            }
        },
        None => rest.await.is_ok(),
    }
}

/// When a connection that has not sent its next request whole is closed: at the first tick of a
/// timer, every read timeout from the opening, that finds no answer written since the tick
/// before — the read timeout after the opening, or between one and two read timeouts after the
/// last answer. So a request costs an add here, not a clock read and a timer-wheel update.
struct ReadDeadline {
    timeout: Duration,
    timer: Pin<Box<Sleep>>,
    /// Batches of answers written, and that count at the last tick.
    answers: u64,
    seen: u64,
}

impl ReadDeadline {
    fn new(timeout: Duration) -> ReadDeadline {
        let timer = Box::pin(tokio::time::sleep_until(Instant::now() + timeout));
        ReadDeadline { timeout, timer, answers: 0, seen: 0 }
    }

    /// Answers were written: the connection sent a request whole since the last tick.
    fn answered(&mut self) {
        self.answers += 1;
    }

    /// The timer, set to when [`expired`] would resolve if no answer were written again.
    fn into_last_tick(mut self) -> Pin<Box<Sleep>> {
        let mut at = self.timer.deadline();
        if self.answers != self.seen {
            // The next tick sees this answer; the one after would see none.
            at += self.timeout;
        }
        self.timer.as_mut().reset(at);
        self.timer
    }
}

/// Resolves when the connection has gone a tick without a whole request; never without a read
/// timeout.
async fn expired(deadline: &mut Option<ReadDeadline>) {
    let Some(deadline) = deadline else { return std::future::pending().await };
    loop {
        (&mut deadline.timer).await;
        if deadline.answers == deadline.seen {
            return;
        }
        deadline.seen = deadline.answers;
        deadline.timer.as_mut().reset(Instant::now() + deadline.timeout);
    }
}

/// A call this module takes: where its body is, and what the request said about the connection.
struct Call {
    action: Action,
    /// Bytes of the request line and headers.
    head: usize,
    /// Bytes of the body, after the head.
    body: usize,
    /// `Connection: close`: answer, then close.
    close: bool,
    /// The request's headers, when a trace parent reads them; empty otherwise.
    headers: HeaderMap,
}

enum Parsed {
    /// A whole call is in the buffer.
    Call(Call),
    /// Not all of it yet: at least `wanted` bytes in all.
    Partial { wanted: usize },
    /// Not one of the calls this module takes, as it is: hyper's.
    NotTaken,
    /// A head the RFC has the server refuse (whatever its method and target): answered so, and
    /// the connection closed.
    Refused(Refusal),
}

/// Reads the request at the start of `input`.
fn parse(input: &[u8], keep_headers: bool) -> Parsed {
    let mut lines = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut lines);
    let head = match request.parse(input) {
        Ok(httparse::Status::Complete(head)) if head <= MAX_HEAD => head,
        Ok(httparse::Status::Partial) if input.len() < MAX_HEAD => return Parsed::Partial { wanted: 0 },
        // Too large, or not HTTP/1.x as httparse reads it (HTTP/2's preface, a malformed head).
        _ => return Parsed::NotTaken,
    };
    // Every line is seen by the check before anything is turned down: a refusal wins over hyper.
    let mut check = HeadCheck::default();
    let (mut body, mut close, mut taken) = (None, false, true);
    for line in request.headers.iter() {
        let name = line.name;
        check.line(name.as_bytes(), line.value);
        if name.eq_ignore_ascii_case("content-length") {
            // Digits only, as hyper reads it (`parse` alone would take `+5`).
            let length = std::str::from_utf8(line.value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<usize>().ok());
            match (body, length) {
                (None, Some(length)) if length <= MAX_BODY => body = Some(length),
                _ => taken = false,
            }
        } else if name.eq_ignore_ascii_case("connection") {
            match line.value {
                v if v.eq_ignore_ascii_case(b"close") => close = true,
                v if v.eq_ignore_ascii_case(b"keep-alive") => {}
                _ => taken = false,
            }
        } else if ["transfer-encoding", "expect", "upgrade"].iter().any(|n| name.eq_ignore_ascii_case(n)) {
            taken = false;
        }
    }
    let http11 = request.version == Some(1);
    if let Err(refusal) = check.finish(http11) {
        return Parsed::Refused(refusal);
    }
    let action = match (request.method, request.path) {
        (Some("POST"), Some("/check")) => Action::Check,
        (Some("POST"), Some("/report")) => Action::Report,
        (Some("POST"), Some("/check_and_report")) => Action::CheckAndReport,
        _ => return Parsed::NotTaken,
    };
    let Some(body) = body.filter(|_| taken && http11) else { return Parsed::NotTaken };
    if input.len() < head + body {
        return Parsed::Partial { wanted: head + body };
    }
    let mut headers = HeaderMap::new();
    if keep_headers {
        for line in request.headers.iter() {
            if let (Ok(name), Ok(value)) =
                (HeaderName::from_bytes(line.name.as_bytes()), HeaderValue::from_bytes(line.value))
            {
                headers.append(name, value);
            }
        }
    }
    Parsed::Call(Call { action, head, body, close, headers })
}

/// Appends `answer` to `output` as hyper would write axum's response to it.
fn write_answer(output: &mut Vec<u8>, answer: &Answer, close: bool) {
    let (content_type, body) = answer.content();
    write_response(output, answer.status, content_type, &answer.headers, body, close);
}

/// The `Content-Type` of a plain-text answer, as axum's `String` and `&str` responses.
const PLAIN_TEXT: &str = "text/plain; charset=utf-8";

/// Appends a response to `output` as hyper would write axum's to it.
fn write_response(
    output: &mut Vec<u8>,
    status: StatusCode,
    content_type: &str,
    headers: &[(&'static str, HeaderValue)],
    body: &str,
    close: bool,
) {
    use std::io::Write as _;
    let reason = status.canonical_reason().unwrap_or("");
    let _ = write!(output, "HTTP/1.1 {} {reason}\r\ncontent-type: {content_type}\r\n", status.as_u16());
    for (name, value) in headers {
        output.extend_from_slice(name.as_bytes());
        output.extend_from_slice(b": ");
        output.extend_from_slice(value.as_bytes());
        output.extend_from_slice(b"\r\n");
    }
    if close {
        output.extend_from_slice(b"connection: close\r\n");
    }
    let _ = write!(output, "content-length: {}\r\ndate: ", body.len());
    DATE.with(|date| output.extend_from_slice(date.borrow_mut().now()));
    output.extend_from_slice(b"\r\n\r\n");
    output.extend_from_slice(body.as_bytes());
}

thread_local! {
    static DATE: std::cell::RefCell<Date> = const { std::cell::RefCell::new(Date { second: u64::MAX, text: [0; 29] }) };
}

/// The `Date` header's value, formatted once a second per thread (as hyper caches it).
struct Date {
    second: u64,
    text: [u8; 29],
}

impl Date {
    fn now(&mut self) -> &[u8] {
        // The HTTP date is wall time by definition: no `Clock` here, as none in hyper.
        let now = SystemTime::now();
        let second = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if second != self.second {
            let text = httpdate::fmt_http_date(now);
            if text.len() == self.text.len() {
                self.text.copy_from_slice(text.as_bytes());
                self.second = second;
            }
        }
        &self.text
    }
}

/// The connection as hyper reads it: the bytes this module read first, then the socket.
struct Rewind {
    first: Bytes,
    /// What ends a read that waits too long, if anything does.
    limit: Option<Limit>,
}

/// When a connection handed to hyper is given up on, besides hyper's own timers.
enum Limit {
    /// HTTP/1: while hyper has not read its first request's head, a read that waits past this
    /// module's deadline fails (hyper's header timer starts afresh at the hand-over: without
    /// this, a head crossing 16 KiB just before the deadline would get the read timeout again).
    First { deadline: Pin<Box<Sleep>>, first: Arc<FirstRequest> },
    /// HTTP/2: hyper's HTTP/2 server has no idle timeout (its PINGs find dead peers, not idle
    /// ones), so a read fails once nothing has come for the read timeout, as an HTTP/1
    /// connection kept alive that long is closed.
    Idle { timeout: Duration, deadline: Pin<Box<Sleep>> },
}

/// The first request hyper reads on an HTTP/1 connection handed over: it must arrive whole by
/// when this module would have closed the connection. [`Rewind`] holds its head to that
/// deadline, [`Checked`] its body (answering 408 when it is late, as a route does).
struct FirstRequest {
    deadline: Instant,
    /// The read timeout, for the 408's words.
    timeout: Duration,
    head_read: AtomicBool,
    body_read: AtomicBool,
}

impl Rewind {
    /// `first`, then the socket. An HTTP/2 connection (its preface in `first`) idles at most the
    /// read timeout; an HTTP/1 one must send its first request whole by the time `deadline`
    /// would have closed it (the [`FirstRequest`] returned). No deadline, no limit.
    fn new(first: Bytes, deadline: Option<ReadDeadline>) -> (Rewind, Option<Arc<FirstRequest>>) {
        let http2 = first.starts_with(HTTP2_PREFACE_START);
        let Some(deadline) = deadline else { return (Rewind { first, limit: None }, None) };
        let timeout = deadline.timeout;
        // The timer is moved along, not allocated again.
        let mut timer = deadline.into_last_tick();
        if http2 {
            timer.as_mut().reset(Instant::now() + timeout);
            return (Rewind { first, limit: Some(Limit::Idle { timeout, deadline: timer }) }, None);
        }
        let request = Arc::new(FirstRequest {
            deadline: timer.deadline(),
            timeout,
            head_read: AtomicBool::new(false),
            body_read: AtomicBool::new(false),
        });
        let limit = Limit::First { deadline: timer, first: request.clone() };
        (Rewind { first, limit: Some(limit) }, Some(request))
    }
}

/// What `parse` has read of an HTTP/2 preface when it turns it down (`httparse` stops at the
/// version).
const HTTP2_PREFACE_START: &[u8] = b"PRI * HTTP/2";

impl ReadHook for Rewind {
    fn poll_read<T: AsyncRead + Unpin>(&mut self, tcp: &mut T, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Polled {
        if !self.first.is_empty() {
            let n = self.first.len().min(buf.remaining());
            buf.put_slice(&self.first[..n]);
            self.first.advance(n);
            if self.first.is_empty() {
                // The buffer it points into is freed now, not when the connection ends.
                self.first = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        if matches!(&self.limit, Some(Limit::First { first, .. }) if first.head_read.load(Ordering::Acquire)) {
            self.limit = None;
        }
        let before = buf.filled().len();
        let polled = Pin::new(tcp).poll_read(cx, buf);
        match (&mut self.limit, polled) {
            (Some(Limit::First { deadline, .. }), Poll::Pending) => timed_out(deadline.as_mut(), cx, || {
                "the head of the request handed to hyper did not arrive within the read timeout".into()
            }),
            (Some(Limit::Idle { timeout, deadline }), Poll::Ready(Ok(()))) if buf.filled().len() > before => {
                deadline.as_mut().reset(Instant::now() + *timeout);
                Poll::Ready(Ok(()))
            }
            (Some(Limit::Idle { timeout, deadline }), Poll::Pending) => timed_out(deadline.as_mut(), cx, || {
                format!("an HTTP/2 connection sent nothing for the read timeout ({timeout:?})")
            }),
            (_, polled) => polled,
        }
    }
}

/// Why a request's head is refused before it is routed (RFC 9112): one check for both paths,
/// so they answer alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// HTTP/1.1 without `Host` (3.2).
    NoHost,
    /// More than one `Host` line (3.2).
    ManyHosts,
    /// A `Host` that is not `host[:port]` (3.2).
    BadHost,
    /// A transfer coding this server does not undo: anything but one final `chunked` (6.1).
    Coding,
    /// A `Content-Length` over [`MAX_BODY`]: refused before its body is waited for.
    TooLarge,
}

impl Refusal {
    fn status(self) -> StatusCode {
        match self {
            Refusal::NoHost | Refusal::ManyHosts | Refusal::BadHost => StatusCode::BAD_REQUEST,
            Refusal::Coding => StatusCode::NOT_IMPLEMENTED,
            Refusal::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }

    /// The answer's body (static: a refusal costs no allocation on the fast path).
    fn reason(self) -> &'static str {
        match self {
            Refusal::NoHost => "an HTTP/1.1 request needs a Host header (RFC 9112, 3.2)\n",
            Refusal::ManyHosts => "a request may have one Host header, not more (RFC 9112, 3.2)\n",
            Refusal::BadHost => "the Host header is not host[:port] (RFC 9112, 3.2)\n",
            Refusal::Coding => "transfer coding not implemented: only `chunked`, alone (RFC 9112, 6.1)\n",
            Refusal::TooLarge => "the request's Content-Length is over the body limit of 2097152 bytes\n",
        }
    }

    /// As hyper sends it: the same answer as the fast path writes, and the connection closed
    /// after it (the body, if any, is never read).
    fn response(self) -> Response {
        let mut response = (self.status(), self.reason()).into_response();
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        response
    }
}

/// What a request's header lines say about the RFC's refusals, fed one line at a time by
/// whichever parser read them (`httparse` here, hyper's header map in [`Checked`]).
#[derive(Debug, Default)]
struct HeadCheck {
    hosts: u32,
    bad_host: bool,
    /// `Transfer-Encoding` lines, and the codings they list.
    encodings: u32,
    codings: u32,
    /// A coding other than `chunked` is listed.
    other_coding: bool,
    too_large: bool,
}

impl HeadCheck {
    fn line(&mut self, name: &[u8], value: &[u8]) {
        if name.eq_ignore_ascii_case(b"host") {
            self.hosts += 1;
            self.bad_host |= !valid_host(value);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            self.encodings += 1;
            // A list; empty elements are ignored (RFC 9110, 5.6.1).
            for coding in value.split(|&b| b == b',').map(trim_ows).filter(|c| !c.is_empty()) {
                self.codings += 1;
                self.other_coding |= !coding.eq_ignore_ascii_case(b"chunked");
            }
        } else if name.eq_ignore_ascii_case(b"content-length") {
            // Any length over the limit, however many digits: a list's elements each.
            self.too_large |= value.split(|&b| b == b',').map(trim_ows).any(|length| {
                !length.is_empty()
                    && length.iter().all(u8::is_ascii_digit)
                    && length
                        .iter()
                        .try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
                        .is_none_or(|n| n > MAX_BODY as u64)
            });
        }
    }

    /// The refusal the head earns, if any: the `Host` first (a request without a valid one is
    /// not read further), then the framing.
    fn finish(&self, http11: bool) -> Result<(), Refusal> {
        match self.hosts {
            0 if http11 => return Err(Refusal::NoHost),
            0 | 1 => {}
            _ => return Err(Refusal::ManyHosts),
        }
        if self.bad_host {
            return Err(Refusal::BadHost);
        }
        if self.encodings > 0 {
            if self.other_coding || self.codings != 1 {
                return Err(Refusal::Coding);
            }
            // Chunked: any `Content-Length` is ignored (RFC 9112, 6.3).
            return Ok(());
        }
        if self.too_large {
            return Err(Refusal::TooLarge);
        }
        Ok(())
    }
}

/// `value` without the spaces and tabs around it.
fn trim_ows(value: &[u8]) -> &[u8] {
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !ows(b)).unwrap_or(value.len());
    let end = value.iter().rposition(|b| !ows(b)).map_or(start, |i| i + 1);
    &value[start..end]
}

/// Whether `value` is a `Host` as RFC 9110 (7.2) and RFC 3986 (3.2.2, 3.2.3) write it:
/// `uri-host [ ":" port ]`, where the host is a bracketed IP literal or a reg-name (IPv4 and
/// DNS names are reg-names), and may be empty.
fn valid_host(value: &[u8]) -> bool {
    let unreserved = |b: u8| b.is_ascii_alphanumeric() || b"-._~".contains(&b);
    let sub_delim = |b: u8| b"!$&'()*+,;=".contains(&b);
    let (host, port) = match value.iter().position(|&b| b == b']').filter(|_| value.first() == Some(&b'[')) {
        Some(end) => {
            let literal = &value[1..end];
            if literal.is_empty() || !literal.iter().all(|&b| unreserved(b) || sub_delim(b) || b == b':') {
                return false;
            }
            (&[][..], &value[end + 1..])
        }
        None => value.split_at(value.iter().position(|&b| b == b':').unwrap_or(value.len())),
    };
    let mut rest = host;
    while let Some((&b, tail)) = rest.split_first() {
        rest = match b {
            b'%' if tail.len() >= 2 && tail[..2].iter().all(u8::is_ascii_hexdigit) => &tail[2..],
            b if unreserved(b) || sub_delim(b) => tail,
            _ => return false,
        };
    }
    match port.split_first() {
        None => true,
        Some((&b':', digits)) => digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    }
}

/// The refusal a request hyper parsed earns, if any (HTTP/1 only: HTTP/2 has no `Host` line
/// or transfer coding, and its own framing).
fn refused(request: &Request<impl Sized>) -> Option<Refusal> {
    let http11 = match request.version() {
        Version::HTTP_11 => true,
        Version::HTTP_10 | Version::HTTP_09 => false,
        _ => return None,
    };
    let mut check = HeadCheck::default();
    for (name, value) in request.headers() {
        check.line(name.as_str().as_bytes(), value.as_bytes());
    }
    check.finish(http11).err()
}

/// The routes as hyper serves them on a connection handed over: behind the [`HeadCheck`]; and,
/// on HTTP/1, with the [`FirstRequest`]'s deadline for the first request's body.
#[derive(Clone)]
struct Checked {
    routes: Router,
    first: Option<Arc<FirstRequest>>,
}

type Answered = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl<B> tower::Service<Request<B>> for Checked
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Answered;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // A `Router` is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Answered {
        // HTTP/1 requests come one at a time: the first one finds its head not yet read.
        let first = self.first.as_ref().filter(|first| !first.head_read.swap(true, Ordering::AcqRel)).cloned();
        if let Some(refusal) = refused(&request) {
            tracing::debug!("HTTP request refused: {}", refusal.reason().trim_end());
            return Box::pin(std::future::ready(Ok(refusal.response())));
        }
        let Some(first) = first else {
            return Box::pin(tower::Service::call(&mut self.routes, request.map(Body::new)));
        };
        // A request without a body has it all now (a route that reads none may take its time).
        if http_body::Body::is_end_stream(request.body()) {
            first.body_read.store(true, Ordering::Release);
        }
        let request = request.map(|body| Body::new(FirstBody { inner: body, first: first.clone() }));
        let answered = tower::Service::call(&mut self.routes, request);
        Box::pin(async move {
            tokio::pin!(answered);
            tokio::select! {
                biased;
                answer = &mut answered => return answer,
                () = tokio::time::sleep_until(first.deadline) => {}
            }
            if first.body_read.load(Ordering::Acquire) {
                return answered.await;
            }
            // The body is not all in: nothing was decided (a call reads its body whole first).
            // Answered as a route answers a body that is late.
            let mut response = body_timed_out(first.timeout);
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            Ok(response)
        })
    }
}

/// The body of hyper's first request on a connection handed over: says when it has been read
/// to the end.
struct FirstBody<B> {
    inner: B,
    first: Arc<FirstRequest>,
}

impl<B: http_body::Body + Unpin> http_body::Body for FirstBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.first.body_read.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(input: &[u8]) -> Call {
        match parse(input, false) {
            Parsed::Call(call) => call,
            Parsed::Partial { wanted } => panic!("partial, wanted {wanted}"),
            Parsed::NotTaken => panic!("not taken"),
            Parsed::Refused(refusal) => panic!("refused: {refusal:?}"),
        }
    }

    fn taken(input: &str) -> bool {
        matches!(parse(input.as_bytes(), false), Parsed::Call(_) | Parsed::Partial { .. })
    }

    fn refusal(input: &str) -> Option<Refusal> {
        match parse(input.as_bytes(), false) {
            Parsed::Refused(refusal) => Some(refusal),
            _ => None,
        }
    }

    #[test]
    fn heads_the_rfc_refuses_are_refused_whatever_their_target() {
        let cases = [
            ("POST /check HTTP/1.1\r\ncontent-length: 0\r\n\r\n", Some(Refusal::NoHost)),
            ("GET /status HTTP/1.1\r\n\r\n", Some(Refusal::NoHost)),
            ("GET /status HTTP/1.0\r\n\r\n", None),
            ("GET /status HTTP/1.0\r\nHost: a\r\nhost: a\r\n\r\n", Some(Refusal::ManyHosts)),
            ("POST /check HTTP/1.1\r\nHost: a\r\nHost: b\r\ncontent-length: 0\r\n\r\n", Some(Refusal::ManyHosts)),
            ("POST /check HTTP/1.1\r\nHost: a b\r\ncontent-length: 0\r\n\r\n", Some(Refusal::BadHost)),
            ("GET / HTTP/1.1\r\nHost: u@a\r\n\r\n", Some(Refusal::BadHost)),
            ("GET / HTTP/1.1\r\nHost: a:b\r\n\r\n", Some(Refusal::BadHost)),
            ("GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", Some(Refusal::BadHost)),
            ("GET / HTTP/1.1\r\nHost: %zz\r\n\r\n", Some(Refusal::BadHost)),
            ("POST /check HTTP/1.1\r\nHost: t\r\ntransfer-encoding: gzip, chunked\r\n\r\n", Some(Refusal::Coding)),
            (
                "POST /check HTTP/1.1\r\nHost: t\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
                Some(Refusal::Coding),
            ),
            ("POST /check HTTP/1.1\r\nHost: t\r\ntransfer-encoding: chunked, identity\r\n\r\n", Some(Refusal::Coding)),
            (
                "POST /check HTTP/1.1\r\nHost: t\r\ntransfer-encoding: Chunked ,\r\ncontent-length: 9999999\r\n\r\n",
                None,
            ),
            ("POST /check HTTP/1.1\r\nHost: t\r\ncontent-length: 2097153\r\n\r\n", Some(Refusal::TooLarge)),
            (
                "POST /check HTTP/1.1\r\nHost: t\r\ncontent-length: 18446744073709551615\r\n\r\n",
                Some(Refusal::TooLarge),
            ),
            ("GET /x HTTP/1.1\r\nHost: t\r\ncontent-length: 99999999999999999999999\r\n\r\n", Some(Refusal::TooLarge)),
            ("POST /check HTTP/1.1\r\nHost: t\r\ncontent-length: 2097152\r\n\r\n", None),
        ];
        for (request, expected) in cases {
            assert_eq!(refusal(request), expected, "{request:?}");
        }
    }

    #[test]
    fn host_values_are_read_as_rfc_3986_writes_them() {
        for good in
            ["", "t", "example.org:8080", "127.0.0.1", "[::1]:80", "[v1.x]", "a%20b", "a-b_c~d!$&'()*+,;=", "h:"]
        {
            assert!(valid_host(good.as_bytes()), "{good:?}");
        }
        for bad in ["a b", "a/b", "u@h", "h:8o", "[::1", "[]", "[::1]x", "%4", "a\tb", "é"] {
            assert!(!valid_host(bad.as_bytes()), "{bad:?}");
        }
    }

    #[test]
    fn a_call_with_a_sized_body_is_taken() {
        let request = b"POST /check_and_report HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nnullPOST";
        let call = parsed(request);
        assert_eq!((call.action, call.head, call.body, call.close), (Action::CheckAndReport, 63, 4, false));
        assert_eq!(&request[call.head..call.head + call.body], b"null");
        assert!(call.headers.is_empty(), "headers are kept only for a trace parent");
        let close = parsed(b"POST /check HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nConnection: Close\r\n\r\n");
        assert_eq!((close.action, close.close), (Action::Check, true));
    }

    #[test]
    fn what_is_not_taken_as_it_is_goes_to_hyper() {
        for request in [
            "GET /status HTTP/1.1\r\nhost: x\r\n\r\n",
            "POST /check_and_report?x=1 HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n",
            "POST /check_and_report HTTP/1.0\r\ncontent-length: 0\r\n\r\n",
            "POST /check_and_report HTTP/1.1\r\nhost: x\r\n\r\n",
            "POST /check_and_report HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
            "POST /check_and_report HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n{}",
            "POST /check_and_report HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\n",
            "POST /check_and_report HTTP/1.1\r\nhost: x\r\ncontent-length: +2\r\n\r\n{}",
            "POST /check_and_report HTTP/1.1\r\nhost: x\r\ncontent-length: 2, 2\r\n\r\n{}",
            "POST /check_and_report HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n",
            "POST /check_and_report HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "POST /check_and_report HTTP/1.1\r\nbad header\r\n\r\n",
        ] {
            assert!(!taken(request), "{request:?}");
        }
        let many = format!("POST /check HTTP/1.1\r\n{}content-length: 0\r\n\r\n", "a: b\r\n".repeat(MAX_HEADERS));
        assert!(!taken(&many), "more header lines than parsed");
        let long = format!("POST /check HTTP/1.1\r\nx: {}", "a".repeat(MAX_HEAD));
        assert!(!taken(&long), "a head past the limit, even unfinished");
    }

    #[test]
    fn a_partial_request_asks_for_the_rest() {
        assert!(matches!(parse(b"POST /check HTTP/1.1\r\ncontent-le", false), Parsed::Partial { wanted: 0 }));
        let head = "POST /check HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n";
        let partial = parse(format!("{head}{{}}").as_bytes(), false);
        assert!(matches!(partial, Parsed::Partial { wanted } if wanted == head.len() + 10));
    }

    #[test]
    fn headers_are_kept_for_a_trace_parent() {
        let request = b"POST /report HTTP/1.1\r\nhost: x\r\ntraceparent: 00-ab-cd-01\r\ncontent-length: 0\r\n\r\n";
        let Parsed::Call(call) = parse(request, true) else { panic!("not a call") };
        assert_eq!(call.headers["traceparent"], "00-ab-cd-01");
    }

    proptest::proptest! {
        /// Whatever arrives, parsing answers without panicking, and a call lies within what was read.
        #[test]
        fn any_bytes_parse_within_bounds(input in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            match parse(&input, true) {
                Parsed::Call(call) => proptest::prop_assert!(call.head + call.body <= input.len()),
                Parsed::Partial { wanted } => proptest::prop_assert!(wanted == 0 || wanted > input.len()),
                Parsed::NotTaken | Parsed::Refused(_) => {}
            }
        }

        /// A call cut anywhere is partial until its last byte, then read whole with its body, and
        /// the next request's bytes after it are left alone.
        #[test]
        fn a_call_cut_anywhere_is_read_whole(
            body in "[ -~]{0,120}",
            extra in proptest::collection::vec(("[a-z]{1,8}", "[!-~]([ -~]{0,14}[!-~])?"), 0..6),
            close in proptest::prelude::any::<bool>(),
            cut in proptest::prelude::any::<proptest::sample::Index>(),
        ) {
            let mut request = String::from("POST /report HTTP/1.1\r\nHost: t\r\n");
            for (name, value) in &extra {
                request += &format!("x-{name}: {value}\r\n");
            }
            if close {
                request += "Connection: close\r\n";
            }
            request += &format!("Content-Length: {}\r\n\r\n{body}", body.len());
            let whole = request.len();
            let input = format!("{request}GET /status HTTP/1.1\r\n\r\n");
            let cut = cut.index(whole + 1);
            match parse(&input.as_bytes()[..cut], false) {
                Parsed::Call(call) => {
                    proptest::prop_assert_eq!(cut, whole);
                    proptest::prop_assert_eq!(&input[call.head..call.head + call.body], body.as_str());
                    proptest::prop_assert_eq!((call.action, call.close, call.head + call.body), (Action::Report, close, whole));
                }
                Parsed::Partial { .. } => proptest::prop_assert!(cut < whole),
                Parsed::NotTaken | Parsed::Refused(_) => proptest::prop_assert!(false, "not taken at {cut} of {request:?}"),
            }
            // With the next request's bytes after it, the call is read just the same.
            let Parsed::Call(call) = parse(input.as_bytes(), false) else { panic!("not read: {input:?}") };
            proptest::prop_assert_eq!(call.head + call.body, whole);
        }
    }

    #[test]
    fn answers_are_written_as_hyper_writes_them() {
        let answer = Answer {
            status: axum::http::StatusCode::TOO_MANY_REQUESTS,
            headers: vec![("x-ratelimit-remaining", HeaderValue::from_static("0"))],
            reason: None,
        };
        let mut output = Vec::new();
        write_answer(&mut output, &answer, true);
        let text = String::from_utf8(output).unwrap();
        let (head, date) = text.split_once("date: ").unwrap();
        assert_eq!(
            head,
            "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nx-ratelimit-remaining: 0\r\n\
             connection: close\r\ncontent-length: 4\r\n"
        );
        assert!(date.ends_with(" GMT\r\n\r\nnull"), "{date:?}");
        assert!(httpdate::parse_http_date(&date[..29]).is_ok(), "{date:?}");
    }
}
