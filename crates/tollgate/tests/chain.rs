//! Chains: all-or-nothing, tightest metadata.

use std::time::Duration;

use tollgate::{
    Acquire, Answer, Chain, Concurrency, Lease, Limiter, ManualClock, Quota, RateLimiter, Reason, Rejected, SlidingLog,
    TokenBucket,
};

/// In-process parts answer at once: a chain of them does too.
fn take(chain: &impl RateLimiter, n: u64) -> Result<Lease, Rejected> {
    match chain.decide(&(), n) {
        Answer::Ready(decided) => decided,
        Answer::Pending(_) => panic!("a chain of in-process limiters answered later"),
    }
}

#[test]
fn a_rejection_by_the_second_takes_nothing_from_the_first() {
    let clock = ManualClock::new();
    let first = Limiter::builder(TokenBucket::new(Quota::per_second(10).unwrap()))
        .clock(clock.clone())
        .statistics(true)
        .build();
    let second = Limiter::builder(SlidingLog::new(Quota::per_minute(3).unwrap())).clock(clock.clone()).build();
    let chain = Chain::new(first, second);
    let _ = take(&chain, 3).unwrap();
    let no = take(&chain, 1).unwrap_err();
    assert_eq!(no.reason(), Reason::Exhausted);
    assert_eq!(chain.first().check(0).unwrap().remaining, 7, "the first limiter was refunded");
    // Tightest metadata: the minute limit's retry-after (60 s), not the bucket's (0).
    assert_eq!(no.retry_after(), Some(Duration::from_secs(60)));
    assert_eq!((no.limit(), no.remaining()), (3, 0));
    assert_eq!(chain.first().statistics().admitted, Some(1));
}

#[test]
fn when_the_first_rejects_the_retry_after_still_covers_the_second() {
    let clock = ManualClock::new();
    let first = Limiter::builder(TokenBucket::new(Quota::per_second(1).unwrap())).clock(clock.clone()).build();
    let second = Limiter::builder(TokenBucket::new(Quota::per_minute(2).unwrap())).clock(clock.clone()).build();
    let chain = Chain::new(first, second);
    let _ = take(&chain, 1).unwrap();
    clock.advance(Duration::from_secs(1));
    let _ = take(&chain, 1).unwrap();
    let no = take(&chain, 1).unwrap_err();
    // First: 1 s; second: 30 s for the next permit (one per 30 s). The chain says 30 s.
    assert_eq!(no.retry_after(), Some(Duration::from_secs(29)));
}

#[test]
fn over_capacity_anywhere_means_never() {
    let clock = ManualClock::new();
    let chain = Chain::new(
        Limiter::builder(TokenBucket::new(Quota::per_second(10).unwrap())).clock(clock.clone()).build(),
        Limiter::builder(Concurrency::new(2).unwrap()).clock(clock.clone()).build(),
    );
    let no = take(&chain, 3).unwrap_err();
    assert_eq!((no.reason(), no.retry_after()), (Reason::ExceedsCapacity, None));
    assert_eq!(chain.first().check(0).unwrap().remaining, 10);
    assert_eq!(chain.capacity(), 2);
}

#[test]
fn chained_concurrency_permits_are_released_with_the_lease() {
    let clock = ManualClock::new();
    let chain = Chain::new(
        Limiter::builder(Concurrency::new(5).unwrap()).clock(clock.clone()).build(),
        Chain::new(
            Limiter::builder(TokenBucket::new(Quota::per_second(100).unwrap())).clock(clock.clone()).build(),
            Limiter::builder(Concurrency::new(2).unwrap()).clock(clock.clone()).build(),
        ),
    );
    let lease = take(&chain, 2).unwrap();
    assert_eq!(lease.remaining(), 0);
    assert_eq!(chain.first().held(), 2);
    assert!(take(&chain, 1).is_err());
    assert_eq!(chain.first().held(), 2, "the rejected attempt released what it took");
    drop(lease);
    assert_eq!(chain.first().held(), 0);
    assert_eq!(chain.second().second().held(), 0);
}

#[test]
fn chain_give_back_refunds_both() {
    let clock = ManualClock::new();
    let chain = Chain::new(
        Limiter::builder(TokenBucket::new(Quota::per_second(10).unwrap())).clock(clock.clone()).build(),
        Limiter::builder(TokenBucket::new(Quota::per_second(5).unwrap())).clock(clock.clone()).build(),
    );
    let lease = take(&chain, 5).unwrap();
    assert!(matches!(chain.give_back(&(), lease), Answer::Ready(())));
    assert_eq!(chain.first().check(0).unwrap().remaining, 10);
    assert_eq!(chain.second().check(0).unwrap().remaining, 5);
}

#[tokio::test]
async fn chain_acquire_waits_on_each_in_turn() {
    let clock = ManualClock::new();
    let chain = Chain::new(
        Limiter::builder(TokenBucket::new(Quota::per_second(10).unwrap())).clock(clock.clone()).build(),
        Limiter::builder(TokenBucket::new(Quota::per_second(5).unwrap())).clock(clock.clone()).build(),
    );
    let _ = take(&chain, 5).unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    let acquire = async {
        let lease = chain.acquire(&(), 1).await;
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        lease
    };
    let driver = async {
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            if clock.pending_sleeps() > 0 {
                clock.advance(Duration::from_millis(100));
            }
            tokio::task::yield_now().await;
        }
    };
    let (lease, ()) = tokio::join!(acquire, driver);
    assert!(lease.unwrap().granted_at() >= 200_000_000, "the 5/s limit needs 200 ms for one more");
}

#[test]
fn a_nested_chain_reports_its_longest_window() {
    let clock = ManualClock::new();
    let chain = Chain::new(
        Limiter::builder(Concurrency::new(5).unwrap()).clock(clock.clone()).build(),
        Chain::new(
            Limiter::builder(TokenBucket::new(Quota::per_second(100).unwrap())).clock(clock.clone()).build(),
            Limiter::builder(SlidingLog::new(Quota::per_minute(1000).unwrap())).clock(clock.clone()).build(),
        ),
    );
    assert_eq!(chain.window(), Some(Duration::from_secs(60)));
    assert_eq!(chain.first().window(), None, "concurrency is not counted over time");
}
