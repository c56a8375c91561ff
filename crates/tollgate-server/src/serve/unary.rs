//! The rate-limit calls over gRPC without tonic's per-call machinery.
//!
//! Envoy's `ShouldRateLimit` and Kuadrant's `CheckRateLimit` and `Report` are unary calls whose
//! answer is decided in memory in a few hundred nanoseconds; tonic's routing, streaming decoder
//! and encoder around each of them cost several times that (measured: README, "Rate-limit
//! server"). [`Unary`] takes those three paths itself — read the one length-prefixed message,
//! decode it, [`Rls::answer`] it, write the reply and `grpc-status` — and hands every other call
//! to tonic's routes: the health service, and any call this path does not take as it is
//! (compressed, or not `application/grpc`), which tonic answers as it always did. The decision is
//! the same code either way: only the framing differs.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use http::{HeaderMap, HeaderValue, Request, Response, header};
use http_body::Frame;
use http_body_util::{BodyExt, Limited};
use prost::Message;
use tollgate::Clock;
use tonic::Status;
use tonic::body::Body;

use super::engine::Action;
use super::rls::Rls;

/// Envoy's method.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// Kuadrant's check without counting.
const CHECK_RATE_LIMIT: &str = "/kuadrant.service.ratelimit.v1.RateLimitService/CheckRateLimit";
/// Kuadrant's count without checking.
const REPORT: &str = "/kuadrant.service.ratelimit.v1.RateLimitService/Report";

/// The largest request message, as tonic's default (4 MiB).
pub(super) const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// A gRPC message's prefix: compressed flag (1 byte) and length (4 bytes, big-endian).
const PREFIX: usize = 5;

/// The gRPC service of `tollgate serve`: the rate-limit calls answered here, the rest by `routes`.
#[derive(Clone)]
pub(super) struct Unary<C: Clock, S> {
    rls: Arc<Rls<C>>,
    routes: S,
}

impl<C: Clock + Clone, S> Unary<C, S> {
    /// Answers the rate-limit calls with `rls`, and passes every other call to `routes`.
    pub(super) fn new(rls: Arc<Rls<C>>, routes: S) -> Unary<C, S> {
        Unary { rls, routes }
    }
}

/// Which action a request asks for, if this path takes it: one of the three methods, sent
/// uncompressed as `application/grpc` (with or without `+proto`).
fn taken(request: &Request<Body>) -> Option<Action> {
    let action = match request.uri().path() {
        SHOULD_RATE_LIMIT => Action::CheckAndReport,
        CHECK_RATE_LIMIT => Action::Check,
        REPORT => Action::Report,
        _ => return None,
    };
    let headers = request.headers();
    let grpc =
        headers.get(header::CONTENT_TYPE).is_some_and(|v| v == "application/grpc" || v == "application/grpc+proto");
    let identity = headers.get("grpc-encoding").is_none_or(|v| v == "identity");
    (grpc && identity).then_some(action)
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl<C, S> tower::Service<Request<Body>> for Unary<C, S>
where
    C: Clock + Clone + Send + Sync + 'static,
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.routes.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> BoxFuture {
        match taken(&request) {
            Some(action) => {
                let rls = Arc::clone(&self.rls);
                Box::pin(async move { Ok(answer(&rls, request, action).await) })
            }
            None => Box::pin(self.routes.call(request)),
        }
    }
}

/// Reads, decides and answers one call; every failure is a gRPC status, as tonic would send it.
async fn answer<C: Clock + Clone>(rls: &Rls<C>, request: Request<Body>, action: Action) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, PREFIX + MAX_MESSAGE).collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return failed(Status::resource_exhausted(format!("request larger than {MAX_MESSAGE} bytes")));
        }
        Err(e) => return failed(Status::cancelled(format!("request body not read: {e}"))),
    };
    let message = match message(&body) {
        Ok(message) => message,
        Err(status) => return failed(status),
    };
    let request = match RateLimitRequest::decode(message) {
        Ok(request) => request,
        Err(e) => return failed(Status::invalid_argument(format!("failed to decode Protobuf message: {e}"))),
    };
    match rls.answer(request, action, &parts.headers).await {
        Ok(reply) => {
            let reply = reply.into_inner();
            let length = reply.encoded_len();
            let mut frame = BytesMut::with_capacity(PREFIX + length);
            frame.put_u8(0);
            frame.put_u32(u32::try_from(length).expect("a reply is far below 4 GiB"));
            reply.encode(&mut frame).expect("the buffer was sized for the message");
            let mut trailers = HeaderMap::with_capacity(1);
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            let body = Body::new(Message1 { data: Some(frame.freeze()), trailers: Some(trailers) });
            let mut response = Response::new(body);
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            response
        }
        Err(status) => failed(status),
    }
}

/// The one message of a unary request's body.
fn message(body: &Bytes) -> Result<Bytes, Status> {
    if body.len() < PREFIX {
        return Err(Status::invalid_argument(format!(
            "failed to decode Protobuf message: a gRPC message needs a 5-byte prefix, the body has {} bytes",
            body.len()
        )));
    }
    if body[0] != 0 {
        // Compressed requests go to tonic (see `taken`); a flag set without grpc-encoding is wrong.
        return Err(Status::internal("compressed message without a grpc-encoding header"));
    }
    let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if length != body.len() - PREFIX {
        return Err(Status::invalid_argument(format!(
            "failed to decode Protobuf message: the prefix says {length} bytes, the body has {} after it \
             (a unary call carries exactly one message)",
            body.len() - PREFIX
        )));
    }
    Ok(body.slice(PREFIX..))
}

/// A trailers-only answer carrying `status`.
fn failed(status: Status) -> Response<Body> {
    let (parts, ()) = status.into_http::<()>().into_parts();
    Response::from_parts(parts, Body::empty())
}

/// A response body of one data frame, then the trailers.
struct Message1 {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for Message1 {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let frame = match self.data.take() {
            Some(data) => Frame::data(data),
            None => match self.trailers.take() {
                Some(trailers) => Frame::trailers(trailers),
                None => return Poll::Ready(None),
            },
        };
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}

impl<C: Clock, S> std::fmt::Debug for Unary<C, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unary").field("rls", &self.rls).finish_non_exhaustive()
    }
}
