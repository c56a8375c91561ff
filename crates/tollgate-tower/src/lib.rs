//! # tollgate-tower: rate limiting as a tower layer
//!
//! Put any Tollgate limiter — anything that implements [`tollgate::RateLimiter`] for the
//! policy's key: local, keyed, chained, or (feature `redis`) `tollgate_redis::RedisLimiter` — in
//! front of tower services and axum routers, with the answers clients need:
//!
//! - 429 by default (configurable status and body, e.g. RFC 9457 problem JSON); a gRPC call
//!   (`content-type: application/grpc*`, e.g. in front of a tonic service) gets a gRPC status
//!   instead — `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms`, or `UNAVAILABLE` when the
//!   backend could not decide — since gRPC clients read an HTTP error as a broken transport;
//! - `Retry-After` in whole seconds rounded **up** — never `0` while still limited;
//! - the IETF `RateLimit-Policy` / `RateLimit` fields, on rejections and optionally on every
//!   response;
//! - keys from the client IP (forwarding headers only from trusted proxies), a header, the matched
//!   route, an extension set by your auth layer, or any function; a missing key is your decision;
//! - a cost per request; several policies all-or-nothing;
//! - concurrency limits whose permits are held until the response body has been sent (or the
//!   client went away), not just until the headers were written;
//! - costs known only after the response (LLM tokens, bytes): a policy reserves an estimate and
//!   the body, when it ends, settles it for the cost the response reported in a header, a
//!   trailer or a [`UsedCost`] extension ([`Policy::settle_from`]);
//! - metrics through the [`metrics`](https://docs.rs/metrics) facade:
//!   `tollgate_layer_decisions_total{policy, outcome}` with `outcome` one of `allowed`,
//!   `limited`, `unavailable`, `no_key`, and for settling policies
//!   `tollgate_layer_settles_total{policy, outcome}` (`settled`, `missing`, `unparseable`,
//!   `dropped`, `failed`) (labels are policy names, never keys). The layer never
//!   queues a request (a decision is immediate, or one Redis round trip), so it has no queue time.
//!   Handles are registered when a [`Policy`] is built: install the recorder first. With no
//!   recorder a decision pays one branch per policy.
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use axum::{Router, routing::get};
//! use tollgate::{Concurrency, Keyed, Quota, TokenBucket};
//! use tollgate_tower::{ClientIp, Policy, RateLimitLayer};
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let per_ip = Policy::new("per-ip", ClientIp::new(), Keyed::new(TokenBucket::new(Quota::per_second(5)?)));
//! let in_flight = Policy::new("in-flight", ClientIp::new(), Keyed::new(Concurrency::new(2)?));
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(per_ip).and(in_flight).headers_on_success(true));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! // The peer address is what `ClientIp` keys on.
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub)]
#![warn(missing_debug_implementations)]
#![forbid(unsafe_code)]

mod body;
pub mod headers;
mod key;
mod metrics;
mod policy;
mod proxy;
mod service;
mod settle;

pub use body::RateLimitBody;
#[cfg(feature = "axum")]
pub use key::Route;
pub use key::{ClientIp, Extension, Global, Header, KeyExtractor, KeyFn, RequestInfo};
pub use policy::{Both, CostFn, Denied, MissingKey, Policies, Policy, PolicyPermit, PolicyState, Verdict};
pub use service::{RateLimit, RateLimitLayer, RejectBody, ResponseFuture, problem_json};
pub use settle::{Reserved, SettleFrom, UsedCost};

/// A configuration mistake, naming the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A trusted-proxy entry is neither a CIDR network nor an IP address.
    ///
    /// ```
    /// use tollgate_tower::{ClientIp, ConfigError};
    /// let err = ClientIp::new().trust_proxies(["10.0.0.0/8", "10.0.0.300"]).unwrap_err();
    /// assert_eq!(err, ConfigError::BadProxyNetwork { entry: "10.0.0.300".into(), number: 2 });
    /// assert_eq!(
    ///     err.to_string(),
    ///     "trusted proxy \"10.0.0.300\" (entry 2 of the list) is neither a network (10.0.0.0/8) nor an address"
    /// );
    /// ```
    #[error("trusted proxy {entry:?} (entry {number} of the list) is neither a network (10.0.0.0/8) nor an address")]
    BadProxyNetwork {
        /// The entry as given (trimmed).
        entry: String,
        /// Its place in the list, from 1.
        number: usize,
    },
}
