//! Redis-specific behaviour: multi-limit atomicity, key expiry, exactness under contention, one
//! round trip per decision, failures (outage, bad URL, auth, WRONGTYPE), commands and pipelines
//! under the same deadline and back-off, and a real cluster.

use std::time::{Duration, Instant};

use tollgate::{ManualClock, Quota, Reason};
use tollgate_redis::{
    AlgorithmKind, BackendError, FailurePolicy, LocalFallback, Redis, RedisLimiter, RedisOptions, RedisTime, redis,
};
use tollgate_testkit::{RedisCluster, RedisServer, free_port};

/// Behaviour on a manual clock: a loaded CI machine must not turn a slow answer into an outage.
async fn connect(server: &RedisServer) -> Redis {
    Redis::connect_with(
        &server.url(),
        tollgate_redis::RedisOptions { deadline: std::time::Duration::from_secs(2), ..Default::default() },
    )
    .await
    .unwrap()
}

/// Every algorithm the Redis limiter runs: the tests below run each behaviour against all of them.
const ALGORITHMS: [AlgorithmKind; 4] =
    [AlgorithmKind::TokenBucket, AlgorithmKind::FixedWindow, AlgorithmKind::WeightedWindow, AlgorithmKind::SlidingLog];

#[tokio::test]
async fn the_catalogue_says_which_algorithms_have_a_script() {
    let server = RedisServer::start();
    let redis = connect(&server).await;
    let runs: Vec<AlgorithmKind> = AlgorithmKind::ALL.into_iter().filter(|k| k.support().redis).collect();
    assert_eq!(runs, ALGORITHMS, "every algorithm with a script is tested below");
    for kind in AlgorithmKind::ALL.into_iter().filter(|k| !k.support().redis) {
        let quota = Quota::per_minute(5).unwrap();
        let err = RedisLimiter::builder(&redis, "nope", kind).limit("user", quota).build().unwrap_err();
        assert_eq!(err, tollgate_redis::ConfigError::Algorithm { prefix: "nope".into(), algorithm: kind });
        assert!(
            err.to_string().contains("expected token_bucket, fixed_window, weighted_window or sliding_log"),
            "{err}"
        );
    }
}

#[tokio::test]
async fn limit_names_that_would_share_a_key_are_refused() {
    let server = RedisServer::start();
    let redis = connect(&server).await;
    let quota = Quota::per_minute(5).unwrap();
    let builder = || RedisLimiter::builder(&redis, "api", AlgorithmKind::TokenBucket);
    // ("a", key "b:c") and ("a:b", key "c") would be one Redis key.
    let err = builder().limit("a", quota).limit("a:b", quota).build().unwrap_err();
    assert_eq!(err, tollgate_redis::ConfigError::LimitName { prefix: "api".into(), name: "a:b".into() });
    assert!(err.to_string().contains("\"a:b\" has a ':'"), "{err}");
    let err = builder().limit("minute", quota).limit("minute", quota).build().unwrap_err();
    assert_eq!(err, tollgate_redis::ConfigError::DuplicateLimit { prefix: "api".into(), name: "minute".into() });
    assert!(builder().limit("a", quota).limit("b", quota).build().is_ok());
}

#[tokio::test]
async fn several_limits_are_all_or_nothing() {
    let server = RedisServer::start();
    let redis = connect(&server).await;
    let clock = ManualClock::new();
    for algorithm in ALGORITHMS {
        let l = RedisLimiter::builder(&redis, &format!("multi:{algorithm:?}"), algorithm)
            .limit("user", Quota::per_minute(5).unwrap())
            .limit("tenant", Quota::per_minute(8).unwrap())
            .time(RedisTime::clock(clock.clone()))
            .build()
            .unwrap();
        let _ = l.try_acquire_keys("acme", &["alice", "acme"], 5).await.unwrap().unwrap();
        // Bob's own limit has room (5) but the tenant has only 3 left: nothing may be taken from bob.
        let no = l.try_acquire_keys("acme", &["bob", "acme"], 4).await.unwrap().unwrap_err();
        assert_eq!(no.reason(), Reason::Exhausted, "{algorithm:?}");
        assert_eq!(no.remaining(), 3, "{algorithm:?}: tightest remaining is the tenant's");
        let lease = l.try_acquire_keys("acme", &["bob", "acme"], 3).await.unwrap().unwrap();
        assert_eq!(lease.remaining(), 0, "{algorithm:?}");
        // Bob took 3 of his 5, not 3 + 4.
        let alone = RedisLimiter::builder(&redis, &format!("multi:{algorithm:?}"), algorithm)
            .limit("user", Quota::per_minute(5).unwrap())
            .time(RedisTime::clock(clock.clone()))
            .build()
            .unwrap();
        let probe = alone.try_acquire_keys("acme", &["bob"], 0).await.unwrap().unwrap();
        assert_eq!(probe.remaining(), 2, "{algorithm:?}: the rejected attempt took nothing from bob");
    }
}

