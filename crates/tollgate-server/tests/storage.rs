//! One test body per behaviour, run against every storage (memory, Redis), so they cannot drift.

mod support;

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use support::{SEED_003, Server, descriptor, seed_003_round, server_on, should_rate_limit};
use tollgate_policy::AlgorithmKind;
use tollgate_server::serve::{Mode, ServeError, Storage, StorageKind};
use tollgate_testkit::RedisServer;

async fn each_storage(body: impl AsyncFn(Server)) {
    each_storage_for(SEED_003, body).await;
}

/// Runs `body` on a server for `yaml` with each storage in turn.
async fn each_storage_for(yaml: &str, body: impl AsyncFn(Server)) {
    body(server_on(yaml, Mode::Accuracy, false, false, Storage::Memory).await).await;
    let redis = RedisServer::start();
    let storage = Storage::Redis { url: redis.url(), prefix: "t:".into() };
    body(server_on(yaml, Mode::Accuracy, false, false, storage).await).await;
    let storage = Storage::RedisCached { url: redis.url(), prefix: "c:".into(), flush: Duration::from_secs(3600) };
    body(server_on(yaml, Mode::Accuracy, false, false, storage).await).await;
    let storage = Storage::RedisLeased { url: redis.url(), prefix: "l:".into() };
    body(server_on(yaml, Mode::Accuracy, false, false, storage).await).await;
}

