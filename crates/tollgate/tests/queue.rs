//! The wait queue: order, eviction, cancellation, max_wait, close. Futures are polled by hand
//! (or run on tokio) against a ManualClock, so nothing sleeps.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::noop_waker;
use tollgate::{Concurrency, Lease, Limiter, ManualClock, QueueOrder, Quota, Reason, Rejected, TokenBucket};

type Acq<'a> = Pin<Box<dyn Future<Output = Result<Lease, Rejected>> + Send + 'a>>;

fn poll(f: &mut Acq<'_>) -> Poll<Result<Lease, Rejected>> {
    f.as_mut().poll(&mut Context::from_waker(&noop_waker()))
}

fn ready(f: &mut Acq<'_>) -> Result<Lease, Rejected> {
    match poll(f) {
        Poll::Ready(r) => r,
        Poll::Pending => panic!("expected the acquire to be complete"),
    }
}

fn pending(f: &mut Acq<'_>) {
    assert!(poll(f).is_pending(), "expected the acquire to still wait");
}

fn semaphore(max: u64, order: QueueOrder, queue_limit: u64) -> Limiter<Concurrency, ManualClock> {
    Limiter::builder(Concurrency::new(max).unwrap())
        .clock(ManualClock::new())
        .queue_order(order)
        .queue_limit(queue_limit)
        .statistics(true)
        .build()
}

#[test]
fn fifo_small_request_never_overtakes_big_one() {
    let l = semaphore(3, QueueOrder::Fifo, 100);
    let mut held: Vec<Lease> = (0..3).map(|_| l.try_acquire(1).unwrap()).collect();
    let mut big: Acq<'_> = Box::pin(l.acquire(3));
    let mut small: Acq<'_> = Box::pin(l.acquire(1));
    pending(&mut big);
    pending(&mut small);
    held.pop();
    // One permit is free, the small request would fit, but the big one is ahead of it.
    pending(&mut small);
    pending(&mut big);
    assert_eq!(l.try_acquire(1).unwrap_err().reason(), Reason::Exhausted, "try_acquire must not jump the queue");
    held.clear();
    let big_lease = ready(&mut big).unwrap();
    assert_eq!(big_lease.permits(), 3);
    pending(&mut small);
    drop(big_lease);
    assert_eq!(ready(&mut small).unwrap().permits(), 1);
    assert_eq!(l.statistics().queued, 0);
}

#[test]
fn fifo_order_with_mixed_sizes_on_a_token_bucket() {
    let clock = ManualClock::new();
    let l = Limiter::builder(TokenBucket::new(Quota::per_second(10).unwrap())).clock(clock.clone()).build();
    let _all = l.try_acquire(10).unwrap();
    let mut a: Acq<'_> = Box::pin(l.acquire(5));
    let mut b: Acq<'_> = Box::pin(l.acquire(1));
    pending(&mut a);
    pending(&mut b);
    assert_eq!(clock.pending_sleeps(), 1, "only the head keeps a timer");
    clock.advance(Duration::from_millis(100));
    pending(&mut b); // one token is there, but `a` (5) is first
    clock.advance(Duration::from_millis(400));
    pending(&mut b);
    let a = ready(&mut a).unwrap();
    assert_eq!(a.remaining(), 0);
    clock.advance(Duration::from_millis(99));
    pending(&mut b);
    clock.advance(Duration::from_millis(1));
    let _ = ready(&mut b).unwrap();
}

#[test]
fn fifo_queue_limit_rejects_the_newcomer() {
    let l = semaphore(1, QueueOrder::Fifo, 2);
    let _h = l.try_acquire(1).unwrap();
    let mut a: Acq<'_> = Box::pin(l.acquire(1));
    let mut b: Acq<'_> = Box::pin(l.acquire(1));
    pending(&mut a);
    pending(&mut b);
    let mut c: Acq<'_> = Box::pin(l.acquire(1));
    assert_eq!(ready(&mut c).unwrap_err().reason(), Reason::QueueFull);
    assert_eq!(l.statistics().queued, 2);
}

#[test]
fn lifo_serves_newest_first_and_evicts_oldest_when_full() {
    let l = semaphore(1, QueueOrder::Lifo, 2);
    let held = l.try_acquire(1).unwrap();
    let mut a: Acq<'_> = Box::pin(l.acquire(1));
    let mut b: Acq<'_> = Box::pin(l.acquire(1));
    pending(&mut a);
    pending(&mut b);
    let mut c: Acq<'_> = Box::pin(l.acquire(1));
    pending(&mut c);
    let evicted = ready(&mut a).unwrap_err();
    assert_eq!(evicted.reason(), Reason::Evicted);
    drop(held);
    let c_lease = ready(&mut c).unwrap();
    pending(&mut b);
    drop(c_lease);
    let _ = ready(&mut b).unwrap();
}

