//! The distributed semaphore against a real `redis-server` per test: capacity under contention,
//! FIFO, max_wait, release, lease expiry, a dead waiter, Redis failures, and 8 OS processes
//! (this test binary re-executed in a child mode) some of which are SIGKILLed while holding.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate::Reason;
use tollgate_redis::{Redis, RedisOptions, RedisSemaphore, SemaphoreConfigError};
use tollgate_testkit::RedisServer;

/// A connection with a deadline that tolerates a busy 2-core test machine.
async fn connect(url: &str) -> Redis {
    let options = RedisOptions { deadline: Duration::from_millis(750), ..RedisOptions::default() };
    Redis::connect_with(url, options).await.unwrap()
}

fn semaphore(redis: &Redis, name: &str, capacity: u64, ttl_ms: u64) -> RedisSemaphore {
    RedisSemaphore::builder(redis, name, capacity).lease_ttl(Duration::from_millis(ttl_ms)).build().unwrap()
}

/// Polls a condition (not a clock): fails after `timeout`.
async fn eventually<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn waiting(sem: &RedisSemaphore) -> u64 {
    sem.state().await.unwrap().waiting
}

#[tokio::test]
async fn bad_configuration_is_an_error_naming_it() {
    let server = RedisServer::start();
    let redis = connect(&server.url()).await;
    let err = RedisSemaphore::new(&redis, "jobs", 0).unwrap_err();
    assert_eq!(err, SemaphoreConfigError::ZeroCapacity { name: "jobs".into() });
    assert!(err.to_string().contains("capacity must be at least 1"), "{err}");
    for name in ["", "a{b", "a}b"] {
        let err = RedisSemaphore::new(&redis, name, 1).unwrap_err();
        assert!(matches!(err, SemaphoreConfigError::BadName { .. }), "{name:?}: {err}");
    }
    let err = RedisSemaphore::builder(&redis, "jobs", 1).lease_ttl(Duration::from_millis(5)).build().unwrap_err();
    assert!(matches!(err, SemaphoreConfigError::TtlTooShort { .. }), "{err}");
    assert!(err.to_string().contains("5ms"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_is_respected_under_contention_on_separate_connections() {
    let server = RedisServer::start();
    let url = server.url();
    const CAPACITY: u64 = 3;
    const TASKS: usize = 16;
    const ROUNDS: usize = 6;
    let holding = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (url, holding, most, tokens) = (url.clone(), holding.clone(), most.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let redis = connect(&url).await;
            let sem = semaphore(&redis, "contended", CAPACITY, 2000);
            for round in 0..ROUNDS {
                let guard = sem.acquire().await.unwrap();
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokens.lock().unwrap().push(guard.fencing_token());
                // The "work": a round trip that also checks Redis's own count.
                let state = sem.state().await.unwrap();
                assert!(state.holders <= CAPACITY, "{state:?}");
                tokio::task::yield_now().await;
                holding.fetch_sub(1, Ordering::SeqCst);
                if (t + round) % 2 == 0 {
                    assert!(guard.release().await.unwrap());
                } else {
                    drop(guard);
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), CAPACITY, "never more than the capacity, and contended enough to fill it");
    let mut tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), TASKS * ROUNDS);
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), TASKS * ROUNDS, "fencing tokens are unique");
    let redis = connect(&url).await;
    let sem = semaphore(&redis, "contended", CAPACITY, 2000);
    eventually("the dropped guards' releases", Duration::from_secs(3), || async {
        let s = sem.state().await.unwrap();
        s.holders == 0 && s.waiting == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_arrival_order() {
    let server = RedisServer::start();
    let redis = connect(&server.url()).await;
    let other = connect(&server.url()).await;
    // Two semaphore values (two wake-up lists, two connections) on one name: one queue.
    let a = semaphore(&redis, "fifo", 1, 1000);
    let b = semaphore(&other, "fifo", 1, 1000);
    let first = a.try_acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6u64 {
        let sem = if i % 2 == 0 { a.clone() } else { b.clone() };
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let guard = sem.acquire().await.unwrap();
            order.lock().unwrap().push((i, guard.fencing_token()));
            guard.release().await.unwrap();
        }));
        eventually("the waiter to queue", Duration::from_secs(3), || async { waiting(&a).await == i + 1 }).await;
    }
    // A newcomer cannot jump the queue, even with try_acquire.
    assert_eq!(b.try_acquire().await.unwrap_err().reason(), Reason::Exhausted);
    assert!(first.release().await.unwrap());
    for task in tasks {
        task.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 5]);
    assert!(order.windows(2).all(|w| w[0].1 < w[1].1), "tokens grow: {order:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_join_in_the_order_acquire_was_called_not_polled() {
    let server = RedisServer::start();
    let redis = connect(&server.url()).await;
    let sem = semaphore(&redis, "call-order", 1, 2000);
    let holder = sem.try_acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    // Futures made in order 0..32, spawned (first polled) in reverse.
    let futures: Vec<_> = (0..32).map(|i| (i, sem.acquire())).collect();
    let mut tasks = Vec::new();
    for (i, acquire) in futures.into_iter().rev() {
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let guard = acquire.await.unwrap();
            order.lock().unwrap().push(i);
            guard.release().await.unwrap();
        }));
    }
    eventually("all to queue", Duration::from_secs(5), || async { waiting(&sem).await == 32 }).await;
    holder.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..32).collect::<Vec<_>>());
}

