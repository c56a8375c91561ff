//! `tollgate serve --otlp-endpoint`: the binary exports one span per decision to an OTLP collector
//! (a fake one here: opentelemetry-proto's `TraceService` served by tonic on a free port), each
//! the child of the caller's span named in a W3C `traceparent` (gRPC metadata, HTTP header), with
//! the decision's attributes; without the flag nothing is exported. In process, the `serve`
//! library's `TraceParent` hook is handed each call's metadata or headers while a subscriber
//! enables the decision spans, and is never called otherwise.

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http_body_util::Full;
use hyper::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use support::binary::Tollgate;
use support::{descriptor, temp_dir};
use tonic::metadata::MetadataValue;
use tonic::transport::server::TcpIncoming;

const LIMITS: &str = r#"
- namespace: api
  name: per-user
  max_value: 2
  seconds: 60
  variables: ["descriptors[0].user"]
- namespace: api
  name: everyone
  max_value: 100
  seconds: 60
"#;

/// The caller's span: W3C's example trace id and parent id, sampled.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// A span as the collector received it, with its resource's `service.name`.
#[derive(Clone, Debug)]
struct Exported {
    service: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    kind: i32,
    status: i32,
    attributes: HashMap<String, String>,
}

/// The fake collector: keeps every span sent to it.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Exported>>>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(attributes: &[KeyValue]) -> HashMap<String, String> {
    attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let resource = resource_spans.resource.map(|r| text(&r.attributes)).unwrap_or_default();
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
                spans.push(Exported {
                    service: service.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name.clone(),
                    kind: span.kind,
                    status: span.status.as_ref().map_or(0, |s| s.code),
                    attributes: text(&span.attributes),
                });
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

impl Collector {
    /// A collector on a free port of 127.0.0.1, and its address.
    async fn start() -> (Collector, SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let collector = Collector::default();
        let service = TraceServiceServer::new(collector.clone());
        tokio::spawn(
            tonic::transport::Server::builder().add_service(service).serve_with_incoming(TcpIncoming::from(listener)),
        );
        (collector, addr)
    }

    fn spans(&self) -> Vec<Exported> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits until `n` spans arrived, for at most 20 s.
    async fn wait_for(&self, n: usize) -> Vec<Exported> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let spans = self.spans();
            if spans.len() >= n || Instant::now() > deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn limits_file() -> std::path::PathBuf {
    let limits = temp_dir("otlp").join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    limits
}

fn rls_request(user: &str, hits: u32, traceparent: Option<&str>) -> tonic::Request<RateLimitRequest> {
    let mut request = tonic::Request::new(RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![descriptor(&[("user", user)])],
        hits_addend: hits,
    });
    if let Some(traceparent) = traceparent {
        request.metadata_mut().insert("traceparent", MetadataValue::try_from(traceparent).unwrap());
        request.metadata_mut().insert("tracestate", MetadataValue::from_static("tollgate=test"));
    }
    request
}

fn traceparent(span: &str) -> String {
    format!("00-{TRACE_ID}-{span}-01")
}

