//! The pacer on a manual clock: smooth slices, costs, AIMD, Retry-After. No test sleeps.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate::{Clock, ManualClock};
use tollgate_pace::{Budget, Pacer};

fn pacer(units: u64, clock: &ManualClock) -> Arc<Pacer<ManualClock>> {
    Arc::new(
        Pacer::builder(Budget::per_second(units).unwrap())
            .granularity(Duration::from_millis(200))
            .clock(clock.clone())
            .build()
            .unwrap(),
    )
}

/// Runs a consumer spending `cost` per item for `seconds` of manual time in 10 ms steps; returns
/// units spent in each 200 ms slice.
async fn drive(pacer: Arc<Pacer<ManualClock>>, clock: &ManualClock, cost: u64, seconds: u64) -> Vec<u64> {
    let spent = Arc::new(AtomicU64::new(0));
    let consumer = {
        let (pacer, spent) = (pacer.clone(), spent.clone());
        tokio::spawn(async move {
            loop {
                pacer.acquire(cost).await.unwrap();
                spent.fetch_add(cost, Ordering::SeqCst);
            }
        })
    };
    let mut slices = Vec::new();
    let mut last = 0;
    for step in 1..=seconds * 100 {
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        clock.advance(Duration::from_millis(10));
        if step % 20 == 0 {
            let now = spent.load(Ordering::SeqCst);
            slices.push(now - last);
            last = now;
        }
    }
    consumer.abort();
    slices
}