#[tokio::test]
async fn try_acquire_does_not_take_a_slot_promised_to_a_waiter() {
    let server = RedisServer::start();
    let redis = connect(&server.url()).await;
    let sem = semaphore(&redis, "promised", 1, 1000);
    let holder = sem.try_acquire().await.unwrap();
    let waiter = tokio::spawn({
        let sem = sem.clone();
        // The task's output keeps the guard (and its slot) until it is awaited.
        async move { sem.acquire().await }
    });
    eventually("the waiter to queue", Duration::from_secs(3), || async { waiting(&sem).await == 1 }).await;
    holder.release().await.unwrap();
    // Whether or not the waiter has taken it yet, the slot is the waiter's.
    let newcomer = sem.try_acquire().await.unwrap_err();
    assert_eq!(newcomer.reason(), Reason::Exhausted);
    assert_eq!(newcomer.retry_after(), None, "only a release can free a slot");
    let guard = waiter.await.unwrap().unwrap();
    assert!(guard.fencing_token() > 0);
}

#[tokio::test]
async fn max_wait_rejects_without_taking_a_slot() {
    let server = RedisServer::start();
    let redis = connect(&server.url()).await;
    let sem = semaphore(&redis, "bounded", 1, 600);
    let patient = RedisSemaphore::builder(&redis, "bounded", 1)
        .lease_ttl(Duration::from_millis(600))
        .max_wait(Duration::from_millis(150))
        .build()
        .unwrap();
    let holder = sem.try_acquire().await.unwrap();
    let start = Instant::now();
    let no = patient.acquire().await.unwrap_err();
    let waited = start.elapsed();
    assert_eq!(no.reason(), Reason::MaxWait);
    assert_eq!(no.limit(), 1);
    assert!(waited >= Duration::from_millis(150) && waited < Duration::from_millis(450), "{waited:?}");
    let state = sem.state().await.unwrap();
    assert_eq!((state.holders, state.waiting), (1, 0), "left the queue, took nothing");
    assert!(holder.release().await.unwrap());
    let guard = patient.try_acquire().await.unwrap();
    assert_eq!(sem.state().await.unwrap().holders, 1);
    drop(guard);
}

#[tokio::test]
async fn cancelled_acquire_leaves_the_queue() {
    let server = RedisServer::start();
    let redis = connect(&server.url()).await;
    let sem = semaphore(&redis, "cancel", 1, 1000);
    let holder = sem.try_acquire().await.unwrap();
    let cancelled = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await.map(drop) }
    });
    eventually("the waiter to queue", Duration::from_secs(3), || async { waiting(&sem).await == 1 }).await;
    cancelled.abort();
    eventually("the cancelled waiter to leave", Duration::from_secs(3), || async { waiting(&sem).await == 0 }).await;
    // The next waiter is served as soon as the slot frees, not after the cancelled one lapses.
    let next = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await.map(|g| g.fencing_token()) }
    });
    eventually("the next waiter to queue", Duration::from_secs(3), || async { waiting(&sem).await == 1 }).await;
    let start = Instant::now();
    holder.release().await.unwrap();
    next.await.unwrap().unwrap();
    assert!(start.elapsed() < Duration::from_millis(250), "woken promptly: {:?}", start.elapsed());
}

