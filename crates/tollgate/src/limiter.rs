//! [`Limiter`]: one algorithm, one state, a clock, and a wait queue for `acquire(n).await`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::algorithm::{Algorithm, peek};
use crate::clock::{Clock, SystemClock, nanos};
use crate::concurrency::Concurrency;
use crate::decision::{Lease, Meta, PermitPool, Reason, Rejected};
use crate::interval_bucket::IntervalBucket;
use crate::queue::Queue;
use crate::quota::Quota;
use crate::snapshot::Snapshot;
use crate::stats::{Counts, Statistics};

/// Which waiter is served first when permits become available.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum QueueOrder {
    /// Oldest first, strictly: a request never overtakes an older one, even a smaller one, and
    /// `try_acquire` fails while anyone is queued.
    #[default]
    Fifo,
    /// Newest first; when the queue limit is hit, the oldest waiters are rejected
    /// ([`Reason::Evicted`]) to make room.
    Lifo,
}

/// A rate or concurrency limiter: an [`Algorithm`] with its state, a [`Clock`] and a wait queue.
///
/// Dropping the limiter (or calling [`Limiter::close`]) completes every waiter with
/// [`Reason::Closed`]. Share it between tasks with an `Arc`.
///
/// ```
/// use tollgate::{Limiter, Quota, TokenBucket};
/// let limiter = Limiter::new(TokenBucket::new(Quota::per_second(100)?));
/// match limiter.try_acquire(1) {
///     Ok(lease) => println!("go ({} left)", lease.remaining()),
///     Err(no) => println!("slow down, retry in {:?}", no.retry_after()),
/// }
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
pub struct Limiter<A: Algorithm, C: Clock = SystemClock> {
    pub(crate) shared: Arc<Shared<A, C>>,
}

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

/// Builds a [`Limiter`]: clock, queue order, queue limit and maximum wait.
#[must_use = "a builder does nothing until .build()"]
pub struct Builder<A: Algorithm, C: Clock> {
    algo: A,
    clock: C,
    order: QueueOrder,
    queue_limit: u64,
    max_wait: Option<u64>,
    statistics: bool,
}

impl<A: Algorithm, C: Clock> Builder<A, C> {
    /// Uses `clock` instead of the system clock (e.g. a [`crate::ManualClock`] in tests).
    pub fn clock<C2: Clock>(self, clock: C2) -> Builder<A, C2> {
        Builder {
            algo: self.algo,
            clock,
            order: self.order,
            queue_limit: self.queue_limit,
            max_wait: self.max_wait,
            statistics: self.statistics,
        }
    }

    /// Order in which waiters are served (default [`QueueOrder::Fifo`]).
    pub fn queue_order(mut self, order: QueueOrder) -> Self {
        self.order = order;
        self
    }

    /// Most permits that may wait in the queue at once (default: unbounded). `0` disables waiting:
    /// `acquire` then behaves like `try_acquire`.
    pub fn queue_limit(mut self, permits: u64) -> Self {
        self.queue_limit = permits;
        self
    }

    /// Rejects a waiter ([`Reason::MaxWait`]) whose wait would exceed `max_wait`: at once, taking
    /// nothing, when the algorithm can tell the wait in advance (the time-based ones); otherwise
    /// (concurrency) when `max_wait` has elapsed.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(nanos(max_wait));
        self
    }

    /// Counts admitted and rejected requests for [`Limiter::statistics`] (default: off, since the
    /// count is an atomic add on a cache line every decision writes, about the cost of a
    /// decision itself).
    pub fn statistics(mut self, on: bool) -> Self {
        self.statistics = on;
        self
    }

    /// The limiter.
    pub fn build(self) -> Limiter<A, C> {
        let now = self.clock.now();
        Limiter {
            shared: Arc::new(Shared {
                state: self.algo.new_state(now),
                algo: self.algo,
                clock: self.clock,
                order: self.order,
                queue_limit: self.queue_limit,
                max_wait: self.max_wait,
                gate: Gate::default(),
                counts: Counts::new(self.statistics),
                queue: Mutex::new(Queue::default()),
            }),
        }
    }
}

impl<A: Algorithm> Limiter<A, SystemClock> {
    /// A limiter on the system clock with a FIFO, unbounded wait queue.
    pub fn new(algo: A) -> Self {
        Self::builder(algo).build()
    }

    /// Starts building a limiter.
    pub fn builder(algo: A) -> Builder<A, SystemClock> {
        Builder {
            algo,
            clock: SystemClock::new(),
            order: QueueOrder::Fifo,
            queue_limit: u64::MAX,
            max_wait: None,
            statistics: false,
        }
    }
}

