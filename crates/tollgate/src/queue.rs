//! The wait queue behind `acquire(n).await`.
//!
//! Waiters sit in a map ordered by arrival. Whoever changes what is available (a release, a
//! refund, a quota change, the head waiter's timer) calls [`Shared::drive`], which grants the
//! head while it fits — strictly in order, so a small request never passes a big one — and
//! wakes the granted waiters after the lock is released. Only the head waiter of a time-based
//! limiter keeps a timer (until the head can be granted); the others sleep without one unless
//! they have a `max_wait` deadline.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::algorithm::{Algorithm, peek};
use crate::clock::{Clock, Sleep};
use crate::decision::{Lease, Meta, Reason, Rejected};
use crate::limiter::{QueueOrder, Shared};

#[derive(Default)]
pub(crate) struct Queue {
    waiters: BTreeMap<u64, Waiter>,
    next_id: u64,
    permits: u64,
}

struct Waiter {
    n: u64,
    deadline: Option<u64>,
    slot: Arc<Slot>,
}

#[derive(Default)]
struct Slot(Mutex<SlotInner>);

#[derive(Default)]
struct SlotInner {
    outcome: Option<Result<Lease, Rejected>>,
    waker: Option<Waker>,
}

impl Slot {
    /// Stores the outcome and returns the waker to call once every lock is released.
    fn complete(&self, outcome: Result<Lease, Rejected>) -> Option<Waker> {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        s.outcome = Some(outcome);
        s.waker.take()
    }

    fn wake_handle(&self) -> Option<Waker> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).waker.clone()
    }
}

enum Enqueued {
    Done(Result<Lease, Rejected>),
    Waiting(u64, Arc<Slot>),
}

/// What a waiter learns from [`Shared::drive`]: when to look again by itself.
struct Next {
    timer: Option<u64>,
}

impl Queue {
    fn head(&self, order: QueueOrder) -> Option<(u64, &Waiter)> {
        match order {
            QueueOrder::Fifo => self.waiters.first_key_value(),
            QueueOrder::Lifo => self.waiters.last_key_value(),
        }
        .map(|(&id, w)| (id, w))
    }

    fn remove(&mut self, id: u64) -> Option<Waiter> {
        let w = self.waiters.remove(&id)?;
        self.permits -= w.n;
        Some(w)
    }
}

impl<A: Algorithm, C: Clock> Shared<A, C> {
    pub(crate) async fn acquire(self: &Arc<Self>, n: u64) -> Result<Lease, Rejected> {
        // Open and nobody queued: what fits now is taken as `try_acquire` takes it, without the
        // queue's lock (nobody to overtake). What does not fit takes the queue's path, which
        // decides again under the lock.
        if n > 0 && self.gate.is_clear() {
            let now = self.now();
            if let Ok(meta) = self.algo.decide(&self.state, now, n, true) {
                return Ok(self.lease(meta, n, now));
            }
        }
        let (id, slot) = match self.enqueue(n) {
            Enqueued::Done(outcome) => return outcome,
            Enqueued::Waiting(id, slot) => (id, slot),
        };
        Wait { shared: self, id, slot, sleep: None, finished: false }.await
    }

    fn enqueue(self: &Arc<Self>, n: u64) -> Enqueued {
        if self.gate.is_closed() {
            return Enqueued::Done(Err(self.reject_closed(n)));
        }
        let now = self.clock.now();
        if n > self.algo.capacity() {
            return Enqueued::Done(Err(self.rejected_over_capacity(n, now)));
        }
        let mut wake = Vec::new();
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        // Re-checked under the lock: `close` sets the flag under the lock, so a waiter inserted
        // here is either seen by `close` or sees the flag.
        if self.gate.is_closed() {
            drop(q);
            return Enqueued::Done(Err(self.reject_closed(n)));
        }
        let may_go_now = n == 0 || q.waiters.is_empty() || self.order == QueueOrder::Lifo;
        let meta = if may_go_now {
            match self.algo.decide(&self.state, now, n, true) {
                Ok(meta) => return Enqueued::Done(Ok(self.lease(meta, n, now))),
                Err(meta) => meta,
            }
        } else {
            peek(&self.algo, &self.state, now, n)
        };
        let meta = meta.meta();
        let ahead = if self.order == QueueOrder::Fifo { q.permits } else { 0 };
        let estimate = self.algo.wait_estimate(&self.state, now, ahead + n);
        let meta = Meta { retry_ns: estimate.or(meta.retry_ns), ..meta };
        if let (Some(max), Some(est)) = (self.max_wait, estimate)
            && est > max
        {
            drop(q);
            return Enqueued::Done(Err(self.reject(meta, n, Reason::MaxWait)));
        }
        if q.permits.saturating_add(n) > self.queue_limit {
            if self.order == QueueOrder::Fifo || n > self.queue_limit {
                drop(q);
                return Enqueued::Done(Err(self.reject(meta, n, Reason::QueueFull)));
            }
            // LIFO: the oldest waiters make room for the newest.
            while q.permits + n > self.queue_limit {
                let (&oldest, _) = q.waiters.first_key_value().expect("permits > 0 means waiters exist");
                let w = q.remove(oldest).expect("just found");
                let retry = self.algo.wait_estimate(&self.state, now, w.n);
                let meta = Meta { retry_ns: retry, ..meta };
                self.counts.rejected();
                wake.extend(w.slot.complete(Err(Rejected::new(meta, w.n, Reason::Evicted))));
            }
        }
        let id = q.next_id;
        q.next_id += 1;
        let slot = Arc::new(Slot::default());
        let deadline = self.max_wait.map(|m| now.saturating_add(m));
        q.waiters.insert(id, Waiter { n, deadline, slot: slot.clone() });
        q.permits += n;
        self.gate.set_queued(q.permits);
        drop(q);
        wake.into_iter().for_each(Waker::wake);
        Enqueued::Waiting(id, slot)
    }

