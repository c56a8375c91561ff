//! The rate-limit calls over gRPC, framed here or by tonic.
//!
//! Envoy's `ShouldRateLimit` and Kuadrant's `CheckRateLimit` and `Report` are unary calls whose
//! answer is decided in memory in a few hundred nanoseconds; tonic's routing, streaming decoder
//! and encoder around each of them cost several times that (measured: docs/benchmarks.md,
//! "Where the RLS figure comes from"). [`Unary`] takes the methods of the one table (`protocol::methods`) itself: as they
//! usually come (uncompressed `application/grpc`) it reads the one length-prefixed message,
//! decodes it, [`Rls::answer`]s it and writes the reply and `grpc-status`; as they come otherwise
//! (compressed, say) it hands them to tonic's unary machinery, which answers them as tonic always
//! did. The decision is the same code either way: only the framing differs. Every other call
//! (the health service) goes to tonic's routes.

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
use tonic::server::{Grpc, UnaryService};

use crate::serve::model::Action;
use crate::serve::protocol::methods;
use crate::serve::protocol::rls::Rls;

/// The largest request message, as tonic's default (4 MiB).
pub(crate) const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// A gRPC message's prefix: compressed flag (1 byte) and length (4 bytes, big-endian).
const PREFIX: usize = 5;

/// The gRPC service of `tollgate serve`: the rate-limit calls answered here, the rest by `routes`.
#[derive(Clone)]
pub(crate) struct Unary<C: Clock, S> {
    rls: Arc<Rls<C>>,
    routes: S,
}

impl<C: Clock + Clone, S> Unary<C, S> {
    /// Answers the rate-limit calls with `rls`, and passes every other call to `routes`.
    pub(crate) fn new(rls: Arc<Rls<C>>, routes: S) -> Unary<C, S> {
        Unary { rls, routes }
    }
}

/// True when a rate-limit call is framed here: sent uncompressed as `application/grpc` (with or
/// without `+proto`).
fn framed_here(request: &Request<Body>) -> bool {
    let headers = request.headers();
    let grpc =
        headers.get(header::CONTENT_TYPE).is_some_and(|v| v == "application/grpc" || v == "application/grpc+proto");
    let identity = headers.get("grpc-encoding").is_none_or(|v| v == "identity");
    grpc && identity
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
        let Some(action) = methods::action(request.uri().path()) else {
            return Box::pin(self.routes.call(request));
        };
        let rls = Arc::clone(&self.rls);
        if framed_here(&request) {
            return Box::pin(async move { Ok(answer(&rls, request, action).await) });
        }
        Box::pin(async move {
            let mut grpc = Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(ByTonic { rls, action }, request).await)
        })
    }
}

/// One rate-limit call as tonic's unary machinery hands it over, decoded.
struct ByTonic<C: Clock> {
    rls: Arc<Rls<C>>,
    action: Action,
}

impl<C: Clock + Clone> UnaryService<RateLimitRequest> for ByTonic<C> {
    type Response = envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    type Future = tonic::codegen::BoxFuture<tonic::Response<Self::Response>, Status>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let (rls, action) = (self.rls.clone(), self.action);
        Box::pin(async move {
            let (metadata, _, request) = request.into_parts();
            rls.answer(request, action, metadata.as_ref()).await.map(tonic::Response::new)
        })
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
        // Compressed requests go to tonic (see `framed_here`); a flag set without grpc-encoding is wrong.
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