fn probe(method: &str, round: &str) -> String {
    format!(
        r#"{{"namespace":"example.org","values":{{"req.method":"{method}","round":"{round}"}},"delta":0,"response_headers":"DraftVersion03"}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seed_003_scenario_is_exact_on_every_storage() {
    each_storage(async |server| {
        let client = server.rls().await;
        for round in 0..30 {
            let round = round.to_string();
            let (allowed, results) = seed_003_round(&client, &round).await;
            if server.running.engine.storage() == StorageKind::RedisLeased {
                // It decides a call's counters one after the other (as throughput mode): a call
                // refused by its second counter gives back what it took from the first, and a
                // concurrent call may have been refused by that hold. Never more, maybe fewer.
                assert!(allowed.0 <= 2 && allowed.1 <= 2, "round {round}: {results:?}");
                continue;
            }
            assert_eq!(allowed, (2, 2), "round {round}: {results:?}");
            let (status, headers, _) = server.post("/check", &probe("POST", &round)).await;
            assert_eq!(status, 200);
            assert_eq!(headers["x-ratelimit-remaining"], "0", "round {round}: the counters are exactly full");
        }
    })
    .await;
}

#[tokio::test]
async fn windows_statuses_and_check_report_agree_on_every_storage() {
    each_storage(async |server| {
        let mut client = server.rls().await;
        let post = || vec![descriptor(&[("req.method", "POST"), ("round", "w")])];
        let first = should_rate_limit(&mut client, "example.org", post(), 2).await;
        assert_eq!(first.overall_code, Code::Ok as i32);
        assert_eq!(first.statuses[0].limit_remaining, 0, "tightest: posts, 2 of 2");
        assert_eq!(first.statuses[0].current_limit.as_ref().unwrap().name, "posts");
        let limited = should_rate_limit(&mut client, "example.org", post(), 1).await;
        assert_eq!(limited.overall_code, Code::OverLimit as i32);
        assert_eq!(limited.statuses[0].duration_until_reset.as_ref().unwrap().seconds, 1);

        server.clock.advance(Duration::from_secs(1));
        let again = should_rate_limit(&mut client, "example.org", post(), 1).await;
        assert_eq!(again.overall_code, Code::Ok as i32, "the 1 s window reopened");
        assert_eq!(again.statuses[0].limit_remaining, 1, "posts 1 of 2; all-requests 3 of 4: tightest 1");

        // check counts nothing; report counts without deciding.
        let check = |delta: u64| {
            format!(r#"{{"namespace":"example.org","values":{{"req.method":"GET","round":"w"}},"delta":{delta}}}"#)
        };
        assert_eq!(server.post("/check", &check(1)).await.0, 200);
        assert_eq!(server.post("/check", &check(2)).await.0, 429, "3 of 4 used");
        assert_eq!(server.post("/report", &check(1)).await.0, 200);
        assert_eq!(server.post("/check_and_report", &check(1)).await.0, 429, "4 of 4 used");
        let unknown = should_rate_limit(&mut client, "nobody", post(), 1).await;
        assert_eq!(unknown.overall_code, Code::Ok as i32);
    })
    .await;
}

#[tokio::test]
async fn redis_outage_is_unavailable_not_allowed() {
    let mut redis = RedisServer::start();
    let storage = Storage::Redis { url: redis.url(), prefix: "t:".into() };
    let server = server_on(SEED_003, Mode::Accuracy, false, false, storage).await;
    let mut client = server.rls().await;
    let d = || vec![descriptor(&[("req.method", "GET"), ("round", "o")])];
    assert_eq!(should_rate_limit(&mut client, "example.org", d(), 1).await.overall_code, Code::Ok as i32);
    redis.kill();
    let request = envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
        domain: "example.org".into(),
        descriptors: d(),
        hits_addend: 1,
    };
    let error = client.should_rate_limit(request).await.unwrap_err();
    assert_eq!(error.code(), tonic::Code::Unavailable, "{error:?}");
    assert!(error.message().contains("counter storage unavailable"), "{}", error.message());
    let body = r#"{"namespace":"example.org","values":{"req.method":"GET","round":"o"},"delta":1}"#;
    let (status, _, text) = server.post("/check_and_report", body).await;
    assert_eq!(status, 503);
    assert!(text.contains("counter storage unavailable"), "{text}");
    // Each counted, per protocol.
    let metrics = server.get("/metrics").await.1;
    for protocol in ["grpc", "http"] {
        let series = format!("tollgate_unavailable_total{{protocol=\"{protocol}\"}} 1");
        assert!(metrics.lines().any(|l| l == series), "{series} in:\n{metrics}");
    }
}

#[tokio::test]
async fn redis_storage_rejects_other_algorithms_and_bad_urls() {
    let redis = RedisServer::start();
    let yaml = "- {namespace: a, max_value: 1, seconds: 1, algorithm: token_bucket}\n";
    let dir = support::temp_dir("storage");
    let limits = dir.join("limits.yaml");
    std::fs::write(&limits, yaml).unwrap();
    let config = |url: String| tollgate_server::serve::ServeConfig {
        time: Default::default(),
        storage: Storage::Redis { url, prefix: "t:".into() },
        ..support::config(&limits)
    };
    let error = tollgate_server::serve::start(&config(redis.url()), tollgate::SystemClock::new()).await.err().unwrap();
    let expected = format!(
        "{}:1:3: algorithm token_bucket is not available with --storage redis (fixed_window only): limit of namespace `a`",
        limits.display()
    );
    assert_eq!(error.to_string(), expected);
    match &error {
        ServeError::Storage { file, source } => {
            assert_eq!(file, &limits);
            assert_eq!((source.algorithm, source.storage), (AlgorithmKind::TokenBucket, StorageKind::Redis));
            assert_eq!((source.position.line, source.namespace.as_str()), (1, "a"));
        }
        other => panic!("expected a storage error, got {other:?}"),
    }
    let port = tollgate_testkit::free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let error = tollgate_server::serve::start(&config(url.clone()), tollgate::SystemClock::new()).await.err().unwrap();
    assert!(error.to_string().contains(&format!("127.0.0.1:{port}")), "names the URL: {error}");
    assert!(matches!(&error, ServeError::Redis(e) if e.is_transient()), "{error:?}");

    // A password in the URL is in neither the error nor the config's Debug (which is logged).
    let secret = format!("redis://app:hunter2@127.0.0.1:{port}/0");
    let error =
        tollgate_server::serve::start(&config(secret.clone()), tollgate::SystemClock::new()).await.err().unwrap();
    assert!(error.to_string().contains(&format!("redis://***@127.0.0.1:{port}/0")), "{error}");
    for shown in [error.to_string(), format!("{error:?}"), format!("{:?}", config(secret))] {
        assert!(!shown.contains("hunter2"), "shows the password: {shown}");
    }
}

#[tokio::test]
async fn a_reload_that_redis_cannot_count_names_the_limit_and_keeps_the_last_limits() {
    let redis = RedisServer::start();
    let storage = Storage::Redis { url: redis.url(), prefix: "r:".into() };
    let server = server_on("- {namespace: a, max_value: 1, seconds: 1}\n", Mode::Accuracy, false, false, storage).await;
    let yaml = "- {namespace: a, max_value: 1, seconds: 1}\n- namespace: b\n  name: smooth\n  max_value: 5\n  \
                seconds: 10\n  algorithm: weighted_window\n";
    std::fs::write(&server.limits, yaml).unwrap();
    let error = server.running.reloader.reload().unwrap_err();
    assert_eq!(error.position.line, 2, "{error}");
    assert_eq!(
        error.message,
        "algorithm weighted_window is not available with --storage redis (fixed_window only): limit `smooth` of \
         namespace `b`"
    );
    assert_eq!(server.running.engine.loaded().generation, 1, "the last good limits stay");
}

/// Two replicas on one Redis with local counters: each sees the other's hits after a flush; before
/// it, each may allow what it last saw as remaining (the documented overshoot).
#[tokio::test]
async fn redis_cached_replicas_share_counts_through_flushes() {
    let redis = RedisServer::start();
    let yaml = "- {namespace: api, name: all, max_value: 4, seconds: 60}\n";
    let storage = || Storage::RedisCached { url: redis.url(), prefix: "r:".into(), flush: Duration::from_secs(3600) };
    let a = server_on(yaml, Mode::Accuracy, false, false, storage()).await;
    let b = server_on(yaml, Mode::Accuracy, false, false, storage()).await;
    let call = r#"{"namespace":"api","values":{},"delta":1}"#;
    for _ in 0..3 {
        assert_eq!(a.post("/check_and_report", call).await.0, 200);
    }
    assert_eq!(redis.cli(&["KEYS", "r:*"]).lines().count(), 0, "nothing written before a flush");
    assert_eq!(a.running.engine.flush().await.unwrap(), 1);
    assert_eq!(b.post("/check_and_report", call).await.0, 200, "b loads the counter: 1 left");
    assert_eq!(b.post("/check_and_report", call).await.0, 429);
    assert_eq!(b.running.engine.flush().await.unwrap(), 1);
    assert_eq!(a.running.engine.flush().await.unwrap(), 0, "nothing new on a");
    // a has not heard of b's hit: it still sees 1 left and allows it (overshoot of 1).
    assert_eq!(a.post("/check_and_report", call).await.0, 200);
    assert_eq!(a.running.engine.flush().await.unwrap(), 1);
    assert_eq!(a.post("/check_and_report", call).await.0, 429, "after the flush a knows the window is full");
    let key = redis.cli(&["KEYS", "r:*"]);
    let count = redis.cli(&["GET", key.trim()]);
    assert_eq!(count.trim(), "4", "Redis saturates at the limit: {count}");
}

/// One replica lists what it admitted: Redis counts its leased, unspent hits as used, the listing
/// adds them back (after 200 hits of 1000, 800 remain, not 1000 less the slices leased).
#[tokio::test]
async fn redis_leased_lists_what_was_admitted_not_what_was_leased() {
    let redis = RedisServer::start();
    let yaml = "- {namespace: api, name: all, max_value: 1000, seconds: 60}\n";
    let server =
        server_on(yaml, Mode::Accuracy, false, false, Storage::RedisLeased { url: redis.url(), prefix: "l:".into() })
            .await;
    let call = r#"{"namespace":"api","values":{},"delta":1}"#;
    for _ in 0..200 {
        server.clock.advance(Duration::from_millis(1));
        assert_eq!(server.post("/check_and_report", call).await.0, 200);
    }
    let (rows, _) = listed(&server, "/counters/api").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].2, 800, "{rows:?}");
}

