//! The runner: the same arrivals through each algorithm, each in its own [`tollgate::Limiter`] on
//! its own [`ManualClock`], so a simulated hour takes milliseconds and every run is repeatable.
//!
//! In [`Mode::Try`] each request calls `try_acquire(1)` at its arrival time and is admitted or
//! dropped. In [`Mode::Acquire`] each request calls `acquire(1)` and waits in the limiter's FIFO
//! queue; the futures are polled by hand (no async runtime): the runner moves the clock to the
//! next arrival or to the moment the head of the queue fits (the limiter's own `retry_after`),
//! polls the head and whoever the limiter woke, and records each grant with the time the limiter
//! stamped on its lease.

use std::collections::BTreeMap;
use std::future::Future;
use std::mem::size_of;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tollgate::{
    Algorithm, Clock, FixedWindow, IntervalBucket, Lease, Limiter, ManualClock, Quota, Rejected, SlidingLog,
    SlidingWindow, TokenBucket, WeightedWindow,
};

use crate::algorithm::AlgorithmKind;
use crate::error::SimError;
use crate::units::nanos;
use crate::window::{Worst, worst_window};

/// How requests meet the limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// `try_acquire(1)` on arrival: admitted at once or rejected (and dropped).
    #[default]
    Try,
    /// `acquire(1)` on arrival: the request waits in the limiter's FIFO queue until it is granted.
    Acquire {
        /// Rejects a request at once ([`tollgate::Reason::MaxWait`]) when its wait would be
        /// longer; `None` waits as long as it takes.
        max_wait: Option<Duration>,
    },
}

/// How long requests waited, by [`Mode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waits {
    /// [`Mode::Try`]: the longest `retry_after` a rejected request was told (`None`: nothing was
    /// rejected). Nobody waits in this mode; this is how long a client would have been asked to.
    RetryAfter(Option<Duration>),
    /// [`Mode::Acquire`]: the longest time from arrival to grant.
    Queued {
        /// The longest wait.
        longest: Duration,
        /// True when the longest waiter was still queued when the simulation ended, so the
        /// wait is a lower bound.
        at_least: bool,
    },
}

/// Memory one key of an algorithm costs: its state, plus what that state points to on the heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memory {
    /// `size_of::<A::State>()`.
    pub state_bytes: u64,
    /// Heap bytes per key: a sliding window's segment counters (8 bytes each); a sliding log's
    /// entries (16 bytes per distinct admission instant, at the peak of this run, not counting the
    /// spare capacity of its `VecDeque`); zero for the others.
    pub heap_bytes: u64,
    /// For a sliding log, its most entries during the run.
    pub log_entries: Option<u64>,
}

/// What one algorithm made of the traffic.
#[derive(Clone, Debug, PartialEq)]
pub struct AlgorithmRun {
    /// The algorithm.
    pub algorithm: AlgorithmKind,
    /// Admission (grant) times in nanoseconds, ascending.
    pub admitted: Vec<u64>,
    /// Requests rejected.
    pub rejected: u64,
    /// Requests still waiting in the queue at the end ([`Mode::Acquire`] only).
    pub queued_at_end: u64,
    /// The most admissions in any window of the quota's period.
    pub worst: Worst,
    /// Waits or retry-afters.
    pub waits: Waits,
    /// Memory per key.
    pub memory: Memory,
}

/// Runs `arrivals` (sorted, all before `end`) through `kind` under `quota`.
pub(crate) fn run(
    kind: AlgorithmKind,
    quota: Quota,
    segments: u64,
    mode: Mode,
    arrivals: &[u64],
    end: u64,
) -> Result<AlgorithmRun, SimError> {
    let ctx = Ctx { kind, period: nanos(quota.period()), mode, arrivals, end };
    Ok(match kind {
        AlgorithmKind::TokenBucket => ctx.drive(TokenBucket::new(quota), 0),
        AlgorithmKind::IntervalBucket => ctx.drive(IntervalBucket::new(quota), 0),
        AlgorithmKind::FixedWindow => ctx.drive(FixedWindow::new(quota), 0),
        AlgorithmKind::SlidingWindow => {
            let window = SlidingWindow::new(quota, segments)
                .map_err(|e| SimError::invalid("--segments", &segments.to_string(), e.to_string()))?;
            ctx.drive(window, size_of::<u64>() as u64 * segments)
        }
        AlgorithmKind::WeightedWindow => ctx.drive(WeightedWindow::new(quota), 0),
        AlgorithmKind::SlidingLog => ctx.drive(SlidingLog::new(quota), 0),
    })
}

struct Ctx<'a> {
    kind: AlgorithmKind,
    period: u64,
    mode: Mode,
    arrivals: &'a [u64],
    end: u64,
}

