//! The pump against a throttled service, through a real redis-server: three workers sharing
//! partitions drain the queue with nothing lost, nothing done twice, few throttled calls; failures
//! and panics are retried then dead-lettered, never lost.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate::{Limiter, Quota, TokenBucket};
use tollgate_pace::{
    Budget, Handled, HandlerError, Item, Pacer, Partitions, Progress, PumpOptions, Queue, RedisStreams, pump,
};
use tollgate_redis::Redis;
use tollgate_testkit::RedisServer;

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
    let url = server.url();
    let queue = Arc::new(RedisStreams::open(&url, "jobs", Duration::from_secs(2), 3).await.unwrap());
    let items = 2000;
    for i in 0..items {
        queue.enqueue(&format!("item-{i}"), &format!("{{\"n\":{i}}}"), 1).await.unwrap();
    }
    let rate = 1000;
    let service = Service::new(rate);
    let budget = Budget::per_second(rate).unwrap();
    let redis = Redis::connect(&url).await.unwrap();
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
    let queue = Arc::new(RedisStreams::open(&server.url(), "jobs", Duration::from_millis(500), 2).await.unwrap());
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
    let dead = server.cli(&["XRANGE", "jobs:dead", "-", "+"]);
    assert!(dead.contains("attempt 2 refused"), "the last error is kept: {dead}");
    assert!(dead.contains("the handler panicked"), "{dead}");
    assert_eq!(queue.outstanding().await.unwrap(), 0, "nothing lost, nothing left");
}

#[tokio::test]
async fn unreachable_redis_is_a_clear_error() {
    let port = tollgate_testkit::free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let error = RedisStreams::open(&url, "jobs", Duration::from_secs(1), 3).await.err().unwrap();
    assert!(error.to_string().starts_with(&format!("queue: cannot connect to {url}")), "{error}");
    assert!(error.is_transient(), "nobody listening may be a restart: {error}");

    // With credentials in the URL: the error names the address, never the password.
    let secret = format!("redis://app:hunter2@127.0.0.1:{port}/0");
    let error = RedisStreams::open(&secret, "jobs", Duration::from_secs(1), 3).await.err().unwrap();
    assert!(error.to_string().contains(&format!("redis://***@127.0.0.1:{port}/0")), "{error}");
    for shown in [error.to_string(), format!("{error:?}")] {
        assert!(!shown.contains("hunter2"), "shows the password: {shown}");
    }
    let error = RedisStreams::open("redis://app:hunter2@127.0.0.1:notaport/", "jobs", Duration::from_secs(1), 3)
        .await
        .err()
        .unwrap();
    assert!(matches!(error, tollgate_pace::PaceError::Queue(tollgate_pace::QueueError::InvalidUrl { .. })), "{error}");
    assert!(!error.is_transient());
    assert!(!format!("{error} {error:?}").contains("hunter2"), "{error:?}");
}
