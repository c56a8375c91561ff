//! Loom models of the lock-free parts. Run with
//! `RUSTFLAGS="--cfg tollgate_loom" cargo test -p tollgate --test loom --release`.
#![cfg(tollgate_loom)]

use std::num::{NonZeroU64, NonZeroUsize};
use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use tollgate::{Algorithm, Concurrency, Keyed, Limiter, ManualClock, Quota, TokenBucket};

/// Racing threads on a GCRA bucket admit exactly the burst, never more.
#[test]
fn token_bucket_admits_exactly_the_burst() {
    loom::model(|| {
        let bucket = Arc::new(TokenBucket::new(Quota::per_second(1).unwrap()));
        let state = Arc::new(bucket.new_state(0));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (bucket, state) = (bucket.clone(), state.clone());
                thread::spawn(move || bucket.decide(&state, 0, 1, true).is_ok() as u64)
            })
            .collect();
        let admitted: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(admitted, 1);
        assert!(bucket.decide(&state, 0, 1, false).is_err());
    });
}

/// A quota change racing a decision: the decision sees the old quota or the new one, never a mix
/// (a mix of burst 1 with the 1 s emission interval of the old quota would admit 0 or 2 at t=0).
#[test]
fn quota_change_is_seen_whole() {
    loom::model(|| {
        let bucket = Arc::new(TokenBucket::new(Quota::per_second(1).unwrap()));
        let state = Arc::new(bucket.new_state(0));
        let writer = {
            let bucket = bucket.clone();
            thread::spawn(move || {
                bucket.set_config(Quota::per(Duration::from_millis(500), 2).unwrap().with_burst(2).unwrap());
            })
        };
        let meta = bucket.decide(&state, 0, 0, false).unwrap().meta();
        writer.join().unwrap();
        assert!(meta.limit == 1 && meta.remaining == 1 || meta.limit == 2 && meta.remaining == 2, "{meta:?}");
    });
}

/// Concurrency limit: holders never exceed the limit, and every permit comes back.
#[test]
fn concurrency_never_exceeds_limit() {
    loom::model(|| {
        let limit = Arc::new(Concurrency::new(1).unwrap());
        let state = Arc::new(limit.new_state(0));
        let inside = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (limit, state, inside) = (limit.clone(), state.clone(), inside.clone());
                thread::spawn(move || {
                    if limit.decide(&state, 0, 1, true).is_ok() {
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                        inside.fetch_sub(1, Ordering::SeqCst);
                        limit.give_back(&state, 0, 1, 0);
                    }
                })
            })
            .collect();
        handles.into_iter().for_each(|h| h.join().unwrap());
        assert!(limit.is_idle(&state, 0));
        assert_eq!(limit.config(), NonZeroU64::new(1).unwrap());
    });
}

/// Keyed limiters read a shard's table through a per-thread slot while no writer is about. Two
/// readers on a stored key race a writer inserting another key into the same (only) shard: loom's
/// cell tracking fails the model if a read of the table overlaps the write, and the answers are
/// those of one order or another (the stored key has one permit left, taken exactly once).
/// The lock has two slots under loom, so the main thread shares its slot with whichever spawned
/// thread reads second (when both read at once, the later one takes the underlying lock). Bounded to 2 preemptions in CI (as tokio
/// bounds its larger models; 0.1 s); `TOLLGATE_LOOM_FULL=1` explores every interleaving (about
/// 4 minutes on 2 cores).
#[test]
fn keyed_readers_in_slots_never_overlap_a_writer() {
    let mut model = loom::model::Builder::new();
    let full = std::env::var_os("TOLLGATE_LOOM_FULL").is_some_and(|v| v != "0");
    model.preemption_bound = if full { None } else { Some(2) };
    model.check(|| {
        let keyed = Arc::new(
            Keyed::builder(TokenBucket::new(Quota::per_second(2).unwrap().with_burst(2).unwrap()))
                .clock(ManualClock::new())
                .shards(NonZeroUsize::MIN)
                .build(),
        );
        assert!(keyed.try_acquire(&0u64, 1).is_ok());
        let threads: Vec<_> = [0u64, 1]
            .into_iter()
            .map(|key| {
                let keyed = keyed.clone();
                thread::spawn(move || keyed.try_acquire(&key, 1).is_ok())
            })
            .collect();
        let main = keyed.try_acquire(&0u64, 1).is_ok();
        let admitted: Vec<bool> = threads.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(main ^ admitted[0], "key 0 had one permit left: main {main}, thread {}", admitted[0]);
        assert!(admitted[1], "key 1 is new");
        assert_eq!(keyed.len(), 2);
    });
}

/// The wait queue's hand-off: the one permit of a concurrency limit is released while another
/// thread joins the queue for it. Either the release sees the queued permits and serves the
/// waiter, or the waiter's own pass over the queue sees the permit back; a lost wakeup leaves the
/// waiter asleep with the permit free, which loom reports as a deadlock. Checked to fail with the
/// fence in `Shared::drive_for` removed, or with the release not driving the queue.
#[test]
fn a_release_never_misses_a_waiter_joining_the_queue() {
    loom::model(|| {
        let limiter = Limiter::builder(Concurrency::new(1).unwrap()).clock(ManualClock::new()).build();
        let held = limiter.try_acquire(1).unwrap();
        let releaser = thread::spawn(move || drop(held));
        let lease = loom::future::block_on(limiter.acquire(1)).expect("the queue has no limit");
        assert_eq!(lease.permits(), 1);
        releaser.join().unwrap();
        assert_eq!(limiter.held(), 1);
        drop(lease);
        assert_eq!(limiter.held(), 0);
    });
}
