//! `redis+sentinel://` against a real deployment started by each test: a master, a replica
//! (`--replicaof`) and a Redis Sentinel (`redis-server sentinel.conf --sentinel`), each on a free
//! port. A limiter decides on the master the sentinel names; after a failover (asked for with
//! `SENTINEL FAILOVER`, or forced by killing the master) decisions resume on the new master within
//! a bounded time, polled; a master name the sentinel does not monitor is a clear error; and
//! `rediss+sentinel://` reaches a sentinel and a master that speak only TLS.

use std::time::{Duration, Instant};

use tollgate::{Quota, Reason};
use tollgate_redis::{AlgorithmKind, BackendError, Redis, RedisLimiter, RedisOptions, RedisSemaphore, redis};
use tollgate_testkit::{Certificates, RedisServer, free_port};

/// The longest a test waits for something it polls (the deployment to settle, a failover).
const PATIENCE: Duration = Duration::from_secs(15);

/// Polls `ready` every 50 ms until it returns `Some`, or panics naming `what` after [`PATIENCE`].
async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, mut ready: impl FnMut() -> F) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = ready().await {
            return v;
        }
        assert!(started.elapsed() < PATIENCE, "{what}: not within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct Deployment {
    master: RedisServer,
    replica: RedisServer,
    sentinel: RedisServer,
}

const NAME: &str = "cache";

/// A master, its replica (in sync), and a sentinel that knows both: quorum 1, the master down
/// after 1 s without an answer.
async fn deploy() -> Deployment {
    // Without the 5 s wait Redis leaves for more replicas before a diskless full sync.
    let master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
    // The sentinel learns the replica from the master's INFO, once it is attached.
    let m = &master;
    eventually("the replica attaches", || async move {
        m.cli(&["INFO", "replication"]).contains("state=online").then_some(())
    })
    .await;
    let conf = format!(
        "sentinel monitor {NAME} 127.0.0.1 {port} 1\n\
         sentinel down-after-milliseconds {NAME} 1000\n\
         sentinel failover-timeout {NAME} 2000\n",
        port = master.port
    );
    let sentinel = RedisServer::start_sentinel(&conf);
    Deployment { master, replica, sentinel }
}

impl Deployment {
    /// The sentinel URL, after a sentinel that is not running: the client goes on to the next.
    fn url(&self) -> String {
        format!("redis+sentinel://127.0.0.1:{},127.0.0.1:{}/{NAME}", free_port(), self.sentinel.port)
    }

    /// `SENTINEL FAILOVER`, asked again until the sentinel has a replica it may promote.
    async fn failover(&self) {
        let s = &self.sentinel;
        eventually("the sentinel accepts SENTINEL FAILOVER", || async move {
            (s.cli(&["SENTINEL", "FAILOVER", NAME]) == "OK").then_some(())
        })
        .await;
    }
}

/// The port of the server `redis` sends its calls to.
async fn port_of(redis: &Redis) -> Option<u16> {
    let reply: Vec<String> = redis.query(redis::cmd("CONFIG").arg("GET").arg("port")).await.ok()?;
    reply.get(1)?.parse().ok()
}

