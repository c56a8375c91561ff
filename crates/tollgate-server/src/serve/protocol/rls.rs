//! Envoy's rate limit service, v3 (`ShouldRateLimit`), and Kuadrant's
//! (`kuadrant.service.ratelimit.v1.RateLimitService`: `CheckRateLimit` checks without counting,
//! `Report` counts without checking; both take and return Envoy's messages), answered by the
//! [`Engine`] on one port. [`Rls::answer`] turns a decoded request into the reply message, or the
//! gRPC status of a refusal; framing it is the transport's (`serve::net`).
//!
//! `domain` is the namespace; each descriptor's entries are one [`Descriptor`]; `hits_addend` is
//! the delta, 0 meaning 1 (as Envoy sends it), and a descriptor's own `hits_addend` overrides it
//! for the counters attributed to that descriptor (0 there counts nothing). The response has the
//! overall code and one status per descriptor: the tightest counter attributed to that descriptor
//! (see [`tollgate_policy::Hit::descriptor`]), with its limit, remaining hits and time until
//! reset — as envoy/ratelimit answers: a counter without room reports 0 remaining, an unlimited
//! rule no limit and 4294967295 remaining, `current_limit.name` is the limit's name (empty without
//! one), and under `--shadow` a descriptor over its limit keeps `OVER_LIMIT` while the overall
//! code is `OK`. A descriptor whose quota limit (`mode: quota`) is exceeded has status `OVER_LIMIT` while
//! the overall code is `OK`; the names of the exceeded quotas are in `dynamic_metadata`
//! (`quota_exceeded`, a list) and in the `x-tollgate-quota-exceeded` response header. With
//! `--rate-limit-headers`, `response_headers_to_add` carries the same RateLimit headers as the
//! HTTP API. With `--response-dynamic-metadata`, `dynamic_metadata` also describes the request
//! and the `metadata` of the rules it passed, as envoy/ratelimit's `RESPONSE_DYNAMIC_METADATA`.
//!
//! A descriptor's own `limit` is counted against instead of the configured rules when the limits
//! are in envoy/ratelimit's format ([`tollgate_policy::LimitOverride`]; Limitador's format has no
//! such counters and the limits file decides, as Limitador does); its status's `current_limit` is
//! that limit, without a name; a unit envoy/ratelimit does not know is refused as
//! `INVALID_ARGUMENT`.
//!
//! A negative `hits_addend` (`is_negative_hits`) is refused as `INVALID_ARGUMENT`, not counted
//! wrongly. So is a request over the engine's [`RequestBounds`](crate::serve::RequestBounds) (the
//! message names the bound).

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus, RateLimit};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use http::HeaderMap;
use tollgate::{CalendarUnit, Clock, SystemClock};
use tollgate_policy::{Descriptor, Enforcement, Limit, LimitOverride};
use tonic::Status as GrpcStatus;
use tracing::Instrument;

use super::headers::{HeaderDraft, response_headers};
use super::metadata::{RequestMetadata, quota_exceeded};
use crate::serve::engine::Engine;
use crate::serve::model::{Action, CallError, Outcome, Status};
use crate::serve::ops::metrics::{Metrics, Port};
use crate::serve::ops::trace::{Decision, Protocol, TraceParent};

/// Envoy's and Kuadrant's rate limit services: what answers their calls, whichever way they came.
pub struct Rls<C: Clock = SystemClock> {
    engine: Arc<Engine<C>>,
    metrics: Arc<Metrics>,
    headers: Option<HeaderDraft>,
    dynamic_metadata: bool,
    trace_parent: Option<Arc<dyn TraceParent>>,
}

impl<C: Clock + Clone> Rls<C> {
    /// A service deciding with `engine` and recording into `metrics`, without RateLimit headers.
    pub fn new(engine: Arc<Engine<C>>, metrics: Arc<Metrics>) -> Rls<C> {
        Rls { engine, metrics, headers: None, dynamic_metadata: false, trace_parent: None }
    }