#[tokio::test]
async fn a_waiter_does_not_poll_and_is_woken_by_the_release() {
    let server = RedisServer::start();
    let redis = connect(&server.url()).await;
    // Default TTL (10 s): renewals and heartbeats every 3.3 s.
    let sem = RedisSemaphore::new(&redis, "quiet", 1).unwrap();
    let holder = sem.try_acquire().await.unwrap();
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await.map(|g| g.fencing_token()) }
    });
    eventually("the waiter to queue", Duration::from_secs(3), || async { waiting(&sem).await == 1 }).await;
    let before = server.calls("evalsha");
    // The observation window: a polling waiter would run scripts during it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.calls("evalsha"), before, "no script ran while the waiter waited");
    let start = Instant::now();
    holder.release().await.unwrap();
    waiter.await.unwrap().unwrap();
    let woken = start.elapsed();
    assert!(woken < Duration::from_millis(100), "woken by the release, not a timer: {woken:?}");
}

#[tokio::test]
async fn release_on_drop_and_explicit_release_and_keys_expire() {
    let server = RedisServer::start();
    let redis = connect(&server.url()).await;
    let sem = semaphore(&redis, "release", 2, 500);
    let a = sem.try_acquire().await.unwrap();
    let b = sem.try_acquire().await.unwrap();
    assert_eq!((a.limit(), b.remaining()), (2, 0));
    assert!(a.fencing_token() < b.fencing_token());
    let full = sem.try_acquire().await.unwrap_err();
    assert_eq!(full.reason(), Reason::Exhausted);
    let first = a.fencing_token();
    assert!(a.release().await.unwrap(), "explicit release of a held lease");
    let c = sem.try_acquire().await.unwrap();
    assert!(c.fencing_token() > b.fencing_token());
    // A waiter is woken by the release a dropped guard spawns.
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await.map(|g| g.fencing_token()) }
    });
    eventually("the waiter to queue", Duration::from_secs(3), || async { waiting(&sem).await == 1 }).await;
    let start = Instant::now();
    drop(b);
    let d = waiter.await.unwrap().unwrap();
    assert!(start.elapsed() < Duration::from_millis(250), "woken by the drop's release: {:?}", start.elapsed());
    assert!(d > c.fencing_token());
    drop(c);
    eventually("every key to go", Duration::from_secs(3), || async { server.cli(&["DBSIZE"]) == "0" }).await;
    // Tokens keep growing after the counter went with the other keys.
    let e = sem.try_acquire().await.unwrap();
    assert!(e.fencing_token() > d, "{} > {d} > {first}", e.fencing_token());
}