    /// Grants queued waiters while the head fits, expires `me` if its deadline passed, and tells
    /// `me` when to look again. Wakers are called after the lock is released.
    fn drive_for(self: &Arc<Self>, me: Option<u64>) -> Next {
        // Pairs with the SeqCst give-back and load in `Shared::release_permits`: either the
        // releaser sees our queued permits and drives, or we see its released permits here (no
        // lost wakeup; pinned by `a_release_never_misses_a_waiter_joining_the_queue`).
        std::sync::atomic::fence(Ordering::SeqCst);
        let now = self.clock.now();
        let mut wake: Vec<Waker> = Vec::new();
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let head_before = q.head(self.order).map(|(id, _)| id);
        while let Some((id, w)) = q.head(self.order) {
            let n = w.n;
            let outcome = if n > self.algo.capacity() {
                // The capacity shrank under this waiter (a quota change): it can never be served.
                Err(self.rejected_over_capacity(n, now))
            } else {
                match self.algo.decide(&self.state, now, n, true) {
                    Ok(meta) => Ok(self.lease(meta, n, now)),
                    Err(_) => break,
                }
            };
            let w = q.remove(id).expect("head exists");
            wake.extend(w.slot.complete(outcome));
        }
        let mut next = Next { timer: None };
        if let Some(me) = me
            && let Some(w) = q.waiters.get(&me)
        {
            if w.deadline.is_some_and(|d| d <= now) {
                let w = q.remove(me).expect("present");
                let meta = peek(&self.algo, &self.state, now, w.n).meta();
                self.counts.rejected();
                wake.extend(w.slot.complete(Err(Rejected::new(meta, w.n, Reason::MaxWait))));
            } else {
                let is_head = q.head(self.order).is_some_and(|(id, _)| id == me);
                let head_timer = if is_head {
                    // Never earlier than 1 ns from now: an estimate of 0 that does not fit yet
                    // (a window not rolled over) must not spin.
                    self.algo.wait_estimate(&self.state, now, w.n).map(|d| now.saturating_add(d.max(1)))
                } else {
                    None
                };
                next.timer = match (head_timer, w.deadline) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        let head_after = q.head(self.order).map(|(id, w)| (id, w.slot.clone()));
        self.gate.set_queued(q.permits);
        drop(q);
        // A new head must arm its own timer.
        if let Some((id, slot)) = head_after
            && Some(id) != head_before
            && Some(id) != me
        {
            wake.extend(slot.wake_handle());
        }
        wake.into_iter().for_each(Waker::wake);
        next
    }

    pub(crate) fn drive(self: &Arc<Self>, me: Option<u64>) {
        self.drive_for(me);
    }

    /// Removes a waiter whose future was dropped; gives back what it may have been granted.
    fn cancel(self: &Arc<Self>, id: u64, slot: &Slot) {
        let removed = {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            let removed = q.remove(id).is_some();
            self.gate.set_queued(q.permits);
            removed
        };
        if removed {
            // Whoever was behind it may fit now, or has become the head.
            self.drive(None);
            return;
        }
        let outcome = slot.0.lock().unwrap_or_else(|e| e.into_inner()).outcome.take();
        if let Some(Ok(lease)) = outcome {
            self.give_back(lease);
        }
    }

    pub(crate) fn close(&self) {
        let waiters = {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.permits = 0;
            self.gate.close();
            std::mem::take(&mut q.waiters)
        };
        let wake: Vec<Waker> =
            waiters.into_values().filter_map(|w| w.slot.complete(Err(self.reject_closed(w.n)))).collect();
        wake.into_iter().for_each(Waker::wake);
    }
}

/// A queued `acquire`: polls its slot, drives the queue, and keeps a timer when it must.
struct Wait<'a, A: Algorithm, C: Clock> {
    shared: &'a Arc<Shared<A, C>>,
    id: u64,
    slot: Arc<Slot>,
    sleep: Option<(u64, Sleep)>,
    finished: bool,
}

impl<A: Algorithm, C: Clock> Future for Wait<'_, A, C> {
    type Output = Result<Lease, Rejected>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            {
                let mut s = this.slot.0.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(outcome) = s.outcome.take() {
                    this.finished = true;
                    return Poll::Ready(outcome);
                }
                if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    s.waker = Some(cx.waker().clone());
                }
            }
            let next = this.shared.drive_for(Some(this.id));
            if this.slot.0.lock().unwrap_or_else(|e| e.into_inner()).outcome.is_some() {
                continue;
            }
            let Some(at) = next.timer else {
                this.sleep = None;
                return Poll::Pending;
            };
            if this.sleep.as_ref().is_none_or(|(d, _)| *d != at) {
                this.sleep = Some((at, this.shared.clock.sleep_until(at)));
            }
            let (_, sleep) = this.sleep.as_mut().expect("just set");
            match sleep.as_mut().poll(cx) {
                Poll::Ready(()) => this.sleep = None,
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<A: Algorithm, C: Clock> Drop for Wait<'_, A, C> {
    fn drop(&mut self) {
        if !self.finished {
            self.shared.cancel(self.id, &self.slot);
        }
    }
}
