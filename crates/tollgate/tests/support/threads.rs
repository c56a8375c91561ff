//! Keyed decisions on several threads at once, timed as one, for the benches that compare two
//! keyed limiters that way (`benches/limiters.rs` and `benches/keyed_lock.rs`, through `#[path]`,
//! each with `rng.rs` as its `rng` module): both sides of a comparison run the same loop, so
//! the loop's own cost cancels out.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use crate::rng::Rng;

/// `iters` decisions per thread on `threads` threads, thread `t` on random keys `k < keys` with
/// `k % 2 == t` (so that two threads never share a key); returns the wall time from the first
/// thread's start to the last one's end (thread start-up excluded).
pub fn decisions(threads: u64, iters: u64, keys: u64, decide: impl Fn(u64) -> bool + Sync) -> Duration {
    let barrier = Barrier::new(threads as usize);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, decide) = (&barrier, &decide);
                s.spawn(move || {
                    let mut rng = Rng(t + 7);
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        let key = rng.below(keys / 2) * 2 + t;
                        black_box(decide(key));
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("bench thread panicked")).collect()
    });
    let start = spans.iter().map(|s| s.0).min().expect("at least one thread");
    let end = spans.iter().map(|s| s.1).max().expect("at least one thread");
    end - start
}