#[tokio::test]
async fn keys_expire_when_they_stop_mattering() {
    let server = RedisServer::start();
    let redis = connect(&server).await;
    let period = Duration::from_millis(800);
    for algorithm in ALGORITHMS {
        let l = RedisLimiter::builder(&redis, &format!("ttl:{algorithm:?}"), algorithm)
            .limit("l", Quota::per(period, 4).unwrap())
            .build()
            .unwrap();
        for key in ["a", "b", "c"] {
            let _ = l.try_acquire(key, 2).await.unwrap();
            let _ = l.check(key, 1).await;
        }
    }
    // Probes and checks store nothing; every stored key carries a TTL no longer than the time it
    // can still matter (a token bucket until it is full, a window until it has slid past).
    let keys = server.cli(&["--scan"]);
    let keys: Vec<&str> = keys.lines().collect();
    assert_eq!(keys.len(), 12, "{keys:?}");
    for key in keys {
        let ttl: i64 = server.cli(&["PTTL", key]).parse().unwrap();
        assert!(ttl > 0 && ttl <= 2 * 800 + 2, "{key} has PTTL {ttl}");
    }
}

/// Keys really go: with a 50 ms period every key is gone soon after its last use.
#[tokio::test]
async fn dbsize_returns_to_zero() {
    let server = RedisServer::start();
    let redis = connect(&server).await;
    for algorithm in ALGORITHMS {
        let l = RedisLimiter::builder(&redis, &format!("gone:{algorithm:?}"), algorithm)
            .limit("l", Quota::per(Duration::from_millis(50), 5).unwrap())
            .build()
            .unwrap();
        for key in 0..20 {
            let _ = l.try_acquire(&key.to_string(), 1).await;
        }
    }
    assert!(server.cli(&["DBSIZE"]).parse::<u64>().unwrap() > 0);
    // Waiting for Redis's own expiry is the behaviour under test (at most 2 periods + 1 ms).
    let deadline = Instant::now() + Duration::from_secs(3);
    while server.cli(&["DBSIZE"]) != "0" {
        assert!(Instant::now() < deadline, "keys left: {}", server.cli(&["--scan"]));
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn one_round_trip_per_decision() {
    let server = RedisServer::start();
    let redis = connect(&server).await;
    let l = RedisLimiter::builder(&redis, "rt", AlgorithmKind::TokenBucket)
        .limit("a", Quota::per_second(1000).unwrap())
        .limit("b", Quota::per_second(500).unwrap())
        .build()
        .unwrap();
    let _ = l.try_acquire("warm", 1).await; // loads the function (not found, FUNCTION LOAD, FCALL)
    server.cli(&["CONFIG", "RESETSTAT"]);
    for i in 0..100 {
        let _ = l.try_acquire(&format!("k{}", i % 7), 1).await;
    }
    // GET/SET inside the function are counted too; what matters is no extra client command.
    let extra = ["evalsha", "eval", "script|load", "function|load"].map(|c| server.calls(c));
    assert_eq!((server.calls("fcall"), extra), (100, [0; 4]));
    // After a FUNCTION FLUSH (a restarted or failed-over server), it is loaded again, once.
    server.cli(&["FUNCTION", "FLUSH"]);
    server.cli(&["CONFIG", "RESETSTAT"]);
    assert_eq!(l.try_acquire("k", 1).await.unwrap().reason(), Reason::Granted);
    assert_eq!((server.calls("fcall"), server.calls("function|load")), (2, 1));
}

/// A user that may not load functions (`-function`), or not call them (`-fcall`), is served by
/// the same scripts with EVALSHA, decided alike; NOSCRIPT loads the script as before.
#[tokio::test]
async fn without_functions_the_scripts_run_as_evalsha() {
    let server = RedisServer::start();
    for (user, denied) in [("noload", "-function"), ("nofcall", "-fcall")] {
        server.cli(&["ACL", "SETUSER", user, "on", ">secret", "~*", "&*", "+@all", denied]);
        let url = server.url().replacen("redis://", &format!("redis://{user}:secret@"), 1);
        let redis = Redis::connect_with(&url, RedisOptions { deadline: Duration::from_secs(2), ..Default::default() })
            .await
            .unwrap();
        let l = RedisLimiter::builder(&redis, user, AlgorithmKind::TokenBucket)
            .limit("a", Quota::per_hour(10).unwrap())
            .build()
            .unwrap();
        server.cli(&["CONFIG", "RESETSTAT"]);
        let admitted = granted(&l, 15).await;
        assert_eq!(admitted, 10, "{user}: a burst of 10 admits 10 of 15");
        // At most the first FCALL ran (and found no function: a user without `-function`'s rights
        // cannot load it); the rest went as EVALSHA.
        assert!(server.calls("fcall") <= 1 && server.calls("function|load") == 0, "{user}: functions refused");
        assert!(server.calls("evalsha") >= 15, "{user}: every call ran as EVALSHA");
        server.cli(&["SCRIPT", "FLUSH"]);
        server.cli(&["CONFIG", "RESETSTAT"]);
        assert_eq!(l.try_acquire("b", 1).await.unwrap().reason(), Reason::Granted);
        assert_eq!((server.calls("evalsha"), server.calls("script|load")), (2, 1), "{user}: NOSCRIPT, loaded once");
    }
}

/// Takes 1 permit of key "a" `n` times, one after the other: how many were granted.
async fn granted(l: &RedisLimiter, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        admitted += usize::from(l.try_acquire("a", 1).await.is_ok_and(|lease| lease.reason() == Reason::Granted));
    }
    admitted
}

/// 8 independent connections hammer one token bucket on the server's real clock; the admitted
/// count never exceeds what the quota allows over the elapsed server time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_under_contention() {
    let server = RedisServer::start();
    let quota = Quota::per(Duration::from_millis(100), 20).unwrap().with_burst(20).unwrap();
    let time_us = |s: &RedisServer| {
        let t = s.cli(&["TIME"]);
        let mut it = t.lines().map(|v| v.trim().parse::<u64>().unwrap());
        it.next().unwrap() * 1_000_000 + it.next().unwrap()
    };
    let start = time_us(&server);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let redis =
            Redis::connect_with(&server.url(), RedisOptions { deadline: Duration::from_secs(2), ..Default::default() })
                .await
                .unwrap();
        let l =
            RedisLimiter::builder(&redis, "contention", AlgorithmKind::TokenBucket).limit("l", quota).build().unwrap();
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0u64;
            let until = Instant::now() + Duration::from_millis(1200); // 12 windows of 100 ms
            while Instant::now() < until {
                match l.try_acquire("shared", 1).await {
                    Ok(_) => admitted += 1,
                    Err(r) => assert_eq!(r.reason(), Reason::Exhausted),
                }
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    let elapsed_us = time_us(&server) - start;
    // burst + one permit per 5 ms of server time.
    let bound = 20 + elapsed_us / 5_000;
    assert!(admitted <= bound, "admitted {admitted} > bound {bound}");
    assert!(admitted >= bound * 8 / 10, "admitted {admitted}, bound {bound}: the limit should be used");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_follows_the_policy_within_the_deadline_and_recovers() {
    let mut server = RedisServer::start();
    let options = RedisOptions {
        deadline: Duration::from_millis(50),
        backoff_max: Duration::from_millis(250),
        ..Default::default()
    };
    let redis = Redis::connect_with(&server.url(), options).await.unwrap();
    let policies = [
        (FailurePolicy::Deny, Reason::Unavailable),
        (FailurePolicy::Allow, Reason::FailOpen),
        (FailurePolicy::local_share(Quota::per_second(1000).unwrap(), 4).unwrap(), Reason::Fallback),
    ];
    let limiters: Vec<_> = policies
        .iter()
        .map(|(p, _)| {
            RedisLimiter::builder(&redis, "outage", AlgorithmKind::TokenBucket)
                .limit("l", Quota::per_second(1000).unwrap())
                .failure_policy(p.clone())
                .build()
                .unwrap()
        })
        .collect();
    for l in &limiters {
        assert_eq!(l.try_acquire("k", 1).await.unwrap().reason(), Reason::Granted);
    }
    server.kill();
    for _ in 0..30 {
        for (l, (_, expected)) in limiters.iter().zip(&policies) {
            let t = Instant::now();
            let reason = match l.try_acquire("k", 1).await {
                Ok(lease) => lease.reason(),
                Err(r) => r.reason(),
            };
            assert_eq!(reason, *expected);
            assert!(t.elapsed() < Duration::from_millis(300), "took {:?}", t.elapsed());
        }
    }
    assert!(redis.last_error().is_some());
    server.restart();
    let restarted = Instant::now();
    loop {
        if let Ok(lease) = limiters[0].try_acquire("k", 1).await
            && lease.reason() == Reason::Granted
        {
            break;
        }
        assert!(restarted.elapsed() < Duration::from_secs(1), "still not using redis 1 s after the restart");
        tokio::task::yield_now().await;
    }
    assert!(redis.last_error().is_none());
}

#[tokio::test]
async fn bad_urls_auth_and_wrong_types_are_clear_errors() {
    let err = Redis::connect("http://nope").await.err().unwrap();
    assert!(matches!(err, BackendError::InvalidUrl { .. }), "{err}");
    assert!(err.to_string().contains("http://nope"), "{err}");

    let url = format!("redis://127.0.0.1:{}/", free_port());
    let err = Redis::connect(&url).await.err().unwrap();
    assert!(matches!(err, BackendError::Connect { .. }), "{err}");
    assert!(err.to_string().contains(&url), "{err}");

    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let err = Redis::connect(&server.url()).await.err().unwrap();
    assert!(matches!(err, BackendError::Auth { .. }), "{err}");
    let wrong = server.url().replace("redis://", "redis://:wrong@");
    let err = Redis::connect(&wrong).await.err().unwrap();
    assert!(matches!(err, BackendError::Auth { .. }), "{err}");
    let redis = Redis::connect(&server.url().replace("redis://", "redis://:s3cret@")).await.unwrap();

    let l = RedisLimiter::builder(&redis, "typed", AlgorithmKind::TokenBucket)
        .limit("l", Quota::per_second(5).unwrap())
        .build()
        .unwrap();
    let key = &l.redis_keys("victim")[0];
    server.cli(&["-a", "s3cret", "--no-auth-warning", "LPUSH", key, "x"]);
    let err = l.try_acquire_or_error("victim", 1).await.unwrap_err();
    assert!(matches!(&err, BackendError::WrongType { key: k, .. } if k == key), "{err}");
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    // Through the failure policy (deny), the caller sees "unavailable", never "limited".
    assert_eq!(l.try_acquire("victim", 1).await.unwrap_err().reason(), Reason::Unavailable);
    // A wrong type is the caller's data, not an outage: other keys still go to Redis.
    assert_eq!(l.try_acquire("other", 1).await.unwrap().reason(), Reason::Granted);

    let none = RedisLimiter::builder(&redis, "empty", AlgorithmKind::TokenBucket).build().err().unwrap();
    assert!(none.to_string().contains("empty"), "{none}");
}

#[tokio::test]
async fn commands_and_pipelines_answer_and_name_the_key_of_a_wrong_type() {
    let server = RedisServer::start();
    let redis = connect(&server).await;
    let id: String = redis.query(redis::cmd("XADD").arg("orders").arg("*").arg("sku").arg(42)).await.unwrap();
    assert!(id.contains('-'), "a stream entry id: {id}");
    assert_eq!(redis.query::<u64>(redis::cmd("XLEN").arg("orders")).await.unwrap(), 1);
    let mut pipe = redis::pipe();
    pipe.atomic().cmd("INCR").arg("{t}a").cmd("SET").arg("{t}b").arg(7).ignore().cmd("INCRBY").arg("{t}b").arg(2);
    assert_eq!(redis.pipeline::<(u64, u64)>(&pipe).await.unwrap(), (1, 9));

    server.cli(&["LPUSH", "listed", "x"]);
    let err = redis.query::<Option<String>>(redis::cmd("GET").arg("listed")).await.unwrap_err();
    assert!(matches!(&err, BackendError::WrongType { key, .. } if key == "listed"), "{err}");
    let mut pipe = redis::pipe();
    pipe.atomic().cmd("INCR").arg("counted").cmd("HINCRBY").arg("listed").arg("f").arg(1);
    let err = redis.pipeline::<(u64, u64)>(&pipe).await.unwrap_err();
    assert!(matches!(&err, BackendError::WrongType { key, .. } if key == "listed"), "{err}");
    let read = redis::cmd("XREADGROUP").arg("GROUP").arg("g").arg("c").arg("STREAMS").arg("listed").arg(">").clone();
    let err = redis.query::<redis::Value>(&read).await.unwrap_err();
    assert!(matches!(&err, BackendError::WrongType { key, .. } if key == "listed"), "{err}");
    assert!(!err.is_transient());
}

/// A command Redis refuses is an error of that command, not an outage: no back-off for the rest.
#[tokio::test]
async fn a_refused_command_opens_no_back_off() {
    let server = RedisServer::start();
    let redis = connect(&server).await;
    let mut create = redis::cmd("XGROUP");
    create.arg("CREATE").arg("jobs").arg("workers").arg("0").arg("MKSTREAM");
    redis.query::<()>(&create).await.unwrap();
    let err = redis.query::<()>(&create).await.unwrap_err();
    assert!(matches!(&err, BackendError::Redis(e) if e.code() == Some("BUSYGROUP")), "{err}");
    assert!(!err.is_transient(), "{err}");
    let err = redis.query::<u64>(redis::cmd("GET").arg("jobs-missing")).await.unwrap_err();
    assert!(!err.is_transient(), "nil is not a number: {err}");
    assert_eq!(redis.query::<u64>(redis::cmd("XLEN").arg("jobs")).await.unwrap(), 0);
    assert!(redis.last_error().is_none());
}

/// A handle with a longer deadline shares the connection and the back-off: a hung server costs it
/// its own deadline, and every handle then backs off until Redis answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_s_own_deadline_bounds_its_calls_and_shares_the_back_off() {
    let server = RedisServer::start();
    let options = RedisOptions { deadline: Duration::from_millis(50), ..Default::default() };
    let redis = Redis::connect_with(&server.url(), options).await.unwrap();
    let patient = redis.with_deadline(Duration::from_millis(400));
    assert_eq!((redis.deadline(), patient.deadline()), (Duration::from_millis(50), Duration::from_millis(400)));
    assert_eq!(patient.query::<String>(&redis::cmd("PING")).await.unwrap(), "PONG");

    server.pause();
    let started = Instant::now();
    let err = patient.query::<String>(&redis::cmd("PING")).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, BackendError::Timeout(d) if d == Duration::from_millis(400)), "{err}");
    assert!(took >= Duration::from_millis(400) && took < Duration::from_secs(2), "took {took:?}");
    let err = redis.query::<String>(&redis::cmd("PING")).await.unwrap_err();
    assert!(matches!(err, BackendError::BackingOff { .. }), "the back-off is shared: {err}");
    assert!(err.is_transient());

    server.resume();
    let resumed = Instant::now();
    while patient.query::<String>(&redis::cmd("PING")).await.is_err() {
        assert!(resumed.elapsed() < Duration::from_secs(3), "still failing 3 s after the server resumed");
        tokio::task::yield_now().await;
    }
    assert!(redis.last_error().is_none());
}

