//! Costs known after the response ([`Policy::settle_from`](crate::Policy::settle_from)): the
//! policy reserves the request's estimated cost, the reservation travels with the response body
//! as a concurrency permit does, and when the body ends it is settled for the cost the response
//! reported.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http::{Extensions, HeaderMap, HeaderName, HeaderValue};
use tollgate::{Answer, BoxFuture, Meta, RateLimiter, Refund, Reservation, SettleFailed, Settled};

use crate::metrics::{SettleMetrics, SettleOutcome};

/// Where a policy reads a request's actual cost from ([`Policy::settle_from`](crate::Policy::settle_from)).
///
/// A header or trailer value is a decimal count of permits (`x-tokens-used: 1234`, blanks around
/// it allowed); anything else keeps the estimate.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettleFrom {
    /// A response header (e.g. `x-tokens-used`), read when the response's head arrives.
    Header(HeaderName),
    /// A trailer (e.g. `x-tokens-used` after a streamed body), read from the body's trailers.
    Trailer(HeaderName),
    /// The [`UsedCost`] the handler put in the response's extensions, read when the body ends: a
    /// streamed body's handler keeps a clone and adds to it as it streams.
    Extension,
}

/// The cost a handler reports for its request, put in the response's extensions
/// ([`SettleFrom::Extension`]).
///
/// A shared count: clones are the same count, so a streamed body can keep one and add to it as
/// it streams; the layer reads it when the body ends. Nothing reported (a new `UsedCost` never
/// set) keeps the estimate.
///
/// ```
/// use tollgate_tower::UsedCost;
/// let used = UsedCost::new(); // into the response's extensions
/// let counter = used.clone(); // into the stream that makes the body
/// assert_eq!(used.get(), None);
/// counter.add(40);
/// counter.add(2);
/// assert_eq!(used.get(), Some(42));
/// assert_eq!(UsedCost::from(7).get(), Some(7));
/// ```
#[derive(Clone, Default)]
pub struct UsedCost(Arc<AtomicU64>); // 0: nothing reported; else the cost + 1 (saturating)

impl UsedCost {
    /// Nothing reported yet.
    pub fn new() -> UsedCost {
        UsedCost::default()
    }

    /// Reports `cost`, replacing what was reported.
    pub fn set(&self, cost: u64) {
        self.0.store(cost.saturating_add(1), Ordering::Release);
    }

    /// Adds `cost` to what was reported (to 0 when nothing was), saturating.
    pub fn add(&self, cost: u64) {
        let add = |stored: u64| Some(stored.max(1).saturating_add(cost));
        let _ = self.0.fetch_update(Ordering::AcqRel, Ordering::Acquire, add);
    }

    /// The cost reported, `None` when nothing was.
    pub fn get(&self) -> Option<u64> {
        self.0.load(Ordering::Acquire).checked_sub(1)
    }
}

impl From<u64> for UsedCost {
    fn from(cost: u64) -> UsedCost {
        let used = UsedCost::new();
        used.set(cost);
        used
    }
}

impl std::fmt::Debug for UsedCost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("UsedCost").field(&self.get()).finish()
    }
}

/// What a settling policy is configured with.
pub(crate) struct SettleConfig {
    pub(crate) policy: Arc<str>,
    pub(crate) from: SettleFrom,
    pub(crate) metrics: SettleMetrics,
}

type SettleFn = Box<dyn FnOnce(u64) -> Settled + Send + Sync>;

/// What is known of the actual cost.
enum Actual {
    /// Not read yet (a trailer before the trailers).
    Unread,
    Reported(u64),
    Unparseable,
    Missing,
    /// The handler's count, read when the body ends.
    Count(UsedCost),
}

/// A reservation a [`Policy`](crate::Policy) with [`settle_from`](crate::Policy::settle_from)
/// took for an admitted request, held by the response body.
///
/// When the body ends (its last frame, its trailers, or the end of the stream) it is settled for
/// the cost the response reported: what the estimate exceeded is given back, what it fell short
/// of is charged as a debt. Dropped before (a client gone mid-stream, a body that failed, a
/// service error), or with no cost reported, the estimate stands.
pub struct Reserved {
    settle: Option<SettleFn>,
    config: Arc<SettleConfig>,
    meta: Meta,
    estimate: u64,
    actual: Actual,
}

impl Reserved {
    /// `reservation`, taken from `limit` for `key`, to be settled at the end of the response.
    pub(crate) fn new<K, L>(config: Arc<SettleConfig>, limit: Arc<L>, key: K, reservation: Reservation) -> Reserved
    where
        K: Send + Sync + 'static,
        L: RateLimiter<K> + ?Sized + 'static,
    {
        let (meta, estimate) = (reservation.lease().meta(), reservation.estimate());
        let settle: SettleFn = Box::new(move |actual| reservation.settle(&*limit, &key, actual));
        Reserved { settle: Some(settle), config, meta, estimate, actual: Actual::Unread }
    }

    /// The state the reserve left, for the response headers.
    pub(crate) fn meta(&self) -> Meta {
        self.meta
    }

    /// Reads the response's head: a header's cost, or the handler's [`UsedCost`].
    pub(crate) fn read_head(&mut self, headers: &HeaderMap, extensions: &Extensions) {
        self.actual = match &self.config.from {
            SettleFrom::Header(name) => parse(headers.get(name)),
            SettleFrom::Extension => extensions.get::<UsedCost>().map_or(Actual::Missing, |c| Actual::Count(c.clone())),
            SettleFrom::Trailer(_) => return,
        };
    }