/// Two replicas spend one hot counter from leases: far fewer round trips than calls, never more
/// admitted than the limit together, a listing counts what is leased, and what a replica leased
/// and did not spend goes back when it closes, so that every hit of the window is admitted once.
#[tokio::test]
async fn redis_leased_replicas_never_overshoot_and_give_back_what_they_hold_on_close() {
    let redis = RedisServer::start();
    let yaml = "- {namespace: api, name: all, max_value: 100, seconds: 60}\n";
    let storage = || Storage::RedisLeased { url: redis.url(), prefix: "l:".into() };
    let a = server_on(yaml, Mode::Accuracy, false, false, storage()).await;
    let b = server_on(yaml, Mode::Accuracy, false, false, storage()).await;
    let call = r#"{"namespace":"api","values":{},"delta":1}"#;
    let before = redis.script_runs();
    let mut admitted = 0;
    // 70 calls each, one per 10 ms of each replica's clock: 140 calls on a limit of 100.
    for _ in 0..70 {
        for server in [&a, &b] {
            server.clock.advance(Duration::from_millis(10));
            match server.post("/check_and_report", call).await.0 {
                200 => admitted += 1,
                status => assert_eq!(status, 429),
            }
        }
    }
    let trips = redis.script_runs() - before;
    assert!(admitted <= 100, "never more than the limit together: {admitted}");
    assert!(admitted >= 90, "under-admission is bounded by the slices held: {admitted} of 100");
    assert!(trips * 3 < 140, "{trips} round trips for 140 calls: the slices are not amortized");
    // What is leased has left the shared count: a replica lists its own unspent slice as
    // remaining, the other's as used.
    let (rows, _) = listed(&a, "/counters/api").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(rows[0].2 <= 100 - admitted, "at most what neither admitted: {rows:?}");
    a.running.engine.close().await.unwrap();
    b.running.engine.close().await.unwrap();
    let (rows, _) = listed(&a, "/counters/api").await;
    assert_eq!(rows[0].2, 100 - admitted, "what was leased and not spent came back: {rows:?}");
    while admitted < 100 {
        assert_eq!(a.post("/check_and_report", call).await.0, 200, "{admitted} admitted");
        admitted += 1;
    }
    assert_eq!(a.post("/check_and_report", call).await.0, 429, "the window holds 100, all admitted once");
}

/// A per-user limit, a per-model limit, a shadow limit and a quota limit, side by side.
const MARKS: &str = r#"
- {namespace: llm, name: per user, max_value: 10, seconds: 60, variables: [user]}
- {namespace: llm, name: per model, max_value: 1, seconds: 60, variables: [model]}
- {namespace: llm, name: trial, max_value: 2, seconds: 60, variables: [user], shadow: true}
- {namespace: llm, name: monthly, max_value: 3, seconds: 60, variables: [tenant], mode: quota}
"#;

fn request(descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest { domain: "llm".into(), descriptors, hits_addend: hits }
}

fn with_hits(mut d: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits });
    d
}

#[tokio::test]
async fn kuadrant_check_and_report_share_counters_with_envoy_on_every_storage() {
    each_storage_for(MARKS, async |server| {
        let mut envoy = server.rls().await;
        let user = || vec![descriptor(&[("user", "ann")])];
        for _ in 0..3 {
            let check = server.kuadrant("CheckRateLimit", request(user(), 4)).await.unwrap();
            assert_eq!(check.overall_code, Code::Ok as i32);
            // The trial shadow limit (2 left) cannot fit 4: reported over, so 0 remaining, as
            // envoy/ratelimit reports a counter without room; checks count nothing.
            assert_eq!(check.statuses[0].limit_remaining, 0, "trial (2) has no room for 4");
            let two = server.kuadrant("CheckRateLimit", request(user(), 2)).await.unwrap();
            assert_eq!(two.statuses[0].limit_remaining, 2, "2 fit: what is left, checks count nothing");
        }
        let report = server.kuadrant("Report", request(user(), 6)).await.unwrap();
        assert_eq!(report.overall_code, Code::Ok as i32, "a report is never limited");
        let decided = should_rate_limit(&mut envoy, "llm", user(), 4).await;
        assert_eq!(decided.overall_code, Code::Ok as i32, "6 reported + 4 = 10 of 10");
        let check = server.kuadrant("CheckRateLimit", request(user(), 1)).await.unwrap();
        assert_eq!(check.overall_code, Code::OverLimit as i32, "what Envoy's call took, Kuadrant's check sees");
        let over = should_rate_limit(&mut envoy, "llm", user(), 1).await;
        assert_eq!(over.overall_code, Code::OverLimit as i32);
        let unknown = server.kuadrant("Nope", request(user(), 1)).await.unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::Unimplemented);
    })
    .await;
}

#[tokio::test]
async fn per_descriptor_hits_addend_counts_its_own_counters_all_or_nothing_on_every_storage() {
    each_storage_for(MARKS, async |server| {
        let mut envoy = server.rls().await;
        let user = |hits| with_hits(descriptor(&[("user", "bob")]), hits);
        let model = |hits: Option<u64>| {
            let d = descriptor(&[("model", "m1")]);
            hits.map_or(d.clone(), |h| with_hits(d, h))
        };
        // 5 tokens for the user, 0 for the model (a probe): the model's 1 is untouched.
        let first = should_rate_limit(&mut envoy, "llm", vec![user(5), model(Some(0))], 1).await;
        assert_eq!(first.overall_code, Code::Ok as i32, "{first:?}");
        let status = |r: &RateLimitResponse, i: usize| (r.statuses[i].code, r.statuses[i].limit_remaining);
        assert_eq!(
            status(&first, 0),
            (Code::Ok as i32, 0),
            "trial (shadow, 2 left): 5 do not fit, reported as 0 left; it took and denied nothing"
        );
        assert_eq!(status(&first, 1), (Code::Ok as i32, 1), "0 hits: the model's counter is untouched");
        // The request's own 1 for the model, 5 again for the user: 10 of 10 for the user.
        let second = should_rate_limit(&mut envoy, "llm", vec![user(5), model(None)], 1).await;
        assert_eq!(second.overall_code, Code::Ok as i32, "{second:?}");
        assert_eq!(status(&second, 1).1, 0, "the model took the request's 1");
        // 1 more token for the user is over; the model's probe must not be counted either way.
        let third = should_rate_limit(&mut envoy, "llm", vec![user(1), model(Some(0))], 1).await;
        assert_eq!(third.overall_code, Code::OverLimit as i32, "{third:?}");
        assert_eq!(status(&third, 0).0, Code::OverLimit as i32);
        // All or nothing: a user with room and a model without take nothing from the user.
        let fresh = |hits| with_hits(descriptor(&[("user", "cat")]), hits);
        let denied = should_rate_limit(&mut envoy, "llm", vec![fresh(4), model(Some(1))], 1).await;
        assert_eq!(denied.overall_code, Code::OverLimit as i32);
        let after = server.kuadrant("CheckRateLimit", request(vec![fresh(10)], 1)).await.unwrap();
        assert_eq!(after.overall_code, Code::Ok as i32, "cat's 10 are all still there: {after:?}");
        let negative = RateLimitDescriptor { is_negative_hits: true, ..user(1) };
        let refused = envoy.should_rate_limit(request(vec![negative], 1)).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(refused.message().contains("negative hits_addend"), "{}", refused.message());
    })
    .await;
}

