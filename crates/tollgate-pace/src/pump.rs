//! The work pump: take items from the queue, spend the pacer's budget on each, run the handler,
//! acknowledge only after success.
//!
//! A throttled item is retried by the same worker once the pacer allows (its Retry-After and the
//! cut rate apply to everyone); a failed one is left to the queue (retried after the idle timeout,
//! dead-lettered after `max_attempts`); a handler that panics counts as a failure — the item is
//! never lost. A queue that cannot be reached for a while (Redis restarting, failing over) is
//! waited out, up to [`PumpOptions::outage`], by every queue call: taking items, and acknowledging
//! or failing each (see the `retry` module); an error that will not pass ends the pump.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate::Clock;

use crate::metrics::ItemOutcome;
use crate::queue::{Item, Queue};
use crate::retry::{Backoff, Jitter};
use crate::{PaceError, Pacer};

/// Items are taken from the queue for about this much work at the current rate.
const TAKE_AHEAD: Duration = Duration::from_millis(500);

/// What the handler made of an item.
#[derive(Clone, Debug)]
pub enum Handled {
    /// Done: acknowledge it.
    Done,
    /// The service throttled it (429/503 or an error classified as throttling): back off, retry.
    Throttled(Option<Duration>),
    /// It failed for another reason: the error is recorded with the item, and kept in the
    /// dead-letter queue if it was the last attempt.
    Failed(HandlerError),
}

impl Handled {
    /// `Failed` with `error`, whatever its type.
    pub fn failed(error: impl std::error::Error + Send + Sync + 'static) -> Handled {
        Handled::Failed(HandlerError::new(error))
    }
}

/// Why a handler failed an item: any error, kept as it is (downcast it with
/// [`HandlerError::downcast_ref`]). Cheap to clone. Its `Display` is the error's.
///
/// ```
/// use tollgate_pace::{Handled, HandlerError};
/// let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "upstream refused");
/// let Handled::Failed(error) = Handled::failed(refused) else { unreachable!() };
/// assert_eq!(error.to_string(), "upstream refused");
/// assert_eq!(error.downcast_ref::<std::io::Error>().unwrap().kind(), std::io::ErrorKind::ConnectionRefused);
/// assert_eq!(HandlerError::message("HTTP 500").to_string(), "HTTP 500");
/// ```
#[derive(Clone, Debug)]
pub struct HandlerError(Arc<dyn std::error::Error + Send + Sync>);

impl HandlerError {
    /// Wraps `error`.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> HandlerError {
        HandlerError(Arc::new(error))
    }

    /// An error that is only a message (for handlers that have nothing more typed to give).
    pub fn message(text: impl Into<String>) -> HandlerError {
        HandlerError(Arc::new(Message(text.into())))
    }

    /// The error, if it is a `T`.
    pub fn downcast_ref<T: std::error::Error + 'static>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for HandlerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// The error of [`HandlerError::message`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Message(String);