    /// Adds the draft's RateLimit headers to every reply (`--rate-limit-headers`).
    #[must_use]
    pub fn with_headers(self, headers: Option<HeaderDraft>) -> Rls<C> {
        Rls { headers, ..self }
    }

    /// Describes the request and the rules it passed in every reply's `dynamic_metadata`, as
    /// envoy/ratelimit's `RESPONSE_DYNAMIC_METADATA` (`--response-dynamic-metadata`; see
    /// `serve::protocol::metadata`).
    #[must_use]
    pub fn with_dynamic_metadata(self, dynamic_metadata: bool) -> Rls<C> {
        Rls { dynamic_metadata, ..self }
    }

    /// Sets each decision span's parent from the call's metadata (see [`crate::serve::trace`]).
    #[must_use]
    pub fn with_trace_parent(self, trace_parent: Option<Arc<dyn TraceParent>>) -> Rls<C> {
        Rls { trace_parent, ..self }
    }

    /// Decides one request for any of the services (`action`: what its method asks), in a
    /// decision span whose parent is named in the call's `metadata`: the reply, or the status of
    /// a refusal (`INVALID_ARGUMENT` for a request that cannot be decided as it is, `UNAVAILABLE`
    /// when the storage cannot answer).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, rate_limit_response::Code};
    /// use futures::executor::block_on;
    /// use tollgate::ManualClock;
    /// use tollgate_policy::Policy;
    /// use tollgate_server::serve::{Action, Engine, Metrics, Mode, rls::Rls};
    ///
    /// let policy = Policy::parse("- {namespace: api, max_value: 1, seconds: 60}", "limits.yaml")?;
    /// let engine = Arc::new(Engine::new(policy, Mode::Accuracy, false, ManualClock::new()));
    /// let rls = Rls::new(engine, Arc::new(Metrics::new()));
    /// let request = || RateLimitRequest { domain: "api".into(), ..Default::default() };
    /// let metadata = http::HeaderMap::new();
    /// let first = block_on(rls.answer(request(), Action::CheckAndReport, &metadata)).unwrap();
    /// assert_eq!(first.overall_code, Code::Ok as i32);
    /// let second = block_on(rls.answer(request(), Action::CheckAndReport, &metadata)).unwrap();
    /// assert_eq!(second.overall_code, Code::OverLimit as i32);
    /// let empty = block_on(rls.answer(RateLimitRequest::default(), Action::Check, &metadata)).unwrap_err();
    /// assert_eq!(empty.code(), tonic::Code::InvalidArgument);
    /// # Ok::<(), tollgate_policy::PolicyError>(())
    /// ```
    pub async fn answer(
        &self,
        request: RateLimitRequest,
        action: Action,
        metadata: &HeaderMap,
    ) -> Result<RateLimitResponse, GrpcStatus> {
        let decision = Decision::start(Protocol::grpc(action), action, self.trace_parent.as_deref(), metadata);
        let span = decision.span().clone();
        self.decide(request, action, &decision).instrument(span).await
    }

    async fn decide(
        &self,
        request: RateLimitRequest,
        action: Action,
        decision: &Decision,
    ) -> Result<RateLimitResponse, GrpcStatus> {
        let started = Instant::now();
        let delta = u64::from(request.hits_addend.max(1));
        decision.request(&request.domain, delta);
        if request.domain.is_empty() {
            decision.invalid();
            return Err(GrpcStatus::invalid_argument("domain (the namespace) must not be empty"));
        }
        let described = self
            .dynamic_metadata
            .then(|| RequestMetadata::new(&request.domain, &request.descriptors, request.hits_addend));
        let descriptors = descriptors(request.descriptors).inspect_err(|_| decision.invalid())?;
        let outcome = match self.engine.call(&request.domain, &descriptors, delta, action).await {
            Ok(outcome) => outcome,
            Err(CallError::Oversize(e)) => {
                decision.invalid();
                self.metrics.refused(e.bound);
                return Err(GrpcStatus::invalid_argument(e.to_string()));
            }
            // UNAVAILABLE lets Envoy's failure_mode_deny decide, as Limitador does.
            Err(e @ CallError::Storage(_)) => {
                decision.unavailable();
                self.metrics.unavailable(Port::Grpc);
                return Err(GrpcStatus::unavailable(e.to_string()));
            }
        };
        decision.decided(&outcome);
        // As on the HTTP API: a decision is a call; a report adds hits only.
        match action {
            Action::CheckAndReport => self.metrics.record(&request.domain, &outcome, delta, started.elapsed()),
            Action::Check => self.metrics.record(&request.domain, &outcome, 0, started.elapsed()),
            Action::Report => self.metrics.record_report(&request.domain, &outcome, delta),
        }
        let mut reply = response(&outcome, descriptors.len());
        reply.response_headers_to_add = response_headers(&outcome, self.headers)
            .into_iter()
            .map(|(key, value)| HeaderValue { key: key.to_string(), value, raw_value: Vec::new() })
            .collect();
        reply.dynamic_metadata = described.map(|d| d.finish(&outcome, &reply));
        quota_exceeded(&outcome, &mut reply.dynamic_metadata);
        Ok(reply)
    }
}

