//! A queue that cannot be reached for a while (Redis restarting or failing over) does not end the
//! pump: every queue call (taking, acknowledging, failing) tries again, pausing longer each time,
//! and the pump gives up only when the outage outlasts `PumpOptions::outage` or the error will
//! not pass by itself. The pump's pauses are on its pacer's clock, a `ManualClock` here, which
//! moves only while every task waits (see `drive`): the pauses take no real time.

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate::{Clock, ManualClock};
use tollgate_pace::{Budget, Handled, Item, Jitter, PaceError, Pacer, Progress, PumpOptions, Queue, pump};
use tollgate_redis::BackendError;

/// A queue in memory whose calls number `down` (counting every `take` and `outstanding`, from 1)
/// fail with `error`, and whose acknowledgements and failures number `ack_down` (counting both,
/// from 1) fail with `ack_error`.
struct Flaky {
    queued: Mutex<Vec<Item>>,
    outstanding: AtomicU64,
    calls: AtomicU64,
    down: RangeInclusive<u64>,
    error: fn() -> PaceError,
    acks: AtomicU64,
    ack_down: RangeInclusive<u64>,
    ack_error: fn() -> PaceError,
    /// Items recorded as failed, and of those dead-lettered.
    failed: AtomicU64,
    dead: AtomicU64,
}

impl Flaky {
    fn new(items: u64, down: RangeInclusive<u64>, error: fn() -> PaceError) -> Flaky {
        let queued = (0..items)
            .map(|i| Item {
                id: format!("{i}-0"),
                key: format!("item-{i}"),
                payload: "{}".into(),
                cost: 1,
                attempts: 0,
            })
            .collect();
        Flaky {
            queued: Mutex::new(queued),
            outstanding: AtomicU64::new(items),
            calls: AtomicU64::new(0),
            down,
            error,
            acks: AtomicU64::new(0),
            ack_down: NEVER,
            ack_error: timeout,
            failed: AtomicU64::new(0),
            dead: AtomicU64::new(0),
        }
    }

    /// Acknowledgements and failures number `down` fail with `error`.
    fn acks_failing(mut self, down: RangeInclusive<u64>, error: fn() -> PaceError) -> Flaky {
        (self.ack_down, self.ack_error) = (down, error);
        self
    }

    fn call(&self) -> Result<(), PaceError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.down.contains(&n) { Err((self.error)()) } else { Ok(()) }
    }

    fn ack_call(&self) -> Result<(), PaceError> {
        let n = self.acks.fetch_add(1, Ordering::SeqCst) + 1;
        if self.ack_down.contains(&n) { Err((self.ack_error)()) } else { Ok(()) }
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
        self.ack_call()?;
        self.outstanding.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    /// Every failure is the item's last: dead-lettered.
    async fn fail(&self, _item: &Item, _error: &str) -> Result<bool, PaceError> {
        self.ack_call()?;
        self.failed.fetch_add(1, Ordering::SeqCst);
        self.dead.fetch_add(1, Ordering::SeqCst);
        self.outstanding.fetch_sub(1, Ordering::SeqCst);
        Ok(true)
    }

    async fn outstanding(&self) -> Result<u64, PaceError> {
        self.call()?;
        Ok(self.outstanding.load(Ordering::SeqCst))
    }
}

fn timeout() -> PaceError {
    PaceError::Backend(BackendError::Timeout(Duration::from_millis(50)))
}

/// No call: calls are numbered from 1.
const NEVER: RangeInclusive<u64> = 0..=0;

/// An error that will not pass by itself.
fn closed() -> PaceError {
    PaceError::Closed { reason: tollgate::Reason::Closed }
}

/// Moves `clock` with tokio's paused clock, a millisecond at a time: tokio ends the driver's
/// sleep only when every other task waits, so the manual clock moves exactly while the pump
/// waits for it, and the pauses it counts are the pump's own.
fn drive(clock: &ManualClock) -> tokio::task::JoinHandle<()> {
    let clock = clock.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(1)).await;
            clock.advance(Duration::from_millis(1));
        }
    })
}

