//! The work pump's HTTP worker (feature `http`): work items as JSON Lines, validated before they
//! are queued, and a ready-made handler that sends each item as an HTTP request to a throttled
//! API (what `tollgate pump` runs).
//!
//! An item is one JSON object: `{"key": "order-17", "cost": 1, "method": "POST", "path":
//! "/orders", "headers": {"content-type": "application/json"}, "body": {...}}`; every field is
//! optional (`method` POST, `path` "", `cost` 1, `key` derived from the line's content and
//! number). The worker sends it to the base URL + `path` with an `Idempotency-Key` header; a 2xx is
//! done, a 429 or 503 is throttled (its `Retry-After` honoured), anything else is a failure.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_pace::http::{HttpWorker, parse_line};
//!
//! // Enqueue side: one line, checked, becomes the queue's key, cost and payload.
//! let item = parse_line(r#"{"key": "order-17", "path": "/orders", "body": {"sku": 42}}"#, 1)?;
//! assert_eq!((item.key.as_str(), item.cost), ("order-17", 1));
//! // queue.enqueue(&item.key, &item.payload, item.cost).await?;
//!
//! // Worker side: the pump's handler.
//! let worker = HttpWorker::new("http://127.0.0.1:3000", Duration::from_secs(10))?;
//! let handler = move |item| {
//!     let worker = worker.clone();
//!     async move { worker.send(&item).await }
//! };
//! // tollgate_pace::pump(queue, pacer, options, progress, handler).await?;
//! # let _ = handler;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
// The `http` crate as hyper re-exports it: one dependency fewer, and no clash with this module's name.
use hyper::http;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde::Deserialize;

use crate::{Handled, Item};

/// One line of the input, as written.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Idempotency key.
    #[serde(default)]
    pub key: Option<String>,
    /// Units the item costs against the budget.
    #[serde(default)]
    pub cost: Option<u64>,
    /// HTTP method.
    #[serde(default)]
    pub method: Option<String>,
    /// Path appended to the worker's base URL.
    #[serde(default)]
    pub path: Option<String>,
    /// Request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Request body: a string is sent as is, anything else as JSON.
    #[serde(default)]
    pub body: Option<serde_json::Value>,
}

/// A line ready to enqueue: its key, cost and the payload stored in the queue.
#[derive(Debug, PartialEq)]
pub struct Parsed {
    /// Idempotency key.
    pub key: String,
    /// Cost in units.
    pub cost: u64,
    /// The line itself (validated).
    pub payload: String,
}

/// Why an input line cannot be queued; each variant carries the line's number (from 1).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LineError {
    /// Not a JSON object of the expected shape (unknown field, wrong type, bad syntax).
    #[error("line {line}: {source}")]
    Json {
        /// The line's number.
        line: usize,
        /// The JSON reader's complaint, with the column.
        #[source]
        source: serde_json::Error,
    },
    /// `method` is not an HTTP method.
    #[error("line {line}: invalid method `{method}`")]
    Method {
        /// The line's number.
        line: usize,
        /// The method as written.
        method: String,
    },
    /// `cost` is 0.
    #[error("line {line}: cost must be at least 1")]
    ZeroCost {
        /// The line's number.
        line: usize,
    },
}

impl LineError {
    /// The number of the offending line, from 1.
    pub fn line(&self) -> usize {
        match self {
            LineError::Json { line, .. } | LineError::Method { line, .. } | LineError::ZeroCost { line } => *line,
        }
    }
}

/// A base URL an [`HttpWorker`] cannot send to.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerUrlError {
    /// Not a URI.
    #[error("invalid worker URL `{url}`: {source}")]
    Invalid {
        /// The URL as given.
        url: String,
        /// Why it does not parse.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// Not `http://` (the worker speaks plain HTTP/1.1 only).
    #[error("invalid worker URL `{url}`: only http:// is supported")]
    Scheme {
        /// The URL as given.
        url: String,
    },
}