/// Outcomes as they come in.
#[derive(Default)]
struct Tally {
    admitted: Vec<u64>,
    rejected: u64,
    longest_retry: Option<u64>,
    longest_wait: u64,
}

impl Tally {
    fn record(&mut self, arrival: u64, outcome: Result<Lease, Rejected>) {
        match outcome {
            Ok(lease) => {
                self.admitted.push(lease.granted_at());
                self.longest_wait = self.longest_wait.max(lease.granted_at().saturating_sub(arrival));
            }
            Err(no) => {
                self.rejected += 1;
                if let Some(retry) = no.retry_after() {
                    self.longest_retry = Some(self.longest_retry.unwrap_or(0).max(nanos(retry)));
                }
            }
        }
    }
}

impl Ctx<'_> {
    fn drive<A: Algorithm>(&self, algo: A, heap_bytes: u64) -> AlgorithmRun {
        let clock = ManualClock::new();
        let mut builder = Limiter::builder(algo).clock(clock.clone());
        if let Mode::Acquire { max_wait: Some(max) } = self.mode {
            builder = builder.max_wait(max);
        }
        let limiter = builder.build();
        let mut tally = Tally::default();
        let (waits, queued_at_end) = match self.mode {
            Mode::Try => {
                for &t in self.arrivals {
                    if t > clock.now() {
                        clock.set(t);
                    }
                    tally.record(t, limiter.try_acquire(1));
                }
                (Waits::RetryAfter(tally.longest_retry.map(Duration::from_nanos)), 0)
            }
            Mode::Acquire { .. } => {
                let (oldest_waiting, queued) = self.queue_all(&limiter, &clock, &mut tally);
                let still = oldest_waiting.map_or(0, |arrival| self.end.saturating_sub(arrival));
                let longest = Duration::from_nanos(tally.longest_wait.max(still));
                (Waits::Queued { longest, at_least: still > tally.longest_wait }, queued)
            }
        };
        let mut admitted = tally.admitted;
        admitted.sort_unstable();
        let worst = worst_window(&admitted, self.period);
        let (heap_bytes, log_entries) = if self.kind == AlgorithmKind::SlidingLog {
            // The log keeps one entry per distinct admission instant inside the window.
            let mut instants = admitted.clone();
            instants.dedup();
            let entries = worst_window(&instants, self.period).count;
            (entries * size_of::<(u64, u64)>() as u64, Some(entries))
        } else {
            (heap_bytes, None)
        };
        AlgorithmRun {
            algorithm: self.kind,
            admitted,
            rejected: tally.rejected,
            queued_at_end,
            worst,
            waits,
            memory: Memory { state_bytes: size_of::<A::State>() as u64, heap_bytes, log_entries },
        }
    }

    /// [`Mode::Acquire`]: every request waits in the FIFO queue. Returns the arrival time of the
    /// oldest request still waiting at the end, and how many are.
    fn queue_all<A: Algorithm>(
        &self,
        limiter: &Limiter<A, ManualClock>,
        clock: &ManualClock,
        tally: &mut Tally,
    ) -> (Option<u64>, u64) {
        let woken = Arc::new(Woken::default());
        let mut queue = Queue { waiting: BTreeMap::new(), woken: woken.clone() };
        let mut next = 0;
        loop {
            let now = clock.now();
            while let Some(&arrival) = self.arrivals.get(next).filter(|&&t| t <= now) {
                let waker = Waker::from(Arc::new(RequestWaker { id: next, woken: woken.clone() }));
                queue.waiting.insert(next, Waiting { arrival, waker, future: Box::pin(limiter.acquire(1)) });
                queue.poll(next, tally);
                next += 1;
            }
            // Let the queue move: its head may fit now; whoever the limiter granted was woken.
            if let Some(&head) = queue.waiting.keys().next() {
                queue.poll(head, tally);
            }
            queue.poll_woken(tally);
            // The next event: an arrival, or the moment the head of the queue fits.
            let head_fits = if queue.waiting.is_empty() {
                None
            } else {
                match limiter.check(1) {
                    Ok(_) => Some(now + 1),
                    Err(no) => no.retry_after().map(|d| now.saturating_add(nanos(d).max(1))),
                }
            };
            let Some(at) = [self.arrivals.get(next).copied(), head_fits].into_iter().flatten().min() else { break };
            if at >= self.end {
                break;
            }
            clock.set(at);
            // Timers due by now woke their waiters.
            queue.poll_woken(tally);
        }
        let oldest = queue.waiting.values().next().map(|w| w.arrival);
        (oldest, queue.waiting.len() as u64)
    }
}

/// Ids of requests whose futures asked to be polled again.
#[derive(Default)]
struct Woken(Mutex<Vec<usize>>);

struct RequestWaker {
    id: usize,
    woken: Arc<Woken>,
}

impl Wake for RequestWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.0.lock().unwrap_or_else(|e| e.into_inner()).push(self.id);
    }
}