/// The request's descriptors as the policy reads them, with their own `hits_addend`.
fn descriptors(descriptors: Vec<RateLimitDescriptor>) -> Result<Vec<Descriptor>, GrpcStatus> {
    descriptors
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            if d.is_negative_hits {
                return Err(GrpcStatus::invalid_argument(format!(
                    "descriptor {i}: a negative hits_addend (is_negative_hits) is not supported"
                )));
            }
            let mut descriptor: Descriptor = d.entries.into_iter().map(|e| (e.key, e.value)).collect();
            descriptor.hits = d.hits_addend.map(|h| h.value);
            descriptor.limit = d.limit.map(|own| own_limit(i, own)).transpose()?;
            Ok(descriptor)
        })
        .collect()
}

/// Descriptor `i`'s own limit. envoy/ratelimit reads its unit as its response's `Unit`
/// (`src/config/config_impl.go`, `GetLimit`): `WEEK` is 7 there, and 7, 30 and 365 days are its
/// week, month and year (`UnitToDivider`, which panics on any other; refused here).
fn own_limit(i: usize, own: RateLimitOverride) -> Result<LimitOverride, GrpcStatus> {
    let unit = match Unit::try_from(own.unit) {
        Ok(Unit::Second) => CalendarUnit::Second,
        Ok(Unit::Minute) => CalendarUnit::Minute,
        Ok(Unit::Hour) => CalendarUnit::Hour,
        Ok(Unit::Day) => CalendarUnit::Day,
        Ok(Unit::Week) => CalendarUnit::EpochWeek,
        Ok(Unit::Month) => CalendarUnit::EpochMonth,
        Ok(Unit::Year) => CalendarUnit::EpochYear,
        Ok(Unit::Unknown) | Err(_) => {
            return Err(GrpcStatus::invalid_argument(format!(
                "descriptor {i}: its limit's unit {} is not one of SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR",
                own.unit
            )));
        }
    };
    Ok(LimitOverride { requests_per_unit: u64::from(own.requests_per_unit), unit })
}

