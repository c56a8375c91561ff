//! RLQS's stream framed by tonic: each message of the request stream is one report, answered by
//! one message on the response stream. The stream is read only as fast as its answers are taken:
//! a client that stops reading holds nothing but HTTP/2's flow-control window.

use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use futures::Stream;
use tollgate::Clock;
use tonic::{Request, Response, Status, Streaming};

use crate::serve::protocol::rlqs::Rlqs;

/// The gRPC service `envoy.service.rate_limit_quota.v3.RateLimitQuotaService`.
pub(crate) struct RlqsService<C: Clock + Clone>(pub(crate) Arc<Rlqs<C>>);

/// The answers of one stream.
type Answers = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<C: Clock + Clone + Send + Sync + 'static> RateLimitQuotaService for RlqsService<C> {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Answers>, Status> {
        let reports = request.into_inner();
        let instance = self.0.open();
        let answers = futures::stream::unfold(Some((reports, instance)), |state| async move {
            let (mut reports, mut instance) = state?;
            match reports.message().await {
                Ok(Some(report)) => match instance.report(report).await {
                    Ok(answer) => Some((Ok(answer), Some((reports, instance)))),
                    // The stream ends in error: as a broken stream, its shares are held until
                    // they expire.
                    Err(status) => Some((Err(status), None)),
                },
                Ok(None) => {
                    instance.end().await;
                    None
                }
                Err(status) => Some((Err(invalid_when_undecodable(status)), None)),
            }
        });
        Ok(Response::new(Box::pin(answers)))
    }
}

/// tonic reports a message it cannot decode as INTERNAL; it is the client's mistake.
fn invalid_when_undecodable(status: Status) -> Status {
    if status.code() == tonic::Code::Internal && status.message().starts_with("failed to decode") {
        Status::invalid_argument(status.message().to_string())
    } else {
        status
    }
}
