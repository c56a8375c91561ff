//! `tollgate pump`: work items as JSON Lines into a durable queue, and a ready-made worker that
//! sends each item as an HTTP request to a throttled API under a pacer.
//!
//! An item is one JSON object: `{"key": "order-17", "cost": 1, "method": "POST", "path":
//! "/orders", "headers": {"content-type": "application/json"}, "body": {...}}`; every field is
//! optional (`method` POST, `path` "", `cost` 1, `key` derived from the line's content and
//! number). The worker sends it to the base URL + `path` with an `Idempotency-Key` header; a 2xx is
//! done, a 429 or 503 is throttled (its `Retry-After` honoured), anything else is a failure.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde::Deserialize;
use tollgate_pace::{Handled, Item};

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

/// Validates one input line (`number` from 1, for the default key and for errors).
pub fn parse_line(line: &str, number: usize) -> Result<Parsed, String> {
    let job: Job = serde_json::from_str(line).map_err(|e| format!("line {number}: {e}"))?;
    if let Some(method) = &job.method {
        http::Method::from_bytes(method.as_bytes()).map_err(|_| format!("line {number}: invalid method `{method}`"))?;
    }
    if job.cost == Some(0) {
        return Err(format!("line {number}: cost must be at least 1"));
    }
    let key = job.key.clone().unwrap_or_else(|| format!("line-{number}-{:016x}", fnv(line.as_bytes())));
    Ok(Parsed { key, cost: job.cost.unwrap_or(1), payload: line.to_string() })
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
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
    pub fn new(base: &str, timeout: Duration) -> Result<HttpWorker, String> {
        let uri: http::Uri = base.parse().map_err(|e| format!("invalid --url `{base}`: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!("invalid --url `{base}`: only http:// is supported"));
        }
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        Ok(HttpWorker { client, base: base.trim_end_matches('/').to_string(), timeout })
    }

    /// Sends one item and classifies the answer.
    pub async fn send(&self, item: &Item) -> Handled {
        let job: Job = match serde_json::from_str(&item.payload) {
            Ok(job) => job,
            Err(e) => return Handled::Failed(format!("invalid item: {e}")),
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
            Err(e) => return Handled::Failed(format!("invalid request to {url}: {e}")),
        };
        let response = match tokio::time::timeout(self.timeout, self.client.request(request)).await {
            Err(_) => return Handled::Failed(format!("{url}: no answer within {:?}", self.timeout)),
            Ok(Err(e)) => return Handled::Failed(format!("{url}: {e}")),
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
            Handled::Failed(format!("{url}: HTTP {status}: {text}"))
        }
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
        assert_eq!(parse_line("{bad", 4).unwrap_err(), "line 4: key must be a string at line 1 column 2");
        assert_eq!(parse_line(r#"{"cost":0}"#, 2).unwrap_err(), "line 2: cost must be at least 1");
        assert!(parse_line(r#"{"colour":1}"#, 3).unwrap_err().starts_with("line 3: unknown field `colour`"));
        assert_eq!(parse_line(r#"{"method":"G E T"}"#, 5).unwrap_err(), "line 5: invalid method `G E T`");
    }
}
