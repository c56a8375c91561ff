//! A queue that cannot be reached for a while (Redis restarting or failing over) does not end the
//! pump: it tries again, pausing longer each time, and gives up only when the outage outlasts
//! `PumpOptions::outage` or the error will not pass by itself. On tokio's paused clock, so the
//! pauses take no real time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tollgate_pace::{Budget, Handled, Item, PaceError, Pacer, Progress, PumpOptions, Queue, pump};
use tollgate_redis::BackendError;

/// A queue in memory whose calls number `down` (counting every `take` and `outstanding`, from 1)
/// fail with `error`.
struct Flaky {
    queued: Mutex<Vec<Item>>,
    outstanding: AtomicU64,
    calls: AtomicU64,
    down: std::ops::RangeInclusive<u64>,
    error: fn() -> PaceError,
}

impl Flaky {
    fn new(items: u64, down: std::ops::RangeInclusive<u64>, error: fn() -> PaceError) -> Flaky {
        let queued = (0..items)
            .map(|i| Item {
                id: format!("{i}-0"),
                key: format!("item-{i}"),
                payload: "{}".into(),
                cost: 1,
                attempts: 0,
            })
            .collect();
        Flaky { queued: Mutex::new(queued), outstanding: AtomicU64::new(items), calls: AtomicU64::new(0), down, error }
    }

    fn call(&self) -> Result<(), PaceError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.down.contains(&n) { Err((self.error)()) } else { Ok(()) }
    }
}

impl Queue for Flaky {
    async fn enqueue(&self, _key: &str, _payload: &str, _cost: u64) -> Result<String, PaceError> {
        unreachable!("the test fills the queue itself")
    }

    async fn take(&self, _consumer: &str, max: usize) -> Result<Vec<Item>, PaceError> {
        self.call()?;
        let mut queued = self.queued.lock().unwrap();
        let n = max.min(queued.len());
        Ok(queued.drain(..n).collect())
    }

    async fn ack(&self, _item: &Item) -> Result<(), PaceError> {
        self.outstanding.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    async fn fail(&self, _item: &Item, _error: &str) -> Result<bool, PaceError> {
        unreachable!("every item succeeds")
    }

    async fn outstanding(&self) -> Result<u64, PaceError> {
        self.call()?;
        Ok(self.outstanding.load(Ordering::SeqCst))
    }
}

fn timeout() -> PaceError {
    PaceError::Backend(BackendError::Timeout(Duration::from_millis(50)))
}

async fn run(queue: Arc<Flaky>, outage: Duration) -> (Result<(), PaceError>, Duration, Arc<Progress>) {
    let pacer = Arc::new(Pacer::builder(Budget::per_second(1_000_000).unwrap()).build().unwrap());
    let mut options = PumpOptions::new("w");
    options.batch = 4;
    options.outage = outage;
    let progress = Arc::new(Progress::default());
    let started = Instant::now();
    let result = pump(queue, pacer, options, progress.clone(), |_item| async { Handled::Done }).await;
    (result, started.elapsed(), progress)
}

#[tokio::test(start_paused = true)]
async fn an_outage_shorter_than_the_limit_is_waited_out_and_nothing_is_lost() {
    // The first take answers; the next 8 queue calls fail, then the queue is back.
    let queue = Arc::new(Flaky::new(20, 2..=9, timeout));
    let (result, elapsed, progress) = run(queue.clone(), Duration::from_secs(60)).await;
    result.unwrap();
    assert_eq!(progress.done.load(Ordering::SeqCst), 20, "every item handled");
    assert_eq!(queue.outstanding.load(Ordering::SeqCst), 0);
    // Pauses from `empty_poll` (100 ms), doubling up to 5 s: 0.1 + 0.2 + ... + 5 + 5 = 16.3 s.
    assert!(elapsed >= Duration::from_millis(16_300) && elapsed < Duration::from_secs(18), "paused {elapsed:?} in all");
}

#[tokio::test(start_paused = true)]
async fn an_outage_longer_than_the_limit_ends_the_pump_with_its_error() {
    let queue = Arc::new(Flaky::new(20, 2..=u64::MAX, timeout));
    let (result, elapsed, progress) = run(queue, Duration::from_secs(3)).await;
    let error = result.unwrap_err();
    assert!(error.is_transient() && matches!(error, PaceError::Backend(BackendError::Timeout(_))), "{error}");
    assert_eq!(progress.done.load(Ordering::SeqCst), 4, "the first batch was handled");
    assert!(elapsed >= Duration::from_secs(3) && elapsed < Duration::from_millis(3_500), "gave up after {elapsed:?}");
}

#[tokio::test(start_paused = true)]
async fn an_error_that_will_not_pass_ends_the_pump_at_once() {
    let closed = || PaceError::Closed { reason: tollgate::Reason::Closed };
    let queue = Arc::new(Flaky::new(20, 1..=1, closed));
    let (result, elapsed, _) = run(queue, Duration::from_secs(60)).await;
    let error = result.unwrap_err();
    assert!(!error.is_transient() && matches!(error, PaceError::Closed { .. }), "{error}");
    assert_eq!(elapsed, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_pump_that_gives_up_returns_once_the_items_being_handled_are_done() {
    // The first take answers 4 items; the next fails for good while their handlers still run.
    let closed = || PaceError::Closed { reason: tollgate::Reason::Closed };
    let queue = Arc::new(Flaky::new(20, 2..=2, closed));
    let pacer = Arc::new(Pacer::builder(Budget::per_second(1_000_000).unwrap()).build().unwrap());
    let mut options = PumpOptions::new("w");
    options.batch = 4;
    let progress = Arc::new(Progress::default());
    let started = Instant::now();
    let handler = |_item| async {
        tokio::time::sleep(Duration::from_secs(10)).await;
        Handled::Done
    };
    let error = pump(queue.clone(), pacer, options, progress.clone(), handler).await.unwrap_err();
    assert!(matches!(error, PaceError::Closed { .. }), "{error}");
    assert_eq!(progress.done.load(Ordering::SeqCst), 4, "the 4 items taken were handled and acknowledged");
    assert_eq!(queue.outstanding.load(Ordering::SeqCst), 16);
    assert_eq!(started.elapsed(), Duration::from_secs(10), "returned when the handlers were done");
}
