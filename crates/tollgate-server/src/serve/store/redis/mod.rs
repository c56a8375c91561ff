//! Counters in Redis, the three ways `--storage` offers:
//!
//! - [`direct`] (`redis`): fixed windows in Redis, a call decided in one script run;
//! - [`cached`] (`redis-cached`): counters decided in memory by [`cache`], loaded from and
//!   flushed to Redis;
//! - [`leased`] (`redis-leased`): the keys of `redis`, spent from slices leased from them.
//!
//! What the three share (the keys, the windows a call touches, listing and resetting by key, the
//! metrics of their round trips) is [`common::RedisCounters`]; none reaches into another.

mod cache;
mod cached;
mod common;
mod direct;
mod leased;

use tollgate::Clock;
use tollgate_redis::RedisTime;

pub use common::SCAN_COUNT;
pub(crate) use common::counter_key;

use super::Store;
use crate::serve::model::StorageKind;

/// The store `--storage` names for counters in Redis, on `store`; `max_bytes` bounds what
/// `redis-cached` and `redis-leased` keep here. Its metrics are registered with the recorder in
/// force now.
///
/// # Panics
/// With [`StorageKind::Memory`], which is no Redis storage (a bug in the caller).
pub(crate) fn open_redis<C: Clock>(kind: StorageKind, store: RedisStore, max_bytes: usize) -> Box<dyn Store<C>> {
    match kind {
        StorageKind::Redis => Box::new(direct::InRedis::new(store)),
        StorageKind::RedisCached => Box::new(cached::Cached::new(store, max_bytes)),
        StorageKind::RedisLeased => Box::new(leased::Leased::new(store, max_bytes)),
        StorageKind::Memory => unreachable!("memory is no Redis storage"),
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
#[derive(Clone, Debug)]
pub struct RedisStore {
    /// The connection.
    pub redis: tollgate_redis::Redis,
    /// Prefix of every key (a counter's key is [`Keyspace::key`](tollgate_redis::Keyspace::key) of the prefix, under the
    /// namespace as tag, named by its limit's id, with its variables' values).
    pub prefix: String,
    /// Whose clock times the windows (see [`TimeSource::redis_time`]).
    pub time: RedisTime,
}
