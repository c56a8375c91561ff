//! Reservations settled in Redis (`settle.lua`): the same state as the in-process limiters after
//! each settle, once per reservation whatever the retries, and not a unit lost or counted twice
//! by 8 tasks in 2 processes whose settles time out and are sent again.

use std::time::Duration;

use tollgate::{
    Algorithm, FixedWindow, Keyed, ManualClock, Quota, RateLimiter, Reservation, SettleError, SlidingLog, TokenBucket,
    WeightedWindow,
};
use tollgate_redis::{AlgorithmKind, LeasedLimiter, Redis, RedisLimiter, RedisOptions, RedisTime};
use tollgate_testkit::{Fault, FaultProxy, RedisServer};

/// Where a redis-server of `url` (`redis://127.0.0.1:<port>/`) listens.
fn addr(url: &str) -> std::net::SocketAddr {
    url.trim_start_matches("redis://").trim_end_matches('/').parse().unwrap()
}

/// A connection that waits long enough for any answer of a loaded machine.
async fn patient(url: &str) -> Redis {
    Redis::connect_with(url, RedisOptions { deadline: Duration::from_secs(5), ..Default::default() }).await.unwrap()
}

fn keyed<A: Algorithm>(algo: A, clock: &ManualClock) -> Box<dyn RateLimiter<str>> {
    Box::new(Keyed::<String, A>::builder(algo).clock(clock.clone()).build())
}

async fn reserve(limiter: &dyn RateLimiter<str>, n: u64) -> Reservation {
    limiter.reserve("k", n).await.unwrap_or_else(|no| panic!("{n} reserved: {no}"))
}

async fn settle(limiter: &dyn RateLimiter<str>, r: Reservation, actual: u64) {
    r.settle(limiter, "k", actual).await.unwrap_or_else(|e| panic!("settled for {actual}: {e}"));
}

/// What a probe reports: remaining, and the wait for one permit in whole milliseconds.
async fn state(limiter: &dyn RateLimiter<str>) -> (u64, u64) {
    let remaining = limiter.decide("k", 0).await.expect("a probe").remaining();
    let retry = match limiter.check("k", 1).await {
        Ok(_) => 0,
        Err(no) => no.retry_after().map_or(u64::MAX, |d| d.as_millis() as u64),
    };
    (remaining, retry)
}

/// Each algorithm Redis runs settles as the in-process one does: given back below the
/// estimate, a debt above it (past the limit, waited out), the estimate kept when dropped.
#[tokio::test]
async fn each_algorithm_settles_in_redis_as_in_memory() {
    let server = RedisServer::start();
    let redis = patient(&server.url()).await;
    let q = Quota::per_minute(100).unwrap();
    for algorithm in [
        AlgorithmKind::TokenBucket,
        AlgorithmKind::FixedWindow,
        AlgorithmKind::WeightedWindow,
        AlgorithmKind::SlidingLog,
    ] {
        let clock = ManualClock::new();
        clock.advance(Duration::from_secs(1_000));
        let in_redis = RedisLimiter::builder(&redis, &format!("settle:{algorithm}"), algorithm)
            .limit("l", q)
            .time(RedisTime::clock(clock.clone()))
            .build()
            .unwrap();
        let local = match algorithm {
            AlgorithmKind::TokenBucket => keyed(TokenBucket::new(q), &clock),
            AlgorithmKind::FixedWindow => keyed(FixedWindow::new(q), &clock),
            AlgorithmKind::WeightedWindow => keyed(WeightedWindow::new(q), &clock),
            _ => keyed(SlidingLog::new(q), &clock),
        };
        let both: [&dyn RateLimiter<str>; 2] = [&in_redis, &*local];
        // (reserve, then settle for; None: dropped unsettled), then the clock moves on.
        let steps = [(30, Some(10)), (50, Some(80)), (10, Some(40)), (5, None), (1, Some(1)), (20, Some(0))];
        let mut in_debt = false;
        for (step, (estimate, actual)) in steps.into_iter().enumerate() {
            let mut seen = Vec::new();
            for limiter in both {
                let admitted = match limiter.reserve("k", estimate).await {
                    Ok(r) => {
                        match actual {
                            Some(actual) => settle(limiter, r, actual).await,
                            None => drop(r),
                        }
                        true
                    }
                    Err(_) => false,
                };
                seen.push((admitted, state(limiter).await));
            }
            assert_eq!(seen[0], seen[1], "{algorithm} step {step}: Redis vs memory (admitted, (remaining, retry ms))");
            in_debt |= seen[0].1.0 == 0 && seen[0].1.1 > 0;
            clock.advance(Duration::from_secs(7));
        }
        assert!(in_debt, "{algorithm}: a debt past the limit was waited out");
    }
}