/// Validates one input line (`number` from 1, for the default key and for errors).
pub fn parse_line(line: &str, number: usize) -> Result<Parsed, LineError> {
    let job: Job = serde_json::from_str(line).map_err(|source| LineError::Json { line: number, source })?;
    if let Some(method) = &job.method {
        http::Method::from_bytes(method.as_bytes())
            .map_err(|_| LineError::Method { line: number, method: method.clone() })?;
    }
    if job.cost == Some(0) {
        return Err(LineError::ZeroCost { line: number });
    }
    let key = job.key.clone().unwrap_or_else(|| format!("line-{number}-{:016x}", fnv(line.as_bytes())));
    Ok(Parsed { key, cost: job.cost.unwrap_or(1), payload: line.to_string() })
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// Why the worker failed an item (the pump records it with the item, and in the dead-letter
/// queue after the last attempt).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The queued payload is not a valid item (it was written by something other than `tollgate
    /// pump enqueue`).
    #[error("invalid item: {0}")]
    Item(#[source] serde_json::Error),
    /// The item makes no valid HTTP request (e.g. a header value with a newline).
    #[error("invalid request to {url}: {source}")]
    Request {
        /// Where it was to go.
        url: String,
        /// Why it is invalid.
        #[source]
        source: http::Error,
    },
    /// No answer within the worker's timeout.
    #[error("{url}: no answer within {after:?}")]
    Timeout {
        /// Where it went.
        url: String,
        /// The timeout.
        after: Duration,
    },
    /// The request could not be sent or its answer not read (connection refused or reset).
    #[error("{url}: {source}")]
    Transport {
        /// Where it went.
        url: String,
        /// The client's error.
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    /// The service answered with a status that is neither success nor throttling.
    #[error("{url}: HTTP {status}: {body}")]
    Status {
        /// Where it went.
        url: String,
        /// The status.
        status: http::StatusCode,
        /// The start of the answer's body (up to 200 bytes, lossy UTF-8).
        body: String,
    },
}

/// Sends items to one base URL.
#[derive(Clone)]
pub struct HttpWorker {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    timeout: Duration,
}

impl HttpWorker {
    /// A worker sending to `base` (e.g. `http://127.0.0.1:3000`), each call within `timeout`.
    pub fn new(base: &str, timeout: Duration) -> Result<HttpWorker, WorkerUrlError> {
        let uri: http::Uri = base.parse().map_err(|source| WorkerUrlError::Invalid { url: base.to_owned(), source })?;
        if uri.scheme_str() != Some("http") {
            return Err(WorkerUrlError::Scheme { url: base.to_owned() });
        }
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        Ok(HttpWorker { client, base: base.trim_end_matches('/').to_string(), timeout })
    }

    /// Sends one item and classifies the answer.
    pub async fn send(&self, item: &Item) -> Handled {
        let job: Job = match serde_json::from_str(&item.payload) {
            Ok(job) => job,
            Err(e) => return Handled::failed(SendError::Item(e)),
        };
        let method = job.method.as_deref().unwrap_or("POST");
        let url = format!("{}{}", self.base, job.path.as_deref().unwrap_or(""));
        let body = match job.body {
            None => Bytes::new(),
            Some(serde_json::Value::String(s)) => Bytes::from(s),
            Some(other) => Bytes::from(other.to_string()),
        };
        let mut request = hyper::Request::builder().method(method).uri(&url).header("idempotency-key", &item.key);
        for (name, value) in &job.headers {
            request = request.header(name, value);
        }
        let request = match request.body(Full::new(body)) {
            Ok(request) => request,
            Err(source) => return Handled::failed(SendError::Request { url, source }),
        };
        let response = match tokio::time::timeout(self.timeout, self.client.request(request)).await {
            Err(_) => return Handled::failed(SendError::Timeout { url, after: self.timeout }),
            Ok(Err(source)) => return Handled::failed(SendError::Transport { url, source }),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64);
        let body = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        if status.is_success() {
            Handled::Done
        } else if status == http::StatusCode::TOO_MANY_REQUESTS || status == http::StatusCode::SERVICE_UNAVAILABLE {
            Handled::Throttled(retry_after)
        } else {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            Handled::failed(SendError::Status { url, status, body: text })
        }
    }
}

impl std::fmt::Debug for HttpWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpWorker").field("base", &self.base).field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        let p = parse_line(r#"{"key":"a","cost":3,"path":"/x","body":{"n":1}}"#, 1).unwrap();
        assert_eq!((p.key.as_str(), p.cost), ("a", 3));
        let d = parse_line("{}", 7).unwrap();
        assert!(d.key.starts_with("line-7-"), "{}", d.key);
        let err = |line: &str, number| parse_line(line, number).unwrap_err();
        assert_eq!(err("{bad", 4).to_string(), "line 4: key must be a string at line 1 column 2");
        assert!(matches!(err("{bad", 4), LineError::Json { line: 4, .. }));
        assert_eq!(err(r#"{"cost":0}"#, 2).to_string(), "line 2: cost must be at least 1");
        assert!(matches!(err(r#"{"cost":0}"#, 2), LineError::ZeroCost { line: 2 }));
        assert!(err(r#"{"colour":1}"#, 3).to_string().starts_with("line 3: unknown field `colour`"));
        assert_eq!(err(r#"{"method":"G E T"}"#, 5).to_string(), "line 5: invalid method `G E T`");
        assert!(matches!(err(r#"{"method":"G E T"}"#, 5), LineError::Method { line: 5, method } if method == "G E T"));
        assert_eq!(err("{bad", 9).line(), 9);
    }

    #[test]
    fn worker_urls() {
        let err = HttpWorker::new("https://api.example", Duration::from_secs(1)).err().unwrap();
        assert!(matches!(&err, WorkerUrlError::Scheme { url } if url == "https://api.example"));
        assert_eq!(err.to_string(), "invalid worker URL `https://api.example`: only http:// is supported");
        let err = HttpWorker::new("http://a b", Duration::from_secs(1)).err().unwrap();
        assert!(matches!(&err, WorkerUrlError::Invalid { url, .. } if url == "http://a b"), "{err}");
    }
}
