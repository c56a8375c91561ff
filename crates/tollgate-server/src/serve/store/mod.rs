//! Where the counters live: one [`Store`] value, picked when the engine is built, decides every
//! call, lists and resets counters, and flushes what it holds back.
//!
//! - [`Memory`]: the engine's own counters, in accuracy mode (the counters a call touches are
//!   locked together) or throughput mode (each on its own, a rejection gives back what was taken);
//! - [`InRedis`]: fixed windows in Redis, a call decided in one script run;
//! - [`Cached`]: counters decided in memory, loaded from and flushed to Redis;
//! - [`Leased`]: the counters of [`InRedis`], spent from slices leased from them.
//!
//! The engine computes which counters a call touches ([`Policy::hits`]) and turns the statuses a
//! store returns into an [`Outcome`](super::Outcome); a store knows nothing of protocols.

mod cache;
mod cached;
mod leased;
mod memory;
mod redis;

use std::future::Future;
use std::pin::Pin;

use tollgate::Clock;
use tollgate_policy::{Descriptor, Hit, Policy};
use tollgate_redis::{BackendError, RedisTime};

pub(crate) use cached::Cached;
pub(crate) use leased::Leased;
pub(crate) use memory::Memory;
pub(crate) use redis::InRedis;
pub use redis::SCAN_COUNT;

use super::admin::{CounterFilter, CounterList};
use super::engine::{Action, Loaded, Mode, Status, StorageError, StorageKind};

/// A future that borrows the call it answers.
pub(crate) type Later<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An answer now (memory), or after I/O (Redis): the memory path neither boxes nor polls.
pub(crate) enum Answer<'a, T> {
    Now(T),
    Later(Later<'a, T>),
}

impl<T> Answer<'_, T> {
    pub(crate) async fn get(self) -> T {
        match self {
            Answer::Now(value) => value,
            Answer::Later(later) => later.await,
        }
    }
}

/// One call, as the engine hands it to its store: the counters it touches and what to do.
pub(crate) struct Call<'a, C: Clock> {
    pub(crate) loaded: &'a Loaded,
    pub(crate) namespace: &'a str,
    /// The counters, in the policy's order.
    pub(crate) hits: &'a [Hit<'a>],
    pub(crate) descriptors: &'a [Descriptor],
    pub(crate) delta: u64,
    pub(crate) action: Action,
    pub(crate) clock: &'a C,
}

impl<C: Clock> Call<'_, C> {
    /// The hits a call counts on a counter: its descriptor's own `hits_addend`, if it sets one,
    /// else the request's.
    pub(crate) fn hits_on(&self, hit: &Hit<'_>) -> u64 {
        self.descriptors.get(hit.descriptor).map_or(self.delta, |d| d.hits_or(self.delta))
    }
}

/// Where the counters live. Every method answers for the limits in `loaded`.
pub(crate) trait Store<C: Clock>: Send + Sync {
    /// What `--storage` calls it.
    fn kind(&self) -> StorageKind;

    /// How a call's counters are decided together.
    fn mode(&self) -> Mode;

    /// Whether this store can count every limit of `policy`; the error names the first it cannot.
    fn accepts(&self, policy: &Policy) -> Result<(), StorageError>;

    /// Decides one call: each counter's status, in the order of `call.hits`. A limited call takes
    /// nothing from any counter. An error means the storage could not answer.
    fn decide<'a>(&'a self, call: Call<'a, C>) -> Answer<'a, Result<Vec<Status>, BackendError>>;

    /// Up to `max` live counters of `namespace`.
    fn list<'a>(
        &'a self,
        loaded: std::sync::Arc<Loaded>,
        namespace: &'a str,
        max: usize,
        clock: &'a C,
    ) -> Later<'a, Result<CounterList, BackendError>>;

    /// Forgets the counters of `namespace` that `filter` chooses; returns how many held hits.
    fn reset<'a>(
        &'a self,
        loaded: &'a Loaded,
        namespace: &'a str,
        filter: &'a CounterFilter,
        clock: &'a C,
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

/// Whose clock times the windows of counters kept in Redis (with in-memory storage the server's
/// clock always does): the choice `tollgate serve` is given, made a [`RedisTime`] by
/// [`TimeSource::redis_time`] once the server's clock is known.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TimeSource {
    /// Redis `TIME`: every replica agrees, whatever its own clock says. The default.
    #[default]
    Redis,
    /// The engine's clock (tests on a [`tollgate::ManualClock`]; replicas with different clocks
    /// would disagree).
    Server,
}

impl TimeSource {
    /// The Redis stores' time for a server on `clock`.
    ///
    /// ```
    /// use tollgate::ManualClock;
    /// use tollgate_server::serve::TimeSource;
    /// assert!(TimeSource::Redis.redis_time(&ManualClock::new()).is_redis());
    /// assert_eq!(TimeSource::Server.redis_time(&ManualClock::new()).now_us(), Some(0));
    /// ```
    pub fn redis_time<C: Clock>(self, clock: &C) -> RedisTime {
        match self {
            TimeSource::Redis => RedisTime::redis(),
            TimeSource::Server => RedisTime::clock(clock.clone()),
        }
    }
}

/// Counters in Redis instead of in memory: the connection, the key prefix, and whose clock times
/// the windows.
#[derive(Debug)]
pub struct RedisStore {
    /// The connection.
    pub redis: tollgate_redis::Redis,
    /// Prefix of every key (a counter's key is [`Keyspace::key`](tollgate_redis::Keyspace::key) of the prefix, under the
    /// namespace as tag, named by its limit's id, with its variables' values).
    pub prefix: String,
    /// Whose clock times the windows (see [`TimeSource::redis_time`]).
    pub time: RedisTime,
}

/// The first limit of `policy` a Redis store cannot count, as the error that names it: Redis counts
/// the algorithms whose [`support`](tollgate::AlgorithmKind::support) says `redis_counters`, and a
/// `cached` or `leased` store no calendar windows (their local copies count windows that open at
/// a first hit).
pub(crate) fn redis_accepts(policy: &Policy, storage: StorageKind) -> Result<(), StorageError> {
    let cached = matches!(storage, StorageKind::RedisCached | StorageKind::RedisLeased);
    let refused = policy.limits().iter().find_map(|l| {
        if !l.algorithm().support().redis_counters {
            Some((l, false))
        } else if cached && l.calendar().is_some() {
            Some((l, true))
        } else {
            None
        }
    });
    match refused {
        Some((limit, calendar)) => Err(StorageError {
            source_name: limit.source_name().to_owned(),
            position: limit.position(),
            namespace: limit.namespace().to_owned(),
            name: limit.name().map(str::to_owned),
            algorithm: limit.algorithm(),
            calendar,
            storage,
        }),
        None => Ok(()),
    }
}