/// A settle sent again (its answer lost) changes nothing more; another reservation's does.
#[tokio::test]
async fn a_settle_sent_again_is_applied_once() {
    let server = RedisServer::start();
    let redis = patient(&server.url()).await;
    let limiter = RedisLimiter::builder(&redis, "once", AlgorithmKind::FixedWindow)
        .limit("l", Quota::per_minute(100).unwrap())
        .build()
        .unwrap();
    let r = reserve(&limiter, 10).await;
    for _ in 0..3 {
        limiter.settle("k", r.lease(), 25, r.id()).await.unwrap();
        assert_eq!(state(&limiter).await.0, 75, "25 used, however many times it is said");
    }
    let other = Reservation::with_id(r.lease().detached(), r.id() + 1);
    limiter.settle("k", other.lease(), 0, other.id()).await.unwrap();
    assert_eq!(state(&limiter).await.0, 85, "another reservation's settle gives its 10 back");
}

/// A settle Redis does not answer in time hands the reservation back; sent again once Redis
/// answers, it is applied once, although the first copy landed too (the partition held it).
#[tokio::test]
async fn a_settle_redis_did_not_confirm_is_sent_again_and_applied_once() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(addr(&server.url()), 11).await.unwrap();
    let redis = Redis::connect_with(
        &proxy.redis_url(),
        RedisOptions { deadline: Duration::from_millis(300), ..Default::default() },
    )
    .await
    .unwrap();
    let limiter = RedisLimiter::builder(&redis, "retried", AlgorithmKind::TokenBucket)
        .limit("l", Quota::per_hour(100).unwrap())
        .build()
        .unwrap();
    let r = reserve(&limiter, 10).await;
    proxy.set(Fault::Blackhole);
    let failed = r.settle(&limiter, "k", 30).await.unwrap_err();
    assert!(matches!(failed.error, SettleError::Unavailable { .. }), "{failed}");
    assert!(failed.to_string().contains("settle it again"), "{failed}");
    proxy.heal();
    let mut r = failed.reservation;
    // The back-off after a failure refuses calls for a moment: settle until one is answered.
    loop {
        match r.settle(&limiter, "k", 30).await {
            Ok(()) => break,
            Err(again) => r = again.reservation,
        }
    }
    assert_eq!(state(&limiter).await.0, 70, "30 used, once");
}

/// The leased limiter settles from its slice first: a cost below the estimate goes back to the
/// slice; a cost above it is taken from the slice, and only what the slice lacks from Redis.
#[tokio::test]
async fn a_leased_limiter_settles_from_its_slice_then_redis() {
    let server = RedisServer::start();
    let redis = patient(&server.url()).await;
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(1_000));
    let leased = LeasedLimiter::builder(&redis, "slices", Quota::per_minute(100).unwrap())
        .clock(clock.clone())
        .time(RedisTime::clock(clock.clone()))
        .build()
        .unwrap();
    let plain = RedisLimiter::builder(&redis, "slices", AlgorithmKind::FixedWindow)
        .limit("leased", Quota::per_minute(100).unwrap())
        .time(RedisTime::clock(clock.clone()))
        .build()
        .unwrap();
    let r = leased.reserve("k", 10).await.unwrap();
    let held = leased.held("k");
    let budget = plain.check("k", 0).await.unwrap().remaining;
    r.settle(&leased, "k", 4).await.unwrap();
    assert_eq!(leased.held("k"), held + 6, "6 back to the slice");
    let r = leased.reserve("k", 2).await.unwrap();
    let held = leased.held("k");
    r.settle(&leased, "k", 2 + held + 5).await.unwrap();
    assert_eq!(leased.held("k"), 0, "the slice spent first");
    assert_eq!(plain.check("k", 0).await.unwrap().remaining, budget - 5, "the rest charged in Redis");
}

const CHILD_ENV: &str = "TOLLGATE_SETTLE_CHILD";
const TASKS: usize = 4;

