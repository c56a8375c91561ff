//! Envoy's `ShouldRateLimit` over HTTP/2 frames written and read here: each call a stream, its
//! HEADERS (the same block every time) and one DATA frame (the gRPC-framed request) written
//! together, its answer read from the DATA frame's `overall_code` and the trailers' `grpc-status`.
//!
//! What the client does of HTTP/2 (RFC 9113) is what a unary-call client needs: the preface and
//! SETTINGS (the server may not push, may not index headers, and may send as much as it likes: the
//! windows are opened to the maximum and refilled), SETTINGS and PING acknowledged, the server's
//! stream limit, frame size and connection window obeyed, RST_STREAM and GOAWAY failing the calls
//! they name. Priorities and padding are read past.

use std::collections::HashMap;
use std::time::Instant;

use super::hpack::{Names, Seen, request_block};
use super::proto::{Template, overall_code};
use super::{Sent, Wire};
use crate::{CallError, Shape, Verdict};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
const SETTINGS_ENABLE_PUSH: u16 = 0x2;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;

/// A window's size before SETTINGS or WINDOW_UPDATE change it.
const DEFAULT_WINDOW: i64 = 65_535;
/// The largest window.
const MAX_WINDOW: u32 = (1 << 31) - 1;
/// A frame's payload at most until the server allows more; also the least it may allow.
const DEFAULT_FRAME: usize = 16_384;
/// The last stream id a client may use.
const LAST_STREAM: u32 = (1 << 31) - 1;
/// Answer bytes received before the connection's window is refilled (it starts at
/// [`MAX_WINDOW`], so it never runs dry).
const REFILL: u32 = 1 << 30;

/// `overall_code` values.
const CODE_OK: u64 = 1;
const CODE_OVER_LIMIT: u64 = 2;

/// One connection's calls.
pub(super) struct Grpc {
    block: Vec<u8>,
    template: Template,
    /// The longest request's DATA payload: what a call may need of the send window.
    max_data: usize,
    names: Names,
    /// Calls in flight at most (streams).
    depth: usize,
    next_stream: u32,
    /// The connection's send window.
    send_window: i64,
    /// Each stream's send window when it opens.
    stream_window: i64,
    max_streams: usize,
    max_frame: usize,
    /// Answer bytes received since the window was last refilled.
    received: u32,
    calls: HashMap<u32, Call>,
    /// The stream whose header block continues in CONTINUATION frames.
    continuation: Option<u32>,
    /// The server sent GOAWAY: no new streams.
    going_away: bool,
    /// Buffers of finished calls, for the next ones.
    spare: Vec<Vec<u8>>,
    /// The DATA payload of the request being written.
    scratch: Vec<u8>,
}

struct Call {
    sent: Sent,
    /// The gRPC-framed answer, as it arrives.
    message: Vec<u8>,
    /// A header block split over CONTINUATION frames, until it is whole.
    headers: Vec<u8>,
    seen: Seen,
    /// END_STREAM arrived on a header block that is not whole yet.
    ended: bool,
}

