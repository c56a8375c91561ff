//! The raw engine ([`Engine::Raw`](crate::Engine::Raw)): requests written as bytes on plain TCP
//! connections, answers read back with the least parsing that tells them apart.
//!
//! # Implementation details
//!
//! The connections are shared out among [`BenchConfig::threads`] threads, each with a
//! current-thread tokio runtime running one future, [`Engine::poll`], over all its connections and
//! a [`Timer`]. Thread `t` of `T` sends requests `t`, `t + T`, `t + 2T`, ... so request `i` is
//! due, as in the client engine, at `i / rate` after the start, and has the same key.
//!
//! Each time it is woken (an answer arrived, the timer fired), the engine reads what every
//! connection has ([`Wire::receive`] matches answers to requests: in order for HTTP/1.1, by
//! stream for HTTP/2), writes every request now due ([`Wire::send`] appends its bytes to the
//! connection's buffer, no allocation), giving one connection as many as it has room for before
//! the next, then writes each buffer in one call, and arms the timer for the next due request
//! (no sooner than [`TICK`] after the last batch: at high rates a few requests go together rather
//! than a wake-up each). A request that finds no room (every connection at its
//! [`BenchConfig::concurrency`], or the HTTP/2 window spent) waits, and its latency is counted
//! from when it was due, as the client engine counts a task still busy with its previous request;
//! one sent when due counts from when it was written, so the timer's lateness is not the server's.
//!
//! A connection that fails (closed, unreadable answer, an answer later than the timeout) fails its
//! requests in flight and is opened again after [`BACKOFF`]; a request due that no connection
//! could take within the timeout is an error too.

mod grpc;
mod hpack;
mod http1;
mod proto;
mod timer;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use self::grpc::Grpc;
use self::http1::Http1;
use self::timer::Timer;
use crate::{BenchConfig, BenchError, BenchReport, CallError, Protocol, Shape, Stats, Verdict};

/// The least time between two batches of requests, so a wake-up sends a few at high rates.
const TICK: Duration = Duration::from_micros(20);
/// How long a failed connection waits before it is opened again.
const BACKOFF: Duration = Duration::from_millis(10);
/// How often requests in flight are checked against the timeout.
const CHECK_EVERY: Duration = Duration::from_millis(10);
/// A connection's read buffer to begin with, and at most (one answer must fit).
const INPUT: usize = 64 * 1024;
const MAX_INPUT: usize = 16 * 1024 * 1024;

/// A request written: where its latency starts, when it was written, and whether it counts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sent {
    from: Instant,
    at: Instant,
    measured: bool,
}

/// A protocol as the engine drives it: one value per connection, holding the requests it waits on.
pub(crate) trait Wire {
    /// Starts over on a new connection, writing what opens it (the HTTP/2 preface).
    fn open(&mut self, out: &mut Vec<u8>);
    /// How many more requests can be written now.
    fn room(&self) -> usize;
    /// Writes request `i` (only when [`Wire::room`] is not 0).
    fn send(&mut self, i: u64, sent: Sent, out: &mut Vec<u8>);
    /// Reads the answers at the start of `input`, calling `done` for each request answered, and
    /// writes to `out` what the protocol answers back (acknowledgements). Returns the bytes read;
    /// the rest waits for more. `Err`: the connection cannot go on.
    fn receive(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        done: &mut impl FnMut(Sent, Result<Verdict, CallError>),
    ) -> Result<usize, String>;
    /// Requests written and not answered.
    fn in_flight(&self) -> usize;
    /// When the oldest of them was written.
    fn oldest(&self) -> Option<Instant>;
    /// Forgets the requests in flight, passing each to `done` (the connection is gone).
    fn fail_all(&mut self, done: &mut impl FnMut(Sent));
}

/// The timing of a run, shared by its threads.
#[derive(Debug)]
struct Plan {
    start: Instant,
    measure_start: Instant,
    deadline: Instant,
    rate: Option<f64>,
    timeout: Duration,
}

