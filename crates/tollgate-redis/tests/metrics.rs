//! The Redis limiter's metrics after real decisions against a real redis-server: decision
//! latency, errors by kind (a key of the wrong type, then the server killed), and what each
//! failure policy decided, read back from a Prometheus recorder installed for the test alone.

use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use tollgate::{Quota, Reason};
use tollgate_redis::{AlgorithmKind, FailurePolicy, LeasedLimiter, Redis, RedisLimiter, RedisMetrics, RedisOptions};
use tollgate_testkit::RedisServer;

/// The value of the series `name{labels}` in the Prometheus text, `None` when it is not there.
fn value(metrics: &PrometheusHandle, name: &str, labels: &str) -> Option<f64> {
    let series = format!("{name}{{{labels}}}");
    metrics.render().lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (s, v) = line.rsplit_once(' ')?;
        (s == series).then(|| v.parse().unwrap())
    })
}

fn errors(metrics: &PrometheusHandle, prefix: &str, kind: &str) -> f64 {
    value(metrics, "tollgate_redis_errors_total", &format!("prefix=\"{prefix}\",kind=\"{kind}\"")).unwrap()
}

fn failure_policy(metrics: &PrometheusHandle, prefix: &str, outcome: &str) -> f64 {
    value(metrics, "tollgate_redis_failure_policy_total", &format!("prefix=\"{prefix}\",outcome=\"{outcome}\""))
        .unwrap()
}

const KINDS: [&str; 7] = ["invalid_url", "connect", "auth", "wrong_type", "timeout", "backing_off", "redis"];

/// A redis-server, a connection to it with a 50 ms deadline, and a Prometheus recorder for this
/// test alone (install it with `metrics::with_local_recorder` while building limiters).
async fn setup() -> (RedisServer, Redis, PrometheusRecorder, PrometheusHandle) {
    let server = RedisServer::start();
    let options = RedisOptions { deadline: Duration::from_millis(50), ..Default::default() };
    let redis = Redis::connect_with(&server.url(), options).await.unwrap();
    let recorder = PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    (server, redis, recorder, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_errors_and_failure_policies_are_measured_by_prefix() {
    let (mut server, redis, recorder, metrics) = setup().await;
    let policies = [
        ("deny", FailurePolicy::Deny, "denied"),
        ("allow", FailurePolicy::Allow, "allowed"),
        ("local", FailurePolicy::local_share(Quota::per_second(1000).unwrap(), 1).unwrap(), "fallback"),
    ];
    // Built under the recorder: each limiter registers its series with it.
    let limiters: Vec<RedisLimiter> = metrics::with_local_recorder(&recorder, || {
        policies
            .iter()
            .map(|(prefix, policy, _)| {
                RedisLimiter::builder(&redis, prefix, AlgorithmKind::TokenBucket)
                    .limit("l", Quota::per_minute(2).unwrap())
                    .failure_policy(policy.clone())
                    .build()
                    .unwrap()
            })
            .collect()
    });
    let deny = &limiters[0];
    for kind in KINDS {
        assert_eq!(errors(&metrics, "deny", kind), 0.0, "every kind's series exists from the start");
    }

    for _ in 0..2 {
        assert_eq!(deny.try_acquire("alice", 1).await.unwrap().reason(), Reason::Granted);
    }
    assert_eq!(deny.try_acquire("alice", 1).await.unwrap_err().reason(), Reason::Exhausted);
    let count =
        |prefix: &str| value(&metrics, "tollgate_redis_decision_seconds_count", &format!("prefix=\"{prefix}\""));
    assert_eq!(count("deny"), Some(3.0), "one latency sample per decision");
    let sum = value(&metrics, "tollgate_redis_decision_seconds_sum", "prefix=\"deny\"").unwrap();
    assert!(sum > 0.0 && sum < 1.0, "3 decisions within the 50 ms deadline took {sum} s in all: not seconds?");
    assert_eq!(errors(&metrics, "deny", "redis") + errors(&metrics, "deny", "wrong_type"), 0.0);

    // A key of another type: an error of that kind, decided by the failure policy.
    server.cli(&["LPUSH", &deny.redis_keys("bob")[0], "x"]);
    assert_eq!(deny.try_acquire("bob", 1).await.unwrap_err().reason(), Reason::Unavailable);
    assert_eq!(errors(&metrics, "deny", "wrong_type"), 1.0);
    assert_eq!(failure_policy(&metrics, "deny", "denied"), 1.0);

    server.kill();
    for (limiter, (prefix, _, outcome)) in limiters.iter().zip(&policies) {
        for _ in 0..3 {
            let reason = match limiter.try_acquire("carol", 1).await {
                Ok(lease) => lease.reason(),
                Err(rejected) => rejected.reason(),
            };
            assert_ne!(reason, Reason::Granted, "{prefix}: redis is down");
        }
        let expected = if *prefix == "deny" { 4.0 } else { 3.0 };
        assert_eq!(failure_policy(&metrics, prefix, outcome), expected, "{prefix}");
        let failed: f64 = KINDS.iter().map(|kind| errors(&metrics, prefix, kind)).sum();
        assert_eq!(failed, expected, "{prefix}: each failed decision is one error of some kind");
    }
    let outage: f64 = ["connect", "timeout", "backing_off", "redis"].iter().map(|k| errors(&metrics, "allow", k)).sum();
    assert_eq!(outage, 3.0, "an outage is counted under the kinds an outage has");
    assert_eq!(failure_policy(&metrics, "allow", "denied") + failure_policy(&metrics, "allow", "fallback"), 0.0);
    let text = metrics.render();
    for key in ["alice", "bob", "carol"] {
        assert!(!text.contains(key), "the key {key} leaked into a label:\n{text}");
    }
}

/// A leased limiter whose lease call fails lets its failure policy decide at once: one failed
/// call to Redis per decision, not a second one first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_limiter_decides_an_outage_with_one_failed_call_each() {
    let (mut server, redis, recorder, metrics) = setup().await;
    let leased = metrics::with_local_recorder(&recorder, || {
        LeasedLimiter::builder(&redis, "leased", Quota::per_second(100).unwrap())
            .failure_policy(FailurePolicy::Allow)
            .metrics(RedisMetrics::new("leased"))
            .build()
            .unwrap()
    });
    server.kill();
    for _ in 0..3 {
        assert_eq!(leased.try_acquire("dave", 1).await.unwrap().reason(), Reason::FailOpen);
    }
    let failed: f64 = KINDS.iter().map(|kind| errors(&metrics, "leased", kind)).sum();
    assert_eq!(failed, 3.0, "one failed call per decision");
    assert_eq!(failure_policy(&metrics, "leased", "allowed"), 3.0);
}
