//! The pump against a real redis-server behind a fault proxy: Redis cut off in the middle of a
//! run (connections reset, new ones answered by nobody) is ridden out and every item is done
//! exactly once; a queue Redis refuses for good still ends the pump with that error.
//!
//! Real sockets need real time: the waits here are Redis's deadlines and back-off and the pump's
//! pauses, set in milliseconds, and each test fails (rather than hangs) past a deadline.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_pace::{
    Budget, Handled, Item, Jitter, PaceError, Pacer, Progress, PumpOptions, Queue, QueueError, RedisStreams, pump,
};
use tollgate_redis::{BackendError, Redis, RedisOptions};
use tollgate_testkit::{Fault, FaultProxy, RedisServer};

const ITEMS: usize = 200;

/// How long a test may take before it fails.
const DEADLINE: Duration = Duration::from_secs(30);

/// Items `item-0` .. `item-199` in the queue `jobs`, written straight to the server.
async fn fill(server: &RedisServer, idle: Duration) {
    let redis = Redis::connect(&server.url()).await.unwrap();
    let queue = RedisStreams::open(&redis, "jobs", idle, 3).await.unwrap();
    for i in 0..ITEMS {
        queue.enqueue(&format!("item-{i}"), "{}", 1).await.unwrap();
    }
}

fn options() -> PumpOptions {
    let mut options = PumpOptions::new("w");
    options.batch = 8;
    options.concurrency = 4;
    options.empty_poll = Duration::from_millis(10);
    options.outage = Duration::from_secs(10);
    options.jitter = Jitter::seeded(41);
    options
}

/// Handles each item once per delivery, counting its key; `at_50` runs when `item-50` is handled.
fn handler(
    done: Arc<Mutex<HashMap<String, u32>>>,
    at_50: impl Fn() + Send + Sync + 'static,
) -> impl Fn(Item) -> std::future::Ready<Handled> + Send + Sync + 'static {
    move |item: Item| {
        let first = {
            let mut done = done.lock().unwrap();
            let count = done.entry(item.key.clone()).or_default();
            *count += 1;
            *count == 1
        };
        if first && item.key == "item-50" {
            at_50();
        }
        std::future::ready(Handled::Done)
    }
}

/// Redis cut off while an item is being handled: its acknowledgement, and the next takes, fail
/// (a reset connection, then a partition: connections accepted, nothing answered) until the
/// proxy heals. The pump tries again and goes on; every item is done once and acknowledged, none
/// is left. Before, the failed acknowledgement was only logged: the item was reclaimed after the
/// idle timeout and done a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cut_off_mid_run_is_ridden_out_and_every_item_is_done_once() {
    let server = RedisServer::start();
    let upstream = server.url().trim_start_matches("redis://").trim_end_matches('/').parse().unwrap();
    let proxy = Arc::new(FaultProxy::start(upstream, 7).await.unwrap());
    // Longer than the cut lasts (well under a second), so that only a lost acknowledgement, not
    // an item still being handled, is delivered again.
    let idle = Duration::from_secs(3);
    fill(&server, idle).await;
    let redis_options = RedisOptions {
        deadline: Duration::from_millis(200),
        connect_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let redis = Redis::connect_with(&proxy.redis_url(), redis_options).await.unwrap();
    let queue =
        Arc::new(RedisStreams::open(&redis, "jobs", idle, 3).await.unwrap().with_deadline(Duration::from_millis(200)));
    let pacer = Arc::new(Pacer::builder(Budget::per_second(2000).unwrap()).build().unwrap());
    let progress = Arc::new(Progress::default());
    let done = Arc::new(Mutex::new(HashMap::new()));

    let cut = proxy.clone();
    let handler = handler(done.clone(), move || {
        cut.set(Fault::Blackhole);
        cut.reset();
    });
    // Heals once the pump has tried the queue again a few times.
    let (healer, watched) = (proxy.clone(), progress.clone());
    let heal = tokio::spawn(async move {
        while watched.queue_retries.load(Ordering::SeqCst) < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        healer.heal();
    });

    let started = Instant::now();
    let result = tokio::time::timeout(DEADLINE, pump(queue.clone(), pacer, options(), progress.clone(), handler))
        .await
        .expect("the pump hung");
    result.unwrap();
    assert!(heal.is_finished(), "the pump finished before the proxy healed");
    let done = done.lock().unwrap().clone();
    assert_eq!(done.len(), ITEMS, "every item handled");
    let twice: Vec<_> = done.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "handled more than once: {twice:?}");
    assert_eq!(progress.done.load(Ordering::SeqCst), ITEMS as u64, "every item acknowledged");
    assert_eq!(progress.unacknowledged.load(Ordering::SeqCst), 0);
    assert!(progress.queue_retries.load(Ordering::SeqCst) >= 3);
    assert_eq!(queue.outstanding().await.unwrap(), 0, "nothing left in the queue");
    println!(
        "{ITEMS} items through a cut in {:?}, {} queue retries",
        started.elapsed(),
        progress.queue_retries.load(Ordering::SeqCst)
    );
}

/// Another program's value where the queue keeps its attempts, written while an item is being
/// handled: Redis refuses the queue's commands (WRONGTYPE) for good, and the pump ends with that
/// error at once instead of trying again; every item was handled or is still in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_redis_refuses_for_good_still_ends_the_pump_with_its_error() {
    let server = Arc::new(RedisServer::start());
    let idle = Duration::from_secs(30);
    fill(&server, idle).await;
    let redis = Redis::connect(&server.url()).await.unwrap();
    let queue = Arc::new(RedisStreams::open(&redis, "jobs", idle, 3).await.unwrap());
    // 4 items per 10 ms: the run takes half a second, so items are still queued when the value is
    // written (a whole slice of a faster pacer goes before redis-cli has started).
    let budget = Budget::per_second(400).unwrap();
    let pacer = Arc::new(Pacer::builder(budget).granularity(Duration::from_millis(10)).build().unwrap());
    let progress = Arc::new(Progress::default());
    let done = Arc::new(Mutex::new(HashMap::new()));
    let spoiler = server.clone();
    let handler = handler(done.clone(), move || {
        spoiler.cli(&["SET", "{jobs}:attempts", "not a hash"]);
    });

    let started = Instant::now();
    let result = tokio::time::timeout(DEADLINE, pump(queue.clone(), pacer, options(), progress.clone(), handler))
        .await
        .expect("the pump hung");
    let error = result.unwrap_err();
    let PaceError::Queue(QueueError::Command { source, .. }) = &error else { panic!("{error:?}") };
    assert!(matches!(source, BackendError::WrongType { key, .. } if key == "{jobs}:attempts"), "{source}");
    assert!(!error.is_transient());
    assert_eq!(progress.queue_retries.load(Ordering::SeqCst), 0, "a refusal is not tried again");
    assert!(started.elapsed() < Duration::from_secs(2), "ended after {:?}", started.elapsed());
    let done = done.lock().unwrap().clone();
    assert!(done.values().all(|&n| n == 1), "none handled twice: {done:?}");
    let left: usize = server.cli(&["XLEN", "{jobs}"]).trim().parse().unwrap();
    assert!(done.len() < ITEMS, "stopped before the end");
    assert!(done.len() + left >= ITEMS, "{} handled, {left} left: items lost", done.len());
}