#[tokio::test]
async fn no_error_or_accessor_shows_the_password_of_a_url() {
    const SECRET: &str = "hunter2-s3cret";
    let shows_no_secret = |what: &str, text: String| {
        assert!(!text.contains(SECRET), "{what} shows the password: {text}");
    };
    let check = |e: &BackendError| {
        shows_no_secret("Display", e.to_string());
        shows_no_secret("Debug", format!("{e:?}"));
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            shows_no_secret("a source", format!("{s} / {s:?}"));
            source = s.source();
        }
    };

    // Nobody listens: a connect error naming the address, not the password.
    let url = format!("redis://app:{SECRET}@127.0.0.1:{}/0", free_port());
    let err = Redis::connect(&url).await.err().unwrap();
    assert!(matches!(err, BackendError::Connect { .. }), "{err}");
    assert!(err.is_transient(), "nobody listening may be a restart: {err}");
    assert!(err.to_string().contains("redis://***@127.0.0.1:"), "{err}");
    check(&err);

    // A URL that does not parse, with a password in it.
    let err = Redis::check_url(&format!("redis://app:{SECRET}@127.0.0.1:notaport/0")).unwrap_err();
    assert!(matches!(err, BackendError::InvalidUrl { .. }), "{err}");
    assert!(!err.is_transient());
    check(&err);

    // The wrong password, and the right one: url() and Debug show neither.
    let server = RedisServer::start_with(&["--requirepass", SECRET]);
    let wrong = server.url().replace("redis://", "redis://:not-the-password@");
    let err = Redis::connect(&wrong).await.err().unwrap();
    assert!(matches!(err, BackendError::Auth { .. }), "{err}");
    assert!(!err.is_transient(), "wrong credentials stay wrong: {err}");
    assert!(!err.to_string().contains("not-the-password"), "{err}");
    check(&err);
    let redis = Redis::connect(&server.url().replace("redis://", &format!("redis://:{SECRET}@"))).await.unwrap();
    assert_eq!(redis.url(), server.url().replace("redis://", "redis://***@"));
    shows_no_secret("Redis::url", redis.url().to_owned());
    shows_no_secret("Redis's Debug", format!("{redis:?}"));

    // Redis gone: the decision's error and last_error() name the address, not the password.
    let options = RedisOptions { deadline: Duration::from_millis(50), ..Default::default() };
    let redis =
        Redis::connect_with(&server.url().replace("redis://", &format!("redis://:{SECRET}@")), options).await.unwrap();
    let l = RedisLimiter::builder(&redis, "secret", AlgorithmKind::TokenBucket)
        .limit("l", Quota::per_second(5).unwrap())
        .build()
        .unwrap();
    drop(server);
    let err = l.try_acquire_or_error("k", 1).await.unwrap_err();
    assert!(err.is_transient(), "an outage is transient: {err}");
    check(&err);
    shows_no_secret("last_error", redis.last_error().unwrap_or_default());
}