#[test]
fn lifo_request_larger_than_queue_limit_is_rejected() {
    let l = semaphore(4, QueueOrder::Lifo, 2);
    let _h = l.try_acquire(4).unwrap();
    let mut big: Acq<'_> = Box::pin(l.acquire(3));
    assert_eq!(ready(&mut big).unwrap_err().reason(), Reason::QueueFull);
}

#[test]
fn cancelling_a_waiter_removes_it_exactly_once_and_lets_the_next_go() {
    let l = semaphore(3, QueueOrder::Fifo, 100);
    let h = l.try_acquire(2).unwrap();
    let mut big: Acq<'_> = Box::pin(l.acquire(3));
    let mut small: Acq<'_> = Box::pin(l.acquire(1));
    pending(&mut big);
    pending(&mut small);
    assert_eq!(l.statistics().queued, 4);
    drop(big);
    assert_eq!(l.statistics().queued, 0);
    // The small one fits in the free permit now that the big one is gone.
    let s = ready(&mut small).unwrap();
    assert_eq!(l.held(), 3);
    drop((s, h));
    assert_eq!(l.held(), 0);
}

#[test]
fn cancelling_after_being_granted_gives_the_permits_back() {
    let l = semaphore(2, QueueOrder::Fifo, 100);
    let h = l.try_acquire(2).unwrap();
    let mut w: Acq<'_> = Box::pin(l.acquire(2));
    pending(&mut w);
    drop(h); // grants `w` from the releasing thread; `w` has not been polled since
    assert_eq!(l.held(), 2);
    drop(w);
    assert_eq!(l.held(), 0, "a dropped future returns what it had been handed");
    assert_eq!(l.statistics().admitted, Some(1), "the given-back lease no longer counts as admitted");
}

#[test]
fn cancelling_a_granted_rate_waiter_refunds_the_tokens() {
    let clock = ManualClock::new();
    let l = Limiter::builder(TokenBucket::new(Quota::per_second(10).unwrap())).clock(clock.clone()).build();
    let _all = l.try_acquire(10).unwrap();
    let mut w: Acq<'_> = Box::pin(l.acquire(2));
    let mut next: Acq<'_> = Box::pin(l.acquire(1));
    pending(&mut w);
    pending(&mut next);
    clock.advance(Duration::from_millis(200));
    // Polling `next` drives the queue: `w` is granted its 2 tokens, `next` still waits.
    pending(&mut next);
    drop(w);
    // The 2 tokens came back: `next` fits now.
    let _ = ready(&mut next).unwrap();
    assert_eq!(l.check(1).unwrap().remaining, 1);
}

#[test]
fn max_wait_rejects_at_once_without_consuming() {
    let clock = ManualClock::new();
    let l = Limiter::builder(TokenBucket::new(Quota::per_second(10).unwrap()))
        .clock(clock.clone())
        .max_wait(Duration::from_millis(150))
        .build();
    let _ = l.try_acquire(9).unwrap();
    let mut far: Acq<'_> = Box::pin(l.acquire(3)); // needs 200 ms
    let no = ready(&mut far).unwrap_err();
    assert_eq!(no.reason(), Reason::MaxWait);
    assert_eq!(no.retry_after(), Some(Duration::from_millis(200)));
    assert_eq!(l.statistics().available, 1, "nothing was taken");
    assert_eq!(l.statistics().queued, 0);
    let mut near: Acq<'_> = Box::pin(l.acquire(2)); // needs 100 ms: waits
    pending(&mut near);
    clock.advance(Duration::from_millis(100));
    let _ = ready(&mut near).unwrap();
}

#[test]
fn max_wait_on_a_concurrency_limit_is_a_timeout_that_takes_nothing() {
    let clock = ManualClock::new();
    let l =
        Limiter::builder(Concurrency::new(1).unwrap()).clock(clock.clone()).max_wait(Duration::from_secs(1)).build();
    let h = l.try_acquire(1).unwrap();
    let mut w: Acq<'_> = Box::pin(l.acquire(1));
    pending(&mut w);
    clock.advance(Duration::from_millis(999));
    pending(&mut w);
    clock.advance(Duration::from_millis(1));
    assert_eq!(ready(&mut w).unwrap_err().reason(), Reason::MaxWait);
    assert_eq!(l.statistics().queued, 0);
    drop(h);
    assert_eq!(l.held(), 0);
}

