//! Fault scenarios 4 and 5 of the fault campaign, against `tollgate serve` over real sockets:
//!
//! - 4: closed-loop load (gRPC RLS and HTTP clients) while the limits file is rewritten every
//!   100 ms, valid and invalid versions alternating: no call fails, the limits that did not change
//!   keep their counters (every counter's history passes the checker), and each bad version is
//!   counted once.
//! - 5: `--storage redis` and `redis-cached`, two replicas, redis-server killed under load and
//!   started again (empty): UNAVAILABLE / 503 while it is down, correct decisions after it is
//!   back, and redis-cached's overshoot across the two replicas against its documented bound.
//!
//! Time: the servers run on one [`ManualClock`], and every decision is recorded with that clock's
//! reading, which is the server's own time for the decision. The clock moves forward 1 ms every
//! [`DECISIONS_PER_MS`] decisions, never while a call is in flight (calls hold a read lock, the
//! step takes the write lock), so the reading taken at the start of a call is the time the server
//! decided it at. No sleep makes time pass for a limiter; sleeps only pace the fault schedule.
//!
//! Short form by default (~3 s of load each); `TOLLGATE_FAULTS_FULL=1` runs the full form (30 s of
//! rewrites; a 5 s outage). Each test prints its figures (`cargo nextest run -p tollgate-server
//! -E 'binary(faults)' --no-capture`).

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tollgate::{Clock, ManualClock};
use tollgate_policy::Policy;
use tollgate_server::serve::{Running, ServeConfig, Storage, start};
use tollgate_testkit::{Bound, Decision, History, RedisServer};
use tonic::transport::Channel;

const NS: &str = "faults";
/// The manual clock's pace: 1 ms of server time per this many decisions (about 1.4 ms of server
/// time per ms of real time on 2 cores, debug build).
const DECISIONS_PER_MS: u64 = 10;

fn full() -> bool {
    std::env::var_os("TOLLGATE_FAULTS_FULL").is_some_and(|v| v != "0")
}

/// The servers' clock, stepped by the load itself, never during a call.
struct Time {
    clock: ManualClock,
    gate: tokio::sync::RwLock<()>,
    decisions: AtomicU64,
}

impl Time {
    fn new() -> Arc<Time> {
        Arc::new(Time { clock: ManualClock::new(), gate: tokio::sync::RwLock::new(()), decisions: AtomicU64::new(0) })
    }

    /// Runs one call with the clock held still; returns the server's time of the decision.
    async fn call<T>(&self, call: impl Future<Output = T>) -> (u64, T) {
        let answer = {
            let _still = self.gate.read().await;
            let at = self.clock.now();
            (at, call.await)
        };
        if (self.decisions.fetch_add(1, Ordering::Relaxed) + 1) % DECISIONS_PER_MS == 0 {
            let _step = self.gate.write().await;
            self.clock.advance(Duration::from_millis(1));
        }
        answer
    }
}

/// What a client got.
#[derive(Clone, Debug, PartialEq)]
enum Answer {
    Allowed,
    Limited,
    /// gRPC UNAVAILABLE or HTTP 503: the counter storage could not answer.
    Unavailable,
    /// Anything else: a failed call.
    Failed(String),
}

impl Answer {
    fn decided(&self) -> bool {
        matches!(self, Answer::Allowed | Answer::Limited)
    }
}

/// One protocol's client of one server.
#[derive(Clone)]
enum Caller {
    Grpc(RateLimitServiceClient<Channel>),
    Http(Client<HttpConnector, Full<Bytes>>, SocketAddr),
}

impl Caller {
    async fn grpc(server: &Running<ManualClock>) -> Caller {
        Caller::Grpc(RateLimitServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap())
    }

    fn http(server: &Running<ManualClock>) -> Caller {
        Caller::Http(Client::builder(hyper_util::rt::TokioExecutor::new()).build_http(), server.http)
    }

