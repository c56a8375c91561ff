//! The HTTP side: `POST /check_and_report` over one HTTP/1.1 keep-alive connection per task.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::{CallError, Shape, Verdict, error_chain};

/// One task's connection, reopened after it fails.
pub(super) struct Client {
    authority: String,
    host: HeaderValue,
    /// The namespace as a JSON string, quotes included.
    namespace: String,
    keys: u64,
    timeout: Duration,
    /// `None` until connected, and after the connection failed.
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Client {
    /// A client of `authority` (`host:port`), not connected yet.
    pub(super) fn new(authority: String, host: HeaderValue, shape: &Shape, timeout: Duration) -> Client {
        // Serializing a string cannot fail; the fallback is never used.
        let namespace = serde_json::to_string(&shape.namespace).unwrap_or_else(|_| "\"\"".to_string());
        Client { authority, host, namespace, keys: shape.keys, timeout, sender: None }
    }

    /// Opens the connection (TCP with no delay, HTTP/1.1 handshake).
    pub(super) async fn connect(&mut self) -> Result<(), String> {
        let connecting = async {
            let stream = TcpStream::connect(&self.authority).await.map_err(|e| e.to_string())?;
            stream.set_nodelay(true).map_err(|e| e.to_string())?;
            let (sender, connection) = http1::handshake(TokioIo::new(stream)).await.map_err(|e| error_chain(&e))?;
            tokio::spawn(async move {
                // Ends when the connection closes; the sender then reports the error.
                let _ = connection.await;
            });
            Ok::<_, String>(sender)
        };
        let sender = tokio::time::timeout(self.timeout, connecting)
            .await
            .map_err(|_| format!("no connection within {:?}", self.timeout))??;
        self.sender = Some(sender);
        Ok(())
    }

    /// Sends request `i`, connecting first if needed.
    pub(super) async fn call(&mut self, i: u64) -> Result<Verdict, CallError> {
        let connection_error = |message: String| CallError { message, connection: true };
        if self.sender.is_none() {
            self.connect().await.map_err(|e| connection_error(format!("cannot connect to {}: {e}", self.authority)))?;
        }
        // Taken out while in use: if this call fails or is abandoned (timeout), the next one
        // reconnects.
        let Some(mut sender) = self.sender.take() else {
            return Err(connection_error("not connected".to_string()));
        };
        sender.ready().await.map_err(|e| connection_error(error_chain(&e)))?;
        let body = format!(
            r#"{{"namespace":{},"values":{{"req.method":"{}","user_id":"user-{}"}},"delta":1}}"#,
            self.namespace,
            Shape::method(i),
            i % self.keys
        );
        let request = Request::builder()
            .method(Method::POST)
            .uri("/check_and_report")
            .header(HOST, self.host.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| CallError { message: e.to_string(), connection: false })?;
        let response = sender.send_request(request).await.map_err(|e| connection_error(error_chain(&e)))?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| connection_error(error_chain(&e)))?.to_bytes();
        self.sender = Some(sender);
        match status {
            StatusCode::OK => Ok(Verdict::Allowed),
            StatusCode::TOO_MANY_REQUESTS => Ok(Verdict::Limited),
            _ => {
                let text = String::from_utf8_lossy(&body);
                let text: String = text.trim().chars().take(200).collect();
                Err(CallError { message: format!("HTTP {status}: {text}"), connection: false })
            }
        }
    }
}
