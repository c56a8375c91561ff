//! Fault scenarios 1 and 2 of the fault campaign: a Redis limiter under 8 tasks of closed-loop
//! load while Redis is blackholed (a partition, through the fault proxy), hung (SIGSTOP), or has
//! its connections reset every 200 ms. Every decision is timed and recorded on the authority's
//! clock (Redis `TIME` for Redis's grants, the wall clock for the failure policy's), and the whole
//! history is checked against the token bucket's bound.
//!
//! Short form by default (a 1 s outage); `TOLLGATE_FAULTS_FULL=1` runs the full 5 s outage.
//! Each test prints its figures (`cargo nextest run -p tollgate-redis -E 'binary(faults)'
//! --no-capture`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tollgate::{Quota, Reason};
use tollgate_redis::{AlgorithmKind, FailurePolicy, Redis, RedisLimiter, RedisOptions};
use tollgate_testkit::{Bound, Decision, Fault, FaultProxy, History, RedisServer};

const TASKS: usize = 8;
const DEADLINE: Duration = Duration::from_millis(50);
/// 1000 permits a second, 100 at once: far below what 8 closed-loop tasks ask for.
const RATE: u64 = 1000;
const BURST: u64 = 100;
const BOUND: Bound = Bound::TokenBucket { burst: BURST, emission_ns: 1_000_000_000 / RATE };