/// The RLS response for an outcome over `descriptors` descriptors.
pub(crate) fn response(outcome: &Outcome, descriptors: usize) -> RateLimitResponse {
    let slots = descriptors.max(1);
    // Per descriptor: the rank and index of its tightest status. A counter over its limit wins,
    // then one without room (a shadow limit's), then the one with the fewest hits remaining.
    type Rank = (bool, bool, u64);
    let mut tightest: Vec<Option<(Rank, usize)>> = vec![None; slots];
    for (i, status) in outcome.statuses.iter().enumerate() {
        let slot = &mut tightest[status.descriptor.min(slots - 1)];
        let rank = (!over(outcome, status), !status.limited, status.meta.remaining);
        if slot.is_none_or(|(best, _)| rank < best) {
            *slot = Some((rank, i));
        }
    }
    let statuses = tightest
        .into_iter()
        .map(|slot| match slot {
            None => DescriptorStatus { code: Code::Ok as i32, ..Default::default() },
            // As envoy/ratelimit: no current limit, all the room a uint32 holds.
            Some((_, i)) if outcome.limit(&outcome.statuses[i]).unlimited() => {
                DescriptorStatus { code: Code::Ok as i32, limit_remaining: u32::MAX, ..Default::default() }
            }
            Some(((not_over, _, _), i)) => {
                let status = &outcome.statuses[i];
                // envoy/ratelimit reports a counter without room as 0 remaining, whatever the
                // request asked for (`src/limiter/base_limiter.go`, `GetResponseDescriptorStatus`).
                let remaining = if status.limited { 0 } else { status.meta.remaining };
                DescriptorStatus {
                    code: if not_over { Code::Ok } else { Code::OverLimit } as i32,
                    current_limit: Some(rate_limit(outcome.limit(status), outcome.max_value(status))),
                    limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
                    duration_until_reset: Some(duration(status.meta.reset_ns)),
                    quota: None,
                }
            }
        })
        .collect();
    RateLimitResponse {
        overall_code: if outcome.allowed { Code::Ok } else { Code::OverLimit } as i32,
        statuses,
        ..Default::default()
    }
}

/// True when a counter is reported over its limit: an enforced limit without room (under
/// `--shadow` too: envoy/ratelimit's `SHADOW_MODE` forces only the overall code to OK,
/// `src/service/ratelimit.go`), or a quota or pooled limit the call exceeded; a shadow limit
/// (`shadow_mode`) reports OK, as envoy/ratelimit's does.
fn over(outcome: &Outcome, status: &Status) -> bool {
    status.limited
        && match outcome.limit(status).enforcement() {
            Enforcement::Enforce | Enforcement::Quota | Enforcement::Pooled => true,
            Enforcement::Shadow => false,
        }
}

/// Envoy's `RateLimit` counts per one unit; a calendar window is its unit (second to year); a
/// window that is not exactly one unit is given per second (rounded down, at least 1), and the
/// exact figure is in `name` when the limit has none. Otherwise `name` is the limit's name, empty
/// without one, as envoy/ratelimit's rule name. `max_value` is the status's
/// ([`Outcome::max_value`]: the request's own for a limit it sets).
fn rate_limit(limit: &Limit, max_value: u64) -> RateLimit {
    let units = [(1, Unit::Second), (60, Unit::Minute), (3600, Unit::Hour), (86_400, Unit::Day), (604_800, Unit::Week)];
    let calendar = limit.calendar().map(|c| match c.unit() {
        CalendarUnit::Second => Unit::Second,
        CalendarUnit::Minute => Unit::Minute,
        CalendarUnit::Hour => Unit::Hour,
        CalendarUnit::Day => Unit::Day,
        CalendarUnit::Week | CalendarUnit::EpochWeek => Unit::Week,
        CalendarUnit::Month | CalendarUnit::EpochMonth => Unit::Month,
        CalendarUnit::EpochYear => Unit::Year,
    });
    let (per_unit, unit, exact) = match (calendar, units.iter().find(|(s, _)| *s == limit.seconds())) {
        (Some(unit), _) | (None, Some(&(_, unit))) => (max_value, unit, true),
        (None, None) => ((max_value / limit.seconds()).max(1), Unit::Second, false),
    };
    let name = match limit.name() {
        Some(name) => name.to_string(),
        None if exact => String::new(),
        None => format!("{max_value} per {}s", limit.seconds()),
    };
    RateLimit { name, requests_per_unit: u32::try_from(per_unit).unwrap_or(u32::MAX), unit: unit as i32 }
}

fn duration(ns: u64) -> ProtoDuration {
    ProtoDuration { seconds: (ns / 1_000_000_000) as i64, nanos: (ns % 1_000_000_000) as i32 }
}

impl<C: Clock> std::fmt::Debug for Rls<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rls")
            .field("engine", &self.engine)
            .field("headers", &self.headers)
            .field("dynamic_metadata", &self.dynamic_metadata)
            .field("trace_parent", &self.trace_parent)
            .finish_non_exhaustive()
    }
}