impl Plan {
    /// When request `i` is due in open loop (`None` past any representable time).
    fn due(&self, i: u64, rate: f64) -> Option<Instant> {
        self.start.checked_add(Duration::try_from_secs_f64(i as f64 / rate).ok()?)
    }
}

/// Runs `config` on the raw engine (validated, `authority` its target as `host:port`).
pub(crate) async fn run(config: &BenchConfig, authority: &str, shape: Shape) -> Result<BenchReport, BenchError> {
    let connect_error =
        |message: String| BenchError::Connect { target: authority.to_string(), protocol: config.protocol, message };
    if config.protocol == Protocol::Grpc && Grpc::new(authority, &shape, 1).block_too_long() {
        return Err(BenchError::Target { target: authority.to_string() });
    }
    let addresses: Arc<[SocketAddr]> =
        tokio::net::lookup_host(authority).await.map_err(|e| connect_error(e.to_string()))?.collect();
    let mut connecting = JoinSet::new();
    for _ in 0..config.connections {
        connecting.spawn(connect(addresses.clone(), config.timeout));
    }
    let mut streams = Vec::with_capacity(config.connections);
    while let Some(joined) = connecting.join_next().await {
        let stream = joined.map_err(BenchError::Task)?.map_err(connect_error)?;
        streams.push(stream.into_std().map_err(|e| connect_error(e.to_string()))?);
    }

    let threads = config.threads.clamp(1, config.connections);
    let mut groups: Vec<Vec<std::net::TcpStream>> = (0..threads).map(|_| Vec::new()).collect();
    for (n, stream) in streams.into_iter().enumerate() {
        groups[n % threads].push(stream);
    }
    let start = Instant::now();
    let too_long = || BenchError::TooLong { warmup: config.warmup, duration: config.duration };
    let measure_start = start.checked_add(config.warmup).ok_or_else(too_long)?;
    let deadline = measure_start.checked_add(config.duration).ok_or_else(too_long)?;
    let plan = Arc::new(Plan { start, measure_start, deadline, rate: config.rate, timeout: config.timeout });
    let shape = Arc::new(shape);
    let mut running = Vec::with_capacity(threads);
    for (index, streams) in groups.into_iter().enumerate() {
        let part = Part {
            index: index as u64,
            stride: threads as u64,
            streams,
            addresses: addresses.clone(),
            plan: plan.clone(),
        };
        let (authority, shape, depth) = (authority.to_string(), shape.clone(), config.concurrency);
        running.push(match config.protocol {
            Protocol::Grpc => tokio::task::spawn_blocking(move || part.run(|| Grpc::new(&authority, &shape, depth))),
            Protocol::Http => tokio::task::spawn_blocking(move || part.run(|| Http1::new(&authority, &shape, depth))),
        });
    }
    let mut stats = Vec::with_capacity(threads);
    for thread in running {
        stats.push(thread.await.map_err(BenchError::Task)??);
    }
    crate::merge(stats, measure_start, deadline)
}

