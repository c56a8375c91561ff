//! [`Limiter`]: one algorithm, one state, a clock, and a wait queue for `acquire(n).await`; a
//! thin public type over the shared state (`shared`) that decides and drives the queue.

use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::{Algorithm, algorithm_name, peek};
use crate::clock::{Clock, SystemClock, nanos};
use crate::concurrency::Concurrency;
use crate::decision::{Lease, Rejected};
use crate::interval_bucket::IntervalBucket;
use crate::queue::{Queue, QueueOrder};
use crate::quota::Quota;
use crate::reservation::SettleError;
use crate::shared::{Gate, Shared};
use crate::snapshot::Meta;
use crate::stats::{Counts, Statistics};
use crate::sync::Mutex;

/// A rate or concurrency limiter: an [`Algorithm`] with its state, a [`Clock`] and a wait queue.
///
/// Dropping the limiter (or calling [`Limiter::close`]) completes every waiter with
/// [`Reason::Closed`](crate::Reason::Closed). Share it between tasks with an `Arc`.
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

    /// Rejects a waiter ([`Reason::MaxWait`](crate::Reason::MaxWait)) whose wait would exceed
    /// `max_wait`: at once, taking nothing, when the algorithm can tell the wait in advance (the
    /// time-based ones); otherwise (concurrency) when `max_wait` has elapsed.
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

    /// Settles a reservation's `lease` (granted by this limiter) for `actual` permits: gives back
    /// what it exceeded, or takes the rest past the limit as a debt ([`crate::Reservation`]).
    /// Usually called through [`crate::Reservation::settle`].
    pub fn settle(&self, lease: &Lease, actual: u64) -> Result<(), SettleError> {
        self.shared
            .settle(lease, actual)
            .map_err(|why| SettleError::Unsupported { limiter: algorithm_name::<A>(), why })
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

    /// Completes every waiter with [`Reason::Closed`](crate::Reason::Closed); later requests are
    /// rejected the same way.
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
