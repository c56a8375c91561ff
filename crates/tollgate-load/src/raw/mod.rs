//! The raw engine ([`Engine::Raw`](crate::Engine::Raw)): requests written as bytes on plain TCP
//! connections, answers read back with the least parsing that tells them apart.
//!
//! # Implementation details
//!
//! The connections are shared out among [`BenchConfig::threads`] threads, each running
//! [`Engine::run`] over its connections (non-blocking sockets in a `mio` poll of its own, no
//! async runtime). Thread `t` of `T` sends requests `t`, `t + T`, `t + 2T`, ... so request `i` is
//! due, as in the client engine, at `i / rate` after the start, and has the same key.
//!
//! In open loop the thread works in ticks of [`BenchConfig::tick`]: it reads what every connection has
//! ([`Wire::receive`] matches answers to requests: in order for HTTP/1.1, by stream for HTTP/2),
//! writes the requests now due ([`Wire::send`] appends their bytes to a connection's buffer, no
//! allocation; a connection takes as many as it has room for before the next is tried), writes
//! each buffer in one call, and sleeps until the next tick, or until the next request is due when
//! none is in flight. The sockets are looked at without waiting (`epoll_wait` with a zero timeout)
//! and the thread sleeps on a timer, so an answer does not wake it: on a virtual machine each
//! wake-up is an interrupt that costs more than everything else the engine does for a request.
//! An answer is timed when the tick that reads it starts, so **latencies read high by up to a
//! tick** (plus the timer's lateness); a request goes out at the first tick at or after it is due.
//! A request that finds no room (every connection at its [`BenchConfig::concurrency`], or the
//! HTTP/2 window spent) waits, and its latency is counted from when it was due, as the client
//! engine counts a task still busy with its previous request; one sent when due counts from when
//! it was written, so the load tool's lateness is not the server's. In closed loop the thread
//! waits on the poll instead: an answer is what lets the next request go.
//!
//! A connection that fails (closed, unreadable answer, an answer later than the timeout) fails its
//! requests in flight and is opened again after [`BACKOFF`]; a request due that no connection
//! could take within the timeout is an error too.

mod grpc;
mod hpack;
mod http1;
mod proto;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::task::JoinSet;

use self::grpc::Grpc;
use self::http1::Http1;
use crate::{BenchConfig, BenchError, BenchReport, CallError, Protocol, Shape, Stats, Verdict};

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
    /// [`BenchConfig::tick`].
    tick: Duration,
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
    let (start, measure_start, deadline) = crate::run_times(config)?;
    let (start, measure_start, deadline) = (start.into_std(), measure_start.into_std(), deadline.into_std());
    let plan = Arc::new(Plan {
        start,
        measure_start,
        deadline,
        rate: config.rate,
        timeout: config.timeout,
        tick: config.tick,
    });
    let shape = Arc::new(shape);
    let mut running = Vec::with_capacity(threads);
    for (index, streams) in groups.into_iter().enumerate() {
        let part = Part { index: index as u64, stride: threads as u64, streams, plan: plan.clone() };
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
    plan: Arc<Plan>,
}

impl Part {
    /// Runs this share on the calling thread, with a `wire()` per connection.
    fn run<W: Wire>(self, wire: impl Fn() -> W) -> Result<Stats, BenchError> {
        // Sleeps end when asked, not up to the default 50 µs later (best effort: without it the
        // ticks are only longer).
        #[cfg(target_os = "linux")]
        let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1_000));
        let poll = mio::Poll::new().map_err(BenchError::Engine)?;
        let mut conns = Vec::with_capacity(self.streams.len());
        for (n, stream) in self.streams.into_iter().enumerate() {
            let peer = stream.peer_addr().map_err(BenchError::Engine)?;
            stream.set_nonblocking(true).map_err(BenchError::Engine)?;
            let mut stream = mio::net::TcpStream::from_std(stream);
            poll.registry().register(&mut stream, mio::Token(n), READ_WRITE).map_err(BenchError::Engine)?;
            let mut conn = Conn {
                wire: wire(),
                link: Link::Up(stream),
                peer,
                token: mio::Token(n),
                readable: true,
                writable: true,
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
            poll,
            events: mio::Events::with_capacity(1024),
            next: self.index,
            stride: self.stride,
            cursor: 0,
            stalled: false,
            next_check: now + CHECK_EVERY,
            last_connect_error: None,
            stats: Stats::new(crate::histogram()?),
            plan: self.plan,
        };
        engine.run().map_err(BenchError::Engine)?;
        Ok(engine.stats)
    }
}