    /// Reads the body's trailers.
    pub(crate) fn read_trailers(&mut self, trailers: &HeaderMap) {
        if let SettleFrom::Trailer(name) = &self.config.from {
            self.actual = parse(trailers.get(name));
        }
    }

    /// The body ended: settles for the reported cost (or leaves the estimate when none was). A
    /// settle a distributed limiter answers later is returned, to be driven to its answer.
    pub(crate) fn finish(&mut self) -> Option<BoxFuture<()>> {
        let settle = self.settle.take()?;
        let actual = match std::mem::replace(&mut self.actual, Actual::Missing) {
            Actual::Reported(actual) => Some(actual),
            Actual::Count(count) => count.get(),
            Actual::Unparseable => {
                self.ended(SettleOutcome::Unparseable, None);
                return None;
            }
            Actual::Unread | Actual::Missing => None,
        };
        let Some(actual) = actual else {
            self.ended(SettleOutcome::Missing, None);
            return None;
        };
        match settle(actual) {
            Answer::Ready(result) => {
                settled(&self.config, self.estimate, actual, result);
                None
            }
            Answer::Pending(answer) => {
                let (config, estimate) = (self.config.clone(), self.estimate);
                Some(Box::pin(async move { settled(&config, estimate, actual, answer.await) }))
            }
        }
    }

    /// Gives the whole estimate back (a later policy turned the request away).
    pub(crate) fn cancel(mut self) -> Refund {
        let Some(settle) = self.settle.take() else { return Answer::Ready(()) };
        let policy = self.config.policy.clone();
        settle(0).map(move |result| {
            if let Err(failed) = result {
                tracing::warn!(policy = %policy, error = %failed.error, "reservation not cancelled: the estimate stands");
            }
        })
    }

    fn ended(&self, outcome: SettleOutcome, actual: Option<u64>) {
        ended(&self.config, outcome, self.estimate, actual);
    }
}

/// Counts and logs how a reservation ended.
fn ended(config: &SettleConfig, outcome: SettleOutcome, estimate: u64, actual: Option<u64>) {
    config.metrics.count(outcome);
    let policy = &*config.policy;
    match outcome {
        SettleOutcome::Settled => tracing::trace!(policy, estimate, actual, "reservation settled"),
        SettleOutcome::Missing => {
            tracing::debug!(policy, estimate, from = ?config.from, "no cost reported: the estimate stands")
        }
        SettleOutcome::Unparseable => {
            tracing::warn!(policy, estimate, from = ?config.from, "reported cost is not a number: the estimate stands")
        }
        SettleOutcome::Dropped => {
            tracing::debug!(policy, estimate, "response body not sent to its end: the estimate stands")
        }
        SettleOutcome::Failed => {}
    }
}

fn settled(config: &SettleConfig, estimate: u64, actual: u64, result: Result<(), SettleFailed>) {
    match result {
        Ok(()) => ended(config, SettleOutcome::Settled, estimate, Some(actual)),
        Err(failed) => {
            config.metrics.count(SettleOutcome::Failed);
            let policy = &*config.policy;
            tracing::warn!(policy, estimate, actual, error = %failed.error, "reservation not settled: the estimate stands");
        }
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if self.settle.is_some() {
            self.ended(SettleOutcome::Dropped, None);
        }
    }
}

/// A header value's cost.
fn parse(value: Option<&HeaderValue>) -> Actual {
    let Some(value) = value else { return Actual::Missing };
    let parsed = std::str::from_utf8(value.as_bytes()).ok().and_then(|s| s.trim().parse().ok());
    parsed.map_or(Actual::Unparseable, Actual::Reported)
}

impl std::fmt::Debug for Reserved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let actual = match &self.actual {
            Actual::Reported(n) => Some(*n),
            Actual::Count(count) => count.get(),
            _ => None,
        };
        f.debug_struct("Reserved")
            .field("policy", &self.config.policy)
            .field("from", &self.config.from)
            .field("estimate", &self.estimate)
            .field("actual", &actual)
            .field("settled", &self.settle.is_none())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for SettleConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SettleConfig").field("policy", &self.policy).field("from", &self.from).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cost_is_a_decimal_count_and_anything_else_is_unparseable() {
        let value = |s: &'static str| HeaderValue::from_static(s);
        assert!(matches!(parse(Some(&value("1234"))), Actual::Reported(1234)));
        assert!(matches!(parse(Some(&value(" 7 "))), Actual::Reported(7)));
        for bad in ["", "-1", "1.5", "lots", "18446744073709551616", "0x10"] {
            assert!(matches!(parse(Some(&value(bad))), Actual::Unparseable), "{bad:?}");
        }
        let not_utf8 = HeaderValue::from_bytes(b"\xff1").unwrap();
        assert!(matches!(parse(Some(&not_utf8)), Actual::Unparseable));
        assert!(matches!(parse(None), Actual::Missing));
    }

    #[test]
    fn a_used_cost_saturates_and_tells_nothing_from_zero() {
        let used = UsedCost::new();
        assert_eq!(used.get(), None);
        used.add(0);
        assert_eq!(used.get(), Some(0));
        used.set(u64::MAX);
        used.add(5);
        assert_eq!(used.get(), Some(u64::MAX - 1), "saturates one short of u64::MAX");
        assert_eq!(format!("{:?}", UsedCost::from(3)), "UsedCost(Some(3))");
    }
}
