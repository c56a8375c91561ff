//! `POST /check_and_report` over HTTP/1.1 with pipelining: requests written back to back on one
//! connection, answered in order, so the oldest request waiting is the one an answer is for.

use std::collections::VecDeque;
use std::time::Instant;

use super::proto::Decimal;
use super::{Sent, Wire};
use crate::{CallError, Shape, Verdict};

/// The most header lines of an answer read.
const MAX_HEADERS: usize = 64;
/// The most characters of an unexpected answer's body kept for the error message.
const ERROR_TEXT: usize = 200;

/// One connection's requests and the answers they wait for.
pub(super) struct Http1 {
    /// The request line and headers up to the value of `content-length`.
    head: Vec<u8>,
    /// The body up to the method: `{"namespace":"…","values":{"req.method":"`.
    body_start: Vec<u8>,
    keys: u64,
    /// Requests in flight at most (pipelined).
    depth: usize,
    waiting: VecDeque<Sent>,
    /// The server said it closes the connection after an answer: send no more on it.
    closing: bool,
}

/// Between the method and the user's number.
const BODY_MIDDLE: &[u8] = br#"","user_id":"user-"#;
/// After the user's number.
const BODY_END: &[u8] = br#""},"delta":1}"#;

impl Http1 {
    pub(super) fn new(authority: &str, shape: &Shape, depth: usize) -> Http1 {
        let head = format!(
            "POST /check_and_report HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\ncontent-length: "
        );
        // Serializing a string cannot fail; the fallback is never used.
        let namespace = serde_json::to_string(&shape.namespace).unwrap_or_else(|_| "\"\"".to_string());
        let body_start = format!(r#"{{"namespace":{namespace},"values":{{"req.method":""#);
        Http1 {
            head: head.into_bytes(),
            body_start: body_start.into_bytes(),
            keys: shape.keys,
            depth,
            waiting: VecDeque::with_capacity(depth),
            closing: false,
        }
    }
}

impl Wire for Http1 {
    fn open(&mut self, _out: &mut Vec<u8>) {
        self.waiting.clear();
        self.closing = false;
    }

    fn room(&self) -> usize {
        if self.closing { 0 } else { self.depth.saturating_sub(self.waiting.len()) }
    }

    fn send(&mut self, i: u64, sent: Sent, out: &mut Vec<u8>) {
        let key = Decimal::new(i % self.keys);
        let method = Shape::method(i).as_bytes();
        let length = self.body_start.len() + method.len() + BODY_MIDDLE.len() + key.digits().len() + BODY_END.len();
        out.extend_from_slice(&self.head);
        out.extend_from_slice(Decimal::new(length as u64).digits());
        out.extend_from_slice(b"\r\n\r\n");
        out.extend_from_slice(&self.body_start);
        out.extend_from_slice(method);
        out.extend_from_slice(BODY_MIDDLE);
        out.extend_from_slice(key.digits());
        out.extend_from_slice(BODY_END);
        self.waiting.push_back(sent);
    }

    fn receive(
        &mut self,
        input: &[u8],
        _out: &mut Vec<u8>,
        done: &mut impl FnMut(Sent, Result<Verdict, CallError>),
    ) -> Result<usize, String> {
        let mut consumed = 0;
        while consumed < input.len() {
            let rest = &input[consumed..];
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut response = httparse::Response::new(&mut headers);
            let head = match response.parse(rest) {
                Ok(httparse::Status::Complete(head)) => head,
                Ok(httparse::Status::Partial) => break,
                Err(e) => return Err(format!("unreadable HTTP answer: {e}")),
            };
            let code = response.code.unwrap_or(0);
            let (mut length, mut chunked) = (None, false);
            for header in response.headers.iter() {
                if header.name.eq_ignore_ascii_case("content-length") {
                    let value = std::str::from_utf8(header.value).ok().and_then(|v| v.trim().parse::<usize>().ok());
                    length = Some(value.ok_or_else(|| {
                        format!("unreadable content-length {:?}", String::from_utf8_lossy(header.value))
                    })?);
                } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
                    chunked = header.value.windows(7).any(|w| w.eq_ignore_ascii_case(b"chunked"));
                } else if header.name.eq_ignore_ascii_case("connection") {
                    self.closing |= header.value.windows(5).any(|w| w.eq_ignore_ascii_case(b"close"));
                }
            }
            let no_body = (100..200).contains(&code) || code == 204 || code == 304;
            let body = if no_body {
                0
            } else if chunked {
                match chunked_len(&rest[head..])? {
                    Some(len) => len,
                    None => break,
                }
            } else {
                length.ok_or_else(|| format!("an HTTP {code} answer with neither content-length nor chunks"))?
            };
            if rest.len() - head < body {
                break;
            }
            consumed += head + body;
            if (100..200).contains(&code) {
                continue; // an interim answer; the final one follows
            }
            let sent = self.waiting.pop_front().ok_or_else(|| format!("an HTTP {code} answer to no request"))?;
            let verdict = match code {
                200 => Ok(Verdict::Allowed),
                429 => Ok(Verdict::Limited),
                _ => {
                    let text =
                        if chunked { String::new() } else { String::from_utf8_lossy(&rest[head..head + body]).into() };
                    let text: String = text.trim().chars().take(ERROR_TEXT).collect();
                    let reason = response.reason.unwrap_or("");
                    Err(CallError { message: format!("HTTP {code} {reason}: {text}"), connection: false })
                }
            };
            done(sent, verdict);
        }
        Ok(consumed)
    }

