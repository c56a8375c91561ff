//! `tollgate serve --otlp-endpoint URL`: the server's decision spans (see
//! `tollgate_server::serve::trace`) exported to an OpenTelemetry collector over OTLP/gRPC, each
//! the child of the caller's span when the request carries a W3C `traceparent`.
//!
//! Spans are batched by the SDK's batch processor (its `OTEL_BSP_*` variables apply: every 5 s
//! by default, at most 2,048 queued, the rest dropped) and flushed when the server stops. The
//! service name is `OTEL_SERVICE_NAME` (or `service.name` in `OTEL_RESOURCE_ATTRIBUTES`), else
//! `tollgate`; `OTEL_TRACES_SAMPLER` applies (default: a caller's sampling decision is followed,
//! every call without one is sampled).

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{ExporterBuildError, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::resource::{EnvResourceDetector, ResourceDetector};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tollgate_server::serve::TraceParent;
use tollgate_server::serve::trace::TARGET;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;

/// The service name when the environment names none.
const SERVICE_NAME: &str = "tollgate";

/// How long stopping waits for the last spans to be sent.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Why spans cannot be exported.
#[derive(Debug, thiserror::Error)]
#[error("--otlp-endpoint {endpoint}: {source}")]
pub(crate) struct OtlpError {
    /// The endpoint given.
    endpoint: String,
    /// What the exporter said of it.
    source: ExporterBuildError,
}

/// The exporting tracer provider.
#[derive(Debug)]
pub(crate) struct Otlp {
    provider: SdkTracerProvider,
}

impl Otlp {
    /// Exports to `endpoint` (`http://host:4317`). Call it inside the tokio runtime the server
    /// runs on: the gRPC channel to the collector runs there.
    pub(crate) fn start(endpoint: &str) -> Result<Otlp, OtlpError> {
        let error = |source| OtlpError { endpoint: endpoint.to_string(), source };
        let exporter =
            opentelemetry_otlp::SpanExporter::builder().with_tonic().with_endpoint(endpoint).build().map_err(error)?;
        let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource()).build();
        Ok(Otlp { provider })
    }

    /// The layer that turns the decision spans (and nothing else) into OpenTelemetry spans.
    pub(crate) fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        let tracer = self.provider.tracer("tollgate");
        let only_decisions = Targets::new().with_target(TARGET, tracing::Level::TRACE);
        tracing_opentelemetry::layer().with_tracer(tracer).with_filter(only_decisions)
    }

    /// Sends the spans still queued (waiting at most [`FLUSH_TIMEOUT`]) and stops exporting.
    pub(crate) async fn shutdown(self) {
        // The batch processor's thread blocks until the export is answered, and the export runs
        // on this runtime: wait for it off the runtime's threads (one, with `--threads 1`).
        let stopped = tokio::task::spawn_blocking(move || self.provider.shutdown_with_timeout(FLUSH_TIMEOUT)).await;
        match stopped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("the last spans may not have reached the OTLP collector: {e}"),
            Err(e) => tracing::warn!("stopping the OTLP exporter failed: {e}"),
        }
    }
}

/// The SDK's resource, named `tollgate` unless the environment names it.
fn resource() -> opentelemetry_sdk::Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|name| !name.is_empty())
        || EnvResourceDetector::new().detect().get(&opentelemetry::Key::new("service.name")).is_some();
    let builder = opentelemetry_sdk::Resource::builder();
    if named { builder.build() } else { builder.with_service_name(SERVICE_NAME).build() }
}

/// The decision span's parent from the W3C `traceparent` and `tracestate` headers (gRPC metadata
/// or HTTP headers).
#[derive(Debug, Default)]
pub(crate) struct W3cParent {
    propagator: TraceContextPropagator,
}

impl W3cParent {
    pub(crate) fn shared() -> Arc<dyn TraceParent> {
        Arc::new(W3cParent::default())
    }
}

impl TraceParent for W3cParent {
    fn set_parent(&self, span: &tracing::Span, headers: &HeaderMap) {
        // Without it the span is a root: no context to extract.
        if !headers.contains_key("traceparent") {
            return;
        }
        let parent = self.propagator.extract(&Headers(headers));
        // Fails only when the span is already started or not an OpenTelemetry one: it then stays
        // a root, which is all that can be done.
        let _ = span.set_parent(parent);
    }
}

/// Headers as the propagator reads them.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|name| name.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_that_is_no_uri_is_refused_with_the_flag_and_its_value() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _inside = runtime.enter();
        let error = Otlp::start("http://[not a host").unwrap_err().to_string();
        assert!(error.starts_with("--otlp-endpoint http://[not a host: "), "{error}");
    }
}
