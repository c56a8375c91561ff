//! Heap bytes per key: 1 million distinct `u64` keys in a tollgate `Keyed<u64, TokenBucket>` and
//! in governor's default keyed limiter (a `DashMap`), measured with a counting global allocator.
//!
//! Run with `cargo run --release -p tollgate --example key_memory`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};

use governor::{DefaultKeyedRateLimiter, RateLimiter};
use tollgate::{Keyed, Quota, TokenBucket};

/// `System`, counting the bytes currently allocated.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to `System`; only the byte count is added on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE.fetch_add(new_size, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const KEYS: u64 = 1_000_000;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Heap bytes the value built by `build` holds, including the empty structure itself.
fn measure<T>(name: &str, build: impl FnOnce() -> T, len: impl Fn(&T) -> usize) -> (T, usize) {
    let before = live();
    let value = build();
    let bytes = live() - before;
    let keys = len(&value);
    assert_eq!(keys as u64, KEYS, "{name} must hold every key");
    println!("{name:<34} {keys:>9} keys {bytes:>12} bytes {:>7.1} bytes/key", bytes as f64 / keys as f64);
    (value, bytes)
}

fn main() {
    // One permit per hour, burst 1M: a key touched once stays non-idle (short of a full bucket)
    // for an hour, so tollgate's sweep of idle keys never removes any while we insert.
    let quota = Quota::per_hour(1).expect("valid quota").with_burst(1_000_000).expect("valid burst");
    let nz = |n| NonZeroU32::new(n).expect("non-zero");
    let gov_quota = governor::Quota::per_hour(nz(1)).allow_burst(nz(1_000_000));

    let (ours, ours_bytes) = measure(
        "tollgate Keyed<u64, TokenBucket>",
        || {
            let keyed: Keyed<u64, TokenBucket> = Keyed::new(TokenBucket::new(quota));
            for key in 0..KEYS {
                assert!(keyed.try_acquire(&key, 1).is_ok());
            }
            keyed
        },
        |k| k.len(),
    );
    let (theirs, theirs_bytes) = measure(
        "governor keyed (DashMap)",
        || {
            let keyed: DefaultKeyedRateLimiter<u64> = RateLimiter::keyed(gov_quota);
            for key in 0..KEYS {
                assert!(keyed.check_key(&key).is_ok());
            }
            keyed
        },
        |k| k.len(),
    );
    println!("ratio tollgate/governor: {:.3}", ours_bytes as f64 / theirs_bytes as f64);
    println!(
        "(payload is 16 bytes/key in both: an 8-byte key and an 8-byte state; governor's DashMap has {} shards here, \
         tollgate's Keyed 64)",
        (std::thread::available_parallelism().map_or(1, usize::from) * 4).next_power_of_two()
    );
    drop((ours, theirs));
}
