//! Envoy's rate limit service, v3: `ShouldRateLimit` answered by the [`Engine`].
//!
//! `domain` is the namespace; each descriptor's entries are one [`Descriptor`]; `hits_addend` is
//! the delta, 0 meaning 1 (as Envoy sends it). The response has the overall code and one status per
//! descriptor: the tightest counter attributed to that descriptor (see
//! [`tollgate_policy::Hit::descriptor`]), with its limit, remaining hits and time until reset.

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus, RateLimit};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tollgate::{Clock, SystemClock};
use tollgate_policy::{Descriptor, Limit};
use tonic::{Request, Response, Status as GrpcStatus};

use super::engine::{Action, Engine, Outcome};
use super::metrics::Metrics;

pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

/// The gRPC service; wrap it in [`RateLimitServiceServer`] to serve it.
pub struct Rls<C: Clock = SystemClock> {
    engine: Arc<Engine<C>>,
    metrics: Arc<Metrics>,
}

impl<C: Clock + Clone> Rls<C> {
    /// A service deciding with `engine` and recording into `metrics`.
    pub fn new(engine: Arc<Engine<C>>, metrics: Arc<Metrics>) -> Rls<C> {
        Rls { engine, metrics }
    }
}

#[tonic::async_trait]
impl<C: Clock + Clone> RateLimitService for Rls<C> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, GrpcStatus> {
        let started = Instant::now();
        let request = request.into_inner();
        if request.domain.is_empty() {
            return Err(GrpcStatus::invalid_argument("domain (the namespace) must not be empty"));
        }
        let descriptors: Vec<Descriptor> = request
            .descriptors
            .into_iter()
            .map(|d| d.entries.into_iter().map(|e| (e.key, e.value)).collect())
            .collect();
        let delta = u64::from(request.hits_addend.max(1));
        let outcome = match self.engine.call(&request.domain, &descriptors, delta, Action::CheckAndReport).await {
            Ok(outcome) => outcome,
            // UNAVAILABLE lets Envoy's failure_mode_deny decide, as Limitador does.
            Err(e) => return Err(GrpcStatus::unavailable(format!("counter storage unavailable: {e}"))),
        };
        self.metrics.record(&request.domain, &outcome, delta, started.elapsed());
        Ok(Response::new(response(&outcome, descriptors.len())))
    }
}

/// The RLS response for an outcome over `descriptors` descriptors.
pub(crate) fn response<C: Clock>(outcome: &Outcome<C>, descriptors: usize) -> RateLimitResponse {
    let mut statuses = vec![DescriptorStatus { code: Code::Ok as i32, ..Default::default() }; descriptors.max(1)];
    let mut tightest: Vec<Option<(bool, u64)>> = vec![None; statuses.len()];
    for status in &outcome.statuses {
        let slot = status.descriptor.min(statuses.len() - 1);
        // A limited counter wins; then the one with the fewest hits remaining.
        let rank = (!status.limited, status.meta.remaining);
        if tightest[slot].is_some_and(|t| t <= rank) {
            continue;
        }
        tightest[slot] = Some(rank);
        let limited = status.limited && !outcome.allowed;
        statuses[slot] = DescriptorStatus {
            code: if limited { Code::OverLimit } else { Code::Ok } as i32,
            current_limit: Some(rate_limit(outcome.limit(status))),
            limit_remaining: u32::try_from(status.meta.remaining).unwrap_or(u32::MAX),
            duration_until_reset: Some(duration(status.meta.reset_ns)),
            quota: None,
        };
    }
    RateLimitResponse {
        overall_code: if outcome.allowed { Code::Ok } else { Code::OverLimit } as i32,
        statuses,
        ..Default::default()
    }
}

/// Envoy's `RateLimit` counts per one unit; a window that is not exactly one unit is given per
/// second (rounded down, at least 1), and the exact figure is in `name`.
fn rate_limit(limit: &Limit) -> RateLimit {
    let units = [(1, Unit::Second), (60, Unit::Minute), (3600, Unit::Hour), (86_400, Unit::Day), (604_800, Unit::Week)];
    let (per_unit, unit) = match units.iter().find(|(s, _)| *s == limit.seconds()) {
        Some(&(_, unit)) => (limit.max_value(), unit),
        None => ((limit.max_value() / limit.seconds()).max(1), Unit::Second),
    };
    let name = match limit.name() {
        Some(name) => name.to_string(),
        None => format!("{} per {}s", limit.max_value(), limit.seconds()),
    };
    RateLimit { name, requests_per_unit: u32::try_from(per_unit).unwrap_or(u32::MAX), unit: unit as i32 }
}

fn duration(ns: u64) -> ProtoDuration {
    ProtoDuration { seconds: (ns / 1_000_000_000) as i64, nanos: (ns % 1_000_000_000) as i32 }
}

impl<C: Clock> std::fmt::Debug for Rls<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rls").field("engine", &self.engine).finish_non_exhaustive()
    }
}
