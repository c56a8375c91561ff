//! `tollgate serve` stopped by SIGTERM, as Kubernetes stops a pod: it exits 0 and leaves nothing
//! behind in Redis. A redis-cached server's hits not yet flushed are flushed, and a redis-leased
//! server's unspent slices are given back: a server started after it on the same Redis and
//! prefix admits exactly what the first one left.

mod support;

use support::binary::Tollgate;
use support::temp_dir;
use tollgate_testkit::RedisServer;

const LIMITS: &str = r#"
- namespace: api
  name: per-user
  max_value: 40
  seconds: 600
  variables: ["descriptors[0].user"]
"#;

fn call(user: &str) -> String {
    format!(r#"{{"namespace":"api","values":{{"user":"{user}"}},"delta":1}}"#)
}

/// Admitted calls for `user` until the first limited one (at most `most`).
async fn admitted(server: &Tollgate, user: &str, most: u32) -> u32 {
    for n in 0..most {
        match server.check_and_report(&call(user), &[]).await {
            200 => {}
            429 => return n,
            other => panic!("call {n} for {user}: {other}"),
        }
    }
    most
}

/// `storage` on one Redis: a server takes `used` hits and is stopped by SIGTERM; the next one
/// admits the rest of the limit, no more and no less.
async fn stopped_cleanly(storage: &str, used: u32) {
    let redis = RedisServer::start();
    let limits = temp_dir("sigterm").join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    let url = redis.url();
    // A flush far away: only the stop can flush what the first server counted.
    let args = ["--storage", storage, "--redis-url", &url, "--redis-prefix", "sigterm:", "--flush-every", "10m"];
    let first = Tollgate::start(&limits, &args, &[]).await;
    assert_eq!(admitted(&first, "alice", used).await, used, "{storage}: the first server admits {used}");
    let status = first.stop();
    assert!(status.success(), "{storage}: SIGTERM ends the server with {status}");
    let second = Tollgate::start(&limits, &args, &[]).await;
    assert_eq!(admitted(&second, "alice", 100).await, 40 - used, "{storage}: the rest of the limit, after SIGTERM");
    assert!(second.stop().success());
}

#[tokio::test]
async fn redis_cached_flushes_its_hits_when_stopped() {
    stopped_cleanly("redis-cached", 7).await;
}

#[tokio::test]
async fn redis_leased_gives_its_slices_back_when_stopped() {
    stopped_cleanly("redis-leased", 3).await;
}