fn options(outage: Duration) -> PumpOptions {
    let mut options = PumpOptions::new("w");
    options.batch = 4;
    options.outage = outage;
    // Whole pauses: the schedule below is exact.
    options.jitter = Jitter::none();
    options
}

/// Runs a pump over `queue` whose handler runs `handler`; returns its result, the time it took
/// on the pacer's clock, and its progress. A pump still running after ten (virtual) minutes has hung:
/// the test fails rather than waits.
async fn run_with<F>(
    queue: Arc<Flaky>,
    options: PumpOptions,
    handler: impl Fn(Item) -> F + Send + Sync + 'static,
) -> (Result<(), PaceError>, Duration, Arc<Progress>)
where
    F: std::future::Future<Output = Handled> + Send + 'static,
{
    let clock = ManualClock::new();
    let driver = drive(&clock);
    let pacer = Arc::new(Pacer::builder(Budget::per_second(1_000_000).unwrap()).clock(clock.clone()).build().unwrap());
    let progress = Arc::new(Progress::default());
    let pumped = pump(queue, pacer, options, progress.clone(), handler);
    let result = tokio::time::timeout(Duration::from_secs(600), pumped).await.expect("the pump hung");
    driver.abort();
    (result, Duration::from_nanos(clock.now()), progress)
}

async fn run(queue: Arc<Flaky>, outage: Duration) -> (Result<(), PaceError>, Duration, Arc<Progress>) {
    run_with(queue, options(outage), |_item| async { Handled::Done }).await
}

#[tokio::test(start_paused = true)]
async fn an_outage_shorter_than_the_limit_is_waited_out_and_nothing_is_lost() {
    // The first take answers; the next 8 queue calls fail, then the queue is back.
    let queue = Arc::new(Flaky::new(20, 2..=9, timeout));
    let (result, elapsed, progress) = run(queue.clone(), Duration::from_secs(60)).await;
    result.unwrap();
    assert_eq!(progress.done.load(Ordering::SeqCst), 20, "every item handled");
    assert_eq!(queue.outstanding.load(Ordering::SeqCst), 0);
    assert_eq!(progress.queue_retries.load(Ordering::SeqCst), 8, "each failed call tried again");
    // Pauses from `empty_poll` (100 ms), doubling up to 5 s: 0.1 + 0.2 + ... + 5 + 5 = 16.3 s.
    assert!(elapsed >= Duration::from_millis(16_300) && elapsed < Duration::from_secs(18), "paused {elapsed:?} in all");
}