    /// One hit for `values` in namespace [`NS`] (RLS `ShouldRateLimit`, HTTP `/check_and_report`).
    async fn hit(&mut self, values: &[(&str, &str)]) -> Answer {
        match self {
            Caller::Grpc(client) => {
                let request = RateLimitRequest {
                    domain: NS.into(),
                    descriptors: vec![support::descriptor(values)],
                    hits_addend: 1,
                };
                match client.should_rate_limit(request).await.map(tonic::Response::into_inner) {
                    Ok(RateLimitResponse { overall_code, .. }) if overall_code == Code::Ok as i32 => Answer::Allowed,
                    Ok(RateLimitResponse { overall_code, .. }) if overall_code == Code::OverLimit as i32 => {
                        Answer::Limited
                    }
                    Ok(other) => Answer::Failed(format!("RLS answered {other:?}")),
                    Err(status) if status.code() == tonic::Code::Unavailable => Answer::Unavailable,
                    Err(status) => Answer::Failed(format!("RLS failed: {status}")),
                }
            }
            Caller::Http(client, addr) => {
                let values: serde_json::Map<String, serde_json::Value> =
                    values.iter().map(|(k, v)| (k.to_string(), serde_json::Value::from(*v))).collect();
                let body = serde_json::json!({"namespace": NS, "values": values, "delta": 1}).to_string();
                let request = hyper::Request::post(format!("http://{addr}/check_and_report"))
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body)))
                    .unwrap();
                let response = match client.request(request).await {
                    Ok(response) => response,
                    Err(e) => return Answer::Failed(format!("HTTP request failed: {e}")),
                };
                let status = response.status().as_u16();
                let body = response.into_body().collect().await.map(|b| b.to_bytes());
                match (status, body) {
                    (_, Err(e)) => Answer::Failed(format!("HTTP body failed: {e}")),
                    (200, _) => Answer::Allowed,
                    (429, _) => Answer::Limited,
                    (503, _) => Answer::Unavailable,
                    (status, Ok(body)) => Answer::Failed(format!("HTTP {status}: {}", String::from_utf8_lossy(&body))),
                }
            }
        }
    }
}

/// One call as the load saw it.
#[derive(Clone, Debug)]
struct Call {
    /// Which server answered (its index).
    server: usize,
    started: Instant,
    ended: Instant,
    /// The server's time of the decision.
    at_ns: u64,
    /// `limit/value`: one counter.
    counter: String,
    answer: Answer,
}

/// A user that is new at every call: a counter the server has never seen.
const FRESH: &str = "*";

/// Closed-loop load: each client (of server `.0`) sends one hit at a time, cycling through
/// `counters` (`(kind, user)`, counted as `kind/user`), until `until`.
async fn load(
    clients: Vec<(usize, Caller)>,
    counters: Vec<(&'static str, String)>,
    time: Arc<Time>,
    until: Instant,
) -> Vec<Call> {
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, (server, mut client))| {
            let (counters, time) = (counters.clone(), time.clone());
            tokio::spawn(async move {
                let mut calls = Vec::new();
                let mut next = i;
                while Instant::now() < until {
                    let (kind, user) = &counters[next % counters.len()];
                    let user = if user == FRESH { format!("{FRESH}{i}.{next}") } else { user.clone() };
                    next += 1;
                    let started = Instant::now();
                    let (at_ns, answer) = time.call(client.hit(&[("kind", kind), ("user", &user)])).await;
                    let (ended, counter) = (Instant::now(), format!("{kind}/{user}"));
                    calls.push(Call { server, started, ended, at_ns, counter, answer });
                }
                calls
            })
        })
        .collect();
    let mut calls = Vec::new();
    for task in tasks {
        calls.extend(task.await.unwrap());
    }
    calls
}

/// The history of `calls` on counters of limit `kind`, decided ones only.
fn history<'a>(calls: impl IntoIterator<Item = &'a Call>, kind: &str) -> History {
    let history = History::default();
    for call in calls.into_iter().filter(|c| c.answer.decided() && c.counter.starts_with(&format!("{kind}/"))) {
        let allowed = call.answer == Answer::Allowed;
        history.record(Decision { at_ns: call.at_ns, key: call.counter.clone(), n: 1, allowed });
    }
    history
}