#[tokio::test]
async fn more_than_the_capacity_is_refused_with_or_without_redis_never_an_error() {
    let server = RedisServer::start();
    let options = RedisOptions { deadline: Duration::from_millis(50), ..Default::default() };
    let redis = Redis::connect_with(&server.url(), options).await.unwrap();
    let l = RedisLimiter::builder(&redis, "over", AlgorithmKind::FixedWindow)
        .limit("l", Quota::per_second(5).unwrap())
        .build()
        .unwrap();
    let _taken = l.try_acquire("k", 2).await.unwrap();
    // With Redis: refused, reporting the key's state (3 left), with no retry-after.
    let refused = l.check_or_error("k", 6).await.unwrap().unwrap_err();
    assert_eq!((refused.reason(), refused.remaining(), refused.retry_after()), (Reason::ExceedsCapacity, 3, None));
    let refused = l.try_acquire_or_error("k", 6).await.unwrap().unwrap_err();
    assert_eq!((refused.reason(), refused.remaining()), (Reason::ExceedsCapacity, 3));
    // Without: still refused (no error to answer, no failure policy to grant it), nothing left.
    drop(server);
    let refused = l.check_or_error("k", 6).await.unwrap().unwrap_err();
    assert_eq!((refused.reason(), refused.remaining(), refused.retry_after()), (Reason::ExceedsCapacity, 0, None));
    let refused = l.try_acquire_or_error("k", 6).await.unwrap().unwrap_err();
    assert_eq!((refused.reason(), refused.remaining()), (Reason::ExceedsCapacity, 0));
    // What fits is Redis's to answer: an error.
    assert!(l.check_or_error("k", 1).await.is_err());
}