fn one_a_minute(redis: &Redis, prefix: &str) -> RedisLimiter {
    RedisLimiter::builder(redis, prefix, AlgorithmKind::FixedWindow)
        .limit("l", Quota::per_minute(1).unwrap())
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_limiter_through_sentinel_decides_on_the_master() {
    let d = deploy().await;
    let url = d.url();
    let redis = Redis::connect(&url).await.unwrap();
    assert_eq!(redis.url(), url);
    assert_eq!(port_of(&redis).await, Some(d.master.port), "calls go to the master the sentinel names");
    let limiter = one_a_minute(&redis, "sentinel");
    assert!(limiter.try_acquire("k", 1).await.is_ok());
    let second = limiter.try_acquire("k", 1).await.unwrap_err();
    assert_eq!(second.reason(), Reason::Exhausted, "decided in Redis, not by the failure policy");
    assert_eq!(d.master.cli(&["EXISTS", "sentinel:{k}:l"]).len(), 1);
    let _ = &d.replica;
}

#[tokio::test]
async fn after_sentinel_failover_decisions_go_to_the_new_master_before_the_old_one_is_demoted() {
    let d = deploy().await;
    let redis = Redis::connect(&d.url()).await.unwrap();
    let limiter = one_a_minute(&redis, "failover");
    assert!(limiter.try_acquire("before", 1).await.is_ok());
    // The replica has the count before it is promoted.
    let replica = &d.replica;
    eventually("the count reaches the replica", || async move { (replica.cli(&["DBSIZE"]) != "0").then_some(()) })
        .await;
    d.failover().await;
    let asked = Instant::now();
    let r = &redis;
    eventually(
        "calls reach the promoted replica",
        || async move { (port_of(r).await == Some(replica.port)).then_some(()) },
    )
    .await;
    let moved_after = asked.elapsed();
    // Sentinel demotes a live old master only ~10 s after the switch: until then it still
    // answers writes, and a client that waited for its connection to break would decide there.
    assert!(
        d.master.cli(&["ROLE"]).starts_with("master"),
        "followed the switch while the old master still took writes ({moved_after:?} after the failover)"
    );
    assert!(limiter.try_acquire("after", 1).await.is_ok(), "decides on the new master");
    assert_eq!(limiter.try_acquire("after", 1).await.unwrap_err().reason(), Reason::Exhausted);
    assert_eq!(
        limiter.try_acquire("before", 1).await.unwrap_err().reason(),
        Reason::Exhausted,
        "the count from before the failover was replicated"
    );
    assert_eq!(d.master.cli(&["EXISTS", "failover:{after}:l"]), "0", "nothing decided on the old master");
    println!("followed SENTINEL FAILOVER in {moved_after:?}");
}

#[tokio::test]
async fn after_the_master_is_killed_decisions_resume_on_the_promoted_replica() {
    let mut d = deploy().await;
    let redis = Redis::connect(&d.url()).await.unwrap();
    let limiter = one_a_minute(&redis, "killed");
    assert!(limiter.try_acquire("before", 1).await.is_ok());
    d.master.kill();
    let killed = Instant::now();
    let mut unavailable = 0;
    // Polled by hand, to check every answer on the way.
    let resumed = loop {
        match limiter.try_acquire(&format!("k{unavailable}"), 1).await {
            Ok(_) => break killed.elapsed(),
            Err(r) => {
                assert_eq!(r.reason(), Reason::Unavailable, "while there is no master, the failure policy denies");
                unavailable += 1;
            }
        }
        assert!(killed.elapsed() < PATIENCE, "no decision within {PATIENCE:?} of killing the master");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(unavailable > 0, "the outage was seen");
    assert_eq!(port_of(&redis).await, Some(d.replica.port));
    println!("decisions resumed {resumed:?} after the master was killed ({unavailable} denied meanwhile)");
}

/// Holds the only slot, queues a waiter, releases: how long the waiter took to get it.
async fn handover(sem: &RedisSemaphore) -> Duration {
    let holder = sem.try_acquire().await.unwrap();
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await.map(drop) }
    });
    eventually("the waiter queues", || async { (sem.state().await.ok()?.waiting == 1).then_some(()) }).await;
    let released = Instant::now();
    holder.release().await.unwrap();
    waiter.await.unwrap().unwrap();
    released.elapsed()
}

#[tokio::test]
async fn a_semaphore_waiter_is_woken_through_the_new_master_after_a_failover() {
    let d = deploy().await;
    // A deadline that tolerates a busy 2-core test machine, as the semaphore's own tests use.
    let options = RedisOptions { deadline: Duration::from_millis(750), ..RedisOptions::default() };
    let redis = Redis::connect_with(&d.url(), options).await.unwrap();
    let sem = RedisSemaphore::new(&redis, "jobs", 1).unwrap();
    // Opens the dedicated wake-up connection (kept for later waits) on the first master.
    let before = handover(&sem).await;
    d.failover().await;
    let (r, replica) = (&redis, d.replica.port);
    eventually("calls reach the promoted replica", || async move { (port_of(r).await == Some(replica)).then_some(()) })
        .await;
    // The kept connection reaches the old master, still up and never pushed to again: a waiter
    // woken through it would wait for its timer (seconds), not for the release.
    let after = handover(&sem).await;
    for took in [before, after] {
        assert!(took < Duration::from_millis(300), "woken by the release, not a timer: {before:?}, then {after:?}");
    }
}

