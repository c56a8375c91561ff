//! One test body per behaviour, run against every storage (memory, Redis), so they cannot drift.

mod support;

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use support::{SEED_003, Server, descriptor, seed_003_round, server_on, should_rate_limit};
use tollgate_policy::AlgorithmKind;
use tollgate_server::serve::{Mode, ServeError, Storage, StorageKind};
use tollgate_testkit::RedisServer;

async fn each_storage(body: impl AsyncFn(Server)) {
    body(server_on(SEED_003, Mode::Accuracy, false, false, Storage::Memory).await).await;
    let redis = RedisServer::start();
    let storage = Storage::Redis { url: redis.url(), prefix: "t:".into() };
    body(server_on(SEED_003, Mode::Accuracy, false, false, storage).await).await;
    let storage = Storage::RedisCached { url: redis.url(), prefix: "c:".into(), flush: Duration::from_secs(3600) };
    body(server_on(SEED_003, Mode::Accuracy, false, false, storage).await).await;
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
}

#[tokio::test]
async fn redis_storage_rejects_other_algorithms_and_bad_urls() {
    let redis = RedisServer::start();
    let yaml = "- {namespace: a, max_value: 1, seconds: 1, algorithm: token_bucket}\n";
    let dir = support::temp_dir("storage");
    let limits = dir.join("limits.yaml");
    std::fs::write(&limits, yaml).unwrap();
    let config = |url: String| tollgate_server::serve::ServeConfig {
        limits: limits.clone(),
        grpc: "127.0.0.1:0".parse().unwrap(),
        http: "127.0.0.1:0".parse().unwrap(),
        mode: Mode::Accuracy,
        shadow: false,
        watch: false,
        time: Default::default(),
        counters: Default::default(),
        storage: Storage::Redis { url, prefix: "t:".into() },
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
    let count = redis.cli(&["HGET", key.trim(), "c"]);
    assert_eq!(count.trim(), "4", "Redis saturates at the limit: {count}");
}