#[tokio::test]
async fn shadow_limits_never_deny_and_quota_limits_mark_on_every_storage() {
    each_storage_for(MARKS, async |server| {
        let mut envoy = server.rls().await;
        let dee = || vec![descriptor(&[("user", "dee"), ("tenant", "acme")])];
        for call in 1..=4u32 {
            let reply = should_rate_limit(&mut envoy, "llm", dee(), 1).await;
            assert_eq!(reply.overall_code, Code::Ok as i32, "call {call}: shadow and quota limits never deny");
            let marks = reply.dynamic_metadata.as_ref().map(|m| format!("{:?}", m.fields["quota_exceeded"]));
            let header = reply.response_headers_to_add.iter().find(|h| h.key == "x-tollgate-quota-exceeded");
            if call <= 3 {
                assert_eq!(marks, None, "call {call}: within the quota");
                assert!(header.is_none());
            } else {
                assert!(marks.unwrap().contains("monthly"), "call {call}");
                assert_eq!(header.unwrap().value, "monthly");
                assert_eq!(reply.statuses[0].code, Code::OverLimit as i32, "the quota's descriptor is marked");
            }
        }
        let body = r#"{"namespace":"llm","values":{"user":"dee","tenant":"acme"},"delta":1}"#;
        let (status, headers, _) = server.post("/check_and_report", body).await;
        assert_eq!(status, 200);
        assert_eq!(headers["x-tollgate-quota-exceeded"], "monthly");
        let metrics = server.get("/metrics").await.1;
        for line in [
            "authorized_calls{limitador_namespace=\"llm\"} 5",
            "shadow_limited_calls{limitador_namespace=\"llm\",limit_name=\"trial\"} 3",
            "quota_exceeded_calls{limitador_namespace=\"llm\",limit_name=\"monthly\"} 2",
        ] {
            assert!(metrics.contains(line), "{line} in\n{metrics}");
        }
        assert!(!metrics.contains("\nlimited_calls{"), "nothing was limited:\n{metrics}");
    })
    .await;
}

const MONTHLY: &str = "- {namespace: billing, name: monthly, max_value: 3, window: {calendar: month, timezone: UTC}, variables: [tenant]}\n";

#[tokio::test]
async fn a_monthly_window_resets_at_midnight_utc_on_the_first_on_memory_and_redis() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
    let redis = RedisServer::start();
    for storage in [Storage::Memory, Storage::Redis { url: redis.url(), prefix: "m:".into() }] {
        let server = server_on(MONTHLY, Mode::Accuracy, false, false, storage.clone()).await;
        // The manual clock's origin is 1970-01-01T00:00Z: this is 2026-01-31T23:59:00Z.
        server.clock.advance(Duration::from_secs(1_769_903_940));
        let mut client = server.rls().await;
        let tenant = || vec![descriptor(&[("tenant", "acme")])];
        for call in 0..3 {
            let reply = should_rate_limit(&mut client, "billing", tenant(), 1).await;
            assert_eq!(reply.overall_code, Code::Ok as i32, "{storage:?} call {call}");
        }
        let over = should_rate_limit(&mut client, "billing", tenant(), 1).await;
        assert_eq!(over.overall_code, Code::OverLimit as i32, "{storage:?}");
        let status = &over.statuses[0];
        assert_eq!(status.duration_until_reset.as_ref().unwrap().seconds, 60, "{storage:?}: February in a minute");
        let limit = status.current_limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (3, Unit::Month as i32), "{storage:?}");
        server.clock.advance(Duration::from_secs(59));
        let still = should_rate_limit(&mut client, "billing", tenant(), 1).await;
        assert_eq!(still.overall_code, Code::OverLimit as i32, "{storage:?}: 23:59:59 is still January");
        server.clock.advance(Duration::from_secs(1));
        let february = should_rate_limit(&mut client, "billing", tenant(), 3).await;
        assert_eq!(february.overall_code, Code::Ok as i32, "{storage:?}: a new month at 00:00 UTC on the 1st");
        let reset = february.statuses[0].duration_until_reset.as_ref().unwrap().seconds;
        assert_eq!(reset, 28 * 86_400, "{storage:?}: February 2026 has 28 days");
    }
    // redis-cached decides windows locally from their first hit, and redis-leased leases slices
    // of windows opened by the first hit: both refuse calendar windows.
    let dir = support::temp_dir("calendar");
    let limits = dir.join("limits.yaml");
    std::fs::write(&limits, MONTHLY).unwrap();
    let cached = Storage::RedisCached { url: redis.url(), prefix: "c:".into(), flush: Duration::from_secs(1) };
    let leased = Storage::RedisLeased { url: redis.url(), prefix: "l:".into() };
    for (storage, name) in [(cached, "redis-cached"), (leased, "redis-leased")] {
        let config =
            tollgate_server::serve::ServeConfig { time: Default::default(), storage, ..support::config(&limits) };
        let error = tollgate_server::serve::start(&config, tollgate::SystemClock::new()).await.err().unwrap();
        let expected = format!(
            "1:3: calendar windows are not available with --storage {name} (windows opened by the first hit only): \
             limit `monthly` of namespace `billing`"
        );
        assert!(error.to_string().ends_with(&expected), "{error}");
    }
}

