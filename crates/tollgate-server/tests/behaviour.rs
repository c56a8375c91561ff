//! One behaviour suite, every implementor of a decision: each behaviour is one test body run
//! against `Limiter`, `Keyed`, a `Chain` of two local limits, a `Chain` of a local and a Redis
//! limit, `RedisLimiter`, `LeasedLimiter` (the implementors of `tollgate::RateLimiter`), and the
//! server's five storages (memory in accuracy and in throughput mode, redis, redis-cached,
//! redis-leased) through its engine,
//! all on one `ManualClock`; every implementor must give the same decisions with the same
//! metadata. The server's storages give no reason with a rejection and take no refunds (a call is
//! all-or-nothing inside the engine): the reason is checked where an implementor gives one, the
//! refund behaviour runs on the `RateLimiter`s.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tollgate::{Chain, FixedWindow, Keyed, Lease, Limiter, ManualClock, Meta, Quota, RateLimiter, Reason};
use tollgate_policy::{Descriptor, Policy};
use tollgate_redis::{AlgorithmKind, LeasedLimiter, Redis, RedisLimiter, RedisTime};
use tollgate_server::serve::{Action, Engine, Mode, RedisStore};
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
        RedisLimiter::builder(&self.redis, prefix, AlgorithmKind::FixedWindow)
            .limit("l", quota)
            .time(RedisTime::clock(self.clock.clone()))
            .build()
            .unwrap()
    }

    fn local(&self, quota: Quota) -> Limiter<FixedWindow, ManualClock> {
        Limiter::builder(FixedWindow::new(quota)).clock(self.clock.clone()).build()
    }

    /// The server's engine on one limit like the others' (`LIMIT` per second, fixed window),
    /// asked for the user "alice".
    fn engine(&self, mode: Mode) -> Engine<ManualClock> {
        let yaml = format!("- {{namespace: b, max_value: {LIMIT}, seconds: 1, variables: [user]}}");
        Engine::new(Policy::parse(&yaml, "limits.yaml").unwrap(), mode, false, self.clock.clone())
    }

    fn redis_store(&self, prefix: &str) -> RedisStore {
        RedisStore { redis: self.redis.clone(), prefix: prefix.to_owned(), time: RedisTime::clock(self.clock.clone()) }
    }

    /// Runs `body` against every implementor, one after the other on the clock, each on a fresh
    /// state (fixed windows open at the first request, so the start time does not matter).
    async fn each<F>(&self, name: &str, body: F)
    where
        F: AsyncFn(&dyn Subject, &ManualClock, &str),
    {
        self.each_limiter(name, async |s, clock, who| body(s, clock, who).await).await;
        let next = || self.clock.advance(Duration::from_secs(10));
        next();
        body(&Storage(self.engine(Mode::Accuracy)), &self.clock, "memory (accuracy)").await;
        next();
        body(&Storage(self.engine(Mode::Throughput)), &self.clock, "memory (throughput)").await;
        next();
        let redis = self.engine(Mode::Accuracy).with_redis(self.redis_store(&format!("{name}:storage:"))).unwrap();
        body(&Storage(redis), &self.clock, "redis").await;
        next();
        let cached =
            self.engine(Mode::Accuracy).with_redis_cached(self.redis_store(&format!("{name}:cached:"))).unwrap();
        body(&Storage(cached), &self.clock, "redis-cached").await;
        next();
        let leased =
            self.engine(Mode::Accuracy).with_redis_leased(self.redis_store(&format!("{name}:leased:"))).unwrap();
        body(&Storage(leased), &self.clock, "redis-leased").await;
    }

    /// Runs `body` against every implementor of `tollgate::RateLimiter`.
    async fn each_limiter<F>(&self, name: &str, body: F)
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
        next();
        let leased = LeasedLimiter::builder(&self.redis, &format!("{name}:leased"), quota())
            .clock(self.clock.clone())
            .time(RedisTime::clock(self.clock.clone()));
        body(&Alice(leased.build().unwrap()), &self.clock, "LeasedLimiter").await;
    }
}

type Later<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// What an implementor answered: granted or not, the state it reports, and why it said no (when it
/// says), with the lease of a grant by a `RateLimiter`.
#[derive(Debug)]
struct Seen {
    granted: bool,
    meta: Meta,
    reason: Option<Reason>,
    lease: Option<Lease>,
}

impl Seen {
    fn of(decided: Result<Lease, tollgate::Rejected>) -> Seen {
        match decided {
            Ok(lease) => Seen { granted: true, meta: lease.meta(), reason: Some(lease.reason()), lease: Some(lease) },
            Err(no) => Seen { granted: false, meta: no.meta(), reason: Some(no.reason()), lease: None },
        }
    }

    /// Granted, with `who` in the message otherwise.
    fn granted(self, who: &str) -> Seen {
        assert!(self.granted, "{who}: rejected: {self:?}");
        self
    }

    fn rejected(self, who: &str) -> Seen {
        assert!(!self.granted, "{who}: granted: {self:?}");
        self
    }

