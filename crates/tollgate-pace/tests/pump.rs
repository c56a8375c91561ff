//! The pump against a throttled service, through a real redis-server: three workers sharing
//! partitions drain the queue with nothing lost, nothing done twice, few throttled calls; failures
//! and panics are retried then dead-lettered, never lost; the queue's errors say whether they
//! pass; the queue works on a Redis Cluster.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate::{Limiter, Quota, TokenBucket};
use tollgate_pace::{
    Budget, Handled, HandlerError, Item, PaceError, Pacer, Partitions, Progress, PumpOptions, Queue, QueueError,
    RedisStreams, pump,
};
use tollgate_redis::{BackendError, Redis, RedisOptions};
use tollgate_testkit::{RedisCluster, RedisServer};

/// A service that throttles above `rate`/s (burst 1/10 s) with 429 + Retry-After, and records
/// each completed idempotency key.
#[derive(Clone)]
struct Service {
    limiter: Arc<Limiter<TokenBucket>>,
    done: Arc<Mutex<HashMap<String, u32>>>,
}

impl Service {
    fn new(rate: u64) -> Service {
        let quota = Quota::per(Duration::from_secs(1), rate).unwrap().with_burst(rate / 10).unwrap();
        Service { limiter: Arc::new(Limiter::new(TokenBucket::new(quota))), done: Default::default() }
    }