#[tokio::test]
async fn acquire_reserves_the_earliest_slot_and_max_wait_takes_nothing() {
    let server = RedisServer::start();
    let redis = connect(&server).await;
    let clock = ManualClock::new();
    let l = RedisLimiter::builder(&redis, "reserve", AlgorithmKind::TokenBucket)
        .limit("l", Quota::per_second(10).unwrap())
        .time(RedisTime::clock(clock.clone()))
        .max_wait(Duration::from_millis(250))
        .build()
        .unwrap();
    let _ = l.try_acquire("k", 10).await.unwrap();
    let no = l.acquire("k", 3).await.unwrap_err(); // needs 300 ms
    assert_eq!(no.reason(), Reason::MaxWait);
    assert_eq!(l.check("k", 0).await.unwrap().retry_ns, Some(100_000_000), "the rejected reservation took nothing");
    // Two reservations in a row: 100 ms and 200 ms from now, in order.
    let first = l.acquire("k", 1);
    let driver = async {
        while clock.pending_sleeps() == 0 {
            tokio::task::yield_now().await;
        }
        clock.advance(Duration::from_millis(100));
    };
    let (lease, ()) = tokio::join!(first, driver);
    assert_eq!(lease.unwrap().granted_at(), 100_000_000);
}

/// A real 3-node cluster: decisions with several limits land on one slot through the hash tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_on_a_three_node_cluster() {
    let cluster = RedisCluster::start(3);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let redis = Redis::connect_cluster(&urls, RedisOptions { deadline: Duration::from_secs(2), ..Default::default() })
        .await
        .unwrap();
    let l = RedisLimiter::builder(&redis, "cluster", AlgorithmKind::SlidingLog)
        .limit("user", Quota::per_minute(3).unwrap())
        .limit("tenant", Quota::per_minute(5).unwrap())
        .build()
        .unwrap();
    // Many tenants, so the keys spread over all three nodes' slots.
    for t in 0..30 {
        let tenant = format!("tenant{t}");
        let _ = l.try_acquire_keys(&tenant, &["u1", &tenant], 3).await.unwrap().unwrap();
        let no = l.try_acquire_keys(&tenant, &["u2", &tenant], 3).await.unwrap().unwrap_err();
        assert_eq!(no.reason(), Reason::Exhausted, "{tenant}");
        let _ = l.try_acquire_keys(&tenant, &["u2", &tenant], 2).await.unwrap().unwrap();
    }
    let per_node: Vec<u64> = cluster.nodes().iter().map(|n| n.cli(&["DBSIZE"]).parse().unwrap()).collect();
    assert!(per_node.iter().filter(|&&k| k > 0).count() >= 2, "keys on one node only: {per_node:?}");

    // Commands go to their key's node; a pipeline goes to one node, so its keys share a hash tag.
    for t in 0..30 {
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("INCR").arg(format!("{{q{t}}}:a")).cmd("INCRBY").arg(format!("{{q{t}}}:b")).arg(t);
        assert_eq!(redis.pipeline::<(u64, u64)>(&pipe).await.unwrap(), (1, t));
        assert_eq!(redis.query::<u64>(redis::cmd("GET").arg(format!("{{q{t}}}:b"))).await.unwrap(), t);
    }
    let mut across = redis::pipe();
    across.cmd("INCR").arg("{q0}:a").cmd("INCR").arg("{q1}:a");
    let err = redis.pipeline::<(u64, u64)>(&across).await.unwrap_err();
    assert!(!err.is_transient(), "keys of two slots in one pipeline is the caller's fault: {err}");
    assert_eq!(redis.query::<u64>(redis::cmd("GET").arg("{q0}:a")).await.unwrap(), 1, "nothing ran, no back-off");
}