impl<A: Algorithm, C: Clock> Limiter<A, C> {
    /// Takes `n` permits now or rejects; never waits. `n == 0` reports the state and takes nothing.
    #[inline]
    pub fn try_acquire(&self, n: u64) -> Result<Lease, Rejected> {
        self.shared.try_acquire(n)
    }

    /// Waits in the queue for `n` permits. Dropping the future leaves the queue and gives back
    /// anything already granted to it. `n == 0` returns a probe at once.
    ///
    /// With the system clock this needs a tokio runtime with time enabled.
    pub async fn acquire(&self, n: u64) -> Result<Lease, Rejected> {
        self.shared.acquire(n).await
    }

    /// Would `n` permits be granted now? Takes nothing.
    pub fn check(&self, n: u64) -> Result<Meta, Rejected> {
        self.shared.check(n)
    }

    /// Gives a lease's permits back as if they had never been taken (rate limits refund what still
    /// counts; concurrency permits are released).
    pub fn give_back(&self, lease: Lease) {
        self.shared.give_back(lease)
    }

    /// Cheap counters: available permits, queued permits, and (when built with
    /// [`Builder::statistics`]) admitted and rejected requests.
    pub fn statistics(&self) -> Statistics {
        let s = &self.shared;
        let available = peek(&s.algo, &s.state, s.clock.now(), 0).meta().remaining;
        let (admitted, rejected) = s.counts.read();
        Statistics { available, queued: s.gate.queued(), admitted, rejected }
    }

    /// Most permits one request can be granted.
    pub fn capacity(&self) -> u64 {
        self.shared.algo.capacity()
    }

    /// Replaces the configuration; the state keeps its meaning by the algorithm's documented rule,
    /// and waiters that now fit are served.
    pub fn set_config(&self, config: A::Config) {
        let s = &self.shared;
        let old = s.algo.set_config(config);
        s.algo.carry_over(&s.state, s.clock.now(), old);
        s.drive(None);
    }

    /// The period the quota is counted over; `None` for concurrency limits.
    pub fn window(&self) -> Option<Duration> {
        self.shared.algo.window()
    }

    /// The algorithm's configuration.
    pub fn config(&self) -> A::Config {
        self.shared.algo.config()
    }

    /// Completes every waiter with [`Reason::Closed`]; later requests are rejected the same way.
    pub fn close(&self) {
        self.shared.close()
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.shared.clock
    }
}

impl<A: Algorithm<Config = Quota>, C: Clock> Limiter<A, C> {
    /// Changes the quota at run time (see each algorithm for how its state carries over).
    pub fn set_quota(&self, quota: Quota) {
        self.set_config(quota)
    }
}

impl<C: Clock> Limiter<IntervalBucket, C> {
    /// Adds one period's tokens now (for [`IntervalBucket::manual`]; also works in auto mode).
    pub fn replenish(&self) {
        let s = &self.shared;
        s.algo.replenish(&s.state, s.clock.now());
        s.drive(None);
    }
}

impl<C: Clock> Limiter<Concurrency, C> {
    /// Permits currently held by leases.
    pub fn held(&self) -> u64 {
        self.shared.state.held()
    }
}

impl<A: Algorithm, C: Clock> Drop for Limiter<A, C> {
    fn drop(&mut self) {
        self.shared.close();
    }
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
    fn try_acquire(self: &Arc<Self>, n: u64) -> Result<Lease, Rejected> {
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

    fn check(&self, n: u64) -> Result<Meta, Rejected> {
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

    /// Gives back `n` held permits (a concurrency lease or permit) and serves waiters that fit.
    #[inline]
    pub(crate) fn release_permits(self: &Arc<Self>, n: u64) {
        // The give-back is a SeqCst read-modify-write (the contract of `releases_on_drop`) and
        // this load is SeqCst: with the fence in `drive_for`, either we see the waiter that just
        // queued, or it sees our permits. No fence here: on x86 both cost nothing extra.
        self.algo.give_back(&self.state, self.now(), n, 0);
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

impl<A: Algorithm, C: Clock> std::fmt::Debug for Limiter<A, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &*self.shared;
        f.debug_struct("Limiter")
            .field("config", &s.algo.config())
            .field("order", &s.order)
            .field("queued", &s.gate.queued())
            .field("closed", &s.gate.is_closed())
            .finish_non_exhaustive()
    }
}

impl<A: Algorithm, C: Clock> std::fmt::Debug for Builder<A, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("config", &self.algo.config())
            .field("order", &self.order)
            .field("queue_limit", &self.queue_limit)
            .field("max_wait_ns", &self.max_wait)
            .finish_non_exhaustive()
    }
}
