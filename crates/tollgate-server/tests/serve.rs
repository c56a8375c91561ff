//! The server end to end, through real sockets: Envoy RLS via a tonic client built from
//! envoy-types, the HTTP API via a real HTTP client.

mod support;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use futures::future::join_all;
use support::{SEED_003, descriptor, seed_003_round, server, should_rate_limit};
use tollgate_server::serve::Mode;

const METHODS: [&str; 5] = ["POST", "POST", "POST", "GET", "GET"];

/// POST, POST, POST, GET, GET at once: any serial order admits both GETs and two POSTs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seed_003_scenario_over_rls_is_exact_in_accuracy_mode() {
    let server = server(SEED_003, Mode::Accuracy, false, false).await;
    let client = server.rls().await;
    for round in 0..100 {
        let round = round.to_string();
        let (allowed, results) = seed_003_round(&client, &round).await;
        assert_eq!(allowed, (2, 2), "round {round}: {results:?}");
        let (_, counters) = server.get("/counters/example.org").await;
        let counters: Vec<serde_json::Value> = serde_json::from_str(&counters).unwrap();
        let mine: Vec<u64> = counters
            .iter()
            .filter(|c| c["set_variables"].as_object().unwrap().values().any(|v| v == round.as_str()))
            .map(|c| c["remaining"].as_u64().unwrap())
            .collect();
        assert_eq!(mine, [0, 0], "round {round}: both counters exactly full");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seed_003_scenario_over_http_is_exact_in_accuracy_mode() {
    let server = server(SEED_003, Mode::Accuracy, false, false).await;
    for round in 0..50 {
        let calls = METHODS.iter().map(|method| {
            let body = format!(
                r#"{{"namespace":"example.org","values":{{"req.method":"{method}","round":"{round}"}},"delta":1}}"#
            );
            let server = &server;
            async move { (*method, server.post("/check_and_report", &body).await.0) }
        });
        let results = join_all(calls).await;
        let allowed = |m: &str| results.iter().filter(|(method, status)| *method == m && *status == 200).count();
        assert_eq!((allowed("POST"), allowed("GET")), (2, 2), "round {round}: {results:?}");
        assert!(results.iter().all(|(_, s)| *s == 200 || *s == 429));
    }
}

/// Throughput mode may wrongly deny (overshoot) under contention, but never admits over a limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn throughput_mode_never_exceeds_a_limit() {
    let server = server(SEED_003, Mode::Throughput, false, false).await;
    let client = server.rls().await;
    for round in 0..100 {
        let round = round.to_string();
        let ((posts, gets), results) = seed_003_round(&client, &round).await;
        assert!(posts <= 2 && posts + gets <= 4, "round {round}: {results:?}");
    }
}

#[tokio::test]
async fn rls_statuses_per_descriptor() {
    let yaml = r#"
- namespace: api
  name: per user
  max_value: 10
  seconds: 60
  variables: ["descriptors[0].user"]
- namespace: api
  max_value: 3
  seconds: 10
  variables: ["descriptors[1].path"]
"#;
    let server = server(yaml, Mode::Accuracy, false, false).await;
    let mut client = server.rls().await;
    let descriptors = || vec![descriptor(&[("user", "alice")]), descriptor(&[("path", "/a")])];
    let response = should_rate_limit(&mut client, "api", descriptors(), 0).await;
    assert_eq!(response.overall_code, Code::Ok as i32);
    assert_eq!(response.statuses.len(), 2);
    let user = &response.statuses[0];
    assert_eq!(user.code, Code::Ok as i32);
    let limit = user.current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit, limit.name.as_str()), (10, Unit::Minute as i32, "per user"));
    assert_eq!(user.limit_remaining, 9, "hits_addend 0 counts as 1");
    assert_eq!(user.duration_until_reset.as_ref().unwrap().seconds, 60);
    let path = &response.statuses[1];
    assert_eq!(path.limit_remaining, 2);
    assert_eq!(path.current_limit.as_ref().unwrap().name, "3 per 10s");

    server.clock.advance(std::time::Duration::from_secs(4));
    let response = should_rate_limit(&mut client, "api", descriptors(), 2).await;
    assert_eq!(response.overall_code, Code::Ok as i32);
    assert_eq!((response.statuses[0].limit_remaining, response.statuses[1].limit_remaining), (7, 0));
    assert_eq!(response.statuses[1].duration_until_reset.as_ref().unwrap().seconds, 6);

    let response = should_rate_limit(&mut client, "api", descriptors(), 1).await;
    assert_eq!(response.overall_code, Code::OverLimit as i32);
    assert_eq!(response.statuses[0].code, Code::Ok as i32, "the user counter had room");
    assert_eq!(response.statuses[1].code, Code::OverLimit as i32);
    assert_eq!(response.statuses[0].limit_remaining, 7, "a limited request takes nothing");

    let unknown = should_rate_limit(&mut client, "nobody", descriptors(), 1).await;
    assert_eq!(unknown.overall_code, Code::Ok as i32, "unknown namespace is allowed");
    assert!(unknown.statuses.iter().all(|s| s.current_limit.is_none()));

    let empty = client
        .should_rate_limit(envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest::default())
        .await
        .unwrap_err();
    assert_eq!(empty.code(), tonic::Code::InvalidArgument);
    assert!(empty.message().contains("domain"), "{}", empty.message());
}

