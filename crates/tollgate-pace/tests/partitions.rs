//! Partitions leased through a real redis-server (started by the test on a free port): later
//! workers take what is free, what live workers may spend never adds up to more than the budget,
//! released partitions are taken over.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_pace::{Budget, Pacer, Partitions};
use tollgate_redis::Redis;
use tollgate_testkit::RedisServer;

async fn worker(redis: &Redis, budget: Budget, want: u64) -> (Arc<Pacer>, Partitions) {
    let pacer = Arc::new(Pacer::builder(budget).build().unwrap());
    let partitions = Partitions::builder(redis, "job", 6, budget)
        .want(want)
        .lease_ttl(Duration::from_secs(2))
        .poll(Duration::from_millis(50))
        .join(pacer.clone())
        .await
        .unwrap();
    (pacer, partitions)
}

/// Waits (for the other worker's poll, not for time to pass) until `f` holds.
async fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_share_the_budget_and_take_over_released_partitions() {
    let server = RedisServer::start();
    let redis = Redis::connect(&server.url()).await.unwrap();
    let budget = Budget::per_second(600).unwrap();

    let (a, pa) = worker(&redis, budget, 4).await;
    assert_eq!((pa.held(), a.ceiling()), (4, 400.0), "4 of 6 partitions of 600/s");
    let (b, pb) = worker(&redis, budget, 4).await;
    assert_eq!((pb.held(), b.ceiling()), (2, 200.0), "the later worker takes what is free");
    let (c, pc) = worker(&redis, budget, 4).await;
    assert_eq!((pc.held(), c.ceiling()), (0, 0.0), "nothing left");
    assert!(a.ceiling() + b.ceiling() + c.ceiling() <= 600.0);
    let mut tokens = pa.fencing_tokens();
    tokens.extend(pb.fencing_tokens());
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 6, "every lease has its own fencing token");

    pa.leave().await.unwrap();
    eventually("b and c take over a's partitions", || pb.held() + pc.held() == 6).await;
    assert!(pb.held() <= 4 && pc.held() >= 2, "each up to what it wants: b {} c {}", pb.held(), pc.held());
    eventually("the ceilings follow", || b.ceiling() + c.ceiling() == 600.0).await;
    pb.leave().await.unwrap();
    pc.leave().await.unwrap();
}

#[tokio::test]
async fn bad_settings_and_unreachable_redis() {
    let budget = Budget::per_second(10).unwrap();
    let port = tollgate_testkit::free_port();
    let error = Redis::connect(&format!("redis://127.0.0.1:{port}")).await.err().unwrap();
    assert!(error.to_string().contains(&port.to_string()), "names the URL: {error}");
    let server = RedisServer::start();
    let redis = Redis::connect(&server.url()).await.unwrap();
    let pacer = Arc::new(Pacer::builder(budget).build().unwrap());
    let error = Partitions::builder(&redis, "job", 0, budget).join(pacer.clone()).await.err().unwrap();
    assert_eq!(error.to_string(), "partitions must be at least 1, got 0");
    assert!(matches!(error, tollgate_pace::PaceError::Config { setting: "partitions", .. }), "{error:?}");
    let error = Partitions::builder(&redis, "job", 2, budget).want(0).join(pacer.clone()).await.err().unwrap();
    assert_eq!(error.to_string(), "want must be at least 1, got 0");
    let error = Partitions::builder(&redis, "j{b}", 2, budget).join(pacer).await.err().unwrap();
    assert!(matches!(error, tollgate_pace::PaceError::Partitions(_)), "{error:?}");
    assert!(error.to_string().contains("\"j{b}\""), "names the bad name: {error}");
}
