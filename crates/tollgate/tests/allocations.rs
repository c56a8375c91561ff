//! Warm decisions allocate nothing: a counting global allocator around 1,000 decisions on each
//! path (after one decision has created what is created once: the key, the clock's calibration).

use std::hint::black_box;

#[path = "support/counting.rs"]
mod counting;
use counting::{Counting, allocations};

use tollgate::{Concurrency, FixedWindow, Keyed, Limiter, Quota, SlidingWindow, TokenBucket};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// 1,000 decisions after a first one; asserts none of them allocated.
fn assert_warm_decisions_allocate_nothing(what: &str, mut decide: impl FnMut(u64)) {
    decide(0);
    let n = allocations(|| (1..=1000).for_each(&mut decide));
    assert_eq!(n, 0, "{what}: {n} allocations in 1,000 warm decisions");
}

#[test]
fn the_counter_sees_allocations() {
    // The test below would pass vacuously if the allocator were not counting.
    assert!(allocations(|| drop(black_box(vec![1u8; 16]))) >= 1);
}

#[test]
fn a_limiters_decisions_allocate_nothing() {
    let admit = Limiter::new(TokenBucket::new(Quota::per_second(1_000_000_000).unwrap().with_burst(1 << 40).unwrap()));
    assert_warm_decisions_allocate_nothing("token bucket, admitted", |_| {
        let lease = admit.try_acquire(1).expect("admitted");
        black_box(lease.remaining());
    });
    let reject = Limiter::new(TokenBucket::new(Quota::per_hour(1).unwrap()));
    let _first = reject.try_acquire(1);
    assert_warm_decisions_allocate_nothing("token bucket, rejected", |_| {
        let no = reject.try_acquire(1).expect_err("rejected");
        black_box(no.retry_after());
    });
    let window = Limiter::new(FixedWindow::new(Quota::per_second(1_000_000_000).unwrap()));
    assert_warm_decisions_allocate_nothing("fixed window", |_| drop(black_box(window.try_acquire(1))));
    let sliding = Limiter::new(SlidingWindow::new(Quota::per_second(1_000_000_000).unwrap(), 4).unwrap());
    assert_warm_decisions_allocate_nothing("sliding window", |_| drop(black_box(sliding.try_acquire(1))));
}

#[test]
fn concurrency_permits_and_leases_allocate_nothing() {
    let limiter = Limiter::new(Concurrency::new(8).unwrap());
    assert_warm_decisions_allocate_nothing("borrowed permit", |_| drop(black_box(limiter.try_permit(1))));
    assert_warm_decisions_allocate_nothing("owned lease", |_| drop(black_box(limiter.try_acquire(1))));
}

#[test]
fn a_keyed_limiters_decisions_on_existing_keys_allocate_nothing() {
    let quota = Quota::per_second(1).unwrap().with_burst(1_000_000_000).unwrap();
    let by_number: Keyed<u64, _> = Keyed::new(TokenBucket::new(quota));
    (0..100).for_each(|k| drop(by_number.try_acquire(&k, 1)));
    assert_warm_decisions_allocate_nothing("u64 keys", |i| {
        drop(by_number.try_acquire(&(i % 100), 1).expect("admitted"));
    });
    let by_name: Keyed<String, _> = Keyed::new(TokenBucket::new(quota));
    let names: Vec<String> = (0..100).map(|i| format!("user-{i}")).collect();
    names.iter().for_each(|k| drop(by_name.try_acquire(k.as_str(), 1)));
    assert_warm_decisions_allocate_nothing("String keys looked up by &str", |i| {
        drop(by_name.try_acquire(names[(i % 100) as usize].as_str(), 1).expect("admitted"));
    });
}
