//! The gRPC side: `ShouldRateLimit` over one tonic channel (one HTTP/2 connection) per connection.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::{Channel, Endpoint};

use crate::{CallError, Shape, Verdict, error_chain};

/// A client on one channel; clones share the channel's connection.
#[derive(Clone)]
pub(super) struct Client {
    client: RateLimitServiceClient<Channel>,
    shape: Arc<Shape>,
}

impl Client {
    /// Opens a connection to `authority` (`host:port`).
    pub(super) async fn connect(authority: String, shape: Arc<Shape>, timeout: Duration) -> Result<Client, String> {
        let endpoint = Endpoint::from_shared(format!("http://{authority}"))
            .map_err(|e| error_chain(&e))?
            .tcp_nodelay(true)
            .connect_timeout(timeout);
        let channel = endpoint.connect().await.map_err(|e| error_chain(&e))?;
        Ok(Client { client: RateLimitServiceClient::new(channel), shape })
    }

    /// Sends request `i`.
    pub(super) async fn call(&mut self, i: u64) -> Result<Verdict, CallError> {
        match self.client.should_rate_limit(request(&self.shape, i)).await {
            Ok(response) => match Code::try_from(response.get_ref().overall_code) {
                Ok(Code::Ok) => Ok(Verdict::Allowed),
                Ok(Code::OverLimit) => Ok(Verdict::Limited),
                _ => Err(CallError {
                    message: format!("unexpected overall_code {} in the answer", response.get_ref().overall_code),
                    connection: false,
                }),
            },
            Err(status) => {
                let mut message = format!("gRPC {:?}: {}", status.code(), status.message());
                if let Some(source) = std::error::Error::source(&status) {
                    message = format!("{message}: {}", error_chain(source));
                }
                Err(CallError { message, connection: status.code() == tonic::Code::Unavailable })
            }
        }
    }
}

/// Request `i` of `shape` (the raw engine writes the same bytes, checked against this).
pub(crate) fn request(shape: &Shape, i: u64) -> RateLimitRequest {
    let key = i % shape.keys;
    let mut descriptors = Vec::with_capacity(shape.descriptors);
    descriptors.push(RateLimitDescriptor {
        entries: vec![
            Entry { key: "req.method".to_string(), value: Shape::method(i).to_string() },
            Entry { key: "user_id".to_string(), value: format!("user-{key}") },
        ],
        ..Default::default()
    });
    for d in 1..shape.descriptors {
        descriptors.push(RateLimitDescriptor {
            entries: vec![Entry { key: format!("k{d}"), value: format!("v{key}") }],
            ..Default::default()
        });
    }
    RateLimitRequest { domain: shape.namespace.clone(), descriptors, hits_addend: 1 }
}
