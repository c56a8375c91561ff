//! One hot key, every task on it: decisions per second with `LeasedLimiter` beside the plain
//! `RedisLimiter` (one round trip per decision), in one run, rounds interleaved; then the leased
//! limiter on a budget it exhausts, with each window's admissions against the limit.
//!
//! `cargo run --release -p tollgate-redis --example hot_key [-- SECONDS_PER_ROUND [REDIS_URL]]`
//! (starts its own redis-server on a free port unless given a URL: run several processes on one
//! server to measure them together; windows are printed by the Unix time they end, so the
//! processes' counts add up by window). docs/benchmarks.md, "Hot keys on Redis", has the figures.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::{Quota, RateLimiter};
use tollgate_redis::{AlgorithmKind, LeasedLimiter, Redis, RedisLimiter};

const TASKS: usize = 8;

/// Decisions per second from `TASKS` tasks deciding on one key for `secs`.
async fn rate<L: RateLimiter<str> + Clone + 'static>(limiter: L, secs: f64) -> (f64, u64) {
    let decided = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (limiter, decided, admitted) = (limiter.clone(), decided.clone(), admitted.clone());
            tokio::spawn(async move {
                while Instant::now() < until {
                    // A decision from a held lease never yields: let the connection's task run,
                    // as a real service's I/O would.
                    tokio::task::consume_budget().await;
                    let ok = limiter.decide("hot", 1).await.is_ok();
                    decided.fetch_add(1, Ordering::Relaxed);
                    admitted.fetch_add(u64::from(ok), Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    (decided.load(Ordering::Relaxed) as f64 / secs, admitted.load(Ordering::Relaxed))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secs: f64 = std::env::args().nth(1).map_or(Ok(2.0), |s| s.parse())?;
    let (_server, url) = match std::env::args().nth(2) {
        Some(url) => (None, url),
        None => {
            let server = tollgate_testkit::RedisServer::start();
            let url = server.url();
            (Some(server), url)
        }
    };
    let redis = Redis::connect(&url).await?;
    // A budget no task can exhaust: the cost of a decision, nothing else.
    let roomy = Quota::per_second(1_000_000_000)?;
    let plain = RedisLimiter::builder(&redis, "plain", AlgorithmKind::FixedWindow).limit("l", roomy).build()?;
    let leased = LeasedLimiter::builder(&redis, "leased", roomy).build()?;
    let (mut plain_rates, mut leased_rates) = (Vec::new(), Vec::new());
    for round in 0..3 {
        let (p, _) = rate(plain.clone(), secs).await;
        let (l, _) = rate(leased.clone(), secs).await;
        println!("round {round}: plain {p:.0}/s, leased {l:.0}/s, ratio {:.1}x", l / p);
        plain_rates.push(p);
        leased_rates.push(l);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (p, l) = (median(&mut plain_rates), median(&mut leased_rates));
    println!("median of 3: plain {p:.0}/s, leased {l:.0}/s: {:.1}x", l / p);

    // A budget the tasks exhaust in every window: over- and under-admission per window.
    let limit = 20_000;
    let tight = LeasedLimiter::builder(&redis, "tight", Quota::per_second(limit)?).build()?;
    let windows = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<u64, u64>::new()));
    let until = Instant::now() + Duration::from_secs_f64(secs * 2.0);
    let unix_ms = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (tight, windows) = (tight.clone(), windows.clone());
            tokio::spawn(async move {
                while Instant::now() < until {
                    tokio::task::consume_budget().await;
                    if let Ok(lease) = tight.try_acquire("hot", 1).await {
                        // The window this admission counts in, by when it ends (Unix ms).
                        let end = unix_ms() + lease.reset_after().as_millis() as u64;
                        *windows.lock().unwrap().entry(end).or_default() += 1;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    // Ends within a few ms of each other are one window (the round trip blurs them).
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (end, n) in windows.lock().unwrap().iter() {
        match merged.last_mut() {
            Some((last, count)) if end - *last < 100 => *count += n,
            _ => merged.push((*end, *n)),
        }
    }
    // The last window was cut short by the end of the run (and, with several processes, so may
    // be the first for the processes that joined it late): add windows up across processes.
    for (end, admitted) in &merged {
        let over = admitted.saturating_sub(limit);
        let under = limit.saturating_sub(*admitted) as f64 / limit as f64 * 100.0;
        println!("window ending {end}: admitted {admitted} of {limit}: over {over}, under {under:.2} %");
    }
    Ok(())
}