#[tokio::test]
async fn malformed_protobuf_is_rejected_with_a_reason() {
    let server = server(SEED_003, Mode::Accuracy, false, false).await;
    // A gRPC frame whose message is not a RateLimitRequest (field 1 with a bad wire type).
    let (code, message) = raw_grpc(&server, &[], vec![0, 0, 0, 0, 2, 0x0f, 0xff]).await;
    assert_eq!(code, tonic::Code::InvalidArgument as i32, "{message}");
    assert!(message.contains("decode"), "the error says why: {message}");
}

/// Framing mistakes are statuses that say what is wrong, as tonic's would be; a compressed call
/// is answered by tonic (which takes no compression).
#[tokio::test]
async fn grpc_framing_errors_and_compressed_calls_are_statuses() {
    let server = server(SEED_003, Mode::Accuracy, false, false).await;
    type Headers = &'static [(&'static str, &'static str)];
    let cases: [(Headers, Vec<u8>, tonic::Code, &str); 4] = [
        (&[], vec![0, 0, 0], tonic::Code::InvalidArgument, "5-byte prefix"),
        (&[], vec![0, 0, 0, 0, 10, 0x0a, 0x01], tonic::Code::InvalidArgument, "prefix says 10 bytes"),
        (&[], vec![0; 5 + 4 * 1024 * 1024 + 1], tonic::Code::ResourceExhausted, "larger than"),
        (&[("grpc-encoding", "gzip")], vec![1, 0, 0, 0, 1, 0], tonic::Code::Unimplemented, "gzip"),
    ];
    for (headers, body, want, says) in cases {
        let (code, message) = raw_grpc(&server, headers, body).await;
        assert_eq!(code, want as i32, "{headers:?}: {message}");
        assert!(message.contains(says), "{headers:?}: {message}");
    }
}

/// Sends `body` to ShouldRateLimit over plain HTTP/2 and returns the status of a trailers-only
/// answer (a failure before any message carries grpc-status in the headers).
async fn raw_grpc(server: &support::Server, headers: &[(&str, &str)], body: Vec<u8>) -> (i32, String) {
    let mut request = hyper::Request::post(format!(
        "http://{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        server.running.grpc
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(http_body_util::Full::new(hyper::body::Bytes::from(body))).unwrap();
    let client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).http2_only(true).build_http();
    let response = client.request(request).await.unwrap();
    let status = tonic::Status::from_header_map(response.headers()).expect("grpc-status in the headers");
    (status.code() as i32, status.message().to_string())
}

#[tokio::test]
async fn grpc_health_reports_serving() {
    let server = server(SEED_003, Mode::Accuracy, false, false).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.running.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let request =
        tonic_health::pb::HealthCheckRequest { service: "envoy.service.ratelimit.v3.RateLimitService".into() };
    let status = health.check(request).await.unwrap().into_inner().status;
    assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
}

#[tokio::test]
async fn rls_replies_carry_the_same_rate_limit_headers_as_the_http_api() {
    use tollgate_server::serve::HeaderDraft;
    for (draft, body_value) in [(HeaderDraft::Draft03, "DraftVersion03"), (HeaderDraft::Draft10, "draft10")] {
        // Two servers with the same limits and clocks: one answers over RLS, one over HTTP, the
        // same calls in the same order.
        let grpc = support::server_with(SEED_003, |c| c.rate_limit_headers = Some(draft)).await;
        let http = support::server_with(SEED_003, |_| {}).await;
        let mut client = grpc.rls().await;
        for call in 0..4 {
            let d = vec![descriptor(&[("req.method", "POST"), ("round", "h")])];
            let reply = should_rate_limit(&mut client, "example.org", d, 1).await;
            let body = format!(
                r#"{{"namespace":"example.org","values":{{"req.method":"POST","round":"h"}},"delta":1,"response_headers":"{body_value}"}}"#
            );
            let (_, headers, _) = http.post("/check_and_report", &body).await;
            let mut from_rls: Vec<(String, String)> =
                reply.response_headers_to_add.iter().map(|h| (h.key.clone(), h.value.clone())).collect();
            let mut from_http: Vec<(String, String)> = headers
                .iter()
                .filter(|(k, _)| k.as_str().starts_with("x-ratelimit") || k.as_str().starts_with("ratelimit"))
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
                .collect();
            from_rls.sort();
            from_http.sort();
            assert!(!from_rls.is_empty(), "{draft:?} call {call}: headers sent");
            assert_eq!(from_rls, from_http, "{draft:?} call {call}");
            assert!(reply.request_headers_to_add.is_empty());
        }
    }
    let plain = support::server_with(SEED_003, |_| {}).await;
    let mut client = plain.rls().await;
    let reply = should_rate_limit(&mut client, "example.org", vec![descriptor(&[("round", "n")])], 1).await;
    assert!(reply.response_headers_to_add.is_empty(), "none unless --rate-limit-headers");
}

/// `tollgate serve --threads 1` runs the server on a current-thread runtime: both protocols and
/// the decisions must work there as on the multi-thread one (no call may block the only thread).
#[tokio::test(flavor = "current_thread")]
async fn one_thread_serves_rls_and_http() {
    let server = server(SEED_003, Mode::Accuracy, false, false).await;
    let (allowed, results) = seed_003_round(&server.rls().await, "one-thread").await;
    assert_eq!(allowed, (2, 2), "{results:?}");
    let body = r#"{"namespace":"example.org","values":{"req.method":"GET","round":"one-thread"},"delta":1}"#;
    assert_eq!(server.post("/check_and_report", body).await.0, 429, "the round's 4 are taken");
}