const READ_WRITE: mio::Interest = mio::Interest::READABLE.add(mio::Interest::WRITABLE);

/// A connection and its buffers.
struct Conn<W> {
    wire: W,
    link: Link,
    peer: SocketAddr,
    token: mio::Token,
    /// The socket may have bytes to read / room to write (edge-triggered: until `WouldBlock`).
    readable: bool,
    writable: bool,
    /// Bytes read and not yet consumed: `input[..filled]`.
    input: Vec<u8>,
    filled: usize,
    /// Bytes to write: `out[written..]`.
    out: Vec<u8>,
    written: usize,
}

enum Link {
    Up(mio::net::TcpStream),
    Down { retry_at: Instant },
    Connecting { stream: mio::net::TcpStream, since: Instant },
}

/// One thread's loop.
struct Engine<W> {
    conns: Vec<Conn<W>>,
    poll: mio::Poll,
    events: mio::Events,
    /// The next request to send.
    next: u64,
    stride: u64,
    /// The connection tried first for the next request.
    cursor: usize,
    /// A request due found no room: those sent until the engine catches up count from when due.
    stalled: bool,
    next_check: Instant,
    last_connect_error: Option<String>,
    stats: Stats,
    plan: Arc<Plan>,
}

impl<W: Wire> Engine<W> {
    /// Runs until every request has been sent and answered (or failed).
    fn run(&mut self) -> std::io::Result<()> {
        loop {
            let tick = Instant::now();
            // Open loop: the sockets are only looked at here, each tick, so answers do not wake
            // the thread one by one. Closed loop: an answer is what lets the next request go, so
            // wait for one.
            let wait = match self.plan.rate {
                Some(_) => Some(Duration::ZERO),
                None => Some(self.next_check.saturating_duration_since(tick)),
            };
            self.poll.poll(&mut self.events, wait)?;
            for event in self.events.iter() {
                if let Some(conn) = self.conns.get_mut(event.token().0) {
                    conn.readable |= event.is_readable() || event.is_read_closed() || event.is_error();
                    conn.writable |= event.is_writable() || event.is_write_closed() || event.is_error();
                }
            }
            let now = Instant::now();
            for conn in &mut self.conns {
                let registry = self.poll.registry();
                if let Some(error) = conn.service(now, registry, self.plan.timeout, &mut self.stats) {
                    self.last_connect_error = Some(error);
                }
            }
            let now = Instant::now();
            self.send(now);
            for conn in &mut self.conns {
                conn.flush(now, &mut self.stats);
            }
            if now >= self.next_check {
                self.check_timeouts(now);
                self.next_check = now + CHECK_EVERY;
            }
            let in_flight = self.conns.iter().any(|c| c.wire.in_flight() > 0 || c.written < c.out.len());
            let wake = match self.next_wake(tick, in_flight) {
                Some(wake) => wake,
                None if !in_flight => return Ok(()),
                None => tick + self.plan.tick,
            };
            if self.plan.rate.is_some() {
                let pause = wake.saturating_duration_since(Instant::now());
                if !pause.is_zero() {
                    std::thread::sleep(pause);
                }
            }
        }
    }

    /// When to look again, in open loop: the next tick while requests are in flight or waiting
    /// for room, else when the next request is due (or a connection is to be opened again).
    /// `None` when no more requests will be sent (closed loop: after the deadline).
    fn next_wake(&self, tick: Instant, in_flight: bool) -> Option<Instant> {
        let plan = &*self.plan;
        let next_tick = tick + self.plan.tick;
        let reconnect = self
            .conns
            .iter()
            .filter_map(|c| match c.link {
                Link::Down { retry_at } => Some(retry_at),
                Link::Connecting { .. } => Some(next_tick),
                Link::Up(_) => None,
            })
            .min();
        let send = match plan.rate {
            Some(rate) => plan
                .due(self.next, rate)
                .filter(|due| *due < plan.deadline)
                .map(|due| if in_flight || self.stalled { next_tick } else { due.max(next_tick) }),
            None => (tick < plan.deadline).then_some(self.next_check),
        };
        match (send, reconnect) {
            (Some(send), Some(reconnect)) => Some(send.min(reconnect)),
            (None, Some(_)) if !in_flight => None,
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
                conn.close(&format!("no answer within {timeout:?}"), now, self.poll.registry(), &mut self.stats);
            }
        }
    }
}

