//! `tollgate pump` end to end: real worker processes, a real redis-server (started on a free
//! port) and an in-process API that throttles with 429 + Retry-After above its limit.

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use tollgate::{Limiter, Quota, TokenBucket};
use tollgate_testkit::RedisServer;

#[derive(Clone)]
struct Api {
    limiter: Arc<Limiter<TokenBucket>>,
    done: Arc<Mutex<HashMap<String, u32>>>,
    throttled: Arc<AtomicU64>,
}

async fn orders(axum::extract::State(api): axum::extract::State<Api>, headers: HeaderMap) -> impl IntoResponse {
    match api.limiter.try_acquire(1) {
        Ok(_) => {
            let key = headers.get("idempotency-key").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
            *api.done.lock().unwrap().entry(key).or_default() += 1;
            StatusCode::OK.into_response()
        }
        Err(rejected) => {
            api.throttled.fetch_add(1, Ordering::Relaxed);
            let secs = rejected.retry_after().unwrap_or_default().as_secs_f64();
            (StatusCode::TOO_MANY_REQUESTS, [("retry-after", format!("{secs:.3}"))]).into_response()
        }
    }
}

/// The throttled API: `rate`/s, bursts of a tenth of that.
async fn api(rate: u64) -> (Api, SocketAddr) {
    let quota = Quota::per(Duration::from_secs(1), rate).unwrap().with_burst(rate / 10).unwrap();
    let api = Api {
        limiter: Arc::new(Limiter::new(TokenBucket::new(quota))),
        done: Default::default(),
        throttled: Default::default(),
    };
    let app = Router::new().route("/orders", post(orders)).with_state(api.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (api, addr)
}

fn tollgate(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    command.args(args).env("RUST_LOG", "warn");
    command
}

fn enqueue(redis: &str, lines: &str) -> std::process::Output {
    let mut child = tollgate(&["pump", "enqueue", "--redis-url", redis, "--queue", "orders", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(lines.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn worker(redis: &str, api: SocketAddr, rate: u64, want: u64, name: &str) -> Child {
    tollgate(&[
        "pump",
        "run",
        "--redis-url",
        redis,
        "--queue",
        "orders",
        "--url",
        &format!("http://{api}"),
        "--rate",
        &format!("{rate}/s"),
        "--partitions",
        "6",
        "--want",
        &want.to_string(),
        "--lease-ttl",
        "1s",
        "--idle",
        "2s",
        "--granularity",
        "100ms",
        "--consumer",
        name,
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap()
}

fn items(n: usize) -> String {
    (0..n).map(|i| format!("{{\"key\":\"order-{i}\",\"path\":\"/orders\",\"body\":{{\"n\":{i}}}}}\n")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_finish_every_item_once_with_few_throttled() {
    let redis = RedisServer::start();
    let (api, addr) = api(2000).await;
    let mut input = items(10_000);
    input.insert_str(input.find("\n").unwrap() + 1, "{not json\n");
    let out = enqueue(&redis.url(), &input);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("skipped line 2: key must be a string"), "the bad line is reported by number: {stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("enqueued 10000 items"), "the rest continue");
    assert_eq!(out.status.code(), Some(1));

    let started = Instant::now();
    let workers: Vec<Child> = (0..3).map(|w| worker(&redis.url(), addr, 2000, 2, &format!("w{w}"))).collect();
    for w in workers {
        let out = w.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let done = api.done.lock().unwrap().clone();
    assert_eq!(done.len(), 10_000, "zero lost");
    assert!(done.values().all(|&n| n == 1), "zero duplicated completions");
    let throttled = api.throttled.load(Ordering::Relaxed);
    println!(
        "3 processes: {:.0} items/s against 2000/s ({:.2}x), {throttled} throttled ({:.2}% of requests)",
        10_000.0 / elapsed,
        10_000.0 / elapsed / 2000.0,
        100.0 * throttled as f64 / (10_000 + throttled) as f64
    );
    assert!(throttled * 100 <= 10_000 + throttled, "throttled responses at most 1%: {throttled}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_items_and_partitions_are_taken_over() {
    let redis = RedisServer::start();
    let (api, addr) = api(1500).await;
    assert!(enqueue(&redis.url(), &items(4000)).status.success());
    // Two workers take three partitions each; the third, started once they hold all six, waits.
    let mut workers: Vec<Child> = (0..2).map(|w| worker(&redis.url(), addr, 1500, 3, &format!("k{w}"))).collect();
    let holders_key = "tollgate:semaphore:{orders:partitions}:holders";
    let holders = || -> Vec<String> {
        redis.cli(&["ZRANGE", holders_key, "0", "-1"]).lines().map(str::to_string).filter(|l| !l.is_empty()).collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while holders().len() < 6 {
        assert!(Instant::now() < deadline, "the first two workers lease every partition");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    workers.push(worker(&redis.url(), addr, 1500, 3, "k2"));
    // Wait (for work to be under way, not for time to pass) until a third of it is done.
    let deadline = Instant::now() + Duration::from_secs(20);
    while api.done.lock().unwrap().len() < 1300 {
        assert!(Instant::now() < deadline, "work under way");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = holders();
    assert_eq!(before.len(), 6, "every partition is held: {before:?}");
    let killed_at = Instant::now();
    workers[0].kill().unwrap(); // SIGKILL
    workers[0].wait().unwrap();
    // Its three leases lapse after the TTL (1 s); the waiting worker takes the partitions over,
    // under new lease ids.
    let mut reused = None;
    while reused.is_none() && killed_at.elapsed() < Duration::from_secs(10) {
        let now = holders();
        if now.len() == 6 && now.iter().filter(|h| !before.contains(h)).count() == 3 {
            reused = Some(killed_at.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reused = reused.expect("the killed worker's partitions are leased again");
    assert!(reused < Duration::from_secs(3), "within the TTL plus a poll: {reused:?}");
    for w in workers.drain(1..) {
        let out = w.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let done = api.done.lock().unwrap().clone();
    assert_eq!(done.len(), 4000, "every item completed, the killed worker's in-flight ones by the others");
    let twice = done.values().filter(|&&n| n > 1).count();
    println!("killed worker: {twice} items completed twice (at least once), partitions reused after {reused:?}");
    assert!(twice <= 16, "only what the killed worker had in flight (16 requests) can repeat: {twice}");
}

/// Fault scenario 6: three workers drain 10,000 items while a random worker is SIGKILLed every
/// 1.5 s (2 s and a slower API with `TOLLGATE_FAULTS_FULL=1`) and replaced by a new process: no
/// item is lost, duplicates (at-least-once) are counted and reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_killed_every_few_seconds_lose_nothing() {
    let full = std::env::var_os("TOLLGATE_FAULTS_FULL").is_some_and(|v| v != "0");
    let (rate, kill_every) = if full { (1000, Duration::from_secs(2)) } else { (2000, Duration::from_millis(1500)) };
    let redis = RedisServer::start();
    let (api, addr) = api(rate).await;
    assert!(enqueue(&redis.url(), &items(10_000)).status.success());
    let mut workers: Vec<Child> = (0..3).map(|w| worker(&redis.url(), addr, rate, 2, &format!("f{w}"))).collect();
    let mut spawned = 3;
    let mut kills = 0;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let started = Instant::now();
    // Kill while work remains; then let the last workers finish (they exit when idle).
    while api.done.lock().unwrap().len() < 9_000 {
        assert!(started.elapsed() < Duration::from_secs(120), "the work does not progress");
        tokio::time::sleep(kill_every).await;
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let victim = (rng % workers.len() as u64) as usize;
        workers[victim].kill().unwrap(); // SIGKILL
        workers[victim].wait().unwrap();
        kills += 1;
        workers[victim] = worker(&redis.url(), addr, rate, 2, &format!("f{spawned}"));
        spawned += 1;
    }
    for w in workers {
        let out = w.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let done = api.done.lock().unwrap().clone();
    let duplicates: u32 = done.values().map(|n| n - 1).sum();
    println!(
        "pump under kills: {kills} workers SIGKILLed in {:.1} s; {} of 10000 items done, {duplicates} duplicate \
         completions",
        started.elapsed().as_secs_f64(),
        done.len()
    );
    assert_eq!(done.len(), 10_000, "zero lost");
    assert!(kills >= 2, "the scenario killed {kills} workers");
    // At least once: only what a killed worker had in flight (2 partitions x 8 requests) repeats.
    assert!(duplicates <= 16 * kills, "{duplicates} duplicates for {kills} kills");
}
