//! The work pump: take items from the queue, spend the pacer's budget on each, run the handler,
//! acknowledge only after success.
//!
//! A throttled item is retried by the same worker once the pacer allows (its Retry-After and the
//! cut rate apply to everyone); a failed one is left to the queue (retried after the idle timeout,
//! dead-lettered after `max_attempts`); a handler that panics counts as a failure — the item is
//! never lost. A queue that cannot be reached for a while (Redis restarting, failing over) is
//! waited out, up to [`PumpOptions::outage`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate::Clock;

use crate::metrics::ItemOutcome;
use crate::queue::{Item, Queue};
use crate::{PaceError, Pacer};

/// Items are taken from the queue for about this much work at the current rate.
const TAKE_AHEAD: Duration = Duration::from_millis(500);

/// The longest pause between two tries of a queue that cannot be reached.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(5);

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
    /// How long the queue may stay unreachable (errors that may pass: see
    /// [`PaceError::is_transient`]) before the pump gives up and returns the last error. Until
    /// then it tries again, pausing from `empty_poll` up to 5 s between tries; items already
    /// being handled go on. Other errors end the pump at once. Either way the pump takes no new
    /// item and returns its error once the items being handled are done.
    pub outage: Duration,
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
        }
    }
}

/// A queue that cannot be reached: since when, and the pause before the next try.
struct Outage {
    since: Option<tokio::time::Instant>,
    pause: Duration,
}

impl Outage {
    fn new() -> Outage {
        Outage { since: None, pause: Duration::ZERO }
    }

    /// A queue call answered: any outage is over.
    fn over(&mut self) {
        if let Some(since) = self.since.take() {
            tracing::info!("the queue answers again after {:.1} s", since.elapsed().as_secs_f64());
        }
        self.pause = Duration::ZERO;
    }

    /// A queue call failed: after a pause, `Ok` to try again; the error itself when it will not
    /// pass by itself or the outage has lasted `options.outage`.
    async fn wait(&mut self, error: PaceError, options: &PumpOptions) -> Result<(), PaceError> {
        if !error.is_transient() {
            return Err(error);
        }
        let now = tokio::time::Instant::now();
        let lasted = now - *self.since.get_or_insert(now);
        let Some(left) = options.outage.checked_sub(lasted).filter(|left| !left.is_zero()) else {
            return Err(error);
        };
        let first = options.empty_poll.max(Duration::from_millis(10));
        self.pause = (self.pause * 2).clamp(first, MAX_RETRY_PAUSE.max(first)).min(left);
        tracing::warn!(
            "queue unavailable for {:.1} s, trying again in {:?}: {error}",
            lasted.as_secs_f64(),
            self.pause
        );
        tokio::time::sleep(self.pause).await;
        Ok(())
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
    let handler = Arc::new(handler);
    let slots = Arc::new(tokio::sync::Semaphore::new(options.concurrency.max(1)));
    let mut outage = Outage::new();
    let ended: Result<(), PaceError> = async {
        loop {
            // Take only what can be sent soon: an item held longer than the queue's idle timeout is
            // delivered to another worker too.
            pacer.ready().await;
            let soon = (pacer.rate() * TAKE_AHEAD.as_secs_f64()).ceil().max(1.0) as usize;
            let items = match queue.take(&options.consumer, options.batch.clamp(1, soon)).await {
                Ok(items) => items,
                Err(e) => {
                    outage.wait(e, &options).await?;
                    continue;
                }
            };
            outage.over();
            if items.is_empty() {
                let idle = slots.available_permits() == options.concurrency.max(1);
                if options.stop_when_empty && idle {
                    match queue.outstanding().await {
                        Ok(0) => return Ok(()),
                        Ok(_) => {}
                        Err(e) => {
                            outage.wait(e, &options).await?;
                            continue;
                        }
                    }
                }
                tokio::time::sleep(options.empty_poll).await;
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
                let (queue, pacer, handler, progress) =
                    (queue.clone(), pacer.clone(), handler.clone(), progress.clone());
                pacer.metrics.in_flight.increment(1.0);
                tokio::spawn(async move {
                    handle(&*queue, &pacer, &*handler, &progress, item).await;
                    pacer.metrics.in_flight.decrement(1.0);
                    drop(slot);
                });
            }
        }
    }
    .await;
    if ended.is_err() {
        // The items being handled finish (acknowledged or failed) before the error is returned:
        // a caller that exits on it would cut them off midway, to be handled again elsewhere.
        let all = u32::try_from(options.concurrency.max(1)).unwrap_or(u32::MAX);
        let _ = slots.acquire_many(all).await;
    }
    ended
}

async fn handle<Q, C, H, F>(queue: &Q, pacer: &Pacer<C>, handler: &H, progress: &Progress, item: Item)
where
    Q: Queue,
    C: Clock,
    H: Fn(Item) -> F,
    F: Future<Output = Handled> + Send + 'static,
{
    loop {
        // Its own task, so that a panicking handler is a failed item, not a dead worker.
        let outcome = match tokio::spawn(handler(item.clone())).await {
            Ok(outcome) => outcome,
            Err(e) => Handled::failed(Panicked(e)),
        };
        match outcome {
            Handled::Done => {
                pacer.succeeded();
                match queue.ack(&item).await {
                    Ok(()) => {
                        progress.done.fetch_add(1, Ordering::Relaxed);
                        pacer.metrics.item(ItemOutcome::Done);
                    }
                    // Not acknowledged: it will be delivered again (at least once).
                    Err(e) => tracing::warn!(item = %item.id, "cannot acknowledge: {e}"),
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
                match queue.fail(&item, &error.to_string()).await {
                    Ok(true) => {
                        progress.dead.fetch_add(1, Ordering::Relaxed);
                        pacer.metrics.item(ItemOutcome::Dead);
                    }
                    Ok(false) => {}
                    Err(e) => tracing::warn!(item = %item.id, "cannot record a failure: {e}"),
                }
                return;
            }
        }
    }
}