#[tokio::test]
async fn a_master_name_the_sentinels_do_not_monitor_is_named_with_the_ones_they_do() {
    let d = deploy().await;
    let url = format!("redis+sentinel://:s3cret@127.0.0.1:{}/cahce", d.sentinel.port);
    let err = Redis::connect(&url).await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, BackendError::UnknownMaster { master, monitored, .. } if master == "cahce" && monitored == &[NAME]),
        "{text}"
    );
    assert!(text.contains("\"cahce\"") && text.contains("[\"cache\"]"), "{text}");
    assert!(!text.contains("s3cret"), "no password in errors: {text}");
    assert!(!err.is_transient(), "a wrong name does not pass with time");
}

#[tokio::test]
async fn the_password_in_the_url_is_the_masters() {
    let master = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let sentinel = RedisServer::start_sentinel(&format!(
        "sentinel monitor {NAME} 127.0.0.1 {} 1\nsentinel auth-pass {NAME} s3cret\n",
        master.port
    ));
    let url = |password: &str| format!("redis+sentinel://:{password}@127.0.0.1:{}/{NAME}", sentinel.port);
    let redis = Redis::connect(&url("s3cret")).await.unwrap();
    assert_eq!(port_of(&redis).await, Some(master.port));
    let err = Redis::connect(&url("wrong")).await.unwrap_err();
    assert!(matches!(err, BackendError::Auth { .. }), "{err}");
    assert!(!err.is_transient() && !err.to_string().contains("wrong"), "{err}");
}

#[tokio::test]
async fn a_bad_sentinel_url_names_its_part_without_the_password() {
    let err = Redis::check_url("redis+sentinel://app:s3cret@h1:26379,h2:x/cache").unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid redis URL \"redis+sentinel://***@h1:26379,h2:x/cache\": sentinel 2 (\"h2:x\"): port \"x\" is not a number from 1 to 65535"
    );
    let err = Redis::check_url("redis+sentinel://h1/").unwrap_err();
    assert!(
        err.to_string().ends_with("the master name is missing: add /MASTER_NAME after the sentinel hosts"),
        "{err}"
    );
    assert!(Redis::check_url("rediss+sentinel://h1,h2:26380/cache/3?sentinel_password=x").is_ok());
}

#[tokio::test]
async fn no_sentinel_answering_is_a_transient_connect_error() {
    let url = format!("redis+sentinel://127.0.0.1:{}/cache", free_port());
    let err = Redis::connect(&url).await.unwrap_err();
    assert!(matches!(err, BackendError::Connect { .. }), "{err}");
    assert!(err.is_transient(), "{err}");
}

#[tokio::test]
async fn rediss_sentinel_speaks_tls_to_the_sentinel_and_to_the_master() {
    let certs = Certificates::make();
    let master_tls = free_port();
    let args = certs.server_args(master_tls, false);
    let _master = RedisServer::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let sentinel_tls = free_port();
    // `tls-replication yes`: the sentinel too reaches the master on its TLS port.
    let conf = format!(
        "tls-port {sentinel_tls}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
         tls-auth-clients no\ntls-replication yes\nsentinel monitor {NAME} 127.0.0.1 {master_tls} 1\n",
        certs.path("server.crt"),
        certs.path("server.key"),
        certs.path("ca.crt"),
    );
    let sentinel = RedisServer::start_sentinel(&conf);
    // The only address the sentinel gives for the master is its TLS port.
    assert_eq!(sentinel.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", NAME]), format!("127.0.0.1\n{master_tls}"));
    let url = format!("rediss+sentinel://127.0.0.1:{sentinel_tls}/{NAME}?tls_ca={}", certs.path("ca.crt"));
    let redis = Redis::connect(&url).await.unwrap();
    assert_eq!(redis.url(), format!("rediss+sentinel://127.0.0.1:{sentinel_tls}/{NAME}"), "no file paths shown");
    let limiter = one_a_minute(&redis, "tls");
    assert!(limiter.try_acquire("k", 1).await.is_ok());
    assert_eq!(limiter.try_acquire("k", 1).await.unwrap_err().reason(), Reason::Exhausted);
    let other_ca = format!("rediss+sentinel://127.0.0.1:{sentinel_tls}/{NAME}?tls_ca={}", certs.path("other.crt"));
    let err = Redis::connect(&other_ca).await.unwrap_err();
    let text = format!("{err}: {:?}", std::error::Error::source(&err));
    assert!(text.to_lowercase().contains("certificate"), "a CA that did not sign the sentinel's certificate: {text}");
}