/// What a local fallback granted during an outage is counted in Redis by the first decision Redis
/// answers afterwards, for every algorithm: Redis then has exactly that much less to grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_fallback_s_grants_are_counted_in_redis_when_it_answers_again() {
    let server = RedisServer::start();
    let upstream = format!("127.0.0.1:{}", server.port).parse().unwrap();
    let proxy = tollgate_testkit::FaultProxy::start(upstream, 1).await.unwrap();
    let options = RedisOptions {
        deadline: Duration::from_millis(20),
        backoff_max: Duration::from_millis(40),
        ..Default::default()
    };
    let redis = Redis::connect_with(&proxy.redis_url(), options).await.unwrap();
    let clock = ManualClock::new();
    for algorithm in ALGORITHMS {
        let local = std::sync::Arc::new(LocalFallback::new(Quota::per_second(2000).unwrap()));
        let limiter = |redis: &Redis| {
            RedisLimiter::builder(redis, &format!("charge:{algorithm:?}"), algorithm)
                .limit("l", Quota::per_minute(100).unwrap())
                .time(RedisTime::clock(clock.clone()))
        };
        let l = limiter(&redis).failure_policy(FailurePolicy::Local(local.clone())).build().unwrap();
        // What is read outside the outage is read with a deadline no loaded machine misses.
        let patient = limiter(&redis.with_deadline(Duration::from_secs(10))).build().unwrap();
        assert_eq!(patient.try_acquire("k", 10).await.unwrap().reason(), Reason::Granted);
        proxy.set(tollgate_testkit::Fault::Blackhole);
        // The local bucket starts the outage empty and earns 2 permits a millisecond.
        let started = Instant::now();
        while local.owed() < 20 {
            if let Ok(lease) = l.try_acquire("k", 1).await {
                assert_eq!(lease.reason(), Reason::Fallback, "{algorithm:?}");
            }
            assert!(started.elapsed() < Duration::from_secs(5), "{algorithm:?}: the fallback granted nothing");
        }
        let owed = local.owed();
        proxy.heal();
        let probe = loop {
            match l.try_acquire_or_error("k", 0).await {
                Ok(answer) => break answer.unwrap(),
                Err(_) => tokio::task::yield_now().await,
            }
        };
        // A decision that missed its deadline may still reach Redis when the partition heals and
        // be counted there (the safe side): the outage's first, and at most one more sent before
        // the local bucket, emptied when the outage began, granted its first permit (later calls
        // fail at once in the client's back-off, or send a charge first, which fails). Every
        // charge sent during the outage lands then too, and the charge sent again after them:
        // each counts only what none counted before, so the debt is counted once.
        let counted = 100 - 10 - probe.remaining();
        assert!((owed..=owed + 2).contains(&counted), "{algorithm:?}: {owed} owed, {counted} counted");
        assert_eq!(local.owed(), 0, "{algorithm:?}: counted once");
        let again = patient.try_acquire_or_error("k", 0).await.unwrap().unwrap();
        assert_eq!(again.remaining(), probe.remaining(), "{algorithm:?}: not counted twice");
    }
}