/// The pauses are drawn from the options' jitter source: at its lowest draw, each is half the
/// back-off's.
#[tokio::test(start_paused = true)]
async fn each_pause_is_spread_by_the_jitter_source() {
    let queue = Arc::new(Flaky::new(20, 2..=9, timeout));
    let draws = Arc::new(AtomicU64::new(0));
    let mut options = options(Duration::from_secs(60));
    let counted = draws.clone();
    options.jitter = Jitter::from_fn(move || {
        counted.fetch_add(1, Ordering::SeqCst);
        0.0
    });
    let (result, elapsed, progress) = run_with(queue, options, |_item| async { Handled::Done }).await;
    result.unwrap();
    assert_eq!(progress.done.load(Ordering::SeqCst), 20);
    assert_eq!(draws.load(Ordering::SeqCst), 8, "one draw per pause");
    // Half of 16.3 s.
    assert!(elapsed >= Duration::from_millis(8_150) && elapsed < Duration::from_secs(9), "paused {elapsed:?} in all");
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
    let queue = Arc::new(Flaky::new(20, 1..=1, closed));
    let (result, elapsed, progress) = run(queue, Duration::from_secs(60)).await;
    let error = result.unwrap_err();
    assert!(!error.is_transient() && matches!(error, PaceError::Closed { .. }), "{error}");
    assert_eq!(elapsed, Duration::ZERO);
    assert_eq!(progress.queue_retries.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_pump_that_gives_up_returns_once_the_items_being_handled_are_done() {
    // The first take answers 4 items; the next fails for good while their handlers still run.
    let queue = Arc::new(Flaky::new(20, 2..=2, closed));
    let clock = ManualClock::new();
    let driver = drive(&clock);
    let pacer = Arc::new(Pacer::builder(Budget::per_second(1_000_000).unwrap()).clock(clock.clone()).build().unwrap());
    let progress = Arc::new(Progress::default());
    let handler_clock = clock.clone();
    let handler = move |_item| {
        let sleep = handler_clock.sleep_until(handler_clock.now() + 10_000_000_000);
        async move {
            sleep.await;
            Handled::Done
        }
    };
    let error =
        pump(queue.clone(), pacer, options(Duration::from_secs(60)), progress.clone(), handler).await.unwrap_err();
    driver.abort();
    assert!(matches!(error, PaceError::Closed { .. }), "{error}");
    assert_eq!(progress.done.load(Ordering::SeqCst), 4, "the 4 items taken were handled and acknowledged");
    assert_eq!(queue.outstanding.load(Ordering::SeqCst), 16);
    assert_eq!(clock.now(), 10_000_000_000, "returned when the handlers were done");
}

/// An item whose handler succeeded while the queue was away is acknowledged once the queue is
/// back, not left to be delivered (and done) again. Before, the failed acknowledgement was only
/// logged: the item stayed outstanding, and this pump waited for it for ever.
#[tokio::test(start_paused = true)]
async fn an_acknowledgement_that_fails_for_a_while_is_tried_again() {
    let queue = Arc::new(Flaky::new(20, NEVER, timeout).acks_failing(3..=5, timeout));
    let (result, _, progress) = run(queue.clone(), Duration::from_secs(60)).await;
    result.unwrap();
    assert_eq!(progress.done.load(Ordering::SeqCst), 20, "every item acknowledged");
    assert_eq!(progress.unacknowledged.load(Ordering::SeqCst), 0);
    assert_eq!(progress.queue_retries.load(Ordering::SeqCst), 3);
    assert_eq!(queue.outstanding.load(Ordering::SeqCst), 0);
}

/// A failure the queue could not record for a while is recorded once it is back: the item is
/// dead-lettered as its attempts say, not left pending with the attempt uncounted.
#[tokio::test(start_paused = true)]
async fn a_failure_the_queue_cannot_record_for_a_while_is_tried_again() {
    let queue = Arc::new(Flaky::new(8, NEVER, timeout).acks_failing(2..=4, timeout));
    let handler = |_item| async { Handled::Failed(tollgate_pace::HandlerError::message("refused")) };
    let (result, _, progress) = run_with(queue.clone(), options(Duration::from_secs(60)), handler).await;
    result.unwrap();
    assert_eq!((progress.failed.load(Ordering::SeqCst), progress.dead.load(Ordering::SeqCst)), (8, 8));
    assert_eq!(queue.failed.load(Ordering::SeqCst), 8, "each failure recorded once");
    assert_eq!(progress.queue_retries.load(Ordering::SeqCst), 3);
}

/// An acknowledgement the queue refuses for good ends the pump with that error (taking more
/// items would do each and fail to acknowledge it), and the item is counted as unacknowledged.
/// Before, it was only logged, and the pump went on for ever.
#[tokio::test(start_paused = true)]
async fn an_acknowledgement_refused_for_good_ends_the_pump_with_its_error() {
    let queue = Arc::new(Flaky::new(20, NEVER, timeout).acks_failing(2..=2, closed));
    let (result, _, progress) = run(queue.clone(), Duration::from_secs(60)).await;
    let error = result.unwrap_err();
    assert!(matches!(error, PaceError::Closed { .. }), "{error}");
    assert_eq!(progress.unacknowledged.load(Ordering::SeqCst), 1);
    assert_eq!(progress.queue_retries.load(Ordering::SeqCst), 0, "not tried again");
    let done = progress.done.load(Ordering::SeqCst);
    assert_eq!(queue.outstanding.load(Ordering::SeqCst), 20 - done, "only the acknowledged left the queue");
    assert!(done < 20, "stopped taking items: {done} done");
}