impl<W: Wire> Conn<W> {
    /// Reads and handles what the connection has, or moves its reconnection on. Returns the
    /// error of a reconnection that failed.
    fn service(
        &mut self,
        now: Instant,
        registry: &mio::Registry,
        timeout: Duration,
        stats: &mut Stats,
    ) -> Option<String> {
        loop {
            match &mut self.link {
                Link::Down { retry_at } => {
                    if now < *retry_at {
                        return None;
                    }
                    let connecting = mio::net::TcpStream::connect(self.peer)
                        .and_then(|mut stream| registry.register(&mut stream, self.token, READ_WRITE).map(|()| stream));
                    match connecting {
                        Ok(stream) => self.link = Link::Connecting { stream, since: now },
                        Err(e) => {
                            self.link = Link::Down { retry_at: now + BACKOFF };
                            return Some(e.to_string());
                        }
                    }
                }
                Link::Connecting { stream, since } => {
                    let failed = match stream.take_error() {
                        Ok(Some(e)) | Err(e) => Some(e.to_string()),
                        Ok(None) => None,
                    };
                    let connected = failed.is_none() && stream.peer_addr().is_ok();
                    if connected {
                        let Link::Connecting { stream, .. } =
                            std::mem::replace(&mut self.link, Link::Down { retry_at: now })
                        else {
                            return None;
                        };
                        let _ = stream.set_nodelay(true);
                        (self.filled, self.written, self.readable, self.writable) = (0, 0, true, true);
                        self.out.clear();
                        self.wire.open(&mut self.out);
                        self.link = Link::Up(stream);
                        return None;
                    }
                    if failed.is_none() && now.saturating_duration_since(*since) <= timeout {
                        return None;
                    }
                    if let Link::Connecting { mut stream, .. } =
                        std::mem::replace(&mut self.link, Link::Down { retry_at: now + BACKOFF })
                    {
                        let _ = registry.deregister(&mut stream);
                    }
                    return Some(failed.unwrap_or_else(|| format!("no connection within {timeout:?}")));
                }
                Link::Up(stream) => {
                    if !self.readable {
                        return None;
                    }
                    if self.filled == self.input.len() {
                        if self.input.len() >= MAX_INPUT {
                            self.close("an answer larger than 16 MiB", now, registry, stats);
                            return None;
                        }
                        self.input.resize(self.input.len() * 2, 0);
                    }
                    match std::io::Read::read(stream, &mut self.input[self.filled..]) {
                        Ok(0) => {
                            self.close("the server closed the connection", now, registry, stats);
                            return None;
                        }
                        Ok(n) => {
                            self.filled += n;
                            let mut record = |sent: Sent, verdict| stats.record(sent, verdict, now);
                            match self.wire.receive(&self.input[..self.filled], &mut self.out, &mut record) {
                                Ok(consumed) => {
                                    self.input.copy_within(consumed..self.filled, 0);
                                    self.filled -= consumed;
                                }
                                Err(e) => {
                                    self.close(&e, now, registry, stats);
                                    return None;
                                }
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            self.readable = false;
                            return None;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            self.close(&e.to_string(), now, registry, stats);
                            return None;
                        }
                    }
                }
            }
        }
    }

    /// Writes what the buffer holds, as far as the socket takes it.
    fn flush(&mut self, now: Instant, stats: &mut Stats) {
        while self.written < self.out.len() && self.writable {
            let Link::Up(stream) = &mut self.link else {
                return;
            };
            match std::io::Write::write(stream, &self.out[self.written..]) {
                Ok(0) => self.fail(&"the connection takes no more bytes", now, stats),
                Ok(n) => self.written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => self.writable = false,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => self.fail(&e, now, stats),
            }
        }
        if self.written == self.out.len() {
            self.out.clear();
            self.written = 0;
        }
    }

    /// A write failed: the next read finds the connection closed, or this closes it now.
    fn fail(&mut self, why: &dyn std::fmt::Display, now: Instant, stats: &mut Stats) {
        self.wire.fail_all(&mut |sent| stats.fail(sent, &why.to_string(), now));
        if let Link::Up(stream) = &self.link {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        self.link = Link::Down { retry_at: now + BACKOFF };
        (self.filled, self.written) = (0, 0);
        self.out.clear();
    }

    /// Drops the connection, failing its requests in flight with `why`; it is opened again later.
    fn close(&mut self, why: &str, now: Instant, registry: &mio::Registry, stats: &mut Stats) {
        if let Link::Up(stream) = &mut self.link {
            let _ = registry.deregister(stream);
        }
        self.fail(&why, now, stats);
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
