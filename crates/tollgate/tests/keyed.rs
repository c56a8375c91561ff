//! Keyed limiters: isolation per key, bounded memory (idle eviction, hard cap), release per key.

use std::num::NonZeroUsize;
use std::time::Duration;

use tollgate::{Concurrency, Keyed, ManualClock, Quota, Reason, SlidingLog, TokenBucket};

fn cap(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap()
}

#[test]
fn keys_are_isolated_and_borrowed_lookups_work() {
    let clock = ManualClock::new();
    let k: Keyed<String, _, _> =
        Keyed::builder(TokenBucket::new(Quota::per_second(2).unwrap())).clock(clock).statistics(true).build();
    let _ = k.try_acquire("a", 2).unwrap();
    assert_eq!(k.try_acquire("a", 1).unwrap_err().reason(), Reason::Exhausted);
    let _ = k.try_acquire("b", 2).unwrap();
    assert_eq!(k.len(), 2);
    let s = k.statistics();
    assert_eq!((s.keys, s.admitted, s.rejected), (2, Some(2), Some(1)));
}

#[test]
fn probes_and_checks_do_not_store_keys() {
    let k: Keyed<u64, _, _> =
        Keyed::builder(TokenBucket::new(Quota::per_second(5).unwrap())).clock(ManualClock::new()).build();
    let p = k.try_acquire(&7, 0).unwrap();
    assert_eq!((p.reason(), p.remaining()), (Reason::Probe, 5));
    assert_eq!(k.check(&7, 5).unwrap().remaining, 5);
    assert!(k.is_empty());
}

#[test]
fn over_capacity_is_rejected_without_storing_the_key() {
    let k: Keyed<u64, _, _> =
        Keyed::builder(TokenBucket::new(Quota::per_second(5).unwrap())).clock(ManualClock::new()).build();
    let no = k.try_acquire(&1, 6).unwrap_err();
    assert_eq!((no.reason(), no.retry_after()), (Reason::ExceedsCapacity, None));
    assert!(k.is_empty());
}

#[test]
fn idle_keys_are_evicted_and_come_back_fresh() {
    let clock = ManualClock::new();
    let k: Keyed<u64, _, _> =
        Keyed::builder(TokenBucket::new(Quota::per_second(10).unwrap())).clock(clock.clone()).build();
    for key in 0..1000 {
        let _ = k.try_acquire(&key, 1).unwrap();
    }
    assert_eq!(k.evict_idle(), 0, "nobody is idle yet");
    clock.advance(Duration::from_millis(100));
    assert_eq!(k.evict_idle(), 1000);
    assert!(k.is_empty());
    // An evicted key behaves exactly like a key whose bucket refilled.
    assert_eq!(k.try_acquire(&3, 10).unwrap().remaining(), 0);
}

#[test]
fn at_the_cap_new_keys_are_rejected_until_old_ones_go_idle() {
    let clock = ManualClock::new();
    let k: Keyed<u64, _, _> = Keyed::builder(TokenBucket::new(Quota::per_second(1).unwrap()))
        .clock(clock.clone())
        .shards(cap(1))
        .max_keys(cap(100))
        .build();
    for key in 0..100 {
        let _ = k.try_acquire(&key, 1).unwrap();
    }
    let no = k.try_acquire(&1000, 1).unwrap_err();
    assert_eq!(no.reason(), Reason::KeyLimit);
    // Existing keys keep their limits at the cap.
    assert_eq!(k.try_acquire(&5, 1).unwrap_err().reason(), Reason::Exhausted);
    clock.advance(Duration::from_secs(1));
    let _ = k.try_acquire(&1000, 1).unwrap();
    assert!(k.len() <= 100);
}

#[test]
fn ten_million_keys_streamed_through_stay_under_the_cap() {
    let clock = ManualClock::new();
    let max = 50_000;
    let k: Keyed<u64, _, _> = Keyed::builder(TokenBucket::new(Quota::per(Duration::from_millis(10), 5).unwrap()))
        .clock(clock.clone())
        .max_keys(cap(max))
        .statistics(true)
        .build();
    let mut high_water = 0;
    for key in 0..10_000_000u64 {
        // 1 µs between keys: a key is idle again 2 ms (2,000 keys) after its one permit.
        if key % 1000 == 0 {
            clock.advance(Duration::from_millis(1));
            high_water = high_water.max(k.len());
        }
        let _ = k.try_acquire(&key, 1).unwrap();
    }
    high_water = high_water.max(k.len());
    assert!(high_water <= k.max_keys(), "{high_water} keys stored, cap {}", k.max_keys());
    // Idle sweeping, not the cap, did the work: far fewer keys than the cap were ever live.
    assert!(high_water < max / 2, "high water {high_water}");
    assert_eq!(k.statistics().admitted, Some(10_000_000));
}

#[test]
fn keyed_concurrency_releases_per_key_on_drop() {
    let k: Keyed<&'static str, _, _> = Keyed::builder(Concurrency::new(1).unwrap()).clock(ManualClock::new()).build();
    let a = k.try_acquire(&"a", 1).unwrap();
    assert_eq!(k.try_acquire(&"a", 1).unwrap_err().reason(), Reason::Exhausted);
    let b = k.try_acquire(&"b", 1).unwrap();
    drop(a);
    let a2 = k.try_acquire(&"a", 1).unwrap();
    // A key with a held permit is never idle, so it is never evicted under its lease.
    assert_eq!(k.evict_idle(), 0);
    drop((a2, b));
    assert_eq!(k.evict_idle(), 2);
}

#[test]
fn keyed_give_back_refunds_that_key_only() {
    let k: Keyed<u64, _, _> =
        Keyed::builder(SlidingLog::new(Quota::per_second(3).unwrap())).clock(ManualClock::new()).build();
    let lease = k.try_acquire(&1, 3).unwrap();
    let _ = k.try_acquire(&2, 3).unwrap();
    k.give_back(&1, lease);
    assert_eq!(k.check(&1, 3).unwrap().remaining, 3);
    assert!(k.check(&2, 1).is_err());
}

#[test]
fn keyed_set_quota_keeps_spent_permits() {
    let k: Keyed<u64, _, _> =
        Keyed::builder(TokenBucket::new(Quota::per_second(10).unwrap())).clock(ManualClock::new()).build();
    let _ = k.try_acquire(&1, 4).unwrap();
    k.set_quota(Quota::per_second(20).unwrap());
    assert_eq!(k.check(&1, 0).unwrap().remaining, 16);
}

#[tokio::test]
async fn keyed_acquire_waits_for_retry_after_and_honours_max_wait() {
    let clock = ManualClock::new();
    let k: Keyed<u64, _, _> =
        Keyed::builder(TokenBucket::new(Quota::per_second(10).unwrap())).clock(clock.clone()).build();
    let _ = k.try_acquire(&1, 10).unwrap();
    let no = k.acquire(&1, 5, Some(Duration::from_millis(100))).await.unwrap_err();
    assert_eq!(no.reason(), Reason::MaxWait);
    let waiting = k.acquire(&1, 1, None);
    let driver = async {
        while clock.pending_sleeps() == 0 {
            tokio::task::yield_now().await;
        }
        clock.advance(Duration::from_millis(100));
    };
    let (lease, ()) = tokio::join!(waiting, driver);
    assert_eq!(lease.unwrap().granted_at(), 100_000_000);
}
