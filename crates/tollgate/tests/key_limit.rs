//! Keyed limiters at their key cap, for each [`AtKeyLimit`] policy, on a manual clock: the retry
//! time a rejected new key is told is exact, eviction takes the key nearest to idle, unstored
//! keys are decided but not kept, and a flood of distinct keys never stores more than the cap.

use std::num::NonZeroUsize;
use std::time::Duration;

use tollgate::{AtKeyLimit, Concurrency, FixedWindow, Keyed, ManualClock, Quota, Reason, SWEEP, TokenBucket};

fn nz(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap()
}

const SECOND: u64 = 1_000_000_000;

/// One shard of `cap` keys, 10 per minute (a permit is earned back every 6 s).
fn per_minute(clock: &ManualClock, cap: usize, policy: AtKeyLimit) -> Keyed<u64, TokenBucket, ManualClock> {
    Keyed::builder(TokenBucket::new(Quota::per_minute(10).unwrap()))
        .clock(clock.clone())
        .shards(nz(1))
        .max_keys(nz(cap))
        .at_key_limit(policy)
        .statistics(true)
        .build()
}

#[test]
fn reject_is_the_default_and_names_itself() {
    let k: Keyed<u64, _> = Keyed::new(TokenBucket::new(Quota::per_minute(10).unwrap()));
    assert_eq!(k.at_key_limit(), AtKeyLimit::Reject);
    assert!(format!("{k:?}").contains("at_key_limit: Reject"), "{k:?}");
    for p in [AtKeyLimit::Reject, AtKeyLimit::EvictNearestIdle, AtKeyLimit::AdmitUnstored] {
        assert_eq!(AtKeyLimit::from_name(p.name()), Some(p));
    }
}

#[test]
fn reject_tells_the_exact_time_a_stored_key_goes_idle() {
    let clock = ManualClock::new();
    let k = per_minute(&clock, 100, AtKeyLimit::Reject);
    // Keys 0..100 take one permit each, 10 ms apart: key 0 is idle first, 6 s after its permit.
    for key in 0..100u64 {
        clock.set(key * 10_000_000);
        let _ = k.try_acquire(&key, 1).unwrap();
    }
    // Keys 0..5 take a second permit later: the times the shard keeps for their buckets are stale
    // now (they took permits under the read lock), so key 5 (idle at 6.05 s) is the first to go
    // idle.
    clock.set(2 * SECOND);
    for key in 0..5u64 {
        let _ = k.try_acquire(&key, 1).unwrap();
    }
    let first_idle = 6 * SECOND + 5 * 10_000_000;
    clock.set(3 * SECOND);
    let no = k.try_acquire(&1000, 1).unwrap_err();
    assert_eq!(no.reason(), Reason::KeyLimit);
    assert_eq!(no.retry_after(), Some(Duration::from_nanos(first_idle - 3 * SECOND)));
    // Nothing for it now; the answer changes when the retry time comes.
    assert_eq!((no.remaining(), no.reset_after()), (0, Duration::from_nanos(first_idle - 3 * SECOND)));
    // A check says what a request would get, and stores nothing.
    let checked = k.check(&1000, 1).unwrap_err();
    assert_eq!((checked.reason(), checked.retry_after()), (Reason::KeyLimit, no.retry_after()));
    // One tick earlier there is still no room, and the answer is the same instant.
    clock.set(first_idle - 1);
    let no = k.try_acquire(&1000, 1).unwrap_err();
    assert_eq!((no.reason(), no.retry_after()), (Reason::KeyLimit, Some(Duration::from_nanos(1))));
    // At that instant there is.
    clock.set(first_idle);
    let yes = k.try_acquire(&1000, 1).unwrap();
    assert_eq!(yes.remaining(), 9);
    assert_eq!(k.len(), 100);
    assert!(k.check(&5, 0).unwrap().remaining == 10, "key 5 went idle and was removed");
    // Existing keys keep their limits at the cap, and no stored key was evicted for the new one.
    let s = k.statistics();
    assert_eq!((s.rejected_at_limit, s.evicted_at_limit, s.swept_idle), (2, 0, 1));
}