/// The most any one counter's history goes over `bound` (the figure the documented overshoot
/// bounds: per counter and window), and that counter.
fn worst_excess(history: &History, bound: &Bound) -> (u64, String) {
    let mut per_counter: std::collections::BTreeMap<String, History> = Default::default();
    for decision in history.decisions() {
        per_counter.entry(decision.key.clone()).or_default().record(decision);
    }
    per_counter.into_iter().map(|(counter, h)| (h.excess(bound), counter)).max().unwrap_or_default()
}

fn failures(calls: &[Call]) -> Vec<&Answer> {
    calls.iter().map(|c| &c.answer).filter(|a| matches!(a, Answer::Failed(_))).collect()
}

fn config(limits: &Path, storage: Storage) -> ServeConfig {
    ServeConfig { storage, ..support::config(limits) }
}

/// A `/metrics` value, with plain HTTP (not through a load client).
async fn metric(server: &Running<ManualClock>, name: &str) -> u64 {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = hyper::Request::get(format!("http://{}/metrics", server.http)).body(Full::new(Bytes::new())).unwrap();
    let body = client.request(request).await.unwrap().into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&body);
    let value = text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok());
    value.unwrap_or_else(|| panic!("{name} is not in /metrics:\n{text}"))
}

// ------------------------------------------------------------------------------------------------
// Scenario 4: the limits file rewritten every 100 ms under load.

const USERS: [&str; 4] = ["u0", "u1", "u2", "u3"];
/// Both limits that never change: 10 hits per second per user, as a fixed window and as a token
/// bucket (burst 10, one hit per 100 ms).
const KEPT_MAX: u64 = 10;
const WINDOW_BOUND: Bound = Bound::FixedWindow { limit: KEPT_MAX, period_ns: 1_000_000_000, aligned: false };
const BUCKET_BOUND: Bound = Bound::TokenBucket { burst: KEPT_MAX, emission_ns: 100_000_000 };

/// A valid version: the two kept limits word for word, a limit whose max_value changes every
/// version (same counter), and one whose window changes (a new limit each time).
fn valid(version: usize) -> String {
    format!(
        "# version {version}\n\
         - {{namespace: {NS}, name: window, max_value: {KEPT_MAX}, seconds: 1, conditions: [\"kind == 'window'\"], variables: [user]}}\n\
         - {{namespace: {NS}, name: bucket, max_value: {KEPT_MAX}, seconds: 1, algorithm: token_bucket, conditions: [\"kind == 'bucket'\"], variables: [user]}}\n\
         - {{namespace: {NS}, name: churn, max_value: {}, seconds: 1, conditions: [\"kind == 'churn'\"]}}\n\
         - {{namespace: {NS}, name: extra, max_value: 5, seconds: {}, conditions: [\"kind == 'extra'\"]}}\n",
        100 + version,
        60 + version
    )
}

/// An invalid version, each one different: broken YAML, a zero max_value, an unknown field, a
/// condition that does not parse.
fn invalid(version: usize) -> String {
    let body = match version / 2 % 4 {
        0 => format!("- {{namespace: {NS}, max_value: [\n"),
        1 => format!("- {{namespace: {NS}, max_value: -1, seconds: 1}}\n"),
        2 => format!("- {{namespace: {NS}, max_value: 5, seconds: 1, colour: red}}\n"),
        _ => format!("- {{namespace: {NS}, max_value: 5, seconds: 1, conditions: [\"kind == \"]}}\n"),
    };
    format!("# version {version}\n{body}")
}