    fn in_flight(&self) -> usize {
        self.waiting.len()
    }

    fn oldest(&self) -> Option<Instant> {
        self.waiting.front().map(|sent| sent.at)
    }

    fn fail_all(&mut self, done: &mut impl FnMut(Sent)) {
        self.waiting.drain(..).for_each(done);
    }
}

/// The length of a chunked body at the start of `bytes`, trailers included; `None` if it has not
/// all arrived.
fn chunked_len(bytes: &[u8]) -> Result<Option<usize>, String> {
    let mut at = 0;
    loop {
        let Some(line) = line_end(&bytes[at..]) else { return Ok(None) };
        let size_text = bytes[at..at + line].split(|b| *b == b';').next().unwrap_or_default();
        let size = std::str::from_utf8(size_text)
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
            .ok_or_else(|| format!("unreadable chunk size {:?}", String::from_utf8_lossy(size_text)))?;
        at += line + 2;
        if size == 0 {
            // Trailer lines, then an empty line.
            loop {
                let Some(line) = line_end(&bytes[at..]) else { return Ok(None) };
                at += line + 2;
                if line == 0 {
                    return Ok(Some(at));
                }
            }
        }
        let Some(next) = at.checked_add(size).and_then(|end| end.checked_add(2)) else {
            return Err(format!("a chunk of {size} bytes"));
        };
        if bytes.len() < next {
            return Ok(None);
        }
        at = next;
    }
}

/// Where the first `\r\n` of `bytes` starts.
fn line_end(bytes: &[u8]) -> Option<usize> {
    bytes.windows(2).position(|w| w == b"\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent() -> Sent {
        let now = Instant::now();
        Sent { from: now, at: now, measured: true }
    }

    #[test]
    fn requests_are_the_bodies_the_client_engine_sends() {
        let shape = Shape { namespace: "a\"b".to_string(), descriptors: 2, keys: 1000 };
        let mut wire = Http1::new("127.0.0.1:1", &shape, 2);
        let mut out = Vec::new();
        wire.send(1003, sent(), &mut out);
        let text = String::from_utf8(out).unwrap();
        let body = r#"{"namespace":"a\"b","values":{"req.method":"GET","user_id":"user-3"},"delta":1}"#;
        assert_eq!(
            text,
            format!(
                "POST /check_and_report HTTP/1.1\r\nhost: 127.0.0.1:1\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\n\r\n{body}",
                body.len()
            )
        );
        assert_eq!(wire.room(), 1);
    }

    #[test]
    fn answers_are_matched_in_order_whatever_their_framing() {
        let shape = Shape { namespace: "n".to_string(), descriptors: 1, keys: 1 };
        let mut wire = Http1::new("h:1", &shape, 8);
        let mut out = Vec::new();
        for i in 0..5 {
            wire.send(i, sent(), &mut out);
        }
        let answers = concat!(
            "HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nnull",
            "HTTP/1.1 100 Continue\r\n\r\n",
            "HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 500 Internal Server Error\r\ntransfer-encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n0\r\nt: 1\r\n\r\n",
            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 7\r\nconnection: close\r\n\r\ndown\r\n\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nnu",
        );
        let mut seen = Vec::new();
        let mut record = |_: Sent, verdict: Result<Verdict, CallError>| {
            seen.push(match verdict {
                Ok(Verdict::Allowed) => "allowed".to_string(),
                Ok(Verdict::Limited) => "limited".to_string(),
                Err(e) => e.message,
            });
        };
        let consumed = wire.receive(answers.as_bytes(), &mut out, &mut record).unwrap();
        assert_eq!(
            seen,
            ["allowed", "limited", "HTTP 500 Internal Server Error: ", "HTTP 503 Service Unavailable: down"]
        );
        // The last answer has not all arrived; the server closes after the 503.
        assert_eq!(&answers[consumed..], "HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nnu");
        assert_eq!((wire.in_flight(), wire.room()), (1, 0));
        let mut failed = 0;
        wire.fail_all(&mut |_| failed += 1);
        assert_eq!((failed, wire.in_flight()), (1, 0));
        let mut ignore = |_: Sent, _: Result<Verdict, CallError>| {};
        assert!(wire.receive(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", &mut out, &mut ignore).is_err());
        assert!(wire.receive(b"HTTP/1.1 200 OK\r\n\r\n", &mut out, &mut ignore).is_err());
        assert!(wire.receive(b"SMTP\r\n\r\n", &mut out, &mut ignore).is_err());
    }

    #[test]
    fn chunked_bodies_are_measured_only_when_whole() {
        assert_eq!(chunked_len(b"0\r\n\r\n"), Ok(Some(5)));
        assert_eq!(chunked_len(b"a\r\n0123456789\r\n0\r\n\r\nrest"), Ok(Some(20)));
        assert_eq!(chunked_len(b"a\r\n0123"), Ok(None));
        assert_eq!(chunked_len(b"0\r\n"), Ok(None));
        assert!(chunked_len(b"zz\r\n").is_err());
    }
}