#[test]
fn reject_for_a_concurrency_limit_says_never_until_a_release_makes_room() {
    let clock = ManualClock::new();
    for policy in [AtKeyLimit::Reject, AtKeyLimit::EvictNearestIdle] {
        let k: Keyed<u64, _, _> = Keyed::builder(Concurrency::new(1).unwrap())
            .clock(clock.clone())
            .shards(nz(1))
            .max_keys(nz(4))
            .at_key_limit(policy)
            .build();
        let mut leases: Vec<_> = (0..4u64).map(|key| k.try_acquire(&key, 1).unwrap()).collect();
        let no = k.try_acquire(&9, 1).unwrap_err();
        assert_eq!((no.reason(), no.retry_after()), (Reason::KeyLimit, None), "{policy:?}");
        // A key holding a permit is never evicted, whatever the policy.
        assert!(k.try_acquire(&0, 1).is_err());
        drop(leases.remove(2));
        let _nine = k.try_acquire(&9, 1).expect("the released key made room");
        assert_eq!(k.len(), 4);
        drop(leases);
    }
}

#[test]
fn evict_takes_the_key_nearest_to_idle() {
    let clock = ManualClock::new();
    let k = per_minute(&clock, 4, AtKeyLimit::EvictNearestIdle);
    // Idle times: key 0 at 18 s (3 permits), key 1 at 6.5 s, key 2 at 12 s, key 3 at 30 s.
    let _ = k.try_acquire(&0, 3).unwrap();
    clock.set(SECOND / 2);
    let _ = k.try_acquire(&1, 1).unwrap();
    let _ = k.try_acquire(&2, 2).unwrap();
    let _ = k.try_acquire(&3, 5).unwrap();
    // Key 1 takes 2 more: idle at 18.5 s, so key 2 is now the nearest (its record is stale).
    let _ = k.try_acquire(&1, 2).unwrap();
    clock.set(SECOND);
    let _ = k.try_acquire(&100, 1).unwrap();
    assert_eq!(k.len(), 4);
    let remaining = |key: u64| k.check(&key, 0).unwrap().remaining;
    assert_eq!(remaining(2), 10, "key 2 was evicted: it answers as a fresh key");
    assert_eq!((remaining(0), remaining(1), remaining(3)), (7, 7, 5));
    // The over-admission the docs state: key 2 comes back with a full burst (evicting key 100,
    // now nearest: idle at 7 s) instead of the 8 it had left.
    let _ = k.try_acquire(&2, 10).unwrap();
    assert_eq!(remaining(100), 10);
    let s = k.statistics();
    assert_eq!((s.evicted_at_limit, s.rejected_at_limit, s.keys), (2, 0, 4));
}

#[test]
fn admit_unstored_decides_a_new_key_on_a_fresh_state_and_keeps_nothing() {
    let clock = ManualClock::new();
    let k = per_minute(&clock, 2, AtKeyLimit::AdmitUnstored);
    let _ = k.try_acquire(&1, 1).unwrap();
    let _ = k.try_acquire(&2, 1).unwrap();
    for _ in 0..3 {
        let lease = k.try_acquire(&3, 10).expect("fail open: a fresh bucket every time");
        assert_eq!((lease.reason(), lease.remaining()), (Reason::Granted, 0));
    }
    assert_eq!(k.len(), 2);
    let s = k.statistics();
    assert_eq!((s.unstored_at_limit, s.admitted), (3, Some(5)));
    // Once a stored key goes idle, the new key is stored (and limited) again.
    clock.advance(Duration::from_secs(6));
    let _ = k.try_acquire(&3, 10).unwrap();
    assert_eq!(k.try_acquire(&3, 1).unwrap_err().reason(), Reason::Exhausted);
}

