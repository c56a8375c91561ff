//! Where the counters live: one [`Store`] value, picked when the engine is built, decides every
//! call, lists and resets counters, and flushes what it holds back.
//!
//! - [`Memory`]: the engine's own counters (their [`Counters`](crate::serve::model::Counters) are
//!   [`keyed`] limiters), in accuracy mode (the counters a call touches are locked together) or
//!   throughput mode (each on its own, a rejection gives back what was taken);
//! - in Redis ([`redis`]): fixed windows decided in one script run, or cached and flushed, or
//!   spent from leased slices; [`open_redis`] opens the one `--storage` names.
//!
//! The engine computes which counters a call touches ([`Policy::hits`](tollgate_policy::Policy::hits))
//! and turns the statuses a store returns into an [`Outcome`](crate::serve::Outcome); a store knows
//! nothing of protocols.

pub(crate) mod keyed;
mod memory;
mod own_limit;
pub(crate) mod redis;

use std::future::Future;
use std::pin::Pin;

use tollgate::{Answer, Clock};
use tollgate_policy::{Descriptor, Hit};
use tollgate_redis::BackendError;

pub(crate) use memory::Memory;
pub use redis::{RedisStore, SCAN_COUNT, TimeSource};
pub(crate) use redis::{counter_key, open_redis};

use crate::serve::model::{Action, CounterFilter, CounterList, Loaded, Mode, Status, StorageKind};

/// A future that borrows the call it answers.
pub(crate) type Later<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A call's statuses: at once (memory: neither boxed nor polled), or after I/O (Redis), in the
/// core's one [`Answer`] type, whose pending future here borrows the call.
pub(crate) type Decided<'a> = Answer<Result<Vec<Status>, BackendError>, Later<'a, Result<Vec<Status>, BackendError>>>;

/// One call, as the engine hands it to its store: the counters it touches and what to do.
pub(crate) struct Call<'a, C: Clock> {
    pub(crate) loaded: &'a Loaded,
    pub(crate) namespace: &'a str,
    /// The counters, in the policy's order.
    pub(crate) hits: &'a [Hit<'a>],
    pub(crate) descriptors: &'a [Descriptor],
    pub(crate) delta: u64,
    pub(crate) action: Action,
    /// The hits are charged, not decided: each counter takes them, or what is left of its
    /// window if less, and none refuses (how the engine counts the limits that count past
    /// theirs when a limit that denies all has denied the call; `action` is then not `Check`).
    /// Only memory and `--storage redis` are asked (they alone [count
    /// past](crate::serve::StorageKind::counts_past)).
    pub(crate) charge: bool,
    pub(crate) clock: &'a C,
}

impl<C: Clock> Call<'_, C> {
    /// The hits a call counts on a counter: its descriptor's own `hits_addend`, if it sets one,
    /// else the request's.
    pub(crate) fn hits_on(&self, hit: &Hit<'_>) -> u64 {
        hits_on(self.descriptors, self.delta, hit.descriptor)
    }
}

/// The hits a call of `delta` counts on a counter attributed to descriptor `at`: that
/// descriptor's own `hits_addend`, if it sets one, else `delta`.
pub(crate) fn hits_on(descriptors: &[Descriptor], delta: u64, at: usize) -> u64 {
    descriptors.get(at).map_or(delta, |d| d.hits_or(delta))
}

/// A namespace's counters, as listing and resetting ask a store for them.
pub(crate) struct Namespace<'a, C> {
    /// The limits in force.
    pub(crate) loaded: std::sync::Arc<Loaded>,
    /// The namespace.
    pub(crate) name: &'a str,
    /// The engine's clock.
    pub(crate) clock: &'a C,
}

/// Where the counters live. Every method answers for the limits in `loaded`.
pub(crate) trait Store<C: Clock>: Send + Sync {
    /// What `--storage` calls it.
    fn kind(&self) -> StorageKind;

    /// How a call's counters are decided together: in one step (one lock, one script run)
    /// unless a store says otherwise.
    fn mode(&self) -> Mode {
        Mode::Accuracy
    }

    /// Decides one call: each counter's status, in the order of `call.hits`. A limited call takes
    /// nothing from any counter but those of limits that [count
    /// past](tollgate_policy::Limit::counts_past) theirs, which a store that counts past
    /// ([`StorageKind::counts_past`]) charges whatever the outcome; every pooled one over with
    /// the call's hits limits the call. An error means the storage could not answer.
    fn decide<'a>(&'a self, call: Call<'a, C>) -> Decided<'a>;

    /// Up to `max` live counters of the namespace.
    fn list<'a>(&'a self, namespace: Namespace<'a, C>, max: usize) -> Later<'a, Result<CounterList, BackendError>>;

    /// Forgets the counters of the namespace that `filter` chooses; returns how many held hits.
    fn reset<'a>(
        &'a self,
        namespace: Namespace<'a, C>,
        filter: &'a CounterFilter,
    ) -> Later<'a, Result<u64, BackendError>>;

    /// Sends what is held back (redis-cached); returns the counters sent.
    fn flush<'a>(&'a self, _clock: &'a C) -> Later<'a, Result<usize, BackendError>> {
        Box::pin(std::future::ready(Ok(0)))
    }

    /// What the counters kept in this process for Redis weigh now, and their cap (redis-cached);
    /// `None` for the storages that keep none (or count them otherwise: memory's tables).
    fn local_bytes(&self) -> Option<(usize, usize)> {
        None
    }

    /// What must happen before the process exits: pending hits are sent (redis-cached), leased
    /// and unspent ones go back (redis-leased).
    fn close<'a>(&'a self, clock: &'a C) -> Later<'a, Result<(), BackendError>> {
        Box::pin(async move { self.flush(clock).await.map(drop) })
    }
}