/// Runs `body` on a thread with its own current-thread runtime, which `body` may freeze with a
/// blocking call (as a stalled or stopped process would be).
fn on_own_runtime<F>(body: impl FnOnce() -> F + Send + 'static) -> std::thread::JoinHandle<()>
where
    F: Future<Output = ()>,
{
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(body());
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_lease_expires_its_slot_is_reused_and_a_late_renewal_is_refused() {
    let server = RedisServer::start();
    let url = server.url();
    const TTL: Duration = Duration::from_millis(400);
    let (frozen_tx, frozen_rx) = tokio::sync::oneshot::channel();
    let (thaw_tx, thaw_rx) = std::sync::mpsc::channel::<()>();
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel();
    let stalled = on_own_runtime(move || async move {
        let redis = connect(&url).await;
        let sem = semaphore(&redis, "stall", 1, TTL.as_millis() as u64);
        let guard = sem.acquire().await.unwrap();
        frozen_tx.send(guard.fencing_token()).unwrap();
        // The runtime stops here: nothing renews the lease (a stopped VM, a blocked executor).
        thaw_rx.recv().unwrap();
        let noticed = tokio::time::timeout(Duration::from_secs(2), guard.lost()).await.is_ok();
        lost_tx.send((noticed, guard.is_lost(), guard.release().await.unwrap())).unwrap();
    });
    let stale_token = frozen_rx.await.unwrap();
    let frozen_at = Instant::now();
    let redis = connect(&server.url()).await;
    let sem =
        RedisSemaphore::builder(&redis, "stall", 1).lease_ttl(TTL).max_wait(Duration::from_secs(3)).build().unwrap();
    let guard = sem.acquire().await.unwrap();
    let reused_after = frozen_at.elapsed();
    assert!(reused_after >= TTL - Duration::from_millis(60), "not before the lease expired: {reused_after:?}");
    assert!(reused_after <= TTL + TTL / 3, "within TTL + one renew interval: {reused_after:?}");
    assert!(guard.fencing_token() > stale_token);
    thaw_tx.send(()).unwrap();
    let (noticed, is_lost, was_held) = lost_rx.await.unwrap();
    assert!(noticed && is_lost, "the late renewal was refused and the guard reports it");
    assert!(!was_held, "nothing to release: the lease had expired");
    let state = sem.state().await.unwrap();
    assert_eq!(state.holders, 1, "the stale holder did not come back");
    assert!(!guard.is_lost());
    stalled.join().unwrap();
}

#[tokio::test]
async fn a_held_lease_is_renewed_for_as_long_as_the_work_runs() {
    let server = RedisServer::start();
    let redis = connect(&server.url()).await;
    let sem = semaphore(&redis, "long", 1, 120);
    let guard = sem.acquire().await.unwrap();
    // Work that outlasts the TTL 2.5 times (the behaviour under test is the renewal).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!guard.is_lost());
    assert_eq!(sem.try_acquire().await.unwrap_err().reason(), Reason::Exhausted);
    assert!(guard.release().await.unwrap(), "still held when released");
}

#[tokio::test]
async fn a_lease_that_vanishes_from_redis_is_reported_lost() {
    let server = RedisServer::start();
    let redis = connect(&server.url()).await;
    let sem = semaphore(&redis, "vanish", 1, 300);
    let guard = sem.acquire().await.unwrap();
    assert!(!guard.is_lost());
    assert_eq!(server.cli(&["DEL", "tollgate:semaphore:{vanish}:holders"]), "1");
    tokio::time::timeout(Duration::from_secs(1), guard.lost()).await.expect("lost within a renew interval");
    assert!(guard.is_lost());
    assert!(!guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_keeps_its_place_only_until_its_heartbeat_lapses() {
    let server = RedisServer::start();
    let url = server.url();
    const TTL: Duration = Duration::from_millis(400);
    let redis = connect(&url).await;
    let sem = RedisSemaphore::builder(&redis, "deadwaiter", 1)
        .lease_ttl(TTL)
        .max_wait(Duration::from_secs(3))
        .build()
        .unwrap();
    let holder = sem.try_acquire().await.unwrap();
    let (freeze_tx, freeze_rx) = tokio::sync::oneshot::channel::<()>();
    let (frozen_tx, frozen_rx) = tokio::sync::oneshot::channel::<()>();
    let (thaw_tx, thaw_rx) = std::sync::mpsc::channel::<()>();
    let dead = on_own_runtime(move || async move {
        let redis = connect(&url).await;
        let sem = semaphore(&redis, "deadwaiter", 1, TTL.as_millis() as u64);
        let acquire = sem.acquire();
        tokio::pin!(acquire);
        tokio::select! {
            r = &mut acquire => panic!("the slot is held: {r:?}"),
            _ = freeze_rx => {}
        }
        frozen_tx.send(()).unwrap();
        // Frozen with the acquire pending: no heartbeat, no wake-up handling.
        thaw_rx.recv().unwrap();
    });
    eventually("the doomed waiter to queue", Duration::from_secs(3), || async { waiting(&sem).await == 1 }).await;
    freeze_tx.send(()).unwrap();
    frozen_rx.await.unwrap();
    let frozen_at = Instant::now();
    let behind = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await.map(|g| (g.fencing_token(), Instant::now())) }
    });
    eventually("the second waiter to queue", Duration::from_secs(3), || async { waiting(&sem).await == 2 }).await;
    holder.release().await.unwrap();
    let (_, granted_at) = behind.await.unwrap().unwrap();
    let after = granted_at - frozen_at;
    // The dead waiter was entitled to the slot until its last heartbeat (at most TTL/3 before it
    // froze) lapsed; then the next one got it.
    assert!(after >= TTL / 2, "the dead waiter kept its place for a while: {after:?}");
    assert!(after <= TTL + TTL / 3, "but not longer than its heartbeat TTL: {after:?}");
    thaw_tx.send(()).unwrap();
    dead.join().unwrap();
}

#[tokio::test]
async fn redis_failure_is_reported_as_unavailable_not_as_limited() {
    let mut server = RedisServer::start();
    let redis = connect(&server.url()).await;
    let sem = RedisSemaphore::builder(&redis, "down", 2)
        .lease_ttl(Duration::from_millis(300))
        .max_wait(Duration::from_secs(1))
        .build()
        .unwrap();
    let held = sem.try_acquire().await.unwrap();
    server.kill();
    assert_eq!(sem.try_acquire().await.unwrap_err().reason(), Reason::Unavailable);
    let start = Instant::now();
    assert_eq!(sem.acquire().await.unwrap_err().reason(), Reason::Unavailable);
    assert!(start.elapsed() < Duration::from_millis(900), "fails fast, not at max_wait");
    tokio::time::timeout(Duration::from_secs(2), held.lost()).await.expect("an unrenewable lease is lost by its TTL");
    server.restart();
    eventually("redis to be used again", Duration::from_secs(3), || async { sem.try_acquire().await.is_ok() }).await;
}

// ---------------------------------------------------------------------------------------------
// 8 OS processes, capacity 3, some SIGKILLed while holding.

const CHILD_ENV: &str = "TOLLGATE_SEMAPHORE_CHILD";
const CRASH_TTL: Duration = Duration::from_millis(450);
const CRASH_CAPACITY: u64 = 3;
const WORKERS: usize = 5;
const VICTIMS: usize = 3;

/// Appends "<what> <Redis TIME in µs>" to the log and pokes the parent, atomically.
const RECORD: &str = "local t = redis.call('TIME') \
     local us = tonumber(t[1]) * 1000000 + tonumber(t[2]) \
     redis.call('RPUSH', KEYS[1], ARGV[1] .. ' ' .. string.format('%.0f', us)) \
     redis.call('RPUSH', KEYS[2], '1') \
     return us";

/// A plain connection whose blocking pops may outlast the client's default 500 ms response timeout.
async fn plain_connection(url: &str) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    redis::Client::open(url).unwrap().get_multiplexed_async_connection_with_config(&config).await.unwrap()
}