#[test]
fn admit_unstored_concurrency_leases_release_nothing_on_drop() {
    let k: Keyed<u64, _, _> = Keyed::builder(Concurrency::new(1).unwrap())
        .clock(ManualClock::new())
        .shards(nz(1))
        .max_keys(nz(1))
        .at_key_limit(AtKeyLimit::AdmitUnstored)
        .build();
    let held = k.try_acquire(&1, 1).unwrap();
    let unstored = k.try_acquire(&2, 1).unwrap();
    drop(held);
    // Key 2 is stored now (key 1 went idle); the unstored lease must not release its permit.
    let stored = k.try_acquire(&2, 1).unwrap();
    drop(unstored);
    assert_eq!(k.try_acquire(&2, 1).unwrap_err().reason(), Reason::Exhausted);
    drop(stored);
    assert!(k.try_acquire(&2, 1).is_ok());
}

/// A flood of distinct new keys against a table full of live keys: the cap holds for every
/// policy, and stored keys keep their limits.
#[test]
fn ten_million_new_keys_never_store_more_than_the_cap() {
    for policy in [AtKeyLimit::Reject, AtKeyLimit::EvictNearestIdle, AtKeyLimit::AdmitUnstored] {
        let clock = ManualClock::new();
        let k: Keyed<u64, _, _> = Keyed::builder(FixedWindow::new(Quota::per_minute(10).unwrap()))
            .clock(clock.clone())
            .shards(nz(16))
            .max_keys(nz(1024))
            .at_key_limit(policy)
            .statistics(true)
            .build();
        let flood = 10_000_000u64;
        let mut high_water = 0;
        for key in 0..flood {
            if key % 100_000 == 0 {
                clock.advance(Duration::from_micros(1));
                high_water = high_water.max(k.len());
            }
            let _ = k.try_acquire(&key, 1);
        }
        high_water = high_water.max(k.len());
        assert_eq!(high_water, k.max_keys(), "{policy:?}");
        let s = k.statistics();
        let at_limit = s.rejected_at_limit + s.evicted_at_limit + s.unstored_at_limit;
        assert_eq!(at_limit, flood - 1024, "{policy:?}: every key past the cap met the policy");
    }
}

/// A small cap holds what it says whatever the keys hash to: the builder gives it fewer shards
/// (with 64 shards of one key each, a cap of 64 turned new keys away from about the tenth), while
/// a large cap keeps the default 64.
#[test]
fn a_small_cap_stores_every_key_up_to_it() {
    for cap in [1, 10, 64, 1000, 2047] {
        let k: Keyed<u64, _, _> = Keyed::builder(TokenBucket::new(Quota::per_minute(10).unwrap()))
            .clock(ManualClock::new())
            .max_keys(nz(cap))
            .build();
        assert_eq!(k.max_keys(), cap, "one shard below 2,048 keys");
        for key in 0..cap as u64 {
            assert!(k.try_acquire(&key, 1).is_ok(), "key {key} of a cap of {cap}");
        }
        let over = k.try_acquire(&(cap as u64), 1).unwrap_err();
        assert_eq!(over.reason(), Reason::KeyLimit, "cap {cap}");
    }
    // The cap is rounded up to a multiple of the shard count: 4 shards at 5,001 keys, 64 from
    // 65,536 on.
    let rounded = |cap: usize| {
        let k: Keyed<u64, _> =
            Keyed::builder(TokenBucket::new(Quota::per_minute(10).unwrap())).max_keys(nz(cap)).build();
        k.max_keys()
    };
    assert_eq!(rounded(5_001), 5_004);
    assert_eq!(rounded(100_000), 100_032);
    assert_eq!(rounded(10_000_000), 10_000_000);
}

