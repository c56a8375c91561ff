//! Decisions that arrive together share script runs (`Redis::batched`), the server's counters and
//! every `RedisLimiter` algorithm: fewer EVALSHA than calls, each call decided alone and exactly
//! (as one EVALSHA each would decide it), a failing call failing alone, and on a cluster one run
//! per hash tag.

use std::time::Duration;

use tollgate::{AlgorithmKind, ManualClock, Quota};
use tollgate_redis::counters::{CountersMode, WindowCounter, decide_windows};
use tollgate_redis::{BackendError, Redis, RedisLimiter, RedisOptions, RedisTime};
use tollgate_testkit::{RedisCluster, RedisServer};

fn options() -> RedisOptions {
    RedisOptions { deadline: Duration::from_secs(5), ..Default::default() }
}

fn clock_time() -> RedisTime {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(1_000));
    RedisTime::clock(clock)
}

/// 200 calls spawned at once on one thread (so every one is queued before the first run goes):
/// a shared counter of 50 admits exactly 50 of them, each admitted call sees its own remaining
/// (49 down to 0, each once: the calls were decided one after the other), each call's own
/// counter took its hit if and only if the call was admitted, and Redis ran a handful of
/// EVALSHA, not 200.
#[test]
fn calls_that_arrive_together_share_runs_and_are_each_decided_alone() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let server = RedisServer::start();
    runtime.block_on(async {
        let redis = Redis::connect_with(&server.url(), options()).await.unwrap();
        let time = clock_time();
        let before = server.script_runs();
        let calls: Vec<_> = (0..200)
            .map(|i| {
                let (redis, time) = (redis.clone(), time.clone());
                tokio::spawn(async move {
                    let shared = WindowCounter::enforcing("rl:{t}:shared".into(), 50, Duration::from_secs(60), 1);
                    let own = WindowCounter::enforcing(format!("rl:{{t}}:own:{i}"), 5, Duration::from_secs(60), 1);
                    decide_windows(&redis, &[shared, own], CountersMode::Take, &time).await.unwrap()
                })
            })
            .collect();
        let mut remaining = Vec::new();
        for (i, call) in calls.into_iter().enumerate() {
            let answer = call.await.unwrap();
            let own = &answer.counters[1].0;
            if answer.admitted {
                remaining.push(answer.counters[0].0.remaining);
                assert_eq!(own.remaining, 4, "call {i}: its own counter took its hit");
            } else {
                assert!(answer.counters[0].1, "call {i} was denied by the shared counter");
                assert_eq!(own.remaining, 5, "call {i}: denied, its own counter took nothing");
            }
        }
        remaining.sort_unstable();
        assert_eq!(remaining, (0..50).collect::<Vec<u64>>(), "each admitted call saw the count its turn left");
        let runs = server.script_runs() - before;
        assert!((1..=10).contains(&runs), "200 calls in {runs} EVALSHA");
    });
}

/// The same for each algorithm of `RedisLimiter`: 200 decisions on one key of 50 at once admit
/// exactly 50, in a handful of runs.
#[test]
fn limiter_decisions_that_arrive_together_share_runs_on_every_algorithm() {
    for kind in [
        AlgorithmKind::TokenBucket,
        AlgorithmKind::FixedWindow,
        AlgorithmKind::WeightedWindow,
        AlgorithmKind::SlidingLog,
    ] {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let server = RedisServer::start();
        runtime.block_on(async {
            let redis = Redis::connect_with(&server.url(), options()).await.unwrap();
            let limiter = RedisLimiter::builder(&redis, "rl", kind)
                .limit("user", Quota::per_hour(50).unwrap())
                .time(clock_time())
                .build()
                .unwrap();
            let before = server.script_runs();
            let calls: Vec<_> = (0..200)
                .map(|_| {
                    let limiter = limiter.clone();
                    tokio::spawn(async move { limiter.try_acquire_or_error("alice", 1).await.unwrap().is_ok() })
                })
                .collect();
            let mut admitted = 0;
            for call in calls {
                admitted += usize::from(call.await.unwrap());
            }
            assert_eq!(admitted, 50, "{kind}");
            let runs = server.script_runs() - before;
            assert!((1..=10).contains(&runs), "{kind}: 200 decisions in {runs} EVALSHA");
        });
    }
}

/// A call on a key that holds another type fails alone, with its key named, and writes nothing;
/// the calls batched with it are decided as if it were not there.
#[test]
fn a_failing_call_fails_alone_in_its_run() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let server = RedisServer::start();
    server.cli(&["LPUSH", "rl:{t}:list", "x"]);
    runtime.block_on(async {
        let redis = Redis::connect_with(&server.url(), options()).await.unwrap();
        let time = clock_time();
        let calls: Vec<_> = ["rl:{t}:a", "rl:{t}:list", "rl:{t}:b", "rl:{t}:a"]
            .into_iter()
            .map(|key| {
                let (redis, time) = (redis.clone(), time.clone());
                let first = WindowCounter::enforcing(key.into(), 10, Duration::from_secs(60), 2);
                let second = WindowCounter::enforcing(format!("{key}:second"), 10, Duration::from_secs(60), 1);
                tokio::spawn(async move { decide_windows(&redis, &[first, second], CountersMode::Take, &time).await })
            })
            .collect();
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.unwrap());
        }
        let remaining = |i: usize| answers[i].as_ref().unwrap().counters[0].0.remaining;
        assert_eq!((remaining(0), remaining(2), remaining(3)), (8, 8, 6));
        let err = answers[1].as_ref().unwrap_err();
        assert!(matches!(err, BackendError::WrongType { key, .. } if key == "rl:{t}:list"), "{err}");
        assert!(!err.is_transient(), "{err}");
        assert_eq!(server.cli(&["EXISTS", "rl:{t}:list:second"]).trim(), "0", "the failed call wrote nothing");
    });
}

/// On a cluster a run is one hash tag's: calls of many tags at once are each decided on their
/// slot's node (a run over several slots would be refused: CROSSSLOT).
#[test]
fn on_a_cluster_calls_are_batched_per_hash_tag() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let cluster = RedisCluster::start(3);
    runtime.block_on(async {
        let urls = cluster.urls();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let redis = Redis::connect_cluster(&urls, options()).await.unwrap();
        let time = clock_time();
        let calls: Vec<_> = (0..120)
            .map(|i| {
                let (redis, time) = (redis.clone(), time.clone());
                let key = format!("rl:{{tag{}}}:k", i % 12);
                tokio::spawn(async move {
                    let counter = WindowCounter::enforcing(key, 100, Duration::from_secs(60), 1);
                    decide_windows(&redis, &[counter], CountersMode::Take, &time).await.unwrap()
                })
            })
            .collect();
        let mut remaining = Vec::new();
        for call in calls {
            let answer = call.await.unwrap();
            assert!(answer.admitted);
            remaining.push(answer.counters[0].0.remaining);
        }
        remaining.sort_unstable();
        let expected: Vec<u64> = (90..100).flat_map(|r| [r; 12]).collect();
        assert_eq!(remaining, expected, "each of 12 tags counted its 10 calls");
    });
}