#[test]
fn close_completes_every_waiter_and_later_requests() {
    let l = semaphore(1, QueueOrder::Fifo, 100);
    let h = l.try_acquire(1).unwrap();
    let mut waiters: Vec<Acq<'_>> = (0..5).map(|_| Box::pin(l.acquire(1)) as Acq<'_>).collect();
    waiters.iter_mut().for_each(pending);
    l.close();
    for w in &mut waiters {
        let no = ready(w).unwrap_err();
        assert_eq!(no.reason(), Reason::Closed);
        assert_eq!(no.retry_after(), None);
    }
    assert_eq!(l.try_acquire(1).unwrap_err().reason(), Reason::Closed);
    let mut late: Acq<'_> = Box::pin(l.acquire(1));
    assert_eq!(ready(&mut late).unwrap_err().reason(), Reason::Closed);
    drop(h); // releasing after close is harmless
    assert_eq!(l.held(), 0);
}

#[test]
fn acquire_zero_is_an_immediate_probe() {
    let l = semaphore(1, QueueOrder::Fifo, 100);
    let _h = l.try_acquire(1).unwrap();
    let mut w: Acq<'_> = Box::pin(l.acquire(1));
    pending(&mut w);
    let mut probe: Acq<'_> = Box::pin(l.acquire(0));
    let p = ready(&mut probe).unwrap();
    assert_eq!((p.permits(), p.reason(), p.remaining()), (0, Reason::Probe, 0));
}

#[test]
fn acquire_over_capacity_is_rejected_at_once() {
    let l = semaphore(2, QueueOrder::Fifo, 100);
    let mut w: Acq<'_> = Box::pin(l.acquire(3));
    let no = ready(&mut w).unwrap_err();
    assert_eq!((no.reason(), no.retry_after()), (Reason::ExceedsCapacity, None));
}

#[test]
fn raising_a_concurrency_limit_serves_waiters() {
    let l = semaphore(1, QueueOrder::Fifo, 100);
    let _h = l.try_acquire(1).unwrap();
    let mut w: Acq<'_> = Box::pin(l.acquire(1));
    pending(&mut w);
    l.set_config(std::num::NonZeroU64::new(2).unwrap());
    let _ = ready(&mut w).unwrap();
}

#[test]
fn shrinking_capacity_below_a_waiter_rejects_it_instead_of_blocking_the_queue() {
    let clock = ManualClock::new();
    let l = Limiter::builder(TokenBucket::new(Quota::per_second(10).unwrap())).clock(clock.clone()).build();
    let _ = l.try_acquire(10).unwrap();
    let mut w: Acq<'_> = Box::pin(l.acquire(8));
    pending(&mut w);
    l.set_quota(Quota::per_second(5).unwrap());
    clock.advance(Duration::from_secs(5));
    assert_eq!(ready(&mut w).unwrap_err().reason(), Reason::ExceedsCapacity);
}

/// The same queue driven by real tokio tasks: wakeups (not polling by hand) deliver the leases,
/// and tasks finish in FIFO order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_tasks_are_served_in_arrival_order() {
    let clock = ManualClock::new();
    let l = Arc::new(Limiter::builder(TokenBucket::new(Quota::per_second(10).unwrap())).clock(clock.clone()).build());
    let _ = l.try_acquire(10).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..20u64 {
        let (task_l, tx) = (l.clone(), tx.clone());
        tokio::spawn(async move {
            let lease = task_l.acquire(1 + i % 3).await.unwrap();
            tx.send((i, lease.granted_at())).unwrap();
        });
        // Let the task reach the queue before the next one arrives.
        while l.statistics().queued < (0..=i).map(|k| 1 + k % 3).sum::<u64>() {
            tokio::task::yield_now().await;
        }
    }
    drop(tx);
    let mut granted = vec![None; 20];
    while granted.iter().any(Option::is_none) {
        clock.advance(Duration::from_millis(10));
        while let Ok((i, at)) = rx.try_recv() {
            granted[i as usize] = Some(at);
        }
        tokio::task::yield_now().await;
    }
    let granted: Vec<u64> = granted.into_iter().map(Option::unwrap).collect();
    assert!(granted.windows(2).all(|w| w[0] <= w[1]), "served out of order: {granted:?}");
    // 39 permits after the first 10: at 10 per second the last is granted at 3.9 s, not earlier.
    assert!(granted[19] >= 3_900_000_000, "{granted:?}");
}