/// A shard of thousands of keys (many groups of table buckets, each with one time for its keys):
/// the keys nearest to idle took permits since (their groups' times went stale). Each new key
/// looks at up to `SWEEP` groups: a retry time is never earlier than the exact one, is later only
/// while more stale groups remain, and becomes exact as new keys look further; eviction takes
/// the key nearest to idle. Where keys land in the table follows the hasher's random seed, so the
/// test runs on 24 tables: in about 1 of 40, key 20 shares a group with one of the first stale
/// keys looked at, so the retry time is exact while stale groups remain (a retry at it once ran
/// out of looks on them and was rejected again).
#[test]
fn the_earliest_idle_key_is_found_among_thousands() {
    const KEYS: u64 = 5_000;
    let ms = 1_000_000;
    let tables = (0..24).flat_map(|_| [AtKeyLimit::Reject, AtKeyLimit::EvictNearestIdle]);
    for policy in tables {
        let clock = ManualClock::new();
        let k = per_minute(&clock, KEYS as usize, policy);
        // Key i takes one permit at i ms: idle at 6 s + i ms.
        for key in 0..KEYS {
            clock.set(key * ms);
            let _ = k.try_acquire(&key, 1).unwrap();
        }
        assert_eq!(k.len(), KEYS as usize);
        // The first ones take another permit: 20 of them (more groups than a new key looks at)
        // before a rejection, 5 before an eviction, which has no second try. Key `stale` is then
        // the first to go idle.
        let stale = if policy == AtKeyLimit::Reject { 20 } else { 5 };
        clock.set(5 * SECOND + 500 * ms);
        for key in 0..stale {
            let _ = k.try_acquire(&key, 1).unwrap();
        }
        let meta = |key: u64| k.check(&key, 0).unwrap();
        let first = 6 * SECOND + stale * ms;
        let now = 5 * SECOND + 500 * ms;
        match policy {
            AtKeyLimit::Reject => {
                let exact = Some(Duration::from_nanos(first - now));
                let mut tries = 0;
                loop {
                    tries += 1;
                    let no = k.try_acquire(&(1 << 40), 1).unwrap_err();
                    assert!(no.retry_after() >= exact, "try {tries}: {:?}, earlier than key 20", no.retry_after());
                    if no.retry_after() == exact {
                        break;
                    }
                    assert!(tries < 20 / SWEEP + 2, "not exact after {tries} tries");
                }
                // At that instant key 20 is idle and makes room.
                clock.set(first);
                assert!(k.try_acquire(&(1 << 40), 1).is_ok());
                assert_eq!(meta(20).remaining, 10, "key 20 went idle and was removed");
            }
            _ => {
                assert!(k.try_acquire(&(1 << 40), 1).is_ok());
                assert_eq!(meta(5).remaining, 10, "key 5, the nearest to idle, was evicted");
                assert_eq!(meta(6).remaining, 9, "key 6 was not");
                assert_eq!(k.statistics().evicted_at_limit, 1);
            }
        }
        assert_eq!(k.len(), KEYS as usize);
    }
}

/// A give-back moves a key's idle time earlier than the shard's time for its group (taken under
/// the read lock, where that time cannot be re-read): the earliest idle time answered at the cap
/// follows it.
#[test]
fn a_give_back_makes_its_key_the_nearest_to_idle() {
    let clock = ManualClock::new();
    let k = per_minute(&clock, 1_000, AtKeyLimit::Reject);
    // Every key takes 3 permits at 0: idle at 18 s.
    let leases: Vec<_> = (0..1_000u64).map(|key| k.try_acquire(&key, 3).unwrap()).collect();
    clock.set(SECOND);
    let no = k.try_acquire(&(1 << 40), 1).unwrap_err();
    assert_eq!(no.retry_after(), Some(Duration::from_secs(17)));
    // Key 700 gives its 3 back at 1 s: idle at 0 + (nothing held) -> idle now.
    let lease = leases.into_iter().nth(700).unwrap();
    k.give_back(&700, lease);
    assert!(k.try_acquire(&(1 << 40), 1).is_ok(), "key 700 was idle: room");
    assert_eq!(k.len(), 1_000);
}