/// One process's tasks: each reserves (on a connection that waits) and settles through a proxy
/// that delays answers past a short deadline, sending a settle again until one is answered.
/// Answers the units it settled and the settles it had to send again.
async fn settle_from_tasks(url: &str, seed: u64, rounds: u64) -> (u64, u64) {
    let direct = patient(url).await;
    let proxy = FaultProxy::start(addr(url), seed).await.unwrap();
    // Round trips of 0-30 ms against a 20 ms deadline: about a fifth time out, and land later.
    proxy.set(Fault::Latency { fixed: Duration::ZERO, jitter: Duration::from_millis(15) });
    let late = Redis::connect_with(
        &proxy.redis_url(),
        RedisOptions {
            deadline: Duration::from_millis(20),
            // A back-off as short as the pacing below: the test is about settles sent again.
            backoff_min: Duration::from_millis(1),
            backoff_max: Duration::from_millis(2),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let build = |redis: &Redis| {
        RedisLimiter::builder(redis, "shared", AlgorithmKind::FixedWindow)
            .limit("l", Quota::per(Duration::from_secs(3_600), 1_000_000_000).unwrap())
            .build()
            .unwrap()
    };
    let (reserving, settling) = (build(&direct), build(&late));
    let tasks: Vec<_> = (0..TASKS as u64)
        .map(|t| {
            let (reserving, settling) = (reserving.clone(), settling.clone());
            tokio::spawn(async move {
                let (mut used, mut again) = (0, 0);
                let mut x = seed.wrapping_mul(31).wrapping_add(t);
                for _ in 0..rounds {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let estimate = 1 + (x >> 33) % 50;
                    let actual = (x >> 20) % (2 * estimate + 1);
                    let mut r = reserving.reserve("k", estimate).await.expect("a billion fit");
                    loop {
                        match r.settle(&settling, "k", actual).await {
                            Ok(()) => break,
                            Err(failed) => {
                                again += 1;
                                r = failed.reservation;
                                // Paces the loop through the connection's back-off after a failure.
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                        }
                    }
                    used += actual;
                }
                (used, again)
            })
        })
        .collect();
    let mut total = (0, 0);
    for task in tasks {
        let (used, again) = task.await.unwrap();
        total = (total.0 + used, total.1 + again);
    }
    total
}

/// The other process of the test below, run by it (skipped on its own).
#[tokio::test]
async fn settle_child_process() {
    let Ok(args) = std::env::var(CHILD_ENV) else { return };
    let [url, rounds] = args.split(' ').collect::<Vec<_>>()[..] else { panic!("{args}") };
    let (used, again) = settle_from_tasks(url, 2, rounds.parse().unwrap()).await;
    println!("\nU {used} {again}");
}

/// 8 tasks over 2 processes reserve and settle on one key, their settles timing out and sent
/// again; what Redis counts afterwards is the sum of the actual costs, to the unit.
/// `TOLLGATE_SETTLE_ROUNDS` sets each task's reservations (CI: 100).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settles_from_8_tasks_in_2_processes_count_every_unit_once() {
    use std::process::{Command, Stdio};
    let server = RedisServer::start();
    let rounds = std::env::var("TOLLGATE_SETTLE_ROUNDS").unwrap_or_else(|_| "100".into());
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["settle_child_process", "--exact", "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, format!("{} {rounds}", server.url()))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (mine, my_again) = settle_from_tasks(&server.url(), 1, rounds.parse().unwrap()).await;
    let output = String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap();
    let line = output.lines().find_map(|l| l.strip_prefix("U ")).unwrap_or_else(|| panic!("child said: {output}"));
    let [theirs, their_again] = line.split(' ').map(|n| n.parse::<u64>().unwrap()).collect::<Vec<_>>()[..] else {
        panic!("{line}")
    };
    let limiter = RedisLimiter::builder(&patient(&server.url()).await, "shared", AlgorithmKind::FixedWindow)
        .limit("l", Quota::per(Duration::from_secs(3_600), 1_000_000_000).unwrap())
        .build()
        .unwrap();
    let counted = 1_000_000_000 - limiter.check("k", 0).await.unwrap().remaining;
    eprintln!("settled {mine} + {theirs}, sent again {my_again} + {their_again}, counted {counted}");
    assert!(my_again + their_again > 0, "no settle timed out: the test proved nothing about retries");
    assert_eq!(counted, mine + theirs, "Redis counts the actual costs, each once");
}