type AcquireFuture<'a> = Pin<Box<dyn Future<Output = Result<Lease, Rejected>> + 'a>>;

struct Waiting<'a> {
    arrival: u64,
    waker: Waker,
    future: AcquireFuture<'a>,
}

/// Requests waiting for their `acquire(1)`, by arrival order.
struct Queue<'a> {
    waiting: BTreeMap<usize, Waiting<'a>>,
    woken: Arc<Woken>,
}

impl Queue<'_> {
    fn poll(&mut self, id: usize, tally: &mut Tally) {
        let Some(w) = self.waiting.get_mut(&id) else { return };
        let mut cx = Context::from_waker(&w.waker);
        if let Poll::Ready(outcome) = w.future.as_mut().poll(&mut cx) {
            let arrival = w.arrival;
            self.waiting.remove(&id);
            tally.record(arrival, outcome);
        }
    }

    /// Polls woken requests, oldest first, until nobody is woken any more.
    fn poll_woken(&mut self, tally: &mut Tally) {
        loop {
            let mut ids = std::mem::take(&mut *self.woken.0.lock().unwrap_or_else(|e| e.into_inner()));
            if ids.is_empty() {
                return;
            }
            ids.sort_unstable();
            ids.dedup();
            for id in ids {
                self.poll(id, tally);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(limit: u64) -> Quota {
        Quota::per_second(limit).unwrap()
    }

    #[test]
    fn try_mode_admits_and_rejects_with_retry_after() {
        // 4 at once against 2 per second: 2 admitted, 2 rejected, told to come back in 1 s.
        let r = run(AlgorithmKind::FixedWindow, quota(2), 10, Mode::Try, &[0, 0, 0, 0], 1_000_000_000).unwrap();
        assert_eq!((r.admitted.as_slice(), r.rejected), ([0, 0].as_slice(), 2));
        assert_eq!(r.waits, Waits::RetryAfter(Some(Duration::from_secs(1))));
        assert_eq!(r.worst, Worst { count: 2, start_ns: 0 });
    }

    #[test]
    fn acquire_mode_queues_fifo_and_grants_when_permits_come() {
        // Token bucket, 10/s, burst 10: 15 requests at once; 10 at once, then one every 100 ms.
        let arrivals = [0; 15];
        let r =
            run(AlgorithmKind::TokenBucket, quota(10), 10, Mode::Acquire { max_wait: None }, &arrivals, 2_000_000_000)
                .unwrap();
        assert_eq!(r.rejected, 0);
        assert_eq!(r.queued_at_end, 0);
        let expected: Vec<u64> = (0..15).map(|i| if i < 10 { 0 } else { (i - 9) * 100_000_000 }).collect();
        assert_eq!(r.admitted, expected);
        assert_eq!(r.waits, Waits::Queued { longest: Duration::from_millis(500), at_least: false });
    }

    #[test]
    fn acquire_mode_reports_who_is_still_waiting() {
        // Sliding log, 2/s: 5 at once over 1.5 s; 2 at 0, 2 at 1 s, one still waiting at the end.
        let r = run(AlgorithmKind::SlidingLog, quota(2), 10, Mode::Acquire { max_wait: None }, &[0; 5], 1_500_000_000)
            .unwrap();
        assert_eq!(r.admitted, [0, 0, 1_000_000_000, 1_000_000_000]);
        assert_eq!(r.queued_at_end, 1);
        assert_eq!(r.waits, Waits::Queued { longest: Duration::from_millis(1500), at_least: true });
        assert_eq!(r.memory.log_entries, Some(1));
    }

    #[test]
    fn acquire_mode_with_max_wait_rejects_long_waits() {
        let mode = Mode::Acquire { max_wait: Some(Duration::from_millis(250)) };
        let r = run(AlgorithmKind::TokenBucket, quota(10), 10, mode, &[0; 15], 2_000_000_000).unwrap();
        // 10 at once, 2 more within 250 ms (100 and 200 ms), the other 3 would wait longer.
        assert_eq!(r.admitted.len(), 12);
        assert_eq!(r.rejected, 3);
    }

    #[test]
    fn memory_per_key() {
        let r = run(AlgorithmKind::SlidingWindow, quota(2), 10, Mode::Try, &[0], 1).unwrap();
        assert_eq!(r.memory.heap_bytes, 80);
        assert!(r.memory.state_bytes > 0);
        let r = run(AlgorithmKind::TokenBucket, quota(2), 10, Mode::Try, &[0], 1).unwrap();
        assert_eq!(r.memory, Memory { state_bytes: 8, heap_bytes: 0, log_entries: None });
        let e = run(AlgorithmKind::SlidingWindow, quota(2), 0, Mode::Try, &[0], 1).unwrap_err();
        assert!(e.to_string().contains("--segments \"0\""), "{e}");
    }
}