/// `reset` deletes every limit's key of one limiter key, whatever the algorithm: that key's next
/// decision starts full, other keys keep their state, and a key never seen has nothing to forget.
#[tokio::test]
async fn reset_forgets_one_key_in_every_limit_and_keeps_the_others() {
    let server = RedisServer::start();
    let redis = connect(&server).await;
    let clock = ManualClock::new();
    for algorithm in ALGORITHMS {
        let prefix = format!("reset:{algorithm:?}");
        let l = RedisLimiter::builder(&redis, &prefix, algorithm)
            .limit("minute", Quota::per_minute(5).unwrap())
            .limit("hour", Quota::per_hour(8).unwrap())
            .time(RedisTime::clock(clock.clone()))
            .build()
            .unwrap();
        let _ = l.try_acquire("alice", 5).await.unwrap();
        let _ = l.try_acquire("bob", 2).await.unwrap();
        assert_eq!(l.try_acquire("alice", 1).await.unwrap_err().reason(), Reason::Exhausted, "{algorithm:?}");
        assert!(l.reset("alice").await.unwrap(), "{algorithm:?}");
        for key in l.redis_keys("alice") {
            assert_eq!(server.cli(&["EXISTS", &key]), "0", "{algorithm:?}: {key}");
        }
        assert_eq!(l.check("alice", 0).await.unwrap().remaining, 5, "{algorithm:?}: full again");
        assert_eq!(l.check("bob", 0).await.unwrap().remaining, 3, "{algorithm:?}: bob untouched");
        let lease = l.try_acquire("alice", 5).await.unwrap();
        assert_eq!(lease.remaining(), 0, "{algorithm:?}: the whole minute's 5 again");
        assert!(!l.reset("carol").await.unwrap(), "{algorithm:?}: never seen");
    }
}

/// A reset needs Redis: when it is down, the error says so (no failure policy decides a reset).
#[tokio::test]
async fn reset_reports_an_outage() {
    let mut server = RedisServer::start();
    let redis = connect(&server).await;
    let l = RedisLimiter::builder(&redis, "reset-outage", AlgorithmKind::TokenBucket)
        .limit("l", Quota::per_minute(60).unwrap())
        .failure_policy(FailurePolicy::Allow)
        .build()
        .unwrap();
    let _ = l.try_acquire("alice", 1).await.unwrap();
    server.kill();
    let error = l.reset("alice").await.unwrap_err();
    assert!(error.is_transient(), "{error:?}");
}