/// Opens a TCP connection to the first of `addresses` that answers, within `timeout`.
async fn connect(addresses: Arc<[SocketAddr]>, timeout: Duration) -> Result<TcpStream, String> {
    let connecting = async {
        let mut last = None;
        for address in addresses.iter() {
            match TcpStream::connect(address).await {
                Ok(stream) => {
                    stream.set_nodelay(true).map_err(|e| e.to_string())?;
                    return Ok(stream);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.map_or_else(|| "no address".to_string(), |e| e.to_string()))
    };
    tokio::time::timeout(timeout, connecting).await.map_err(|_| format!("no connection within {timeout:?}"))?
}

/// One thread's share of a run.
struct Part {
    index: u64,
    stride: u64,
    streams: Vec<std::net::TcpStream>,
    addresses: Arc<[SocketAddr]>,
    plan: Arc<Plan>,
}

impl Part {
    /// Runs this share on a current-thread runtime of its own, with a `wire()` per connection.
    fn run<W: Wire>(self, wire: impl Fn() -> W) -> Result<Stats, BenchError> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(BenchError::Engine)?;
        runtime.block_on(async move {
            let mut conns = Vec::with_capacity(self.streams.len());
            for stream in self.streams {
                let mut conn = Conn {
                    wire: wire(),
                    link: Link::Up(TcpStream::from_std(stream).map_err(BenchError::Engine)?),
                    input: vec![0; INPUT],
                    filled: 0,
                    out: Vec::with_capacity(INPUT),
                    written: 0,
                };
                conn.wire.open(&mut conn.out);
                conns.push(conn);
            }
            let now = Instant::now();
            let mut engine = Engine {
                conns,
                addresses: self.addresses,
                next: self.index,
                stride: self.stride,
                cursor: 0,
                stalled: false,
                last_batch: now,
                next_check: now + CHECK_EVERY,
                last_connect_error: None,
                timer: Timer::new().map_err(BenchError::Engine)?,
                stats: Stats::new(crate::histogram()?),
                plan: self.plan,
            };
            std::future::poll_fn(|cx| engine.poll(cx)).await.map_err(BenchError::Engine)?;
            Ok(engine.stats)
        })
    }
}

/// A connection and its buffers.
struct Conn<W> {
    wire: W,
    link: Link,
    /// Bytes read and not yet consumed: `input[..filled]`.
    input: Vec<u8>,
    filled: usize,
    /// Bytes to write: `out[written..]`.
    out: Vec<u8>,
    written: usize,
}

type Connecting = Pin<Box<dyn Future<Output = Result<TcpStream, String>>>>;

enum Link {
    Up(TcpStream),
    Down { retry_at: Instant },
    Connecting(Connecting),
}

/// One thread's event loop.
struct Engine<W> {
    conns: Vec<Conn<W>>,
    addresses: Arc<[SocketAddr]>,
    /// The next request to send.
    next: u64,
    stride: u64,
    /// The connection tried first for the next request.
    cursor: usize,
    /// A request due found no room: those sent until the engine catches up count from when due.
    stalled: bool,
    last_batch: Instant,
    next_check: Instant,
    last_connect_error: Option<String>,
    timer: Timer,
    stats: Stats,
    plan: Arc<Plan>,
}

impl<W: Wire> Engine<W> {
    /// Runs until every request has been sent and answered (or failed).
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        loop {
            let now = Instant::now();
            for conn in &mut self.conns {
                if let Some(error) = conn.poll_link(cx, now, &self.addresses, self.plan.timeout, &mut self.stats) {
                    self.last_connect_error = Some(error);
                }
            }
            let now = Instant::now();
            self.send(now);
            for conn in &mut self.conns {
                conn.flush(cx, now, &mut self.stats);
            }
            if now >= self.next_check {
                self.check_timeouts(now);
                self.next_check = now + CHECK_EVERY;
            }
            let wake = match self.next_wake(now) {
                Some(wake) => wake.min(self.next_check),
                None if self.conns.iter().all(|c| c.wire.in_flight() == 0) => return Poll::Ready(Ok(())),
                None => self.next_check,
            };
            if wake <= Instant::now() {
                continue;
            }
            self.timer.arm(wake)?;
            match self.timer.poll_fired(cx) {
                Poll::Ready(result) => result?,
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// When to wake for the next request or reconnection; `None` when no more will be sent.
    fn next_wake(&self, now: Instant) -> Option<Instant> {
        let plan = &*self.plan;
        let reconnect = self
            .conns
            .iter()
            .filter_map(|c| match c.link {
                Link::Down { retry_at } => Some(retry_at),
                _ => None,
            })
            .min();
        let send = match plan.rate {
            Some(rate) => match plan.due(self.next, rate).filter(|due| *due < plan.deadline) {
                // Nothing to wake for while stalled: an answer makes room.
                Some(_) if self.stalled => Some(self.next_check),
                Some(due) => Some(due.max(self.last_batch + TICK)),
                None => None,
            },
            None => (now < plan.deadline).then_some(self.next_check),
        };
        match (send, reconnect) {
            (Some(send), Some(reconnect)) => Some(send.min(reconnect)),
            (None, Some(_)) if self.conns.iter().all(|c| c.wire.in_flight() == 0) => None,
            (send, reconnect) => send.or(reconnect),
        }
    }

    /// Writes the requests due (closed loop: as many as there is room for) into the buffers.
    fn send(&mut self, now: Instant) {
        let plan = self.plan.clone();
        let mut sent_any = false;
        match plan.rate {
            Some(rate) => loop {
                let i = self.next;
                let Some(due) = plan.due(i, rate).filter(|due| *due < plan.deadline && *due <= now) else {
                    self.stalled = false;
                    break;
                };
                let measured = due >= plan.measure_start;
                if now.saturating_duration_since(due) > plan.timeout {
                    let why = match &self.last_connect_error {
                        Some(e) => format!(
                            "not sent within {:?}: no connection had room (last connect error: {e})",
                            plan.timeout
                        ),
                        None => format!("not sent within {:?}: no connection had room", plan.timeout),
                    };
                    self.stats.fail(Sent { from: due, at: due, measured }, &why, now);
                    self.next = self.next.saturating_add(self.stride);
                    continue;
                }
                let Some(c) = self.pick() else {
                    self.stalled = true;
                    break;
                };
                let from = if self.stalled { due } else { now };
                let conn = &mut self.conns[c];
                conn.wire.send(i, Sent { from, at: now, measured }, &mut conn.out);
                self.next = self.next.saturating_add(self.stride);
                sent_any = true;
            },
            None if now < plan.deadline => {
                let measured = now >= plan.measure_start;
                while let Some(c) = self.pick() {
                    let conn = &mut self.conns[c];
                    conn.wire.send(self.next, Sent { from: now, at: now, measured }, &mut conn.out);
                    self.next = self.next.saturating_add(self.stride);
                    sent_any = true;
                }
            }
            None => {}
        }
        if sent_any {
            self.last_batch = now;
            self.cursor = (self.cursor + 1) % self.conns.len();
        }
    }

    /// A connection with room, trying the cursor's first.
    fn pick(&mut self) -> Option<usize> {
        let n = self.conns.len();
        let found = (0..n)
            .map(|k| (self.cursor + k) % n)
            .find(|&c| matches!(self.conns[c].link, Link::Up(_)) && self.conns[c].wire.room() > 0)?;
        self.cursor = found;
        Some(found)
    }

    fn check_timeouts(&mut self, now: Instant) {
        let timeout = self.plan.timeout;
        for conn in &mut self.conns {
            if conn.wire.oldest().is_some_and(|oldest| now.saturating_duration_since(oldest) > timeout) {
                conn.close(&format!("no answer within {timeout:?}"), now, &mut self.stats);
            }
        }
    }
}

impl<W: Wire> Conn<W> {
    /// Reads and handles what the connection has, or moves its reconnection on. Returns the
    /// error of a reconnection that failed.
    fn poll_link(
        &mut self,
        cx: &mut Context<'_>,
        now: Instant,
        addresses: &Arc<[SocketAddr]>,
        timeout: Duration,
        stats: &mut Stats,
    ) -> Option<String> {
        loop {
            match &mut self.link {
                Link::Down { retry_at } => {
                    if now < *retry_at {
                        return None;
                    }
                    self.link = Link::Connecting(Box::pin(connect(addresses.clone(), timeout)));
                }
                Link::Connecting(connecting) => match connecting.as_mut().poll(cx) {
                    Poll::Ready(Ok(stream)) => {
                        (self.filled, self.written) = (0, 0);
                        self.out.clear();
                        self.wire.open(&mut self.out);
                        self.link = Link::Up(stream);
                    }
                    Poll::Ready(Err(e)) => {
                        self.link = Link::Down { retry_at: now + BACKOFF };
                        return Some(e);
                    }
                    Poll::Pending => return None,
                },
                Link::Up(stream) => {
                    if self.filled == self.input.len() {
                        if self.input.len() >= MAX_INPUT {
                            self.close("an answer larger than 16 MiB", now, stats);
                            return None;
                        }
                        self.input.resize(self.input.len() * 2, 0);
                    }
                    let mut buf = ReadBuf::new(&mut self.input[self.filled..]);
                    match Pin::new(stream).poll_read(cx, &mut buf) {
                        Poll::Pending => return None,
                        Poll::Ready(Ok(())) if buf.filled().is_empty() => {
                            self.close("the server closed the connection", Instant::now(), stats);
                            return None;
                        }
                        Poll::Ready(Ok(())) => {
                            self.filled += buf.filled().len();
                            let answered = Instant::now();
                            let mut record = |sent: Sent, verdict| stats.record(sent, verdict, answered);
                            match self.wire.receive(&self.input[..self.filled], &mut self.out, &mut record) {
                                Ok(consumed) => {
                                    self.input.copy_within(consumed..self.filled, 0);
                                    self.filled -= consumed;
                                }
                                Err(e) => {
                                    self.close(&e, answered, stats);
                                    return None;
                                }
                            }
                        }
                        Poll::Ready(Err(e)) => {
                            self.close(&e.to_string(), Instant::now(), stats);
                            return None;
                        }
                    }
                }
            }
        }
    }

    /// Writes what the buffer holds, as far as the socket takes it.
    fn flush(&mut self, cx: &mut Context<'_>, now: Instant, stats: &mut Stats) {
        while self.written < self.out.len() {
            let Link::Up(stream) = &mut self.link else {
                break;
            };
            match Pin::new(stream).poll_write(cx, &self.out[self.written..]) {
                Poll::Ready(Ok(0)) => self.close("the connection takes no more bytes", now, stats),
                Poll::Ready(Ok(n)) => self.written += n,
                Poll::Ready(Err(e)) => self.close(&e.to_string(), now, stats),
                Poll::Pending => return,
            }
        }
        self.out.clear();
        self.written = 0;
    }

    /// Drops the connection, failing its requests in flight with `why`; it is opened again later.
    fn close(&mut self, why: &str, now: Instant, stats: &mut Stats) {
        self.wire.fail_all(&mut |sent| stats.fail(sent, why, now));
        self.link = Link::Down { retry_at: now + BACKOFF };
        (self.filled, self.written) = (0, 0);
        self.out.clear();
    }
}

impl Stats {
    /// Counts an answer (if the request is in the measured window).
    fn record(&mut self, sent: Sent, verdict: Result<Verdict, CallError>, answered: Instant) {
        if !sent.measured {
            return;
        }
        self.last_answer = Some(answered);
        match verdict {
            Ok(verdict) => {
                let ns = u64::try_from(answered.saturating_duration_since(sent.from).as_nanos()).unwrap_or(u64::MAX);
                if self.latency.record(ns).is_err() {
                    self.latency.saturating_record(ns);
                }
                match verdict {
                    Verdict::Allowed => self.allowed += 1,
                    Verdict::Limited => self.limited += 1,
                }
            }
            Err(error) => self.fail(sent, &error.message, answered),
        }
    }

    /// Counts a request that got no decision (if it is in the measured window).
    fn fail(&mut self, sent: Sent, why: &str, now: Instant) {
        if !sent.measured {
            return;
        }
        self.last_answer = Some(now);
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(why.to_string());
        }
    }
}