/// A handler that panicked (its item counts as failed, never as lost).
#[derive(Debug, thiserror::Error)]
#[error("the handler panicked: {0}")]
struct Panicked(#[source] tokio::task::JoinError);

/// Counts, readable while the pump runs (for a progress bar).
#[derive(Debug, Default)]
pub struct Progress {
    /// Items acknowledged.
    pub done: AtomicU64,
    /// Failed attempts (including panics).
    pub failed: AtomicU64,
    /// Items sent to the dead-letter queue.
    pub dead: AtomicU64,
    /// Throttled attempts.
    pub throttled: AtomicU64,
    /// Queue calls tried again after an error that may pass (see [`PumpOptions::outage`]).
    pub queue_retries: AtomicU64,
    /// Items handled whose acknowledgement the queue refused for good or never got within
    /// [`PumpOptions::outage`]: they are delivered again, so their handler runs once more.
    pub unacknowledged: AtomicU64,
}

/// How a pump runs.
#[derive(Clone, Debug)]
pub struct PumpOptions {
    /// This worker's consumer name in the group (unique per worker).
    pub consumer: String,
    /// Items taken from the queue at once.
    pub batch: usize,
    /// Handlers running at once.
    pub concurrency: usize,
    /// Return when the queue has nothing left (nothing queued, nothing pending anywhere).
    pub stop_when_empty: bool,
    /// How long to wait before asking an empty queue again.
    pub empty_poll: Duration,
    /// How long a queue call may keep failing with errors that may pass (see
    /// [`PaceError::is_transient`]) before the pump gives up and returns the last error. Until
    /// then the call is tried again, pausing from `empty_poll` (at least 10 ms), doubling up to
    /// 5 s, each pause spread by [`PumpOptions::jitter`]; items already being handled go on. This
    /// holds for taking items and for acknowledging or failing each one, so an item whose handler
    /// succeeded is not handled again because Redis was away for a moment. Other errors end the
    /// pump at once. Either way the pump takes no new item and returns its error once the items
    /// being handled are done. Pauses are on the pacer's clock.
    pub outage: Duration,
    /// Where the retry pauses get their randomness (default [`Jitter::random`]).
    pub jitter: Jitter,
}

impl PumpOptions {
    /// Defaults for `consumer`: batches of 32, 16 handlers, runs until the queue is drained,
    /// rides out a queue outage of up to a minute.
    pub fn new(consumer: &str) -> PumpOptions {
        PumpOptions {
            consumer: consumer.to_string(),
            batch: 32,
            concurrency: 16,
            stop_when_empty: true,
            empty_poll: Duration::from_millis(100),
            outage: Duration::from_secs(60),
            jitter: Jitter::random(),
        }
    }
}

/// What the pump and its handlers share.
struct Shared<Q, C: Clock, H> {
    queue: Arc<Q>,
    pacer: Arc<Pacer<C>>,
    handler: H,
    progress: Arc<Progress>,
    options: PumpOptions,
    /// The error a handler gave up on (a queue call it could not make): it ends the pump, as the
    /// same error from taking items would.
    gave_up: Mutex<Option<PaceError>>,
}

impl<Q, C: Clock, H> Shared<Q, C, H> {
    fn give_up(&self, error: PaceError) {
        self.gave_up.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(error);
    }

    fn given_up(&self) -> Option<PaceError> {
        self.gave_up.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// `call` until it answers, riding out errors that may pass (counted as retries).
    async fn retrying<T, F: Future<Output = Result<T, PaceError>>>(
        &self,
        what: &str,
        mut call: impl FnMut() -> F,
    ) -> Result<T, PaceError> {
        let mut backoff = Backoff::new(self.pacer.clock(), &self.options);
        loop {
            match call().await {
                Ok(answer) => {
                    backoff.over();
                    return Ok(answer);
                }
                Err(e) => {
                    backoff.wait(e, what).await?;
                    self.progress.queue_retries.fetch_add(1, Ordering::Relaxed);
                    self.pacer.metrics.queue_retries.increment(1);
                }
            }
        }
    }
}

/// Drains `queue` through `handler` under `pacer` until the queue is empty (or forever).
pub async fn pump<Q, C, H, F>(
    queue: Arc<Q>,
    pacer: Arc<Pacer<C>>,
    options: PumpOptions,
    progress: Arc<Progress>,
    handler: H,
) -> Result<(), PaceError>
where
    Q: Queue,
    C: Clock,
    H: Fn(Item) -> F + Send + Sync + 'static,
    F: Future<Output = Handled> + Send + 'static,
{
    let concurrency = options.concurrency.max(1);
    let slots = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let shared = Arc::new(Shared { queue, pacer, handler, progress, options, gave_up: Mutex::new(None) });
    let (queue, pacer, options) = (&*shared.queue, &*shared.pacer, &shared.options);
    let ended: Result<(), PaceError> = async {
        loop {
            if let Some(error) = shared.given_up() {
                return Err(error);
            }
            // Take only what can be sent soon: an item held longer than the queue's idle timeout is
            // delivered to another worker too.
            pacer.ready().await;
            let soon = (pacer.rate() * TAKE_AHEAD.as_secs_f64()).ceil().max(1.0) as usize;
            let max = options.batch.clamp(1, soon);
            let items = shared.retrying("take items", || queue.take(&options.consumer, max)).await?;
            if items.is_empty() {
                let idle = slots.available_permits() == concurrency;
                if options.stop_when_empty && idle && shared.retrying("count items", || queue.outstanding()).await? == 0
                {
                    return Ok(());
                }
                let clock = pacer.clock();
                clock.sleep_until(clock.now().saturating_add(nanos(options.empty_poll))).await;
                continue;
            }
            for item in items {
                pacer.acquire(item.cost).await?;
                // `slots` is never closed; the error is only the type's.
                let slot = slots
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| PaceError::Closed { reason: tollgate::Reason::Closed })?;
                let shared = shared.clone();
                shared.pacer.metrics.in_flight.increment(1.0);
                tokio::spawn(async move {
                    handle(&shared, item).await;
                    shared.pacer.metrics.in_flight.decrement(1.0);
                    drop(slot);
                });
            }
        }
    }
    .await;
    if ended.is_err() {
        // The items being handled finish (acknowledged or failed) before the error is returned:
        // a caller that exits on it would cut them off midway, to be handled again elsewhere.
        let all = u32::try_from(concurrency).unwrap_or(u32::MAX);
        let _ = slots.acquire_many(all).await;
    }
    ended
}

/// `d` in the clock's nanoseconds, saturating (584 years).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

async fn handle<Q, C, H, F>(shared: &Shared<Q, C, H>, item: Item)
where
    Q: Queue,
    C: Clock,
    H: Fn(Item) -> F,
    F: Future<Output = Handled> + Send + 'static,
{
    let (queue, pacer, progress) = (&*shared.queue, &*shared.pacer, &*shared.progress);
    loop {
        // Its own task, so that a panicking handler is a failed item, not a dead worker.
        let outcome = match tokio::spawn((shared.handler)(item.clone())).await {
            Ok(outcome) => outcome,
            Err(e) => Handled::failed(Panicked(e)),
        };
        match outcome {
            Handled::Done => {
                pacer.succeeded();
                // Acknowledging again is harmless (XACK and XDEL of an id already gone do
                // nothing), and an item done but not acknowledged would be done again.
                match shared.retrying("acknowledge an item", || queue.ack(&item)).await {
                    Ok(()) => {
                        progress.done.fetch_add(1, Ordering::Relaxed);
                        pacer.metrics.item(ItemOutcome::Done);
                    }
                    Err(e) => {
                        // Delivered again after the queue's idle timeout: counted, and the pump
                        // stops rather than doing every later item twice.
                        tracing::warn!(item = %item.id, "cannot acknowledge, it will be handled again: {e}");
                        progress.unacknowledged.fetch_add(1, Ordering::Relaxed);
                        pacer.metrics.item(ItemOutcome::Unacknowledged);
                        shared.give_up(e);
                    }
                }
                return;
            }
            Handled::Throttled(retry_after) => {
                progress.throttled.fetch_add(1, Ordering::Relaxed);
                pacer.metrics.item(ItemOutcome::Throttled);
                pacer.throttled(retry_after);
                if pacer.acquire(item.cost).await.is_err() {
                    return;
                }
            }
            Handled::Failed(error) => {
                progress.failed.fetch_add(1, Ordering::Relaxed);
                pacer.metrics.item(ItemOutcome::Failed);
                let error = error.to_string();
                // A try whose answer was lost after Redis counted the attempt counts it again:
                // the item is dead-lettered an attempt early at worst, never lost.
                match shared.retrying("record a failure", || queue.fail(&item, &error)).await {
                    Ok(true) => {
                        progress.dead.fetch_add(1, Ordering::Relaxed);
                        pacer.metrics.item(ItemOutcome::Dead);
                    }
                    Ok(false) => {}
                    // Left pending: delivered again after the idle timeout, this attempt uncounted.
                    Err(e) => {
                        tracing::warn!(item = %item.id, "cannot record a failure: {e}");
                        shared.give_up(e);
                    }
                }
                return;
            }
        }
    }
}
