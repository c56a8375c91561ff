//! What a [`Limiter`](crate::Limiter) shares with its leases and waiters: the algorithm, its
//! state, the clock, the gate and the wait queue; the decisions, and the queue's driving.
//!
//! The wait queue ([`Queue`]): waiters sit in a map ordered by arrival. Whoever changes what is
//! available (a release, a refund, a quota change, the head waiter's timer) calls
//! [`Shared::drive`], which grants the head while it fits — strictly in order, so a small
//! request never passes a big one — and wakes the granted waiters after the lock is released.
//! Only the head waiter of a time-based limiter keeps a timer (until the head can be granted);
//! the others sleep without one unless they have a `max_wait` deadline.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::algorithm::{Algorithm, peek};
use crate::clock::{Clock, Sleep};
use crate::decision::{Lease, PermitPool, Reason, Rejected};
use crate::queue::{Queue, QueueOrder, Slot, Waiter};
use crate::snapshot::{Meta, Snapshot};
use crate::stats::Counts;
use crate::sync::{AtomicU64, Mutex, Ordering, fence};

/// A limiter's state, shared by the [`Limiter`](crate::Limiter), its leases (concurrency
/// permits go back here) and its waiters.
pub(crate) struct Shared<A: Algorithm, C: Clock> {
    pub(crate) algo: A,
    pub(crate) state: A::State,
    pub(crate) clock: C,
    pub(crate) order: QueueOrder,
    pub(crate) queue_limit: u64,
    pub(crate) max_wait: Option<u64>,
    pub(crate) gate: Gate,
    pub(crate) counts: Counts,
    pub(crate) queue: Mutex<Queue>,
}

/// Permits waiting in the queue and whether the limiter is closed, in one word: a decision reads
/// one atomic to know it has nobody to wait behind. Written only under the queue's lock.
#[derive(Debug, Default)]
pub(crate) struct Gate(AtomicU64);

impl Gate {
    const CLOSED: u64 = 1 << 63;

    /// Open, with nobody queued: a request may decide at once.
    #[inline]
    pub(crate) fn is_clear(&self) -> bool {
        self.0.load(Ordering::Acquire) == 0
    }

    /// Permits waiting in the queue.
    pub(crate) fn queued(&self) -> u64 {
        self.0.load(Ordering::Acquire) & !Gate::CLOSED
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.0.load(Ordering::Acquire) & Gate::CLOSED != 0
    }

    /// Sets the queued permits; the caller holds the queue's lock.
    pub(crate) fn set_queued(&self, permits: u64) {
        let closed = self.0.load(Ordering::Relaxed) & Gate::CLOSED;
        self.0.store(permits.min(!Gate::CLOSED) | closed, Ordering::Release);
    }

    /// Closes, with nobody queued; the caller holds the queue's lock.
    pub(crate) fn close(&self) {
        self.0.store(Gate::CLOSED, Ordering::Release);
    }
}

