//! Kuadrant's rate limit service, `kuadrant.service.ratelimit.v1.RateLimitService`, served beside
//! Envoy's: `CheckRateLimit` (would the hits be allowed? counts nothing) and `Report` (count the
//! hits that happened, e.g. LLM tokens known only once the response is out). Requests and replies
//! are Envoy's RLS messages, so the service is written here by hand, as `tonic`'s code generator
//! would write it, instead of compiling Kuadrant's three-line proto at build time.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate::Clock;
use tonic::body::Body;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};

use super::engine::Action;
use super::rls::Rls;

/// The service's full name, as clients and health checks address it.
pub(super) const SERVICE_NAME: &str = "kuadrant.service.ratelimit.v1.RateLimitService";

/// The tonic service answering Kuadrant's two methods; add it to a `tonic` server beside
/// [`super::rls::RateLimitServiceServer`].
pub struct KuadrantServer<C: Clock> {
    rls: Arc<Rls<C>>,
}

impl<C: Clock + Clone> KuadrantServer<C> {
    /// The service over `rls`, the state Envoy's service also runs on (engine, metrics, headers):
    /// both count on the same counters.
    pub fn new(rls: Arc<Rls<C>>) -> KuadrantServer<C> {
        KuadrantServer { rls }
    }
}

struct Method<C: Clock> {
    rls: Arc<Rls<C>>,
    action: Action,
}

impl<C: Clock + Clone> UnaryService<RateLimitRequest> for Method<C> {
    type Response = RateLimitResponse;
    type Future = tonic::codegen::BoxFuture<Response<RateLimitResponse>, Status>;

    fn call(&mut self, request: Request<RateLimitRequest>) -> Self::Future {
        let (rls, action) = (self.rls.clone(), self.action);
        Box::pin(async move {
            let (metadata, _, request) = request.into_parts();
            rls.answer(request, action, metadata.as_ref()).await
        })
    }
}

impl<C, B> tower::Service<http::Request<B>> for KuadrantServer<C>
where
    C: Clock + Clone,
    B: http_body::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.uri().path().strip_prefix('/').and_then(|p| p.strip_prefix(SERVICE_NAME));
        let action = match method {
            Some("/CheckRateLimit") => Some(Action::Check),
            Some("/Report") => Some(Action::Report),
            _ => None,
        };
        let Some(action) = action else {
            return Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) });
        };
        let method = Method { rls: self.rls.clone(), action };
        Box::pin(async move {
            let mut grpc = Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(method, request).await)
        })
    }
}

impl<C: Clock> Clone for KuadrantServer<C> {
    fn clone(&self) -> Self {
        KuadrantServer { rls: self.rls.clone() }
    }
}

impl<C: Clock> NamedService for KuadrantServer<C> {
    const NAME: &'static str = SERVICE_NAME;
}

impl<C: Clock> std::fmt::Debug for KuadrantServer<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KuadrantServer").field("rls", &self.rls).finish()
    }
}