async fn record(conn: &mut redis::aio::MultiplexedConnection, what: &str) {
    redis::Script::new(RECORD).key("crash:log").key("crash:poke").arg(what).invoke_async::<i64>(conn).await.unwrap();
}

/// Not a test on its own: the body of a child process of
/// `eight_processes_capacity_three_some_killed_while_holding` (does nothing unless re-executed
/// with `TOLLGATE_SEMAPHORE_CHILD` set).
#[tokio::test]
async fn semaphore_child_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return };
    let mut parts = spec.split(' ');
    let (url, role, child) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
    if role == "holder" {
        return hold_and_report(url, child).await;
    }
    let redis = connect(url).await;
    let sem = semaphore(&redis, "crash", CRASH_CAPACITY, CRASH_TTL.as_millis() as u64);
    let mut log = plain_connection(url).await;
    let mut rng = Lcg(std::process::id() as u64 * 7919 + child.len() as u64);
    if role == "victim" {
        let _: Option<(String, String)> =
            redis::cmd("BLPOP").arg(format!("crash:go:{child}")).arg(30).query_async(&mut log).await.unwrap();
        let guard = sem.acquire().await.unwrap();
        record(&mut log, &format!("S {child} 0")).await;
        let _: i64 =
            redis::cmd("RPUSH").arg(format!("crash:holding:{child}")).arg(1).query_async(&mut log).await.unwrap();
        // Holds until SIGKILLed (the parent gives up long before this).
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(guard);
        return;
    }
    let mut failures = 0;
    for seq in 0.. {
        let stop: Option<String> = redis::cmd("GET").arg("crash:stop").query_async(&mut log).await.unwrap();
        if stop.is_some() {
            break;
        }
        let guard = match sem.acquire().await {
            Ok(guard) => guard,
            Err(no) => {
                failures += 1;
                assert!(failures < 50, "redis keeps failing: {no}");
                continue;
            }
        };
        record(&mut log, &format!("S {child} {seq}")).await;
        // The critical section: random length, well below the TTL and above it in sum.
        tokio::time::sleep(Duration::from_millis(10 + rng.next(70))).await;
        let what = if guard.is_lost() { "L" } else { "E" };
        record(&mut log, &format!("{what} {child} {seq}")).await;
        if seq % 2 == 0 {
            guard.release().await.unwrap();
        } else {
            drop(guard);
        }
    }
}

struct Lcg(u64);
impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound
    }
}

/// Kills every child still running if the test fails half-way.
struct Children(Vec<Child>);
impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[derive(Debug, Default)]
struct Timeline {
    /// Most critical sections open at one instant.
    max_holders: usize,
    /// Per kill: µs from the SIGKILL to the first instant 3 live holders hold again.
    returned_after_us: Vec<Option<u64>>,
    holds: usize,
    lost: usize,
}