#[tokio::test(flavor = "current_thread")]
async fn the_budget_is_spent_in_even_slices() {
    let clock = ManualClock::new();
    let slices = drive(pacer(100, &clock), &clock, 1, 10).await;
    let total: u64 = slices.iter().sum();
    assert!((1000..=1020).contains(&total), "100/s for 10 s: {total}");
    assert!(slices.iter().all(|&s| s <= 20), "never more than 20 in a 200 ms slice: {slices:?}");
    assert!(slices.iter().skip(1).all(|&s| s == 20), "the flow is even: {slices:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn items_cost_units_and_dear_items_span_slices() {
    let clock = ManualClock::new();
    let slices = drive(pacer(100, &clock), &clock, 50, 10).await;
    let total: u64 = slices.iter().sum();
    assert!((950..=1050).contains(&total), "1000 units in 10 s whatever the item cost: {total}");
}

#[tokio::test(flavor = "current_thread")]
async fn throttling_halves_the_rate_and_success_probes_back_up() {
    let clock = ManualClock::new();
    let pacer = Arc::new(
        Pacer::builder(Budget::per_second(1000).unwrap())
            .granularity(Duration::from_millis(200))
            .decrease(0.5)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    pacer.throttled(None);
    assert_eq!(pacer.rate(), 500.0);
    clock.advance(Duration::from_millis(200));
    pacer.throttled(None);
    assert_eq!(pacer.rate(), 250.0);
    pacer.throttled(None);
    assert_eq!(pacer.rate(), 250.0, "throttled twice within one slice: one cut");
    pacer.succeeded();
    assert_eq!(pacer.rate(), 250.0, "no increase within a second of throttling");
    clock.advance(Duration::from_secs(1));
    pacer.succeeded();
    assert_eq!(pacer.rate(), 300.0, "+5% of the ceiling per second");
    clock.advance(Duration::from_secs(20));
    pacer.succeeded();
    assert_eq!(pacer.rate(), 1000.0, "back to the ceiling, not above");
    for _ in 0..20 {
        clock.advance(Duration::from_millis(200));
        pacer.throttled(None);
    }
    assert_eq!(pacer.rate(), 10.0, "not below min_rate (1% of the budget)");

    let slices = drive(pacer.clone(), &clock, 1, 1).await;
    assert!(slices.iter().all(|&s| s <= 2), "10/s is 2 per slice: {slices:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn retry_after_pauses_everything_until_then() {
    let clock = ManualClock::new();
    let pacer = pacer(100, &clock);
    pacer.throttled(Some(Duration::from_secs(2)));
    let done = Arc::new(AtomicU64::new(0));
    let waiter = {
        let (pacer, done, clock) = (pacer.clone(), done.clone(), clock.clone());
        tokio::spawn(async move {
            pacer.acquire(1).await.unwrap();
            done.store(clock.now(), Ordering::SeqCst);
        })
    };
    for _ in 0..250 {
        tokio::task::yield_now().await;
        clock.advance(Duration::from_millis(10));
    }
    waiter.await.unwrap();
    let at = done.load(Ordering::SeqCst);
    assert!(at >= 2_000_000_000, "not before the Retry-After: {at} ns");
    assert!(at <= 2_010_000_000, "right after it: {at} ns");
}

#[tokio::test(flavor = "current_thread")]
async fn the_ceiling_follows_partitions() {
    let clock = ManualClock::new();
    let pacer = pacer(600, &clock);
    pacer.set_ceiling(200.0);
    assert_eq!((pacer.ceiling(), pacer.rate()), (200.0, 200.0), "down at once");
    pacer.set_ceiling(400.0);
    assert_eq!(pacer.rate(), 200.0, "up by additive increase only");
    pacer.set_ceiling(0.0);
    let slices = drive(pacer.clone(), &clock, 1, 1).await;
    assert!(slices.iter().sum::<u64>() <= 1, "no partition, (almost) nothing spent: {slices:?}");
}

#[test]
fn bad_settings_are_errors_naming_the_setting() {
    let budget = Budget::per_second(10).unwrap();
    let err = |b: tollgate_pace::PacerBuilder| b.build().err().unwrap().to_string();
    assert_eq!(err(Pacer::builder(budget).decrease(1.5)), "decrease must be in (0, 1), got 1.5");
    assert_eq!(err(Pacer::builder(budget).increase(0.0)), "increase must be in (0, 1], got 0");
    assert_eq!(
        err(Pacer::builder(budget).granularity(Duration::ZERO)),
        "granularity must be longer than zero, got 0ns"
    );
    assert_eq!(err(Pacer::builder(budget).min_rate(20.0)), "min_rate must be in (0, 10], got 20");
    assert_eq!(Budget::per_second(0).unwrap_err().to_string(), "budget units must be at least 1, got 0");
}

/// A client pacing itself against a service whose limit is halved, then restored: measured rates
/// in the last 10 s of each 20 s phase.
#[tokio::test(flavor = "current_thread")]
async fn converges_when_the_service_limit_is_halved_and_restored() {
    use tollgate::{Limiter, Quota, TokenBucket};
    let clock = ManualClock::new();
    // Slices of 50 ms: 50 requests at once, within the service's burst of 100.
    let pacer = Arc::new(
        Pacer::builder(Budget::per_second(1000).unwrap())
            .granularity(Duration::from_millis(50))
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let quota = |rate: u64| Quota::per(Duration::from_secs(1), rate).unwrap().with_burst(rate / 10).unwrap();
    let service = Arc::new(Limiter::builder(TokenBucket::new(quota(1000))).clock(clock.clone()).build());
    let (done, throttled) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let client = {
        let (pacer, service, done, throttled) = (pacer.clone(), service.clone(), done.clone(), throttled.clone());
        tokio::spawn(async move {
            loop {
                pacer.acquire(1).await.unwrap();
                match service.try_acquire(1) {
                    Ok(_) => {
                        done.fetch_add(1, Ordering::SeqCst);
                        pacer.succeeded();
                    }
                    Err(rejected) => {
                        throttled.fetch_add(1, Ordering::SeqCst);
                        pacer.throttled(rejected.retry_after());
                    }
                }
            }
        })
    };
    let mut rates = Vec::new();
    for (phase, limit) in [1000u64, 500, 1000].into_iter().enumerate() {
        service.set_quota(quota(limit));
        let mut at_10s = 0;
        for step in 1..=4000 {
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            clock.advance(Duration::from_millis(5));
            if step == 2000 {
                at_10s = done.load(Ordering::SeqCst);
            }
        }
        let rate = (done.load(Ordering::SeqCst) - at_10s) as f64 / 10.0;
        println!("phase {phase}: service {limit}/s, achieved {rate:.0}/s, pacer rate {:.0}/s", pacer.rate());
        rates.push((limit as f64, rate));
    }
    client.abort();
    for (limit, rate) in rates {
        assert!((rate - limit).abs() <= 0.2 * limit, "within 20% of the service's {limit}/s: {rate}/s");
    }
    let throttled = throttled.load(Ordering::SeqCst);
    assert!(throttled * 100 <= done.load(Ordering::SeqCst), "throttled calls under 1%: {throttled}");
}