/// Per user, per user and route, and for everyone, in one namespace; a per-user limit in another.
const COUNTERS: &str = r#"
- {namespace: api, name: per user, max_value: 5, seconds: 60, variables: [user]}
- {namespace: api, name: per route, max_value: 3, seconds: 60, variables: [user, "descriptors[0].route"]}
- {namespace: api, name: all, max_value: 100, seconds: 60}
- {namespace: other, name: elsewhere, max_value: 5, seconds: 60, variables: [user]}
"#;

fn hit(namespace: &str, user: &str, route: &str) -> String {
    format!(r#"{{"namespace":"{namespace}","values":{{"user":"{user}","route":"{route}"}},"delta":1}}"#)
}

/// `GET /counters/{namespace}`: (limit name, set_variables, remaining, expires_in_seconds), sorted;
/// and the truncation header.
async fn listed(server: &Server, path: &str) -> (Vec<(String, String, u64, u64)>, String) {
    let (status, headers, body) = server.send("GET", path, None).await;
    assert_eq!(status, 200, "{path}: {body}");
    let counters: Vec<tollgate_server::serve::http::CounterJson> = serde_json::from_str(&body).unwrap();
    let mut rows: Vec<_> = counters
        .into_iter()
        .map(|c| {
            let vars = c.set_variables.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
            (c.limit.name.unwrap_or_default(), vars, c.remaining, c.expires_in_seconds)
        })
        .collect();
    rows.sort();
    (rows, headers["x-tollgate-truncated"].to_str().unwrap().to_string())
}

async fn reset(server: &Server, namespace: &str, body: Option<&str>) -> (u16, String) {
    let (status, _, text) = server.send("DELETE", &format!("/counters/{namespace}"), body).await;
    (status, text)
}

#[tokio::test]
async fn counters_are_listed_and_reset_by_values_on_every_storage() {
    each_storage_for(COUNTERS, async |server| {
        for (user, route) in [("ann", "/a"), ("ann", "/a"), ("ann", "/b"), ("bob", "/a")] {
            assert_eq!(server.post("/check_and_report", &hit("api", user, route)).await.0, 200);
        }
        assert_eq!(server.post("/check_and_report", &hit("other", "ann", "/a")).await.0, 200);
        // redis-cached: a window opens in Redis at the flush that first sends its hits (a
        // listing flushes), so flush before the clock moves for every storage to agree.
        server.running.engine.flush().await.unwrap();
        server.clock.advance(Duration::from_secs(10));
        let row = |name: &str, vars: &str, remaining| (name.to_string(), vars.to_string(), remaining, 50);
        let all = vec![
            row("all", "", 96),
            row("per route", "descriptors[0].route=/a,user=ann", 1),
            row("per route", "descriptors[0].route=/a,user=bob", 2),
            row("per route", "descriptors[0].route=/b,user=ann", 2),
            row("per user", "user=ann", 2),
            row("per user", "user=bob", 4),
        ];
        assert_eq!(listed(&server, "/counters/api").await, (all.clone(), "false".into()));
        assert_eq!(listed(&server, "/counters/api?limit=6").await, (all.clone(), "false".into()));
        let (some, truncated) = listed(&server, "/counters/api?limit=4").await;
        assert_eq!((some.len(), truncated.as_str()), (4, "true"));
        assert!(some.iter().all(|r| all.contains(r)), "{some:?}");
        for (query, why) in [("limit=0", "invalid limit 0"), ("limit=x", "invalid query"), ("size=3", "invalid query")]
        {
            let (status, _, text) = server.send("GET", &format!("/counters/api?{query}"), None).await;
            assert_eq!(status, 400, "{query}");
            assert!(text.contains(why), "{query}: {text}");
        }

        // ann's counters in every limit with a `user` variable; bob's, everyone's and the other
        // namespace's stay.
        assert_eq!(reset(&server, "api", Some(r#"{"values":{"user":"ann"}}"#)).await, (200, r#"{"reset":3}"#.into()));
        let kept = vec![all[0].clone(), all[2].clone(), all[5].clone()];
        assert_eq!(listed(&server, "/counters/api").await.0, kept);
        assert_eq!(listed(&server, "/counters/other").await.0.len(), 1);
        for _ in 0..3 {
            assert_eq!(server.post("/check_and_report", &hit("api", "ann", "/a")).await.0, 200, "ann starts again");
        }
        assert_eq!(server.post("/check_and_report", &hit("api", "ann", "/a")).await.0, 429);

        // Every variable named (as written, or by the entry it reads): one counter.
        let bob_a = r#"{"values":{"user":"bob","route":"/a"}}"#;
        assert_eq!(reset(&server, "api", Some(bob_a)).await, (200, r#"{"reset":1}"#.into()));
        assert_eq!(reset(&server, "api", Some(bob_a)).await, (200, r#"{"reset":0}"#.into()), "nothing left");
        assert_eq!(reset(&server, "api", Some(r#"{"values":{"tier":"gold"}}"#)).await.1, r#"{"reset":0}"#);

        for (body, why) in [("{", "invalid request body"), (r#"{"valuez":{}}"#, "unknown field `valuez`")] {
            let (status, text) = reset(&server, "api", Some(body)).await;
            assert_eq!(status, 400, "{body}");
            assert!(text.contains(why), "{body}: {text}");
        }
        // No body: every counter of the namespace (all, bob per user, ann per user and per route).
        assert_eq!(reset(&server, "api", None).await, (200, r#"{"reset":4}"#.into()));
        assert_eq!(listed(&server, "/counters/api").await.0, vec![]);
        assert_eq!(reset(&server, "nobody", None).await, (200, r#"{"reset":0}"#.into()));

        // A window that is over is no counter: not listed, not counted as reset.
        server.clock.advance(Duration::from_secs(60));
        assert_eq!(listed(&server, "/counters/other").await.0, vec![]);
        assert_eq!(reset(&server, "other", Some("{}")).await, (200, r#"{"reset":0}"#.into()));
    })
    .await;
}

/// Four limits reading four descriptors: 300 calls make 1,200 counters, more than a listing shows
/// by default and more than one SCAN step looks at.
const MANY: &str = r#"
- {namespace: big, max_value: 9, seconds: 60, variables: ["descriptors[0].u"]}
- {namespace: big, max_value: 9, seconds: 60, variables: ["descriptors[1].u"]}
- {namespace: big, max_value: 9, seconds: 60, variables: ["descriptors[2].u"]}
- {namespace: big, max_value: 9, seconds: 60, variables: ["descriptors[3].u"]}
"#;

#[tokio::test]
async fn listings_are_bounded_and_resets_reach_every_counter_on_every_storage() {
    each_storage_for(MANY, async |server| {
        let mut client = server.rls().await;
        for user in 0..300 {
            let user = format!("u{user}");
            let d = || descriptor(&[("u", user.as_str())]);
            let reply = should_rate_limit(&mut client, "big", vec![d(), d(), d(), d()], 1).await;
            assert_eq!(reply.overall_code, Code::Ok as i32);
        }
        let (rows, truncated) = listed(&server, "/counters/big").await;
        assert_eq!((rows.len(), truncated.as_str()), (1000, "true"), "1,000 by default");
        assert_eq!(listed(&server, "/counters/big?limit=1200").await.0.len(), 1200);
        assert_eq!(listed(&server, "/counters/big?limit=1200").await.1, "false");
        assert_eq!(listed(&server, "/counters/big?limit=1199").await.1, "true");
        let (status, _, text) = server.send("GET", "/counters/big?limit=100001", None).await;
        assert_eq!(status, 400, "{text}");
        // `u` is the entry all four variables read.
        assert_eq!(reset(&server, "big", Some(r#"{"values":{"u":"u7"}}"#)).await.1, r#"{"reset":4}"#);
        assert_eq!(reset(&server, "big", None).await.1, r#"{"reset":1196}"#);
        assert_eq!(listed(&server, "/counters/big").await, (vec![], "false".into()));
    })
    .await;
}

/// With redis-cached, a reset first sends the replica's pending hits, then deletes the counters
/// in Redis and forgets the local copies: what was counted before it never comes back, and the
/// next calls start from a fresh window, locally and in Redis.
#[tokio::test]
async fn a_reset_on_redis_cached_drops_the_local_counter_and_its_pending_hits() {
    let redis = RedisServer::start();
    let yaml = "- {namespace: api, name: per user, max_value: 3, seconds: 60, variables: [user]}\n";
    let storage = Storage::RedisCached { url: redis.url(), prefix: "r:".into(), flush: Duration::from_secs(3600) };
    let server = server_on(yaml, Mode::Accuracy, false, false, storage).await;
    let call = |user: &str| format!(r#"{{"namespace":"api","values":{{"user":"{user}"}},"delta":1}}"#);
    for _ in 0..3 {
        assert_eq!(server.post("/check_and_report", &call("ann")).await.0, 200);
    }
    assert_eq!(server.post("/check_and_report", &call("bob")).await.0, 200);
    assert_eq!(redis.cli(&["KEYS", "r:*"]).lines().count(), 0, "all pending, nothing flushed");
    assert_eq!(reset(&server, "api", Some(r#"{"values":{"user":"ann"}}"#)).await.1, r#"{"reset":1}"#);
    assert_eq!(redis.cli(&["KEYS", "r:*"]).lines().count(), 1, "bob's hit was flushed; ann's deleted");
    assert_eq!(server.running.engine.flush().await.unwrap(), 0, "ann's pending hits went with the reset");
    for _ in 0..3 {
        assert_eq!(server.post("/check_and_report", &call("ann")).await.0, 200, "a fresh window");
    }
    assert_eq!(server.post("/check_and_report", &call("ann")).await.0, 429);
    assert_eq!(server.running.engine.flush().await.unwrap(), 1);
    let ann = redis.cli(&["KEYS", "r:*:3:ann"]);
    assert_eq!(redis.cli(&["GET", ann.trim()]).trim(), "3", "the new window's 3, not 3 more on the old");
}

/// With redis-cached, a replica's flush opens Redis's window when its first hit opened its own,
/// not a flush interval later: the replicas' windows, and Redis's, end together.
#[tokio::test]
async fn redis_cached_windows_open_in_redis_at_the_first_hit_not_at_the_flush() {
    let redis = RedisServer::start();
    let yaml = "- {namespace: api, name: per user, max_value: 5, seconds: 60, variables: [user]}\n";
    let storage = Storage::RedisCached { url: redis.url(), prefix: "w:".into(), flush: Duration::from_secs(3600) };
    let a = server_on(yaml, Mode::Accuracy, false, false, storage.clone()).await;
    let b = server_on(yaml, Mode::Accuracy, false, false, storage).await;
    let advance = |by: Duration| {
        a.clock.advance(by);
        b.clock.advance(by);
    };
    /// Status, remaining, seconds to the reset.
    async fn hit(server: &Server) -> (u16, String, String) {
        let call = r#"{"namespace":"api","values":{"user":"ann"},"delta":1,"response_headers":"DraftVersion03"}"#;
        let (status, headers, _) = server.post("/check_and_report", call).await;
        let header = |name: &str| headers[name].to_str().unwrap().to_owned();
        (status, header("x-ratelimit-remaining"), header("x-ratelimit-reset"))
    }
    let answer = |remaining: &str, reset: &str| (200, remaining.to_owned(), reset.to_owned());
    advance(Duration::from_secs(1000));
    assert_eq!(hit(&a).await, answer("4", "60"));
    advance(Duration::from_secs(10));
    assert_eq!(a.running.engine.flush().await.unwrap(), 1);
    assert_eq!(hit(&a).await, answer("3", "50"), "the window opened 10 s ago, in Redis too");
    // B reads the window from Redis: the same end, A's flushed hit counted.
    assert_eq!(hit(&b).await, answer("3", "50"));
    advance(Duration::from_secs(49));
    assert_eq!(hit(&a).await.2, "1");
    advance(Duration::from_secs(1));
    assert_eq!(hit(&a).await, answer("4", "60"), "a new window on A");
    assert_eq!(hit(&b).await, answer("4", "60"), "and on B, at the same moment");
}

#[tokio::test]
async fn listing_and_reset_say_when_redis_is_down() {
    let mut redis = RedisServer::start();
    let storage = Storage::Redis { url: redis.url(), prefix: "t:".into() };
    let server = server_on(COUNTERS, Mode::Accuracy, false, false, storage).await;
    assert_eq!(server.post("/check_and_report", &hit("api", "ann", "/a")).await.0, 200);
    redis.kill();
    let (status, _, text) = server.send("GET", "/counters/api", None).await;
    assert_eq!(status, 503);
    assert!(text.contains("counter storage unavailable"), "{text}");
    let (status, text) = reset(&server, "api", None).await;
    assert_eq!(status, 503);
    assert!(text.contains("counter storage unavailable"), "{text}");
}

/// A calendar counter is listed until its calendar boundary, with the time to it, and is no
/// counter after it (Redis still holds January's key then, stored for January's start).
#[tokio::test]
async fn a_calendar_counter_is_listed_until_its_boundary_and_reset_on_memory_and_redis() {
    let redis = RedisServer::start();
    for storage in [Storage::Memory, Storage::Redis { url: redis.url(), prefix: "m:".into() }] {
        let server = server_on(MONTHLY, Mode::Accuracy, false, false, storage.clone()).await;
        // 2026-01-31T23:59:00Z on the manual clock (its origin is the epoch).
        server.clock.advance(Duration::from_secs(1_769_903_940));
        let call = r#"{"namespace":"billing","values":{"tenant":"acme"},"delta":1}"#;
        for _ in 0..2 {
            assert_eq!(server.post("/check_and_report", call).await.0, 200, "{storage:?}");
        }
        server.clock.advance(Duration::from_secs(30));
        let january = vec![("monthly".to_string(), "tenant=acme".to_string(), 1, 30)];
        assert_eq!(listed(&server, "/counters/billing").await.0, january, "{storage:?}: 30 s to February");
        assert_eq!(reset(&server, "billing", Some(r#"{"values":{"tenant":"acme"}}"#)).await.1, r#"{"reset":1}"#);
        for _ in 0..3 {
            assert_eq!(server.post("/check_and_report", call).await.0, 200, "{storage:?}: a fresh January");
        }
        assert_eq!(server.post("/check_and_report", call).await.0, 429, "{storage:?}");
        server.clock.advance(Duration::from_secs(30));
        assert_eq!(listed(&server, "/counters/billing").await.0, vec![], "{storage:?}: January is over");
        assert_eq!(reset(&server, "billing", None).await.1, r#"{"reset":0}"#, "{storage:?}");
    }
}

/// A limit matched against each descriptor on its own (`descriptor_keys`) counts one counter once
/// per descriptor that gives it the same values, on every storage (Redis takes the key once, with
/// the hits summed).
#[tokio::test]
async fn a_descriptor_sent_twice_counts_twice_on_every_storage() {
    let yaml = "- {namespace: sms, max_value: 3, seconds: 60, descriptor_keys: [to], variables: ['descriptors[0].to']}";
    each_storage_for(yaml, async |server| {
        let mut client = server.rls().await;
        let twice = || vec![descriptor(&[("to", "1")]), descriptor(&[("to", "1")])];
        let first = should_rate_limit(&mut client, "sms", twice(), 1).await;
        assert_eq!(first.overall_code, Code::Ok as i32);
        assert_eq!(first.statuses.len(), 2);
        assert!(first.statuses[1].limit_remaining <= 1, "two of three taken: {first:?}");
        assert_eq!(should_rate_limit(&mut client, "sms", twice(), 1).await.overall_code, Code::OverLimit as i32);
        let once = should_rate_limit(&mut client, "sms", vec![descriptor(&[("to", "1")])], 1).await;
        assert_eq!(once.overall_code, Code::Ok as i32, "the third");
        let more = should_rate_limit(&mut client, "sms", vec![descriptor(&[("to", "1")])], 1).await;
        assert_eq!(more.overall_code, Code::OverLimit as i32);
        let other = should_rate_limit(&mut client, "sms", vec![descriptor(&[("to", "2")])], 1).await;
        assert_eq!(other.overall_code, Code::Ok as i32, "one counter per number");
    })
    .await;
}

/// One sample of a Prometheus text exposition: name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: std::collections::BTreeMap<String, String>,
    value: f64,
}

/// The samples of a Prometheus text exposition (labels without escaped quotes or commas, as the
/// server's are), and the `# TYPE` of each family.
fn exposition(text: &str) -> (Vec<Sample>, std::collections::HashMap<String, String>) {
    let mut samples = Vec::new();
    let mut types = std::collections::HashMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(family) = line.strip_prefix("# TYPE ") {
            let (name, kind) = family.split_once(' ').unwrap();
            types.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.strip_suffix('}').unwrap_or_else(|| panic!("{line}"))),
            None => (series, ""),
        };
        let labels = labels
            .split(',')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("label {l} in {line}"));
                (k.to_string(), v.trim_matches('"').to_string())
            })
            .collect();
        let value = value.parse().unwrap_or_else(|e| panic!("value of {line}: {e}"));
        samples.push(Sample { name: name.to_string(), labels, value });
    }
    (samples, types)
}

/// The sum of the samples named `name` whose labels include `labels`.
fn total(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v)))
        .map(|s| s.value)
        .sum()
}

/// The Redis storages' own series (`tollgate_redis_*`, labelled with the key prefix) are on the
/// server's `/metrics`: recorded in the server's recorder, not the process-global one (which a
/// server in memory, in the same process, does not show).
#[tokio::test]
async fn the_redis_storages_decision_latency_and_errors_are_on_the_servers_metrics() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let stores = [
        (Storage::Redis { url: url.clone(), prefix: "rm:".into() }, "rm:"),
        (Storage::RedisCached { url: url.clone(), prefix: "cm:".into(), flush: Duration::from_secs(3600) }, "cm:"),
        (Storage::RedisLeased { url: url.clone(), prefix: "lm:".into() }, "lm:"),
    ];
    let mut servers = Vec::new();
    for (storage, prefix) in stores {
        let server = server_on(SEED_003, Mode::Accuracy, false, false, storage).await;
        let mut client = server.rls().await;
        // Three rounds: three new counters, each a round trip to Redis (redis-cached loads it,
        // redis-leased leases a slice of it).
        for round in ["1", "2", "3"] {
            let reply = should_rate_limit(&mut client, "example.org", vec![descriptor(&[("round", round)])], 1).await;
            assert_eq!(reply.overall_code, Code::Ok as i32);
        }
        let (samples, types) = exposition(&server.get("/metrics").await.1);
        assert_eq!(types.get("tollgate_redis_decision_seconds").map(String::as_str), Some("histogram"));
        let decisions = total(&samples, "tollgate_redis_decision_seconds_count", &[("prefix", prefix)]);
        assert_eq!(decisions, 3.0, "{prefix}: one round trip per new counter");
        let seconds = total(&samples, "tollgate_redis_decision_seconds_sum", &[("prefix", prefix)]);
        assert!(seconds > 0.0 && seconds < 3.0, "{prefix}: {seconds} s");
        let kinds = samples.iter().filter(|s| s.name == "tollgate_redis_errors_total").count();
        assert_eq!(kinds, 7, "{prefix}: every kind of error, at 0");
        assert_eq!(total(&samples, "tollgate_redis_errors_total", &[]), 0.0);
        assert!(
            !samples.iter().any(|s| s.labels.get("prefix").is_some_and(|p| p != prefix)),
            "{prefix}: only this server's storage"
        );
        // The counters live in Redis: the engine keeps no in-memory tables for its limits, so
        // there is no per-limit series about them (they read 0 when the tables were kept unused).
        let local = ["tollgate_counters", "tollgate_counters_max", "tollgate_limit_fill"];
        let listed: Vec<_> = samples.iter().filter(|s| local.contains(&s.name.as_str())).collect();
        assert!(listed.is_empty(), "{prefix}: {listed:?}");
        servers.push((server, prefix));
    }
    let memory = server_on(SEED_003, Mode::Accuracy, false, false, Storage::Memory).await;
    let text = memory.get("/metrics").await.1;
    assert!(!text.contains("tollgate_redis_"), "in memory: no Redis series");
    let (samples, _) = exposition(&text);
    for name in ["tollgate_counters", "tollgate_counters_max", "tollgate_limit_fill"] {
        assert!(samples.iter().any(|s| s.name == name), "in memory: {name} per limit");
    }

    // Redis gone: a call on a new counter fails, and the failure is counted by kind.
    redis.kill();
    for (server, prefix) in &servers {
        let request = RateLimitRequest {
            domain: "example.org".into(),
            descriptors: vec![descriptor(&[("round", "after")])],
            hits_addend: 1,
        };
        let status = server.rls().await.should_rate_limit(request).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{prefix}");
        let (samples, _) = exposition(&server.get("/metrics").await.1);
        assert_eq!(total(&samples, "tollgate_redis_errors_total", &[("prefix", prefix)]), 1.0, "{prefix}");
        assert_eq!(total(&samples, "tollgate_redis_decision_seconds_count", &[("prefix", prefix)]), 4.0, "{prefix}");
    }
}

/// redis-cached keeps its local copies of the counters within `--max-counter-bytes`: past it, a
/// call is decided in Redis (nothing kept here), and the decisions stay exact either way.
#[tokio::test]
async fn redis_cached_keeps_its_local_counters_within_the_byte_budget() {
    let redis = RedisServer::start();
    let yaml = "- {namespace: api, max_value: 1, seconds: 60, variables: [user]}\n";
    let server = support::server_with(yaml, |config| {
        config.storage =
            Storage::RedisCached { url: redis.url(), prefix: "b:".into(), flush: Duration::from_secs(3600) };
        config.counters.max_bytes = std::num::NonZeroUsize::new(4096).unwrap();
    })
    .await;
    let mut client = server.rls().await;
    for i in 0..100 {
        let user = format!("user-{i}-{}", "x".repeat(100));
        let user = || vec![descriptor(&[("user", user.as_str())])];
        let first = should_rate_limit(&mut client, "api", user(), 1).await;
        assert_eq!(first.overall_code, Code::Ok as i32, "user {i}");
        let second = should_rate_limit(&mut client, "api", user(), 1).await;
        assert_eq!(second.overall_code, Code::OverLimit as i32, "user {i}: counted, cached or not");
    }
    let (bytes, max) = server.running.engine.cached_bytes().unwrap();
    assert_eq!(max, 4096);
    eprintln!("{bytes} bytes kept");
    assert!(bytes <= max && bytes > max / 2, "{bytes} bytes kept");
    let (_, metrics) = server.get("/metrics").await;
    assert!(metrics.lines().any(|l| l == format!("tollgate_redis_cached_bytes {bytes}")), "{metrics}");
}

/// redis-leased: once an enforcing counter has denied a call, the call's later counters are only
/// looked at, not taken from (nor leased from Redis and given back to this replica's slice, which
/// would keep their budget from the other replicas until the window ends).
#[tokio::test]
async fn redis_leased_takes_nothing_from_later_counters_once_a_call_is_denied() {
    let redis = RedisServer::start();
    let yaml = "- {namespace: api, name: all, max_value: 1, seconds: 60}\n\
                - {namespace: api, name: per-user, max_value: 10, seconds: 60, variables: [user]}\n";
    let storage = Storage::RedisLeased { url: redis.url(), prefix: "d:".into() };
    let server = server_on(yaml, Mode::Accuracy, false, false, storage).await;
    let mut client = server.rls().await;
    let user = |u: &str| vec![descriptor(&[("user", u)])];
    let first = should_rate_limit(&mut client, "api", user("ann"), 1).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    let denied = should_rate_limit(&mut client, "api", user("bob"), 1).await;
    assert_eq!(denied.overall_code, Code::OverLimit as i32, "`all` is spent");
    assert_eq!(denied.statuses[0].limit_remaining, 0);
    let keys = redis.cli(&["KEYS", "d:*bob*"]);
    assert_eq!(keys.trim(), "", "nothing of bob's counter was taken in Redis");
}
