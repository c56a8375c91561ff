//! One test body, two backends: the same sequence of decisions on the in-memory `Keyed` limiter
//! and on the Redis limiter (both on one ManualClock) must give the same decisions and metadata.

use std::time::Duration;

use tollgate::{
    Algorithm, FixedWindow, Keyed, ManualClock, Meta, Quota, Reason, SlidingLog, TokenBucket, WeightedWindow,
};
use tollgate::{Lease, RateLimiter};
use tollgate_redis::{AlgorithmKind, Redis, RedisLimiter, RedisTime};
use tollgate_testkit::RedisServer;

/// What a caller can observe of a decision.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Admitted { permits: u64, meta: Meta },
    Rejected { reason: Reason, meta: Meta },
}

async fn observe(l: &impl RateLimiter<str>, key: &str, n: u64) -> (Seen, Option<Lease>) {
    // Redis works in whole microseconds, rounding waits up; so do we before comparing.
    let us = |ns: u64| ns.div_ceil(1000) * 1000;
    let norm = |m: Meta| Meta { reset_ns: us(m.reset_ns), retry_ns: m.retry_ns.map(us), ..m };
    match l.decide(key, n).await {
        Ok(lease) => (Seen::Admitted { permits: lease.permits(), meta: norm(lease.meta()) }, Some(lease)),
        Err(r) => (Seen::Rejected { reason: r.reason(), meta: norm(r.meta()) }, None),
    }
}

/// A small deterministic generator (no shared RNG state between backends).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound
    }
}

/// The generic body: a random walk of (advance, key, n) applied to both, compared step by step;
/// some leases are given back later (a real refund on both sides: what still counts returns).
/// The clock moves in whole `tick_us`: what the Redis side times its windows to (a fixed
/// window's end is its key's expiry, a whole millisecond).
async fn same_decisions<A: Algorithm>(
    memory: Keyed<String, A, ManualClock>,
    redis: RedisLimiter,
    clock: &ManualClock,
    (period_us, tick_us): (u64, u64),
    capacity: u64,
    seed: u64,
) {
    let mut rng = Lcg(seed);
    let mut held: Vec<(&str, Lease, Lease)> = Vec::new();
    for step in 0..400 {
        // Mostly small steps, sometimes exact period boundaries, sometimes long gaps; all whole
        // ticks.
        let advance = match rng.next(10) {
            0 => period_us,
            1 => period_us * rng.next(4),
            2 | 3 => 0,
            _ => rng.next(period_us / 3 + 1) / tick_us * tick_us,
        };
        clock.advance(Duration::from_micros(advance));
        let key = ["a", "b"][rng.next(2) as usize];
        let n = rng.next(capacity + 2);
        let ((m, m_lease), (r, r_lease)) = (observe(&memory, key, n).await, observe(&redis, key, n).await);
        assert_eq!(m, r, "step {step}: key {key}, n {n}, t {} µs", clock.now_us());
        if let (Some(a), Some(b)) = (m_lease, r_lease) {
            held.push((key, a, b));
        }
        if !held.is_empty() && rng.next(3) == 0 {
            let (key, a, b) = held.swap_remove(rng.next(held.len() as u64) as usize);
            RateLimiter::give_back(&memory, key, a).await;
            redis.give_back(key, b).await.expect("the refund script runs");
        }
    }
}

trait NowUs {
    fn now_us(&self) -> u64;
}
impl NowUs for ManualClock {
    fn now_us(&self) -> u64 {
        tollgate::Clock::now(self) / 1000
    }
}

async fn setup(server: &RedisServer, algorithm: AlgorithmKind, quota: Quota, clock: &ManualClock) -> RedisLimiter {
    let redis = Redis::connect_with(
        &server.url(),
        tollgate_redis::RedisOptions { deadline: std::time::Duration::from_secs(2), ..Default::default() },
    )
    .await
    .unwrap();
    // A prefix per limiter: each run starts from empty state, like its fresh in-memory twin.
    let prefix = format!("generic:{algorithm:?}:{quota}");
    RedisLimiter::builder(&redis, &prefix, algorithm)
        .limit("l", quota)
        .time(RedisTime::clock(clock.clone()))
        .build()
        .unwrap()
}

// Quotas whose emission intervals and periods are whole microseconds, so µs (Redis) and ns
// (memory) arithmetic agree exactly.
fn quotas() -> Vec<Quota> {
    vec![
        Quota::per_second(10).unwrap().with_burst(5).unwrap(),
        Quota::per(Duration::from_millis(70), 7).unwrap(),
        Quota::per_second(4).unwrap().with_burst(8).unwrap(),
    ]
}

#[tokio::test]
async fn token_bucket_matches_memory() {
    let server = RedisServer::start();
    for (i, q) in quotas().into_iter().enumerate() {
        let clock = ManualClock::new();
        clock.advance(Duration::from_secs(1000 + i as u64));
        let memory = Keyed::builder(TokenBucket::new(q)).clock(clock.clone()).build();
        let redis = setup(&server, AlgorithmKind::TokenBucket, q, &clock).await;
        same_decisions(memory, redis, &clock, (q.period().as_micros() as u64, 1), q.burst(), i as u64 + 1).await;
    }
}

#[tokio::test]
async fn fixed_window_matches_memory() {
    let server = RedisServer::start();
    for (i, q) in quotas().into_iter().enumerate() {
        let clock = ManualClock::new();
        clock.advance(Duration::from_secs(2000 + i as u64));
        let memory = Keyed::builder(FixedWindow::new(q)).clock(clock.clone()).build();
        let redis = setup(&server, AlgorithmKind::FixedWindow, q, &clock).await;
        same_decisions(memory, redis, &clock, (q.period().as_micros() as u64, 1000), q.limit(), i as u64 + 11).await;
    }
}

#[tokio::test]
async fn weighted_window_matches_memory() {
    let server = RedisServer::start();
    for (i, q) in quotas().into_iter().enumerate() {
        let clock = ManualClock::new();
        clock.advance(Duration::from_secs(3000 + i as u64));
        let memory = Keyed::builder(WeightedWindow::new(q)).clock(clock.clone()).build();
        let redis = setup(&server, AlgorithmKind::WeightedWindow, q, &clock).await;
        same_decisions(memory, redis, &clock, (q.period().as_micros() as u64, 1), q.limit(), i as u64 + 21).await;
    }
}

#[tokio::test]
async fn sliding_log_matches_memory() {
    let server = RedisServer::start();
    for (i, q) in quotas().into_iter().enumerate() {
        let clock = ManualClock::new();
        clock.advance(Duration::from_secs(4000 + i as u64));
        let memory = Keyed::builder(SlidingLog::new(q)).clock(clock.clone()).build();
        let redis = setup(&server, AlgorithmKind::SlidingLog, q, &clock).await;
        same_decisions(memory, redis, &clock, (q.period().as_micros() as u64, 1), q.limit(), i as u64 + 31).await;
    }
}