/// Rebuilds every hold interval from the log (Redis TIME µs): a hold runs from its "S" to its
/// "E"/"L", or to its holder's "K" (SIGKILL) when it never ended.
fn analyse(log: &[String]) -> Timeline {
    let mut starts: HashMap<(String, String), u64> = HashMap::new();
    let mut ends: HashMap<(String, String), u64> = HashMap::new();
    let mut kills: BTreeMap<u64, String> = BTreeMap::new();
    let mut lost = 0;
    for line in log {
        let f: Vec<&str> = line.split(' ').collect();
        match f[0] {
            "S" => drop(starts.insert((f[1].into(), f[2].into()), f[3].parse().unwrap())),
            "E" | "L" => {
                lost += usize::from(f[0] == "L");
                ends.insert((f[1].into(), f[2].into()), f[3].parse().unwrap());
            }
            "K" => drop(kills.insert(f[2].parse().unwrap(), f[1].into())),
            other => panic!("bad log line {other}"),
        }
    }
    let killed_at: HashMap<&String, u64> = kills.iter().map(|(t, c)| (c, *t)).collect();
    // (time, +1 start / -1 end); ends sort before starts at the same µs.
    let mut events: Vec<(u64, i32)> = Vec::new();
    for (key, &s) in &starts {
        events.push((s, 1));
        if let Some(&e) = ends.get(key).or(killed_at.get(&key.0)) {
            events.push((e, -1));
        }
    }
    events.sort_unstable();
    let mut timeline = Timeline { holds: starts.len(), lost, ..Timeline::default() };
    let mut open = 0usize;
    let mut full_at: Vec<u64> = Vec::new();
    for (t, d) in events {
        open = (open as i64 + d as i64) as usize;
        timeline.max_holders = timeline.max_holders.max(open);
        if open == CRASH_CAPACITY as usize {
            full_at.push(t);
        }
    }
    for &k in kills.keys() {
        timeline.returned_after_us.push(full_at.iter().find(|&&t| t >= k).map(|t| t - k));
    }
    timeline
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_capacity_three_some_killed_while_holding() {
    let server = RedisServer::start();
    let url = server.url();
    let exe = std::env::current_exe().unwrap();
    let spawn = |role: &str, child: usize| {
        Command::new(&exe)
            .args(["semaphore_child_process", "--exact", "--nocapture", "--test-threads", "1"])
            .env(CHILD_ENV, format!("{url} {role} {child}"))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    };
    let mut children = Children(Vec::new());
    for child in 0..WORKERS {
        children.0.push(spawn("worker", child));
    }
    for victim in 0..VICTIMS {
        children.0.push(spawn("victim", WORKERS + victim));
    }
    let mut conn = plain_connection(&url).await;
    let redis = connect(&url).await;
    let sem = semaphore(&redis, "crash", CRASH_CAPACITY, CRASH_TTL.as_millis() as u64);
    let started = Instant::now();
    let mut rng = Lcg(42);
    for victim in WORKERS..WORKERS + VICTIMS {
        let _: i64 = redis::cmd("RPUSH").arg(format!("crash:go:{victim}")).arg(1).query_async(&mut conn).await.unwrap();
        let holding: Option<(String, String)> =
            redis::cmd("BLPOP").arg(format!("crash:holding:{victim}")).arg(10).query_async(&mut conn).await.unwrap();
        assert!(holding.is_some(), "victim {victim} never got a slot");
        // Kill at a random point: before its first renewal or after one or two.
        tokio::time::sleep(Duration::from_millis(rng.next(CRASH_TTL.as_millis() as u64))).await;
        let child = &mut children.0[victim];
        child.kill().unwrap();
        child.wait().unwrap();
        record(&mut conn, &format!("K {victim}")).await;
        // Wait (on the children's log) until its slot is back in use before killing the next.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let log: Vec<String> =
                redis::cmd("LRANGE").arg("crash:log").arg(0).arg(-1).query_async(&mut conn).await.unwrap();
            let t = analyse(&log);
            assert!(t.max_holders <= CRASH_CAPACITY as usize, "{t:?}");
            if t.returned_after_us.last().copied().flatten().is_some() {
                break;
            }
            assert!(Instant::now() < deadline, "victim {victim}'s slot never returned: {t:?}");
            let state = sem.state().await.unwrap();
            assert!(state.holders <= CRASH_CAPACITY, "{state:?}");
            let _: Option<(String, String)> =
                redis::cmd("BLPOP").arg("crash:poke").arg(1).query_async(&mut conn).await.unwrap();
        }
    }
    let _: () = redis::cmd("SET").arg("crash:stop").arg(1).query_async(&mut conn).await.unwrap();
    for child in &mut children.0[..WORKERS] {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "a worker failed: {status}");
                break;
            }
            assert!(Instant::now() < deadline, "a worker did not stop");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let log: Vec<String> = redis::cmd("LRANGE").arg("crash:log").arg(0).arg(-1).query_async(&mut conn).await.unwrap();
    let t = analyse(&log);
    let bound = CRASH_TTL + CRASH_TTL / 3;
    eprintln!(
        "8 processes, capacity 3, ttl {CRASH_TTL:?}: {} holds ({} lost) in {:?}; most holders at once {}; \
         killed holders' slots back in use after {:?} µs (bound {} µs)",
        t.holds,
        t.lost,
        started.elapsed(),
        t.max_holders,
        t.returned_after_us,
        bound.as_micros()
    );
    assert_eq!(t.max_holders, CRASH_CAPACITY as usize, "never more than 3, and contended enough to reach 3");
    assert_eq!(t.returned_after_us.len(), VICTIMS);
    for after in &t.returned_after_us {
        let after = after.expect("every killed holder's slot returned");
        assert!(after <= bound.as_micros() as u64, "slot returned after {after} µs > {bound:?}");
    }
    let state = sem.state().await.unwrap();
    assert_eq!((state.holders, state.waiting), (0, 0), "{state:?}");
}