fn full() -> bool {
    std::env::var_os("TOLLGATE_FAULTS_FULL").is_some_and(|v| v != "0")
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Outage {
    /// The proxy holds every byte (a partition).
    Blackhole,
    /// redis-server is SIGSTOPped.
    Hang,
    /// The proxy resets every connection every 200 ms for the whole outage.
    Resets,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Policy {
    Deny,
    Local,
    Allow,
}

/// One decision as the load task saw it.
struct Call {
    started: Instant,
    took: Duration,
    reason: Reason,
}

struct Figures {
    calls: Vec<Call>,
    history: History,
    fault_at: Instant,
    healed_at: Instant,
}

fn wall_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// `before` of load, the outage, then `after` of load, against a limiter behind a proxy.
async fn run(outage: Outage, policy: Policy) -> Figures {
    let (before, length, after) = if full() {
        (Duration::from_secs(2), Duration::from_secs(5), Duration::from_secs(3))
    } else {
        (Duration::from_millis(500), Duration::from_secs(1), Duration::from_millis(1500))
    };
    let server = RedisServer::start();
    // The proxy runs on its own thread, so the load does not slow the network it goes through.
    let proxy_runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let upstream = format!("127.0.0.1:{}", server.port).parse().unwrap();
    let proxy = proxy_runtime.spawn(FaultProxy::start(upstream, 18)).await.unwrap().unwrap();
    let options = RedisOptions { deadline: DEADLINE, ..RedisOptions::default() };
    let redis = Redis::connect_with(&proxy.redis_url(), options).await.unwrap();
    let quota = Quota::per_second(RATE).unwrap().with_burst(BURST).unwrap();
    let failure = match policy {
        Policy::Deny => FailurePolicy::Deny,
        Policy::Allow => FailurePolicy::Allow,
        Policy::Local => FailurePolicy::local_share(quota, 1).unwrap(),
    };
    let limiter = RedisLimiter::builder(&redis, "faults", AlgorithmKind::TokenBucket)
        .limit("rps", quota)
        .failure_policy(failure)
        .build()
        .unwrap();

    let history = Arc::new(History::default());
    let calls = Arc::new(Mutex::new(Vec::new()));
    let stop_at = Instant::now() + before + length + after;
    let load: Vec<_> = (0..TASKS)
        .map(|_| {
            let (limiter, history, calls) = (limiter.clone(), history.clone(), calls.clone());
            tokio::spawn(async move {
                let mut mine = Vec::new();
                while Instant::now() < stop_at {
                    let started = Instant::now();
                    let outcome = limiter.try_acquire("k", 1).await;
                    let took = started.elapsed();
                    let (allowed, reason, at_ns) = match &outcome {
                        // Redis's grants carry Redis TIME; the policy's are timed on the wall clock.
                        Ok(lease) if lease.reason() == Reason::Granted => (true, Reason::Granted, lease.granted_at()),
                        Ok(lease) => (true, lease.reason(), wall_ns()),
                        Err(rejected) => (false, rejected.reason(), wall_ns()),
                    };
                    history.record(Decision { at_ns, key: "k".into(), n: 1, allowed });
                    mine.push(Call { started, took, reason });
                }
                calls.lock().unwrap().extend(mine);
            })
        })
        .collect();

    tokio::time::sleep(before).await;
    match outage {
        Outage::Blackhole => proxy.set(Fault::Blackhole),
        Outage::Hang => server.pause(),
        Outage::Resets => {}
    }
    // Once the fault is in place (kill(1) has delivered the signal): what starts later cannot be
    // answered by Redis.
    let fault_at = Instant::now();
    if outage == Outage::Resets {
        while fault_at.elapsed() < length {
            proxy.reset();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    } else {
        tokio::time::sleep(length).await;
    }
    let healed_at = Instant::now();
    match outage {
        Outage::Blackhole => proxy.heal(),
        Outage::Hang => server.resume(),
        Outage::Resets => {}
    }
    for task in load {
        task.await.unwrap();
    }
    drop(proxy);
    proxy_runtime.shutdown_background();
    let calls = std::mem::take(&mut *calls.lock().unwrap());
    let history = Arc::into_inner(history).unwrap();
    Figures { calls, history, fault_at, healed_at }
}

impl Figures {
    fn answered_by_redis(reason: Reason) -> bool {
        matches!(reason, Reason::Granted | Reason::Exhausted)
    }

    /// The p99.9 and the longest decision time.
    fn latency(&self) -> (Duration, Duration) {
        let mut took: Vec<_> = self.calls.iter().map(|c| c.took).collect();
        took.sort_unstable();
        (took[(took.len() * 999 / 1000).min(took.len() - 1)], *took.last().unwrap())
    }

    /// Decisions that started after the fault and ended before the heal (Redis could not answer
    /// those), and how many of them Redis did answer all the same.
    fn during(&self) -> (usize, usize) {
        let inside: Vec<_> =
            self.calls.iter().filter(|c| c.started >= self.fault_at && c.started + c.took <= self.healed_at).collect();
        (inside.len(), inside.iter().filter(|c| Self::answered_by_redis(c.reason)).count())
    }

    /// From the heal to the first decision Redis answered.
    fn recovery(&self) -> Option<Duration> {
        self.calls
            .iter()
            .filter(|c| c.started >= self.healed_at && Self::answered_by_redis(c.reason))
            .map(|c| c.started + c.took - self.healed_at)
            .min()
    }

    fn report(&self, name: &str) {
        let (p999, max) = self.latency();
        let (during, by_redis) = self.during();
        println!(
            "{name}: {} decisions, {} admitted; during the outage {during} decisions ({by_redis} by Redis); \
             latency p99.9 {p999:?}, max {max:?}; Redis answering again {:?} after the heal; \
             over-admission against the bound: {}",
            self.calls.len(),
            self.history.admitted(),
            self.recovery(),
            self.history.excess(&BOUND)
        );
    }

    /// What every scenario must show, whatever the policy.
    fn assert_common(&self, policy_reason: Reason) {
        let (p999, _) = self.latency();
        assert!(p999 <= DEADLINE + Duration::from_millis(5), "p99.9 decision latency {p999:?}");
        let (during, by_redis) = self.during();
        assert!(during > 0, "no decision was made during the outage");
        assert_eq!(by_redis, 0, "Redis answered while it could not");
        let off_policy: Vec<_> = self
            .calls
            .iter()
            .filter(|c| !Self::answered_by_redis(c.reason) && c.reason != policy_reason)
            .map(|c| c.reason)
            .collect();
        assert!(off_policy.is_empty(), "decisions neither Redis's nor the policy's: {off_policy:?}");
        let recovery = self.recovery().expect("Redis never answered again after the heal");
        assert!(recovery < Duration::from_secs(1), "Redis used again only {recovery:?} after the heal");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_with_deny_keeps_the_bound() {
    let figures = run(Outage::Blackhole, Policy::Deny).await;
    figures.report("blackhole, Deny");
    figures.assert_common(Reason::Unavailable);
    figures.history.check(&BOUND).unwrap();
}

/// Failing open breaks the bound by design: the figure is reported, and it must be bounded by
/// what the outage let through (every decision of the outage admitted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_with_allow_reports_its_over_admission() {
    let figures = run(Outage::Blackhole, Policy::Allow).await;
    figures.report("blackhole, Allow");
    figures.assert_common(Reason::FailOpen);
    let (during, _) = figures.during();
    let excess = figures.history.excess(&BOUND);
    assert!(excess > 0 && excess <= figures.calls.len() as u64, "over-admission {excess} of {during} outage decisions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_with_deny_keeps_the_bound() {
    let figures = run(Outage::Hang, Policy::Deny).await;
    figures.report("SIGSTOP, Deny");
    figures.assert_common(Reason::Unavailable);
    figures.history.check(&BOUND).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_resets_with_deny_keep_the_bound() {
    let figures = run(Outage::Resets, Policy::Deny).await;
    figures.report("resets every 200 ms, Deny");
    let (p999, _) = figures.latency();
    assert!(p999 <= DEADLINE + Duration::from_millis(5), "p99.9 decision latency {p999:?}");
    figures.history.check(&BOUND).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_with_a_local_fallback_keeps_the_bound() {
    let figures = run(Outage::Blackhole, Policy::Local).await;
    figures.report("blackhole, Local");
    figures.assert_common(Reason::Fallback);
    figures.history.check(&BOUND).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_with_a_local_fallback_keeps_the_bound() {
    let figures = run(Outage::Hang, Policy::Local).await;
    figures.report("SIGSTOP, Local");
    figures.assert_common(Reason::Fallback);
    figures.history.check(&BOUND).unwrap();
}