impl<A: Algorithm, C: Clock> Shared<A, C> {
    /// The clock's time, or 0 for algorithms that never read it (saves a clock read per call).
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        if self.algo.reads_clock() { self.clock.now() } else { 0 }
    }

    fn closed_rejection(&self, n: u64) -> Rejected {
        self.final_rejection(self.clock.now(), n, Reason::Closed)
    }

    fn over_capacity(&self, now: u64, n: u64) -> Rejected {
        self.final_rejection(now, n, Reason::ExceedsCapacity)
    }

    /// A rejection waiting cannot cure: the state as a probe reports it, no retry time.
    fn final_rejection(&self, now: u64, n: u64, reason: Reason) -> Rejected {
        Rejected::of(peek(&self.algo, &self.state, now, 0).with_retry(None), n, reason)
    }

    #[inline]
    pub(crate) fn reject(&self, meta: impl Into<Snapshot>, n: u64, reason: Reason) -> Rejected {
        self.counts.rejected();
        Rejected::of(meta.into(), n, reason)
    }

    #[inline]
    pub(crate) fn lease(self: &Arc<Self>, meta: Snapshot, n: u64, now: u64) -> Lease {
        if n == 0 {
            return Lease::of(meta, n, now);
        }
        self.counts.admitted();
        self.lease_held(meta, n, now)
    }

    /// A lease for `n` permits already taken (and counted) at `now`.
    #[inline]
    pub(crate) fn lease_held(self: &Arc<Self>, meta: Snapshot, n: u64, now: u64) -> Lease {
        let pool = self.algo.releases_on_drop().then(|| self.clone() as Arc<dyn PermitPool>);
        Lease::held_by(meta, n, now, pool)
    }

    #[inline]
    pub(crate) fn try_acquire(self: &Arc<Self>, n: u64) -> Result<Lease, Rejected> {
        self.try_take(n, |meta, now| self.lease(meta, n, now))
    }

    /// Takes `n` permits now or rejects; `hold` makes what holds them (a lease, a permit) from
    /// the decision's snapshot and time, in place (no intermediate copy of the snapshot).
    #[inline(always)]
    pub(crate) fn try_take<R>(&self, n: u64, hold: impl FnOnce(Snapshot, u64) -> R) -> Result<R, Rejected> {
        // One load tells the common case: open, nobody queued.
        let gate = self.gate.0.load(Ordering::Acquire);
        if gate != 0
            && let Err(rejected) = self.may_take_gated(n, gate)
        {
            return Err(rejected);
        }
        let now = self.now();
        match self.algo.decide(&self.state, now, n, true) {
            Ok(meta) => Ok(hold(meta, now)),
            // "Never" (more than the capacity, which is the decision's `limit`) or "not now"; the
            // snapshot goes straight into the rejection (a copy through memory stalls the load).
            Err(meta) if n > meta.limit() => Err(self.rejected_over_capacity(n, now)),
            Err(meta) => Err(self.reject(meta, n, Reason::Exhausted)),
        }
    }

    /// Counted: more than the capacity was asked for.
    #[cold]
    #[inline(never)]
    pub(crate) fn rejected_over_capacity(&self, n: u64, now: u64) -> Rejected {
        self.counts.rejected();
        self.over_capacity(now, n)
    }

    /// The limiter is closed or someone is queued: may a request decide now, or is it rejected
    /// (closed, or it would overtake FIFO waiters)?
    #[cold]
    fn may_take_gated(&self, n: u64, gate: u64) -> Result<(), Rejected> {
        if gate & Gate::CLOSED != 0 {
            return Err(self.reject_closed(n));
        }
        let queued = gate;
        if n > 0 && self.order == QueueOrder::Fifo {
            let now = self.now();
            if n > self.algo.capacity() {
                return Err(self.rejected_over_capacity(n, now));
            }
            // Strict FIFO: taking permits now would overtake the waiters.
            let meta = peek(&self.algo, &self.state, now, n).meta();
            let retry = self.algo.wait_estimate(&self.state, now, queued + n);
            return Err(self.reject(Meta { remaining: 0, retry_ns: retry, ..meta }, n, Reason::Exhausted));
        }
        Ok(())
    }

    /// Counted: the limiter is closed.
    pub(crate) fn reject_closed(&self, n: u64) -> Rejected {
        self.counts.rejected();
        self.closed_rejection(n)
    }

    pub(crate) fn check(&self, n: u64) -> Result<Meta, Rejected> {
        let now = self.clock.now();
        if self.gate.is_closed() {
            return Err(self.closed_rejection(n));
        }
        if n > self.algo.capacity() {
            return Err(self.over_capacity(now, n));
        }
        self.algo
            .decide(&self.state, now, n, false)
            .map(|m| m.meta())
            .map_err(|m| Rejected::of(m, n, Reason::Exhausted))
    }

    pub(crate) fn give_back(self: &Arc<Self>, lease: Lease) {
        if lease.permits() == 0 {
            return;
        }
        self.counts.given_back();
        if self.algo.releases_on_drop() {
            drop(lease); // its drop releases through `PermitPool`
        } else {
            self.algo.give_back(&self.state, self.clock.now(), lease.permits(), lease.acquired_at);
            self.drive(None);
        }
    }

    /// [`crate::Limiter::settle`]: `Err` with the algorithm's reason when it cannot carry a debt
    /// (nothing is changed then, whatever `actual`).
    pub(crate) fn settle(self: &Arc<Self>, lease: &Lease, actual: u64) -> Result<(), &'static str> {
        let now = self.now();
        let estimate = lease.permits();
        if actual > estimate {
            // Takes nothing when the algorithm cannot carry a debt.
            return self.algo.charge(&self.state, now, actual - estimate);
        }
        // A charge of nothing asks the algorithm whether it can settle at all.
        self.algo.charge(&self.state, now, 0)?;
        if actual < estimate {
            self.algo.give_back(&self.state, now, estimate - actual, lease.acquired_at);
            self.drive(None);
        }
        Ok(())
    }

    /// Gives back `n` held permits (a concurrency lease or permit) and serves waiters that fit.
    #[inline]
    pub(crate) fn release_permits(self: &Arc<Self>, n: u64) {
        // The give-back is a SeqCst read-modify-write (the contract of `releases_on_drop`) and
        // this load is SeqCst: with the fence in `drive_for`, either we see the waiter that just
        // queued, or it sees our permits. No fence here: on x86 both cost nothing extra. Loom
        // models SeqCst accesses as acquire/release only (a SeqCst fence it models exactly), so
        // under loom a fence stands between the two, as in `biased_lock`.
        self.algo.give_back(&self.state, self.now(), n, 0);
        #[cfg(tollgate_loom)]
        fence(Ordering::SeqCst);
        if self.gate.0.load(Ordering::SeqCst) & !Gate::CLOSED > 0 {
            self.drive(None);
        }
    }
}

impl<A: Algorithm, C: Clock> PermitPool for Shared<A, C> {
    fn release(self: Arc<Self>, n: u64) {
        self.release_permits(n);
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
        fence(Ordering::SeqCst);
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