impl Grpc {
    pub(super) fn new(authority: &str, shape: &Shape, depth: usize) -> Grpc {
        let template = Template::new(shape);
        let max_data = 5 + template.max_len();
        Grpc {
            block: request_block(PATH, authority),
            template,
            max_data,
            names: Names::new(),
            depth,
            next_stream: 1,
            send_window: DEFAULT_WINDOW,
            stream_window: DEFAULT_WINDOW,
            max_streams: usize::MAX,
            max_frame: DEFAULT_FRAME,
            received: 0,
            calls: HashMap::with_capacity(depth.min(1024)),
            continuation: None,
            going_away: false,
            spare: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// The request header block is longer than one frame may carry (a very long target).
    pub(super) fn block_too_long(&self) -> bool {
        self.block.len() > DEFAULT_FRAME
    }

    fn finish(&mut self, stream: u32, done: &mut impl FnMut(Sent, Result<Verdict, CallError>)) {
        if let Some(mut call) = self.calls.remove(&stream) {
            done(call.sent, verdict(&call));
            call.message.clear();
            self.spare.push(call.message);
        }
    }

    fn fail(&mut self, stream: u32, message: String, done: &mut impl FnMut(Sent, Result<Verdict, CallError>)) {
        if let Some(call) = self.calls.remove(&stream) {
            done(call.sent, Err(CallError { message, connection: false }));
            self.spare.push(call.message);
        }
    }
}

/// What a finished call's answer says.
fn verdict(call: &Call) -> Result<Verdict, CallError> {
    let error = |message: String| Err(CallError { message, connection: false });
    match call.seen.status {
        Some(200) | None => {}
        Some(0) => return error("an HTTP status other than 200 to a gRPC call".to_string()),
        Some(status) => return error(format!("HTTP status {status} to a gRPC call")),
    }
    match call.seen.grpc_status {
        Some(0) | None => {}
        Some(code) => {
            let code = i32::try_from(code).map_or(tonic::Code::Unknown, tonic::Code::from_i32);
            let connection = code == tonic::Code::Unavailable;
            return Err(CallError { message: format!("gRPC {code:?} (its grpc-message is not read)"), connection });
        }
    }
    let message = call.message.as_slice();
    let Some((&compressed, rest)) = message.split_first() else {
        return error("a gRPC answer with no message".to_string());
    };
    let length = rest.get(..4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
    if compressed != 0 {
        return error("a compressed gRPC answer".to_string());
    }
    match length.and_then(|len| rest.get(4..len.checked_add(4)?)).and_then(overall_code) {
        Some(CODE_OK) => Ok(Verdict::Allowed),
        Some(CODE_OVER_LIMIT) => Ok(Verdict::Limited),
        Some(code) => error(format!("unexpected overall_code {code} in the answer")),
        None => error("an unreadable gRPC answer".to_string()),
    }
}

/// Appends a frame header.
fn frame(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = (len as u32).to_be_bytes();
    out.extend_from_slice(&[len[1], len[2], len[3], kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// A payload without its padding (and, for HEADERS, its priority).
fn unpad(payload: &[u8], flags: u8, priority: bool) -> Result<&[u8], String> {
    let mut body = payload;
    let mut pad = 0;
    if flags & PADDED != 0 {
        let (&len, rest) = body.split_first().ok_or("a padded frame without its pad length")?;
        (pad, body) = (usize::from(len), rest);
    }
    if priority && flags & PRIORITY != 0 {
        body = body.get(5..).ok_or("a HEADERS frame shorter than its priority")?;
    }
    body.len().checked_sub(pad).map(|end| &body[..end]).ok_or_else(|| "padding longer than its frame".to_string())
}

impl Wire for Grpc {
    fn open(&mut self, out: &mut Vec<u8>) {
        self.next_stream = 1;
        self.send_window = DEFAULT_WINDOW;
        self.stream_window = DEFAULT_WINDOW;
        self.max_streams = usize::MAX;
        self.max_frame = DEFAULT_FRAME;
        self.received = 0;
        self.calls.clear();
        self.continuation = None;
        self.going_away = false;
        out.extend_from_slice(PREFACE);
        let settings =
            [(SETTINGS_HEADER_TABLE_SIZE, 0), (SETTINGS_ENABLE_PUSH, 0), (SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW)];
        frame(out, settings.len() * 6, SETTINGS, 0, 0);
        for (id, value) in settings {
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(&value.to_be_bytes());
        }
        frame(out, 4, WINDOW_UPDATE, 0, 0);
        out.extend_from_slice(&(MAX_WINDOW - DEFAULT_WINDOW as u32).to_be_bytes());
    }

    fn room(&self) -> usize {
        if self.going_away || self.next_stream > LAST_STREAM || self.stream_window < self.max_data as i64 {
            return 0;
        }
        let streams = self.depth.min(self.max_streams).saturating_sub(self.calls.len());
        let window = usize::try_from(self.send_window).unwrap_or(0) / self.max_data;
        streams.min(window).min(((LAST_STREAM - self.next_stream) / 2 + 1) as usize)
    }

    fn send(&mut self, i: u64, sent: Sent, out: &mut Vec<u8>) {
        let stream = self.next_stream;
        self.next_stream += 2;
        frame(out, self.block.len(), HEADERS, END_HEADERS, stream);
        out.extend_from_slice(&self.block);

        let len = self.template.len(i);
        self.scratch.clear();
        self.scratch.push(0);
        self.scratch.extend_from_slice(&(len as u32).to_be_bytes());
        self.template.write(i, &mut self.scratch);
        self.send_window -= self.scratch.len() as i64;
        let mut chunks = self.scratch.chunks(self.max_frame).peekable();
        while let Some(chunk) = chunks.next() {
            let flags = if chunks.peek().is_none() { END_STREAM } else { 0 };
            frame(out, chunk.len(), DATA, flags, stream);
            out.extend_from_slice(chunk);
        }
        let message = self.spare.pop().unwrap_or_default();
        self.calls.insert(stream, Call { sent, message, headers: Vec::new(), seen: Seen::default(), ended: false });
    }

    fn receive(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        done: &mut impl FnMut(Sent, Result<Verdict, CallError>),
    ) -> Result<usize, String> {
        let mut at = 0;
        while input.len() - at >= 9 {
            let head = &input[at..at + 9];
            let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
            let (kind, flags, stream) = (head[3], head[4], u32_at(head, 5) & LAST_STREAM);
            if input.len() - at - 9 < len {
                break;
            }
            let payload = &input[at + 9..at + 9 + len];
            at += 9 + len;
            if self.continuation.is_some_and(|s| kind != CONTINUATION || s != stream) {
                return Err(format!("a frame of type {kind} inside stream {stream}'s header block"));
            }
            match kind {
                DATA => {
                    self.received = self.received.saturating_add(len as u32);
                    let body = unpad(payload, flags, false)?;
                    if let Some(call) = self.calls.get_mut(&stream) {
                        call.message.extend_from_slice(body);
                    }
                    if flags & END_STREAM != 0 {
                        self.finish(stream, done);
                    }
                }
                HEADERS | CONTINUATION => {
                    let fragment = if kind == HEADERS { unpad(payload, flags, true)? } else { payload };
                    let Some(call) = self.calls.get_mut(&stream) else {
                        self.continuation = (flags & END_HEADERS == 0).then_some(stream);
                        continue;
                    };
                    call.ended |= kind == HEADERS && flags & END_STREAM != 0;
                    if flags & END_HEADERS == 0 {
                        call.headers.extend_from_slice(fragment);
                        self.continuation = Some(stream);
                        continue;
                    }
                    self.continuation = None;
                    let scanned = if call.headers.is_empty() {
                        self.names.scan(fragment, &mut call.seen)
                    } else {
                        call.headers.extend_from_slice(fragment);
                        self.names.scan(&call.headers, &mut call.seen)
                    };
                    scanned.map_err(|e| format!("unreadable headers of stream {stream}: {e}"))?;
                    call.headers.clear();
                    if call.ended {
                        self.finish(stream, done);
                    }
                }
                RST_STREAM if len == 4 => {
                    let code = u32_at(payload, 0);
                    self.fail(stream, format!("the server reset the stream (HTTP/2 error {code})"), done);
                }
                SETTINGS if flags & ACK == 0 => {
                    for setting in payload.chunks_exact(6) {
                        let value = u32_at(setting, 2);
                        match u16::from_be_bytes([setting[0], setting[1]]) {
                            SETTINGS_MAX_CONCURRENT_STREAMS => self.max_streams = value as usize,
                            SETTINGS_INITIAL_WINDOW_SIZE => self.stream_window = i64::from(value),
                            SETTINGS_MAX_FRAME_SIZE => self.max_frame = (value as usize).max(DEFAULT_FRAME),
                            _ => {}
                        }
                    }
                    frame(out, 0, SETTINGS, ACK, 0);
                }
                PING if flags & ACK == 0 && len == 8 => {
                    frame(out, 8, PING, ACK, 0);
                    out.extend_from_slice(payload);
                }
                GOAWAY if len >= 8 => {
                    let (last, code) = (u32_at(payload, 0) & LAST_STREAM, u32_at(payload, 4));
                    self.going_away = true;
                    let unanswered: Vec<u32> = self.calls.keys().copied().filter(|s| *s > last).collect();
                    for stream in unanswered {
                        let message = format!("the server went away before answering (GOAWAY, HTTP/2 error {code})");
                        self.fail(stream, message, done);
                    }
                }
                WINDOW_UPDATE if len == 4 && stream == 0 => {
                    self.send_window += i64::from(u32_at(payload, 0) & LAST_STREAM);
                }
                PUSH_PROMISE => return Err("a PUSH_PROMISE, though push was refused".to_string()),
                _ => {}
            }
        }
        if self.received >= REFILL {
            frame(out, 4, WINDOW_UPDATE, 0, 0);
            out.extend_from_slice(&self.received.to_be_bytes());
            self.received = 0;
        }
        Ok(at)
    }

    fn in_flight(&self) -> usize {
        self.calls.len()
    }

    fn oldest(&self) -> Option<Instant> {
        self.calls.values().map(|call| call.sent.at).min()
    }

    fn fail_all(&mut self, done: &mut impl FnMut(Sent)) {
        for (_, call) in self.calls.drain() {
            done(call.sent);
        }
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use prost::Message;

    use super::*;

    fn sent() -> Sent {
        let now = Instant::now();
        Sent { from: now, at: now, measured: true }
    }

    /// A frame as bytes.
    fn bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        frame(&mut out, payload.len(), kind, flags, stream);
        out.extend_from_slice(payload);
        out
    }

    fn answer(code: i32) -> Vec<u8> {
        let message = RateLimitResponse { overall_code: code, ..Default::default() }.encode_to_vec();
        let mut framed = vec![0];
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(&message);
        framed
    }

    fn outcome(verdict: Result<Verdict, CallError>) -> String {
        match verdict {
            Ok(Verdict::Allowed) => "allowed".to_string(),
            Ok(Verdict::Limited) => "limited".to_string(),
            Err(e) => e.message,
        }
    }

    #[test]
    fn a_call_is_headers_and_one_data_frame_and_its_answer_is_read() {
        let shape = Shape { namespace: "ns".to_string(), descriptors: 2, keys: 10 };
        let mut wire = Grpc::new("h:1", &shape, 4);
        let mut out = Vec::new();
        wire.open(&mut out);
        assert!(out.starts_with(PREFACE));
        out.clear();
        for i in 0..4 {
            wire.send(i, sent(), &mut out);
        }
        assert_eq!(wire.room(), 0);
        // Stream 1: HEADERS, then DATA with END_STREAM holding the framed request.
        assert_eq!(&out[3..9], &[HEADERS, END_HEADERS, 0, 0, 0, 1]);
        let data = 9 + wire.block.len();
        assert_eq!(&out[data + 3..data + 9], &[DATA, END_STREAM, 0, 0, 0, 1]);
        assert_eq!(out[data + 9], 0);
        out.clear();

        let mut input = Vec::new();
        input.extend(bytes(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]));
        input.extend(bytes(PING, 0, 0, b"12345678"));
        input.extend(bytes(HEADERS, END_HEADERS, 1, &[0x88]));
        input.extend(bytes(DATA, 0, 1, &answer(1)));
        input.extend(bytes(
            HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &[0x00, 0x0b, b'g', b'r', b'p', b'c', b'-', b's', b't', b'a', b't', b'u', b's', 0x01, b'0'],
        ));
        input.extend(bytes(HEADERS, END_HEADERS, 3, &[0x88]));
        // Padded DATA for stream 3, with END_STREAM.
        let mut padded = vec![2];
        padded.extend(answer(2));
        padded.extend([0, 0]);
        input.extend(bytes(DATA, PADDED | END_STREAM, 3, &padded));
        // Stream 5: trailers only, split over a CONTINUATION, grpc-status 14.
        input.extend(bytes(HEADERS, END_STREAM, 5, &[0x88, 0x00, 0x0b]));
        input.extend(bytes(
            CONTINUATION,
            END_HEADERS,
            5,
            &[b'g', b'r', b'p', b'c', b'-', b's', b't', b'a', b't', b'u', b's', 0x02, b'1', b'4'],
        ));
        input.extend(bytes(RST_STREAM, 0, 7, &[0, 0, 0, 2]));
        input.extend(bytes(WINDOW_UPDATE, 0, 0, &[0, 0, 1, 0]));
        let partial = bytes(DATA, 0, 9, b"abc");
        input.extend(&partial[..5]);

        let mut seen = Vec::new();
        let consumed = wire.receive(&input, &mut out, &mut |_, v| seen.push(outcome(v))).unwrap();
        assert_eq!(consumed, input.len() - 5);
        assert_eq!(
            seen,
            [
                "allowed",
                "limited",
                "gRPC Unavailable (its grpc-message is not read)",
                "the server reset the stream (HTTP/2 error 2)"
            ]
        );
        // SETTINGS acknowledged, PING answered.
        assert_eq!(out, [bytes(SETTINGS, ACK, 0, &[]), bytes(PING, ACK, 0, b"12345678")].concat());
        assert_eq!(wire.max_streams, 100);
        let requests: usize = (0..4).map(|i| 5 + wire.template.len(i)).sum();
        assert_eq!(wire.send_window, DEFAULT_WINDOW - requests as i64 + 256);
        assert_eq!((wire.in_flight(), wire.room()), (0, 4));
    }

    #[test]
    fn goaway_fails_the_calls_it_leaves_and_stops_new_ones() {
        let shape = Shape { namespace: "ns".to_string(), descriptors: 1, keys: 1 };
        let mut wire = Grpc::new("h:1", &shape, 10);
        let mut out = Vec::new();
        wire.open(&mut out);
        for i in 0..3 {
            wire.send(i, sent(), &mut out);
        }
        let mut seen = Vec::new();
        let goaway = bytes(GOAWAY, 0, 0, &[0, 0, 0, 1, 0, 0, 0, 0]);
        wire.receive(&goaway, &mut out, &mut |_, v| seen.push(outcome(v))).unwrap();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen[0].contains("GOAWAY"), "{seen:?}");
        assert_eq!((wire.in_flight(), wire.room()), (1, 0));
        let mut failed = 0;
        wire.fail_all(&mut |_| failed += 1);
        assert_eq!(failed, 1);
        let push = bytes(PUSH_PROMISE, 0, 1, &[0, 0, 0, 2]);
        assert!(wire.receive(&push, &mut out, &mut |_, _| {}).is_err());
    }

    #[test]
    fn a_small_window_holds_calls_back() {
        let shape = Shape { namespace: "ns".to_string(), descriptors: 1, keys: 1 };
        let mut wire = Grpc::new("h:1", &shape, usize::MAX);
        let mut out = Vec::new();
        wire.open(&mut out);
        let per_call = wire.max_data;
        assert_eq!(wire.room(), DEFAULT_WINDOW as usize / per_call);
        let settings = bytes(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 1]);
        wire.receive(&settings, &mut out, &mut |_, _| {}).unwrap();
        assert_eq!(wire.room(), 0, "a stream window smaller than a call");
    }
}
