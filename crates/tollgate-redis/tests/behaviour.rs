//! One behaviour suite, every implementor of `tollgate::RateLimiter`: each behaviour is one test
//! body run against `Limiter`, `Keyed`, a `Chain` of two local limits, a `Chain` of a local and a
//! Redis limit, and `RedisLimiter`, all on one `ManualClock`; every implementor must give the same
//! decisions with the same metadata.

use std::time::Duration;

use tollgate::{
    Chain, Decision, FixedWindow, Keyed, Lease, Limiter, ManualClock, Meta, Quota, RateLimiter, Reason, Refund,
};
use tollgate_redis::{Redis, RedisAlgorithm, RedisLimiter};
use tollgate_testkit::RedisServer;

const LIMIT: u64 = 5;
const SEC: u64 = 1_000_000_000;

fn quota() -> Quota {
    Quota::per_second(LIMIT).unwrap()
}

/// A looser limit on the same period: chained after the tight one, it never changes the answer.
fn loose() -> Quota {
    Quota::per_second(1000).unwrap()
}

/// The implementors, each on a fresh state, and the clock they all read.
struct Backends {
    clock: ManualClock,
    _server: RedisServer,
    redis: Redis,
}

impl Backends {
    async fn new() -> Backends {
        let server = RedisServer::start();
        let redis = Redis::connect_with(
            &server.url(),
            tollgate_redis::RedisOptions { deadline: std::time::Duration::from_secs(2), ..Default::default() },
        )
        .await
        .unwrap();
        let clock = ManualClock::new();
        clock.advance(Duration::from_secs(1_000));
        Backends { clock, _server: server, redis }
    }

    fn redis(&self, prefix: &str, quota: Quota) -> RedisLimiter {
        RedisLimiter::builder(&self.redis, prefix, RedisAlgorithm::FixedWindow)
            .limit("l", quota)
            .clock(self.clock.clone())
            .build()
            .unwrap()
    }

    fn local(&self, quota: Quota) -> Limiter<FixedWindow, ManualClock> {
        Limiter::builder(FixedWindow::new(quota)).clock(self.clock.clone()).build()
    }

    /// Runs `body` against every implementor, one after the other on the clock, each on a fresh
    /// state (fixed windows open at the first request, so the start time does not matter).
    async fn each<F>(&self, name: &str, body: F)
    where
        F: AsyncFn(&dyn Subject, &ManualClock, &str),
    {
        let next = || self.clock.advance(Duration::from_secs(10));
        body(&Unit(self.local(quota())), &self.clock, "Limiter").await;
        next();
        let keyed: Keyed<String, _, _> = Keyed::builder(FixedWindow::new(quota())).clock(self.clock.clone()).build();
        body(&Alice(keyed), &self.clock, "Keyed").await;
        next();
        body(&Unit(Chain::new(self.local(quota()), self.local(loose()))), &self.clock, "Chain(local, local)").await;
        next();
        let mixed = Chain::new(self.local(loose()), self.redis(&format!("{name}:mixed"), quota()));
        body(&Unit(mixed), &self.clock, "Chain(local, Redis)").await;
        next();
        body(&Alice(self.redis(&format!("{name}:redis"), quota())), &self.clock, "RedisLimiter").await;
    }
}

/// What a behaviour does with an implementor: decide `n`, give a lease back.
trait Subject {
    fn decide(&self, n: u64) -> Decision;
    fn refund(&self, lease: Lease) -> Refund;
}

/// A limiter with one state (key `()`).
struct Unit<L>(L);
impl<L: RateLimiter> Subject for Unit<L> {
    fn decide(&self, n: u64) -> Decision {
        self.0.decide(&(), n)
    }
    fn refund(&self, lease: Lease) -> Refund {
        self.0.give_back(&(), lease)
    }
}

/// A keyed limiter, asked for the key "alice".
struct Alice<L>(L);
impl<L: RateLimiter<str>> Subject for Alice<L> {
    fn decide(&self, n: u64) -> Decision {
        self.0.decide("alice", n)
    }
    fn refund(&self, lease: Lease) -> Refund {
        self.0.give_back("alice", lease)
    }
}

fn meta(remaining: u64, reset_ns: u64, retry_ns: Option<u64>) -> Meta {
    Meta { limit: LIMIT, remaining, reset_ns, retry_ns }
}

#[tokio::test]
async fn admits_up_to_the_limit_then_rejects_until_the_window_ends() {
    let b = Backends::new().await;
    b.each("limit", async |s, clock, who| {
        for i in 1..=LIMIT {
            let lease = s.decide(1).await;
            let lease = lease.unwrap_or_else(|r| panic!("{who}: request {i} rejected: {r}"));
            assert_eq!(lease.meta(), meta(LIMIT - i, SEC, Some(if i < LIMIT { 0 } else { SEC })), "{who}: request {i}");
        }
        clock.advance(Duration::from_millis(400));
        let no = s.decide(1).await.unwrap_err();
        assert_eq!((no.reason(), no.meta()), (Reason::Exhausted, meta(0, 600_000_000, Some(600_000_000))), "{who}");
        clock.advance(Duration::from_millis(600));
        assert_eq!(s.decide(LIMIT).await.map(|l| l.remaining()), Ok(0), "{who}: a new window");
    })
    .await;
}

#[tokio::test]
async fn a_probe_reports_the_state_and_takes_nothing() {
    let b = Backends::new().await;
    b.each("probe", async |s, _clock, who| {
        let probe = s.decide(0).await.unwrap();
        assert_eq!((probe.permits(), probe.reason(), probe.remaining()), (0, Reason::Probe, LIMIT), "{who}");
        let _ = s.decide(2).await.unwrap();
        for _ in 0..3 {
            assert_eq!(s.decide(0).await.unwrap().remaining(), LIMIT - 2, "{who}: probes take nothing");
        }
    })
    .await;
}

#[tokio::test]
async fn more_than_the_capacity_is_never_granted_and_takes_nothing() {
    let b = Backends::new().await;
    b.each("capacity", async |s, _clock, who| {
        let no = s.decide(LIMIT + 1).await.unwrap_err();
        assert_eq!((no.reason(), no.retry_after()), (Reason::ExceedsCapacity, None), "{who}");
        assert_eq!(s.decide(0).await.unwrap().remaining(), LIMIT, "{who}: nothing taken");
    })
    .await;
}

#[tokio::test]
async fn a_lease_given_back_is_refunded_while_its_window_counts_it() {
    let b = Backends::new().await;
    b.each("refund", async |s, clock, who| {
        let lease = s.decide(3).await.unwrap();
        s.refund(lease).await;
        assert_eq!(s.decide(0).await.unwrap().remaining(), LIMIT, "{who}: refunded");
        let lease = s.decide(LIMIT).await.unwrap();
        assert!(s.decide(1).await.is_err(), "{who}: full");
        clock.advance(Duration::from_secs(1));
        let _ = s.decide(2).await.unwrap();
        s.refund(lease).await;
        assert_eq!(s.decide(0).await.unwrap().remaining(), LIMIT - 2, "{who}: an old window's lease changes nothing");
    })
    .await;
}