    /// The reason, where the implementor gives one, is `reason`.
    fn because(self, reason: Reason, who: &str) -> Seen {
        if let Some(given) = self.reason {
            assert_eq!(given, reason, "{who}: {self:?}");
        }
        self
    }
}

/// What a behaviour does with an implementor: decide `n`, give a lease back (`RateLimiter`s only).
trait Subject {
    fn decide(&self, n: u64) -> Later<'_, Seen>;
    fn refund(&self, lease: Lease) -> Later<'_, ()>;
}

/// A limiter with one state (key `()`).
struct Unit<L>(L);
impl<L: RateLimiter> Subject for Unit<L> {
    fn decide(&self, n: u64) -> Later<'_, Seen> {
        let decision = self.0.decide(&(), n);
        Box::pin(async move { Seen::of(decision.await) })
    }
    fn refund(&self, lease: Lease) -> Later<'_, ()> {
        Box::pin(self.0.give_back(&(), lease).into_future())
    }
}

/// A keyed limiter, asked for the key "alice".
struct Alice<L>(L);
impl<L: RateLimiter<str>> Subject for Alice<L> {
    fn decide(&self, n: u64) -> Later<'_, Seen> {
        let decision = self.0.decide("alice", n);
        Box::pin(async move { Seen::of(decision.await) })
    }
    fn refund(&self, lease: Lease) -> Later<'_, ()> {
        Box::pin(self.0.give_back("alice", lease).into_future())
    }
}

/// The server's engine with one of its storages, asked for the user "alice" (`/check_and_report`).
struct Storage(Engine<ManualClock>);
impl Subject for Storage {
    fn decide(&self, n: u64) -> Later<'_, Seen> {
        Box::pin(async move {
            let alice = [Descriptor::from([("user", "alice")])];
            let outcome = self.0.call("b", &alice, n, Action::CheckAndReport).await.unwrap();
            let [status] = &outcome.statuses[..] else { panic!("one counter: {outcome:?}") };
            Seen { granted: outcome.allowed, meta: status.meta, reason: None, lease: None }
        })
    }
    fn refund(&self, _lease: Lease) -> Later<'_, ()> {
        unreachable!("the storages grant no leases")
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
            let seen = s.decide(1).await.granted(&format!("{who}: request {i}"));
            assert_eq!(seen.meta, meta(LIMIT - i, SEC, Some(if i < LIMIT { 0 } else { SEC })), "{who}: request {i}");
        }
        clock.advance(Duration::from_millis(400));
        let no = s.decide(1).await.rejected(who).because(Reason::Exhausted, who);
        assert_eq!(no.meta, meta(0, 600_000_000, Some(600_000_000)), "{who}");
        clock.advance(Duration::from_millis(600));
        assert_eq!(s.decide(LIMIT).await.granted(who).meta.remaining, 0, "{who}: a new window");
    })
    .await;
}

#[tokio::test]
async fn a_probe_reports_the_state_and_takes_nothing() {
    let b = Backends::new().await;
    b.each("probe", async |s, _clock, who| {
        let probe = s.decide(0).await.granted(who).because(Reason::Probe, who);
        assert_eq!(probe.meta.remaining, LIMIT, "{who}");
        assert_eq!(probe.lease.map_or(0, |l| l.permits()), 0, "{who}: a probe holds nothing");
        s.decide(2).await.granted(who);
        for _ in 0..3 {
            assert_eq!(s.decide(0).await.granted(who).meta.remaining, LIMIT - 2, "{who}: probes take nothing");
        }
    })
    .await;
}

#[tokio::test]
async fn more_than_the_capacity_is_never_granted_and_takes_nothing() {
    let b = Backends::new().await;
    b.each("capacity", async |s, _clock, who| {
        let no = s.decide(LIMIT + 1).await.rejected(who).because(Reason::ExceedsCapacity, who);
        assert_eq!(no.meta.retry_ns, None, "{who}: waiting cannot help");
        assert_eq!(s.decide(0).await.granted(who).meta.remaining, LIMIT, "{who}: nothing taken");
    })
    .await;
}

#[tokio::test]
async fn a_lease_given_back_is_refunded_while_its_window_counts_it() {
    let b = Backends::new().await;
    b.each_limiter("refund", async |s, clock, who| {
        let lease = s.decide(3).await.granted(who).lease.unwrap();
        s.refund(lease).await;
        assert_eq!(s.decide(0).await.granted(who).meta.remaining, LIMIT, "{who}: refunded");
        let lease = s.decide(LIMIT).await.granted(who).lease.unwrap();
        s.decide(1).await.rejected(&format!("{who}: full"));
        clock.advance(Duration::from_secs(1));
        s.decide(2).await.granted(who);
        s.refund(lease).await;
        assert_eq!(
            s.decide(0).await.granted(who).meta.remaining,
            LIMIT - 2,
            "{who}: an old window's lease changes nothing"
        );
    })
    .await;
}