/// The server's counters listed by SCAN steps: every counter matching the pattern once the scan
/// is over (glob characters in the tag taken literally, keys of other types left out), and
/// deleted with a count of those whose window was still open.
#[tokio::test]
async fn counters_are_scanned_in_steps_and_deleted_with_a_count_of_the_live_ones() {
    use std::collections::HashSet;
    use tollgate_redis::counters::{
        CountersMode, WindowCounter, WindowKey, decide_windows, delete_windows, scan_windows,
    };
    use tollgate_redis::{Keyspace, RedisTime};

    let server = RedisServer::start();
    let redis = connect(&server).await;
    let counter = |key: String, window: u64| WindowCounter::enforcing(key, 10, Duration::from_secs(window), 3);
    let now = 1_000_000_000;
    let clock = ManualClock::new();
    clock.advance(Duration::from_micros(now));
    let time = RedisTime::clock(clock.clone());
    for i in 0..300 {
        // Every third counter has a 1 s window, over by the time of the scan below.
        let window = if i % 3 == 0 { 1 } else { 60 };
        let one = [counter(format!("rl:{{a*}}:{i}"), window)];
        assert!(decide_windows(&redis, &one, CountersMode::Take, &time).await.unwrap().admitted);
    }
    let other = [counter("rl:{ab}:1".into(), 60)];
    assert!(decide_windows(&redis, &other, CountersMode::Take, &time).await.unwrap().admitted);
    server.cli(&["SET", "rl:{a*}:not-a-hash", "1"]);

    let counters = Keyspace::new("rl:");
    let later = now + 2_000_000;
    clock.advance(Duration::from_secs(2));
    let (mut cursor, mut steps, mut found) = (0, 0, Vec::new());
    loop {
        let page = scan_windows(&redis, &counters, "a*", cursor, 50, &time).await.unwrap();
        assert_eq!(page.now_us, later);
        found.extend(page.windows);
        steps += 1;
        cursor = page.cursor;
        if cursor == 0 {
            break;
        }
    }
    assert!(steps > 1, "a COUNT of 50 takes several steps over 302 keys");
    let keys: HashSet<&str> = found.iter().map(|w| w.key.as_str()).collect();
    assert_eq!(keys.len(), 300, "every counter of the tag, no other key");
    let window = found.iter().find(|w| w.key == "rl:{a*}:1").unwrap();
    assert_eq!((window.end_us, window.count), (now + 60_000_000, 3));
    assert_eq!(window.state(10, None, later), Some((7, 58_000_000)));

    let doomed: Vec<WindowKey> = (0..150)
        .map(|i| WindowKey {
            key: format!("rl:{{a*}}:{i}"),
            window: Duration::from_secs(if i % 3 == 0 { 1 } else { 60 }),
            calendar: None,
        })
        .collect();
    assert_eq!(delete_windows(&redis, &doomed, &time).await.unwrap(), 100, "50 of the 150 windows were over");
    assert_eq!(server.cli(&["EXISTS", "rl:{a*}:1"]), "0");
    assert_eq!(server.cli(&["EXISTS", "rl:{a*}:150"]), "1");
    assert_eq!(server.cli(&["EXISTS", "rl:{ab}:1"]), "1");

    // Calendar windows: a counter is live in the calendar window it was stored for only.
    let day = (now - 5_000_000, now + 86_400_000_000 - 5_000_000);
    // Stored at `now`, listed at `later`.
    let at_now = ManualClock::new();
    at_now.advance(Duration::from_micros(now));
    let at_now = RedisTime::clock(at_now);
    for key in ["rl:{cal}:now", "rl:{cal}:older"] {
        let one = [WindowCounter { calendar: Some(day), ..counter(key.into(), 86_400) }];
        assert!(decide_windows(&redis, &one, CountersMode::Take, &at_now).await.unwrap().admitted);
    }
    let page = scan_windows(&redis, &counters, "cal", 0, 1000, &time).await.unwrap();
    let stored = page.windows.iter().find(|w| w.key == "rl:{cal}:now").unwrap();
    assert_eq!(stored.state(10, Some(day), later), Some((7, day.1 - later)));
    let next_day = (day.1, day.1 + 86_400_000_000);
    assert_eq!(stored.state(10, Some(next_day), day.1), None, "yesterday's");
    let key = |key: &str, calendar| WindowKey { key: key.into(), window: Duration::from_secs(86_400), calendar };
    let both = [key("rl:{cal}:now", Some(day)), key("rl:{cal}:older", Some(next_day))];
    assert_eq!(delete_windows(&redis, &both, &time).await.unwrap(), 1, "the older day's counter is no counter");
    assert_eq!(server.cli(&["EXISTS", "rl:{cal}:older"]), "0", "deleted all the same");
}

/// Deployed state lives under these keys: the layout of each type must not move when the code
/// that builds them does.
#[tokio::test]
async fn each_type_keeps_its_deployed_keys() {
    let server = RedisServer::start();
    let redis = connect(&server).await;
    let quota = Quota::per_minute(5).unwrap();
    let two = RedisLimiter::builder(&redis, "api", AlgorithmKind::FixedWindow)
        .limit("user", quota)
        .limit("tenant", quota)
        .build()
        .unwrap();
    assert_eq!(two.redis_keys("user:42"), ["api:{user:42}:user", "api:{user:42}:tenant"]);
    let _lease = two.try_acquire_keys("acme", &["user:42", "acme"], 1).await.unwrap().unwrap();
    for key in ["api:{acme}:user:user:42", "api:{acme}:tenant"] {
        assert_eq!(server.cli(&["EXISTS", key]), "1", "{key}");
    }

    let semaphore = tollgate_redis::RedisSemaphore::builder(&redis, "db", 2).build().unwrap();
    let held = semaphore.try_acquire().await.unwrap();
    for key in ["holders", "tokens", "fence"] {
        let key = format!("tollgate:semaphore:{{db}}:{key}");
        assert_eq!(server.cli(&["EXISTS", &key]), "1", "{key}");
    }
    drop(held);
}