/// Writes a version as editors and Kubernetes do: a new file renamed over the old one.
fn install(limits: &Path, text: &str) {
    let staged = limits.with_file_name(".limits.yaml.new");
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(&staged, limits).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_every_100ms_under_load_keep_counters_and_fail_no_call() {
    for version in 0..8 {
        let text = if version % 2 == 0 { valid(version) } else { invalid(version) };
        assert_eq!(Policy::parse(&text, "limits.yaml").is_ok(), version % 2 == 0, "version {version}:\n{text}");
    }
    let length = if full() { Duration::from_secs(30) } else { Duration::from_secs(3) };
    let limits = support::temp_dir("faults-reload").join("limits.yaml");
    std::fs::write(&limits, valid(0)).unwrap();
    let time = Time::new();
    let server =
        start(&ServeConfig { watch: true, ..config(&limits, Storage::Memory) }, time.clock.clone()).await.unwrap();

    let clients = vec![
        (0, Caller::grpc(&server).await),
        (0, Caller::grpc(&server).await),
        (0, Caller::grpc(&server).await),
        (0, Caller::http(&server)),
        (0, Caller::http(&server)),
    ];
    let mut counters: Vec<(&str, String)> = Vec::new();
    for user in USERS {
        counters.push(("window", user.into()));
        counters.push(("bucket", user.into()));
    }
    counters.push(("churn", "-".into()));
    let started = Instant::now();
    let load = tokio::spawn(load(clients, counters, time.clone(), started + length));

    // The fault: a new version every 100 ms, valid and invalid alternating, ending on a valid one.
    let (mut good, mut bad) = (0u64, 0u64);
    let mut version = 1;
    while started.elapsed() < length {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if version % 2 == 0 {
            install(&limits, &valid(version));
            good += 1;
        } else {
            install(&limits, &invalid(version));
            bad += 1;
        }
        version += 1;
    }
    let calls = load.await.unwrap();
    // The last version was a bad one: give the watcher time to have read it (SETTLE is 50 ms).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let errors = metric(&server, "tollgate_config_reload_errors_total").await;
    let generation = server.engine.loaded().generation;

    let failed = failures(&calls);
    let windows = history(&calls, "window");
    let buckets = history(&calls, "bucket");
    let limited = calls.iter().filter(|c| c.answer == Answer::Limited).count();
    println!(
        "scenario 4 ({length:?}): {} calls ({} limited), {} failed; {good} valid and {bad} invalid versions \
         written, {} applied (generation {generation}), {errors} reload errors counted; server time {:.1} s; \
         window: {} admitted, excess {}; bucket: {} admitted, excess {}",
        calls.len(),
        limited,
        failed.len(),
        generation - 1,
        time.clock.now() as f64 / 1e9,
        windows.admitted(),
        windows.excess(&WINDOW_BOUND),
        buckets.admitted(),
        buckets.excess(&BUCKET_BOUND),
    );
    assert!(failed.is_empty(), "{} failed calls, first: {:?}", failed.len(), failed.first());
    assert!(limited > 0, "the load never reached a limit: nothing was tested");
    // Counters of unchanged limits are kept: a counter started again by a reload would admit a
    // second full window (or bucket) at once, which the checker reports.
    windows.check(&WINDOW_BOUND).unwrap();
    buckets.check(&BUCKET_BOUND).unwrap();
    let applied = generation - 1;
    assert!(2 * applied >= good, "only {applied} of {good} valid versions applied");
    // Each bad version once (some may have been replaced before the watcher read them); the bug
    // this pins counted every re-read, about 20 a second per bad file.
    assert!((1..=bad).contains(&errors), "{errors} reload errors for {bad} bad versions");
    server.shutdown().await;
}

// ------------------------------------------------------------------------------------------------
// Scenario 5: Redis restarted (killed, down for a while, started again empty) under load.

/// One limit shared by every replica: 20 hits per second per user, a fixed window.
const SHARED_MAX: u64 = 20;
const SHARED_BOUND: Bound = Bound::FixedWindow { limit: SHARED_MAX, period_ns: 1_000_000_000, aligned: false };
const REPLICAS: usize = 2;
const FLUSH: Duration = Duration::from_millis(100);

struct Restart {
    calls: Vec<Call>,
    /// redis-server was killed.
    down_at: Instant,
    /// A new redis-server was being started.
    restart_at: Instant,
    /// It answers.
    up_at: Instant,
}

impl Restart {
    /// Load on two replicas against one redis-server, which is killed after `before`, started
    /// again (empty) after `outage`, and kept for `after`.
    async fn run(cached: bool) -> Restart {
        let (before, outage, after) = if full() {
            (Duration::from_secs(3), Duration::from_secs(5), Duration::from_secs(5))
        } else {
            (Duration::from_secs(1), Duration::from_secs(1), Duration::from_millis(1500))
        };
        let mut redis = RedisServer::start();
        let limits = support::temp_dir("faults-redis").join("limits.yaml");
        std::fs::write(
            &limits,
            format!("- {{namespace: {NS}, max_value: {SHARED_MAX}, seconds: 1, variables: [user]}}\n"),
        )
        .unwrap();
        let (url, prefix) = (redis.url(), "faults:".to_string());
        let storage =
            if cached { Storage::RedisCached { url, prefix, flush: FLUSH } } else { Storage::Redis { url, prefix } };
        let time = Time::new();
        let mut servers = Vec::new();
        let mut clients = Vec::new();
        for replica in 0..REPLICAS {
            let server = start(&config(&limits, storage.clone()), time.clock.clone()).await.unwrap();
            clients.push((replica, Caller::grpc(&server).await));
            clients.push((replica, Caller::http(&server)));
            servers.push(server);
        }
        // Two counters every replica shares, and a new counter at every third call (which the
        // cache must read from Redis first).
        let counters = vec![("shared", "u0".to_string()), ("shared", "u1".to_string()), ("fresh", FRESH.to_string())];
        let started = Instant::now();
        let load = tokio::spawn(load(clients, counters, time.clone(), started + before + outage + after));

        tokio::time::sleep(before).await;
        tokio::task::block_in_place(|| redis.kill());
        let down_at = Instant::now();
        tokio::time::sleep(outage).await;
        let restart_at = Instant::now();
        tokio::task::block_in_place(|| redis.restart());
        let up_at = Instant::now();
        let calls = load.await.unwrap();
        for server in servers {
            server.shutdown().await;
        }
        Restart { calls, down_at, restart_at, up_at }
    }

    /// Calls made entirely while redis-server was down.
    fn during(&self) -> impl Iterator<Item = &Call> {
        self.calls.iter().filter(|c| c.started >= self.down_at && c.ended <= self.restart_at)
    }

    /// Per replica, from redis-server answering again to its first decision on a new counter
    /// (which needs Redis with either storage).
    fn recovery(&self) -> Vec<Option<Duration>> {
        (0..REPLICAS)
            .map(|server| {
                self.calls
                    .iter()
                    .filter(|c| c.server == server && c.started >= self.up_at && c.answer.decided())
                    .filter(|c| c.counter.starts_with("fresh/"))
                    .map(|c| c.ended - self.up_at)
                    .min()
            })
            .collect()
    }

    /// Decisions on the shared counters before the fault, and after it (every decision made
    /// after the kill was made against the new, empty redis-server, or locally by the cache).
    fn histories(&self) -> (History, History) {
        let before = history(self.calls.iter().filter(|c| c.ended <= self.down_at), "shared");
        let after = history(self.calls.iter().filter(|c| c.started >= self.down_at), "shared");
        (before, after)
    }

    fn report(&self, name: &str) -> (History, History) {
        let during: Vec<_> = self.during().collect();
        let count = |calls: &[&Call], f: fn(&Call) -> bool| calls.iter().filter(|c| f(c)).count();
        let (before, after) = self.histories();
        let whole = history(&self.calls, "shared");
        println!(
            "scenario 5, {name}: {} calls, {} failed; while Redis was down ({:?}): {} calls, {} unavailable \
             ({} of {} on new counters), {} decided locally; first decision on a new counter after Redis was \
             back (per replica, Redis took {:?} to start): {:?}; most admitted beyond the fixed window bound \
             by one shared counter in one window ({} per window): before the fault {}, after it {}, whole run {} \
             (admitted {} / {} / {})",
            self.calls.len(),
            failures(&self.calls).len(),
            self.restart_at - self.down_at,
            during.len(),
            count(&during, |c| c.answer == Answer::Unavailable),
            count(&during, |c| c.answer == Answer::Unavailable && c.counter.starts_with("fresh/")),
            count(&during, |c| c.counter.starts_with("fresh/")),
            count(&during, |c| c.answer.decided()),
            self.up_at - self.restart_at,
            self.recovery(),
            SHARED_MAX,
            worst_excess(&before, &SHARED_BOUND).0,
            worst_excess(&after, &SHARED_BOUND).0,
            worst_excess(&whole, &SHARED_BOUND).0,
            before.admitted(),
            after.admitted(),
            whole.admitted(),
        );
        (before, after)
    }

    /// What both storages must show.
    fn assert_common(&self) {
        let failed = failures(&self.calls);
        assert!(failed.is_empty(), "{} failed calls, first: {:?}", failed.len(), failed.first());
        let during: Vec<_> = self.during().filter(|c| c.counter.starts_with("fresh/")).collect();
        assert!(!during.is_empty(), "no call on a new counter while Redis was down");
        let decided: Vec<_> = during.iter().filter(|c| c.answer.decided()).collect();
        assert!(decided.is_empty(), "decided without Redis: {:?}", decided.first());
        for (replica, recovery) in self.recovery().into_iter().enumerate() {
            let recovery = recovery.unwrap_or_else(|| panic!("replica {replica} never decided again"));
            // The connection's back-off is at most 500 ms.
            assert!(recovery < Duration::from_secs(1), "replica {replica} decided again only {recovery:?} later");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_storage_answers_unavailable_while_redis_is_down_and_exactly_after() {
    let restart = Restart::run(false).await;
    let (before, after) = restart.report("redis");
    restart.assert_common();
    let unavailable = restart.during().filter(|c| c.answer != Answer::Unavailable).count();
    assert_eq!(unavailable, 0, "every call is UNAVAILABLE / 503 while Redis is down");
    // One Redis decides for both replicas: exact, before the fault and after it (Redis restarted
    // empty, so the two are checked apart: what it forgot is counted again).
    before.check(&SHARED_BOUND).unwrap();
    after.check(&SHARED_BOUND).unwrap();
}

/// The bounds documented for redis-cached (`serve/store/redis/cache.rs`, docs/server.md): with R replicas a
/// window may admit up to (R − 1) × max_value beyond the limit before they hear of each other.
/// While Redis is down each replica opens its windows at its own first hit, so the replicas'
/// windows drift apart: one window-long interval can then meet two windows of every replica,
/// up to (2R − 1) × max_value beyond the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cached_overshoot_across_two_replicas_stays_within_its_bound() {
    let restart = Restart::run(true).await;
    let (before, after) = restart.report("redis-cached");
    restart.assert_common();
    let aligned = (REPLICAS as u64 - 1) * SHARED_MAX;
    let drifting = (2 * REPLICAS as u64 - 1) * SHARED_MAX;
    for (when, history, documented) in [("before the fault", before, aligned), ("after the kill", after, drifting)] {
        let (excess, counter) = worst_excess(&history, &SHARED_BOUND);
        if excess > documented {
            let mut admitted: Vec<_> = restart
                .calls
                .iter()
                .filter(|c| c.counter == counter && c.answer == Answer::Allowed)
                .map(|c| (c.at_ns / 1_000_000, c.server, c.started.duration_since(restart.down_at).as_millis()))
                .collect();
            admitted.sort_unstable();
            panic!(
                "{when}: {excess} beyond the limit on {counter} (documented: {documented}); \
                 admissions as (server ms, replica, real ms after the kill): {admitted:?}"
            );
        }
    }
}