    fn call(&self, item: &Item) -> Handled {
        match self.limiter.try_acquire(1) {
            Ok(_) => {
                *self.done.lock().unwrap().entry(item.key.clone()).or_default() += 1;
                Handled::Done
            }
            Err(rejected) => Handled::Throttled(rejected.retry_after()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_drain_the_queue_exactly_under_the_limit() {
    let server = RedisServer::start();
    let redis = Redis::connect(&server.url()).await.unwrap();
    let queue = Arc::new(RedisStreams::open(&redis, "jobs", Duration::from_secs(2), 3).await.unwrap());
    let items = 2000;
    for i in 0..items {
        queue.enqueue(&format!("item-{i}"), &format!("{{\"n\":{i}}}"), 1).await.unwrap();
    }
    let rate = 1000;
    let service = Service::new(rate);
    let budget = Budget::per_second(rate).unwrap();
    let started = Instant::now();
    let mut workers = Vec::new();
    let mut progresses = Vec::new();
    for w in 0..3 {
        let pacer = Arc::new(Pacer::builder(budget).granularity(Duration::from_millis(100)).build().unwrap());
        let partitions = Partitions::builder(&redis, "jobs", 6, budget)
            .want(2)
            .poll(Duration::from_millis(50))
            .join(pacer.clone())
            .await
            .unwrap();
        let progress = Arc::new(Progress::default());
        progresses.push(progress.clone());
        let service = service.clone();
        let queue = queue.clone();
        workers.push(tokio::spawn(async move {
            let options = PumpOptions::new(&format!("worker-{w}"));
            let result = pump(queue, pacer, options, progress, move |item| {
                let service = service.clone();
                async move { service.call(&item) }
            })
            .await;
            partitions.leave().await.unwrap();
            result
        }));
    }
    for worker in workers {
        worker.await.unwrap().unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let done = service.done.lock().unwrap().clone();
    assert_eq!(done.len(), items, "every item completed");
    assert!(done.values().all(|&n| n == 1), "none completed twice");
    let throttled: u64 = progresses.iter().map(|p| p.throttled.load(Ordering::Relaxed)).sum();
    let completed: u64 = progresses.iter().map(|p| p.done.load(Ordering::Relaxed)).sum();
    assert_eq!(completed, items as u64);
    let share = throttled as f64 / (throttled + completed) as f64;
    let achieved = items as f64 / elapsed;
    println!(
        "achieved {achieved:.0}/s of {rate}/s ({:.2}x), throttled {:.2}% of calls",
        achieved / rate as f64,
        share * 100.0
    );
    assert!(share <= 0.01, "throttled responses are at most 1% of calls: {throttled} of {}", throttled + completed);
    assert_eq!(queue.outstanding().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_and_panics_are_retried_then_dead_lettered() {
    let server = RedisServer::start();
    let redis = Redis::connect(&server.url()).await.unwrap();
    let queue = Arc::new(RedisStreams::open(&redis, "jobs", Duration::from_millis(500), 2).await.unwrap());
    for key in ["ok", "fails", "panics"] {
        queue.enqueue(key, "{}", 1).await.unwrap();
    }
    let pacer = Arc::new(Pacer::builder(Budget::per_second(1000).unwrap()).build().unwrap());
    let progress = Arc::new(Progress::default());
    let mut options = PumpOptions::new("w");
    options.empty_poll = Duration::from_millis(20);
    pump(queue.clone(), pacer, options, progress.clone(), |item| async move {
        match item.key.as_str() {
            "ok" => Handled::Done,
            "fails" => Handled::Failed(HandlerError::message(format!("attempt {} refused", item.attempts + 1))),
            _ => panic!("handler bug"),
        }
    })
    .await
    .unwrap();
    assert_eq!(progress.done.load(Ordering::Relaxed), 1);
    assert_eq!(progress.failed.load(Ordering::Relaxed), 4, "two attempts each");
    assert_eq!(progress.dead.load(Ordering::Relaxed), 2);
    assert_eq!(queue.dead_letter_stream(), "{jobs}:dead");
    let dead = server.cli(&["XRANGE", "{jobs}:dead", "-", "+"]);
    assert!(dead.contains("attempt 2 refused"), "the last error is kept: {dead}");
    assert!(dead.contains("the handler panicked"), "{dead}");
    assert_eq!(queue.outstanding().await.unwrap(), 0, "nothing lost, nothing left");
}

/// The queue's errors name the stream and what was being done, and tell an outage (transient)
/// from a fault that needs someone to act; none shows the password of the Redis URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_errors_name_the_stream_and_say_whether_they_pass() {
    let mut server = RedisServer::start_with(&["--requirepass", "hunter2"]);
    let url = server.url().replace("redis://", "redis://:hunter2@");
    let redis = Redis::connect(&url).await.unwrap();

    for bad in ["", "{jobs}", "jo}bs"] {
        let error = RedisStreams::open(&redis, bad, Duration::from_secs(1), 3).await.unwrap_err();
        assert!(matches!(&error, PaceError::Queue(QueueError::BadName { name }) if name == bad), "{error}");
        assert!(!error.is_transient(), "{error}");
    }

    let queue = RedisStreams::open(&redis, "jobs", Duration::from_secs(1), 3).await.unwrap();
    assert_eq!(queue.stream(), "{jobs}");
    queue.enqueue("a", "{}", 1).await.unwrap();
    // Another program's value where the queue keeps its attempts: Redis refuses, for good.
    server.cli(&["-a", "hunter2", "--no-auth-warning", "SET", "{jobs}:attempts", "x"]);
    let error = queue.take("w", 8).await.unwrap_err();
    let PaceError::Queue(QueueError::Command { action, stream, source }) = &error else { panic!("{error:?}") };
    assert_eq!((*action, stream.as_str()), ("read the items' attempts", "{jobs}"));
    assert!(matches!(source, BackendError::WrongType { key, .. } if key == "{jobs}:attempts"), "{source}");
    assert!(!error.is_transient(), "{error}");
    assert_eq!(queue.outstanding().await.unwrap(), 1, "a refused command opens no back-off");

    server.kill();
    let error = queue.enqueue("b", "{}", 1).await.unwrap_err();
    assert!(error.to_string().starts_with("queue: cannot add an item on stream \"{jobs}\""), "{error}");
    assert!(error.is_transient(), "nobody listening may be a restart: {error}");
    let error = queue.outstanding().await.unwrap_err();
    assert!(error.is_transient(), "backing off is transient: {error}");
    for shown in [error.to_string(), format!("{error:?}"), format!("{queue:?}")] {
        assert!(!shown.contains("hunter2"), "shows the password: {shown}");
    }
}

/// A hung Redis costs a queue call its deadline, not more; the decisions' shorter deadline on the
/// same connection is not the queue's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_call_waits_for_its_own_deadline() {
    let server = RedisServer::start();
    let options = RedisOptions { deadline: Duration::from_millis(1), ..Default::default() };
    let redis = Redis::connect_with(&server.url(), options).await.unwrap();
    let queue = RedisStreams::open(&redis, "jobs", Duration::from_secs(1), 3).await.unwrap();
    assert!(format!("{queue:?}").contains(&format!("deadline: {:?}", RedisStreams::DEFAULT_DEADLINE)), "{queue:?}");
    queue.enqueue("a", "{}", 1).await.unwrap();
    let queue = queue.with_deadline(Duration::from_millis(300));
    server.pause();
    let started = Instant::now();
    let error = queue.take("w", 8).await.unwrap_err();
    let took = started.elapsed();
    server.resume();
    let PaceError::Queue(QueueError::Command { source, .. }) = &error else { panic!("{error:?}") };
    assert!(matches!(source, BackendError::Timeout(d) if *d == Duration::from_millis(300)), "{source}");
    assert!(error.is_transient());
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(2), "took {took:?}");
}

/// On a Redis Cluster, queues whose keys live on different nodes take, fail, dead-letter and
/// acknowledge: every pipeline stays on its queue's hash tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_work_on_a_redis_cluster() {
    let cluster = RedisCluster::start(3);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let redis = Redis::connect_cluster(&urls, RedisOptions::default()).await.unwrap();
    for q in 0..6 {
        let queue = RedisStreams::open(&redis, &format!("jobs{q}"), Duration::from_secs(30), 1).await.unwrap();
        for key in ["ok", "bad"] {
            queue.enqueue(key, "{}", 1).await.unwrap();
        }
        let items = queue.take("w", 8).await.unwrap();
        assert_eq!(items.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(), ["ok", "bad"]);
        queue.ack(&items[0]).await.unwrap();
        assert!(queue.fail(&items[1], "refused").await.unwrap(), "dead-lettered at the first failure");
        assert_eq!(queue.outstanding().await.unwrap(), 0);
        assert!(queue.take("w", 8).await.unwrap().is_empty());
    }
    let per_node: Vec<u64> = cluster.nodes().iter().map(|n| n.cli(&["DBSIZE"]).parse().unwrap()).collect();
    assert!(per_node.iter().filter(|&&k| k > 0).count() >= 2, "queues on one node only: {per_node:?}");
}
