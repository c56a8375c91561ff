//! A `tracing` span per decision, and the hook that makes it the child of the caller's span.
//!
//! Every call the server decides — Envoy's `ShouldRateLimit`, Kuadrant's `CheckRateLimit` and
//! `Report`, the HTTP API's `/check`, `/report` and `/check_and_report` — runs in one span named
//! [`SPAN_NAME`], target [`TARGET`], level TRACE, with these fields:
//!
//! | field | value |
//! | --- | --- |
//! | `ratelimit.protocol` | `rls` (Envoy), `kuadrant` or `http` |
//! | `ratelimit.action` | `check_and_report`, `check` or `report` |
//! | `ratelimit.namespace` | the namespace (RLS `domain`) as the caller sent it |
//! | `ratelimit.hits_addend` | the hits asked for (RLS: `hits_addend`, 0 read as 1; HTTP: `delta`) |
//! | `ratelimit.outcome` | `ok`, `over_limit`, `unavailable` (the storage could not answer) or `invalid` (refused before deciding) |
//! | `ratelimit.limits` | the limits whose counters the call touched, comma-separated: their `name`, or their id when unnamed |
//! | `ratelimit.limits_over` | those of them that had no room (in shadow mode, or for shadow and quota limits, the call is allowed all the same) |
//! | `otel.kind`, `otel.status_code` | `server`; `error` when unavailable (read by `tracing-opentelemetry`) |
//!
//! Only names from the limits file and the namespace are recorded, never a descriptor's values.
//!
//! The level and target keep the span off by default: under a subscriber whose filters do not
//! enable TRACE for [`TARGET`] (`tollgate serve` logs at `info`), making it is a comparison with
//! the maximum level and it is `Span::none()`: no field is computed, the [`TraceParent`] is not
//! called, recording into it is a branch. Nothing here depends on OpenTelemetry: `tollgate serve
//! --otlp-endpoint` installs an OpenTelemetry layer for this target and a [`TraceParent`] that
//! reads W3C `traceparent` and `tracestate`.

use std::fmt::Write as _;

use http::HeaderMap;
use tracing::Span;
use tracing::field::Empty;

use crate::serve::model::{Action, Outcome, Status};

/// The target of the decision spans.
pub const TARGET: &str = "tollgate::decision";

/// The name of the decision spans.
pub const SPAN_NAME: &str = "ratelimit.decide";

/// Makes a decision's span the child of the caller's span, named in the request's headers (W3C
/// `traceparent` and `tracestate`, B3, or whatever the implementation reads).
///
/// The server calls it once per decision whose span is enabled, right after making the span and
/// before entering it, with the request's headers: the gRPC metadata for RLS and Kuadrant, the
/// HTTP headers for the HTTP API. With `tracing-opentelemetry`, an implementation extracts the
/// caller's context with a propagator and calls `OpenTelemetrySpanExt::set_parent`.
///
/// ```
/// use http::HeaderMap;
/// use tollgate_server::serve::TraceParent;
///
/// /// Records which requests came with a W3C trace context (a stand-in for a propagator).
/// #[derive(Debug)]
/// struct Noticed;
///
/// impl TraceParent for Noticed {
///     fn set_parent(&self, span: &tracing::Span, headers: &HeaderMap) {
///         if let Some(parent) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
///             tracing::trace!(parent: span, parent, "caller's trace context");
///         }
///     }
/// }
/// ```
pub trait TraceParent: Send + Sync + std::fmt::Debug {
    /// Sets `span`'s parent from `headers`, if they name one.
    fn set_parent(&self, span: &Span, headers: &HeaderMap);
}

/// Which protocol a decision came by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// Envoy's `ShouldRateLimit`.
    Rls,
    /// Kuadrant's `CheckRateLimit` and `Report`.
    Kuadrant,
    /// The HTTP API.
    Http,
}

impl Protocol {
    /// The gRPC services' protocol for `action`: Envoy's service only checks and reports
    /// together, Kuadrant's only does one or the other.
    pub(crate) fn grpc(action: Action) -> Protocol {
        match action {
            Action::CheckAndReport => Protocol::Rls,
            Action::Check | Action::Report => Protocol::Kuadrant,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Protocol::Rls => "rls",
            Protocol::Kuadrant => "kuadrant",
            Protocol::Http => "http",
        }
    }
}

fn action_name(action: Action) -> &'static str {
    match action {
        Action::Check => "check",
        Action::Report => "report",
        Action::CheckAndReport => "check_and_report",
    }
}

/// One decision's span; every method is a branch when the span is disabled.
pub(crate) struct Decision {
    span: Span,
}

impl Decision {
    /// The span of a call by `protocol` asking for `action`, its parent set by `parent` from
    /// `headers`.
    pub(crate) fn start(
        protocol: Protocol,
        action: Action,
        parent: Option<&dyn TraceParent>,
        headers: &HeaderMap,
    ) -> Decision {
        let span = tracing::trace_span!(
            target: TARGET,
            SPAN_NAME,
            otel.kind = "server",
            otel.status_code = Empty,
            ratelimit.protocol = protocol.name(),
            ratelimit.action = action_name(action),
            ratelimit.namespace = Empty,
            ratelimit.hits_addend = Empty,
            ratelimit.outcome = Empty,
            ratelimit.limits = Empty,
            ratelimit.limits_over = Empty,
        );
        if let Some(parent) = parent.filter(|_| !span.is_disabled()) {
            parent.set_parent(&span, headers);
        }
        Decision { span }
    }

    /// The span, to instrument the call with.
    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// What the call asks for.
    pub(crate) fn request(&self, namespace: &str, hits: u64) {
        if self.span.is_disabled() {
            return;
        }
        self.span.record("ratelimit.namespace", namespace);
        self.span.record("ratelimit.hits_addend", hits);
    }

    /// The call was decided.
    pub(crate) fn decided(&self, outcome: &Outcome) {
        if self.span.is_disabled() {
            return;
        }
        // A limit matched against each descriptor on its own can touch two counters: named once.
        let (mut limits, mut over) = (Names::default(), Names::default());
        for status in &outcome.statuses {
            limits.add(outcome, status);
            if status.limited {
                over.add(outcome, status);
            }
        }
        self.span.record("ratelimit.outcome", if outcome.allowed { "ok" } else { "over_limit" });
        self.span.record("ratelimit.limits", limits.text.as_str());
        self.span.record("ratelimit.limits_over", over.text.as_str());
    }

    /// The storage could not answer.
    pub(crate) fn unavailable(&self) {
        self.span.record("ratelimit.outcome", "unavailable");
        self.span.record("otel.status_code", "error");
    }

    /// The call was refused before deciding (a malformed request).
    pub(crate) fn invalid(&self) {
        self.span.record("ratelimit.outcome", "invalid");
    }
}

/// Limits' names, comma-separated, each once.
#[derive(Default)]
struct Names {
    text: String,
    seen: Vec<usize>,
}

impl Names {
    /// Adds the limit of `status`, unless it is there already.
    fn add(&mut self, outcome: &Outcome, status: &Status) {
        if self.seen.contains(&status.limit) {
            return;
        }
        self.seen.push(status.limit);
        let limit = outcome.limit(status);
        if !self.text.is_empty() {
            self.text.push(',');
        }
        match limit.name() {
            Some(name) => self.text.push_str(name),
            None => {
                let _ = write!(self.text, "{}", limit.id());
            }
        }
    }
}