/// The one span with these attribute values.
fn the<'a>(spans: &'a [Exported], want: &[(&str, &str)]) -> &'a Exported {
    let found: Vec<_> = spans
        .iter()
        .filter(|s| want.iter().all(|(key, value)| s.attributes.get(*key).is_some_and(|v| v == value)))
        .collect();
    assert_eq!(found.len(), 1, "one span with {want:?} in {spans:#?}");
    found[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_decision_is_a_span_under_the_callers_span_with_its_attributes() {
    let (collector, addr) = Collector::start().await;
    let endpoint = format!("http://{addr}");
    let server =
        Tollgate::start(&limits_file(), &["--otlp-endpoint", &endpoint], &[("OTEL_BSP_SCHEDULE_DELAY", "50")]).await;
    let mut rls = RateLimitServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();

    // RLS with the caller's context: 2 of alice's 2.
    let reply = rls.should_rate_limit(rls_request("alice", 2, Some(&traceparent(CALLER_SPAN)))).await.unwrap();
    assert_eq!(reply.into_inner().overall_code, Code::Ok as i32);
    // RLS without one: alice is over her limit.
    let reply = rls.should_rate_limit(rls_request("alice", 1, None)).await.unwrap();
    assert_eq!(reply.into_inner().overall_code, Code::OverLimit as i32);
    // HTTP with the caller's context (another caller span of the same trace).
    let body = r#"{"namespace":"api","values":{"user":"bob"},"delta":3}"#;
    assert_eq!(server.check_and_report(body, &[("traceparent", &traceparent("1111111111111111"))]).await, 429);
    // Kuadrant's CheckRateLimit through tonic's generic client, with the caller's context.
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc)).unwrap();
    let mut grpc = tonic::client::Grpc::new(channel.connect().await.unwrap());
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static("/kuadrant.service.ratelimit.v1.RateLimitService/CheckRateLimit");
    let request = rls_request("carol", 1, Some(&traceparent("2222222222222222")));
    let reply: tonic::Response<envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse> =
        grpc.unary(request, path, tonic_prost::ProstCodec::default()).await.unwrap();
    assert_eq!(reply.into_inner().overall_code, Code::Ok as i32);

    let spans = collector.wait_for(4).await;
    assert_eq!(spans.len(), 4, "one span per decision: {spans:#?}");
    for span in &spans {
        assert_eq!(span.name, "ratelimit.decide");
        assert_eq!(span.kind, SpanKind::Server as i32);
        assert_eq!(span.service, "tollgate", "the default service name");
        assert_eq!(span.attributes["ratelimit.namespace"], "api");
        assert_eq!(span.attributes["ratelimit.limits"], "per-user,everyone");
        assert!(!span.attributes.contains_key("user"), "no descriptor value is recorded: {span:?}");
    }

    let first = the(&spans, &[("ratelimit.protocol", "rls"), ("ratelimit.hits_addend", "2")]);
    assert_eq!((first.trace_id.as_str(), first.parent_span_id.as_str()), (TRACE_ID, CALLER_SPAN));
    assert_eq!(first.attributes["ratelimit.protocol"], "rls");
    assert_eq!(first.attributes["ratelimit.action"], "check_and_report");
    assert_eq!(first.attributes["ratelimit.outcome"], "ok");
    assert_eq!(first.attributes["ratelimit.limits_over"], "");

    let over = the(&spans, &[("ratelimit.protocol", "rls"), ("ratelimit.hits_addend", "1")]);
    assert_eq!(over.attributes["ratelimit.outcome"], "over_limit");
    assert_eq!(over.parent_span_id, "", "no traceparent: a root span");
    assert_ne!(over.trace_id, TRACE_ID);
    assert_eq!(over.attributes["ratelimit.limits_over"], "per-user");

    let http = the(&spans, &[("ratelimit.protocol", "http")]);
    assert_eq!((http.trace_id.as_str(), http.parent_span_id.as_str()), (TRACE_ID, "1111111111111111"));
    assert_eq!(http.attributes["ratelimit.hits_addend"], "3");
    assert_eq!(http.attributes["ratelimit.outcome"], "over_limit");
    assert_eq!(http.attributes["ratelimit.limits_over"], "per-user");

    let kuadrant = the(&spans, &[("ratelimit.protocol", "kuadrant")]);
    assert_eq!((kuadrant.trace_id.as_str(), kuadrant.parent_span_id.as_str()), (TRACE_ID, "2222222222222222"));
    assert_eq!(kuadrant.attributes["ratelimit.action"], "check");
    assert_eq!(kuadrant.attributes["ratelimit.outcome"], "ok");

    let ids: std::collections::HashSet<_> = spans.iter().map(|s| &s.span_id).collect();
    assert_eq!(ids.len(), 4, "each decision its own span");
    assert!(spans.iter().all(|s| s.status != StatusCode::Error as i32), "no decision failed");
    assert!(server.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_spans_are_sent_when_the_server_stops_and_the_service_name_is_the_environments() {
    let (collector, addr) = Collector::start().await;
    let endpoint = format!("http://{addr}");
    // The batch processor would wait an hour: only stopping sends the span.
    let env = [("OTEL_BSP_SCHEDULE_DELAY", "3600000"), ("OTEL_SERVICE_NAME", "edge-limits")];
    let server = Tollgate::start(&limits_file(), &["--otlp-endpoint", &endpoint], &env).await;
    let mut rls = RateLimitServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();
    rls.should_rate_limit(rls_request("dave", 1, Some(&traceparent(CALLER_SPAN)))).await.unwrap();
    assert!(server.stop().success());
    let spans = collector.spans();
    assert_eq!(spans.len(), 1, "sent before the process exited: {spans:#?}");
    assert_eq!(spans[0].service, "edge-limits");
    assert_eq!(spans[0].parent_span_id, CALLER_SPAN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_rlqs_assignment_round_is_a_span() {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};

    let (collector, addr) = Collector::start().await;
    let endpoint = format!("http://{addr}");
    let env = [("OTEL_BSP_SCHEDULE_DELAY", "3600000")];
    let server = Tollgate::start(&limits_file(), &["--otlp-endpoint", &endpoint], &env).await;
    let mut rlqs = RateLimitQuotaServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();
    let buckets = ["ann", "bob"].map(|user| BucketQuotaUsage {
        bucket_id: Some(BucketId { bucket: [("user".to_string(), user.to_string())].into() }),
        num_requests_allowed: 1,
        ..Default::default()
    });
    let report = RateLimitQuotaUsageReports { domain: "api".into(), bucket_quota_usages: buckets.to_vec() };
    let mut answers = rlqs.stream_rate_limit_quotas(futures::stream::iter([report])).await.unwrap().into_inner();
    assert_eq!(answers.message().await.unwrap().unwrap().bucket_action.len(), 2);
    assert!(server.stop().success());
    let spans = collector.spans();
    let round = spans.iter().find(|s| s.name == "ratelimit.rlqs.assign").unwrap_or_else(|| panic!("{spans:#?}"));
    assert_eq!(round.attributes.get("ratelimit.namespace").map(String::as_str), Some("api"), "{round:?}");
    assert_eq!(round.attributes.get("rlqs.buckets").map(String::as_str), Some("2"), "{round:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_nothing_is_exported_even_with_the_sdks_endpoint_variable_set() {
    let (collector, addr) = Collector::start().await;
    let endpoint = format!("http://{addr}");
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "10")];
    let server = Tollgate::start(&limits_file(), &[], &env).await;
    let mut rls = RateLimitServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();
    rls.should_rate_limit(rls_request("erin", 1, Some(&traceparent(CALLER_SPAN)))).await.unwrap();
    assert_eq!(server.check_and_report(r#"{"namespace":"api","delta":1}"#, &[]).await, 200);
    // Everything the process would have sent, it sent before exiting.
    assert!(server.stop().success());
    assert_eq!(collector.spans().len(), 0);
}

#[test]
fn an_endpoint_that_is_not_a_uri_is_a_usage_error() {
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--no-watch", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--limits"])
        .arg(limits_file())
        .args(["--otlp-endpoint", "http://[::1"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--otlp-endpoint http://[::1: "), "{stderr}");
}

/// A `TraceParent` that keeps the `traceparent` of each call it is handed.
#[derive(Debug, Default)]
struct Seen(Mutex<Vec<String>>);

impl tollgate_server::serve::TraceParent for Seen {
    fn set_parent(&self, _: &tracing::Span, headers: &http::HeaderMap) {
        let value = headers.get("traceparent").map_or("none".into(), |v| v.to_str().unwrap().to_string());
        self.0.lock().unwrap().push(value);
    }
}

/// One RLS call and one HTTP call, each with a `traceparent`, to an in-process server handing
/// them to `seen`, under `subscriber` (this thread's: the server runs on the test's one thread).
async fn calls_under(subscriber: impl tracing::Subscriber + Send + Sync + 'static, seen: &Arc<Seen>) -> Vec<String> {
    let _default = tracing::subscriber::set_default(subscriber);
    let hook: Arc<dyn tollgate_server::serve::TraceParent> = seen.clone();
    let server = support::server_with(LIMITS, |config| config.trace_parent = Some(hook)).await;
    let mut rls = server.rls().await;
    rls.should_rate_limit(rls_request("frank", 1, Some(&traceparent(CALLER_SPAN)))).await.unwrap();
    let body = r#"{"namespace":"api","values":{"user":"frank"},"delta":1}"#;
    let request = hyper::Request::post(format!("http://{}/check_and_report", server.running.http))
        .header("traceparent", traceparent("3333333333333333"))
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    assert_eq!(server.http.request(request).await.unwrap().status(), 200);
    server.running.shutdown().await;
    seen.0.lock().unwrap().clone()
}

#[tokio::test]
async fn the_hook_is_handed_each_calls_headers_while_decision_spans_are_enabled() {
    use tracing_subscriber::layer::SubscriberExt;
    let decisions = tracing_subscriber::filter::Targets::new()
        .with_target(tollgate_server::serve::trace::TARGET, tracing::Level::TRACE);
    let subscriber = tracing_subscriber::registry().with(decisions);
    let seen = Arc::new(Seen::default());
    let handed = calls_under(subscriber, &seen).await;
    assert_eq!(handed, [traceparent(CALLER_SPAN), traceparent("3333333333333333")]);
}

#[tokio::test]
async fn the_hook_is_never_called_while_decision_spans_are_off() {
    use tracing_subscriber::layer::SubscriberExt;
    // What `tollgate serve` logs by default: info and above.
    let subscriber = tracing_subscriber::registry().with(tracing_subscriber::filter::LevelFilter::INFO);
    let seen = Arc::new(Seen::default());
    assert_eq!(calls_under(subscriber, &seen).await, Vec::<String>::new());
}