// --- Fault scenario 3: holders SIGKILLed at random while Redis is paused (SIGSTOP) for 2 s. ---
//
// The log cannot go through Redis (it is paused): each holder prints what it believes on stdout,
// timed by the wall clock all processes of this machine share. A holder believes it holds from
// the grant it received ("G") until it decides to release ("R", printed before the release is
// sent), learns the lease was lost ("L"), or is killed (the parent notes when).

const PAUSED_CAPACITY: u64 = 3;
/// Starts each line a holder child reports (G granted, R released, L lost).
const HOLD_MARK: &str = "hold: ";
/// Shorter than the pause: every lease held when Redis stops is lost during it.
const PAUSED_TTL: Duration = Duration::from_millis(1000);

fn wall_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// The child's loop: take a slot, hold it 10-80 ms (one hold in ten: 3 s, longer than the pause),
/// print each step; until killed.
async fn hold_and_report(url: &str, child: &str) {
    let options = RedisOptions { deadline: Duration::from_millis(750), ..RedisOptions::default() };
    // Started while Redis is paused, it waits for Redis like any client would.
    let redis = loop {
        match Redis::connect_with(url, options.clone()).await {
            Ok(redis) => break redis,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let sem = semaphore(&redis, "paused", PAUSED_CAPACITY, PAUSED_TTL.as_millis() as u64);
    let mut rng = Lcg(std::process::id() as u64 * 104729);
    loop {
        let guard = match sem.acquire().await {
            Ok(guard) => guard,
            // Redis paused or restarting: ask again (acquire itself waited its deadline).
            Err(_) => continue,
        };
        let token = guard.fencing_token();
        println!("{HOLD_MARK}G {child} {token} {}", wall_ns());
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(if rng.next(10) == 0 { 3000 } else { 10 + rng.next(70) })) => {
                println!("{HOLD_MARK}R {child} {token} {}", wall_ns());
                let _ = guard.release().await;
            }
            _ = guard.lost() => println!("{HOLD_MARK}L {child} {token} {}", wall_ns()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_killed_at_random_and_a_paused_redis_never_exceed_capacity() {
    use std::io::BufRead;
    use tollgate_testkit::{Hold, max_holders};
    let full = std::env::var_os("TOLLGATE_FAULTS_FULL").is_some_and(|v| v != "0");
    let (kill_every, faults_for) = if full {
        (Duration::from_millis(300), Duration::from_secs(30))
    } else {
        (Duration::from_millis(500), Duration::from_secs(5))
    };
    let server = RedisServer::start();
    let url = server.url();
    let exe = std::env::current_exe().unwrap();
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let spawn = |child: usize| {
        let mut process = Command::new(&exe)
            .args(["semaphore_child_process", "--exact", "--nocapture", "--test-threads", "1"])
            .env(CHILD_ENV, format!("{url} holder {child}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let (out, lines) = (process.stdout.take().unwrap(), lines.clone());
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                // The harness prints "test semaphore_child_process ... " with no newline before
                // the child's first line: find the marker anywhere, or the first grant is lost.
                if let Some(at) = line.find(HOLD_MARK) {
                    lines.lock().unwrap().push(line[at + HOLD_MARK.len()..].to_owned());
                }
            }
        });
        process
    };
    let mut children = Children((0..8).map(spawn).collect());
    // The child number of the process in each slot.
    let mut ids: Vec<usize> = (0..8).collect();
    let mut kills: Vec<(usize, u64)> = Vec::new();
    let mut rng = Lcg(3);
    let started = Instant::now();
    let (pause_at, resume_at) = (faults_for / 3, faults_for / 3 + Duration::from_secs(2));
    let mut paused = false;
    let mut next_child = 8;
    let mut last_fault = wall_ns();
    while started.elapsed() < faults_for {
        tokio::time::sleep(kill_every).await;
        let at = started.elapsed();
        if !paused && at >= pause_at && at < resume_at {
            server.pause();
            paused = true;
        } else if paused && at >= resume_at {
            server.resume();
            paused = false;
            last_fault = wall_ns();
        }
        let slot = rng.next(children.0.len() as u64) as usize;
        children.0[slot].kill().unwrap();
        children.0[slot].wait().unwrap();
        last_fault = last_fault.max(wall_ns());
        kills.push((ids[slot], wall_ns()));
        // The replacement is a new process with a new child number.
        children.0[slot] = spawn(next_child);
        ids[slot] = next_child;
        next_child += 1;
    }
    if paused {
        server.resume();
        last_fault = wall_ns();
    }
    // Quiet: the holders run undisturbed for a TTL and 2 s more.
    tokio::time::sleep(PAUSED_TTL + Duration::from_secs(2)).await;
    let end = wall_ns();
    drop(children);
    let lines = lines.lock().unwrap().clone();

    // Holds from the holders' own words, closed at a kill or at the end.
    let mut open: HashMap<String, (u64, u64)> = HashMap::new();
    let mut holds = Vec::new();
    let (mut grants, mut lost) = (0, 0);
    for line in &lines {
        let f: Vec<&str> = line.split(' ').collect();
        let (child, token, at): (String, u64, u64) = (f[1].into(), f[2].parse().unwrap(), f[3].parse().unwrap());
        if f[0] == "G" {
            grants += 1;
            open.insert(child, (token, at));
        } else if let Some((token, from_ns)) = open.remove(&child) {
            lost += usize::from(f[0] == "L");
            holds.push(Hold { from_ns, until_ns: at, token });
        }
    }
    let killed_at: HashMap<String, u64> = kills.iter().map(|(c, at)| (c.to_string(), *at)).collect();
    for (child, (token, from_ns)) in open {
        holds.push(Hold { from_ns, until_ns: killed_at.get(&child).copied().unwrap_or(end), token });
    }
    let most = max_holders(&holds);
    // Full again: the first instant after the last fault at which 3 holders hold.
    let mut edges: Vec<(u64, i64)> = holds.iter().flat_map(|h| [(h.from_ns, 1), (h.until_ns, -1)]).collect();
    edges.sort_unstable();
    let mut now = 0;
    let full_again = edges.iter().find_map(|&(at, step)| {
        now += step;
        (at >= last_fault && now == PAUSED_CAPACITY as i64).then(|| Duration::from_nanos(at - last_fault))
    });
    let mut tokens: Vec<u64> = holds.iter().map(|h| h.token).collect();
    tokens.sort_unstable();
    let distinct = tokens.windows(2).all(|w| w[0] < w[1]);
    eprintln!(
        "semaphore, capacity {PAUSED_CAPACITY}, ttl {PAUSED_TTL:?}: {} kills, Redis paused 2 s; {grants} grants, {lost} \
         leases lost; most holders at once {most}; full capacity again {full_again:?} after the last fault",
        kills.len()
    );
    assert!(most <= PAUSED_CAPACITY as usize, "{most} holders at once");
    assert!(distinct, "a fencing token was given twice");
    let recovery = PAUSED_TTL + Duration::from_secs(1);
    assert!(
        full_again.is_some_and(|d| d <= recovery),
        "full capacity again {full_again:?} after the last fault, more than the lease TTL + 1 s ({recovery:?})"
    );
}

/// Immediate grants (free slots, nobody waiting) follow the order `acquire` was called, not the
/// order the futures are polled: the fencing tokens grow in call order, cold (scripts not yet
/// loaded) and warm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_grants_follow_the_call_order_not_the_poll_order() {
    let server = RedisServer::start();
    let redis = connect(&server.url()).await;
    for round in 0..20 {
        let sem = semaphore(&redis, &format!("immediate-{round}"), 5, 2000);
        let futures: Vec<_> = (0..3).map(|i| (i, sem.acquire())).collect();
        let mut tasks = Vec::new();
        for (i, acquire) in futures.into_iter().rev() {
            tasks.push(tokio::spawn(async move { (i, acquire.await.unwrap()) }));
        }
        let mut granted = Vec::new();
        for task in tasks {
            granted.push(task.await.unwrap());
        }
        granted.sort_by_key(|(i, _)| *i);
        let tokens: Vec<u64> = granted.iter().map(|(_, g)| g.fencing_token()).collect();
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "round {round}: tokens in call order 0, 1, 2: {tokens:?}");
        for (_, guard) in granted {
            guard.release().await.unwrap();
        }
    }
}
