//! `--storage redis-cached`: counters decided in memory by [`Cache`], loaded from Redis on first
//! sight and flushed to it in batches (see [`super::cache`] for the overshoot this allows across
//! replicas). Listing and resetting flush this replica's pending hits first, so that they see what
//! it counted; a reset then deletes in Redis and forgets the local copies with no flush in between.
//! Other replicas keep their local copy of a reset counter until they flush hits for it or its
//! window ends: a reset meant for every replica is sent to each.

use tollgate::{Answer, Clock};
use tollgate_redis::BackendError;

use super::RedisStore;
use super::cache::Cache;
use super::common::{RedisCounters, statuses};
use crate::serve::model::{Action, CounterFilter, CounterList, StorageKind};
use crate::serve::store::{Call, Decided, Later, Namespace, Store};

/// Counters decided here, kept in step with Redis.
pub(super) struct Cached {
    redis: RedisCounters,
    cache: Cache,
}

impl Cached {
    /// Counters in `store`, cached here up to `max_bytes` (see [`super::cache`]).
    pub(super) fn new(store: RedisStore, max_bytes: usize) -> Cached {
        Cached { redis: RedisCounters::new(store, StorageKind::RedisCached), cache: Cache::new(max_bytes) }
    }
}

impl<C: Clock> Store<C> for Cached {
    fn kind(&self) -> StorageKind {
        StorageKind::RedisCached
    }

    fn decide<'a>(&'a self, call: Call<'a, C>) -> Decided<'a> {
        let (counters, slots) = self.redis.windows(&call);
        let missing = self.cache.missing(&counters);
        if !missing.is_empty() && !self.cache.has_room(&missing) {
            // Full: decided where the counters live, nothing kept here.
            return Answer::Pending(self.redis.decide(call));
        }
        let clock = call.clock;
        let decide = move || {
            let now = call.clock.now();
            let decided: Vec<_> = match call.action {
                // A report counts what happened: each counter on its own, as far as it has room.
                Action::Report => counters
                    .iter()
                    .flat_map(|c| self.cache.decide(std::slice::from_ref(c), true, now))
                    .map(|(meta, _)| (meta, false))
                    .collect(),
                action => self.cache.decide(&counters, action != Action::Check, now),
            };
            statuses(&call, &slots, &decided)
        };
        if missing.is_empty() {
            return Answer::Ready(Ok(decide()));
        }
        Answer::Pending(Box::pin(async move {
            let store = &self.redis.store;
            let load = self.cache.load(&store.redis, missing, clock.now(), &store.time);
            self.redis.measured(load).await?;
            Ok(decide())
        }))
    }

    fn list<'a>(&'a self, ns: Namespace<'a, C>, max: usize) -> Later<'a, Result<CounterList, BackendError>> {
        Box::pin(async move {
            Store::<C>::flush(self, ns.clock).await?;
            self.redis.list_now(ns.loaded, ns.name, max, |_, _| 0).await
        })
    }

    fn reset<'a>(&'a self, ns: Namespace<'a, C>, filter: &'a CounterFilter) -> Later<'a, Result<u64, BackendError>> {
        Box::pin(async move {
            let store = &self.redis.store;
            let held = self.cache.hold_flushes().await;
            let flushed = self.cache.flush_held(&held, &store.redis, ns.clock.now(), &store.time).await;
            flushed.inspect_err(|e| self.redis.metrics.error(e))?;
            let reset = self.redis.reset_now(&ns.loaded, ns.name, filter).await?;
            self.cache.forget(&held, self.redis.chosen_by(&ns.loaded, ns.name, filter));
            Ok(reset)
        })
    }

    fn local_bytes(&self) -> Option<(usize, usize)> {
        Some((self.cache.bytes(), self.cache.max_bytes()))
    }

    fn flush<'a>(&'a self, clock: &'a C) -> Later<'a, Result<usize, BackendError>> {
        let store = &self.redis.store;
        let flush = self.cache.flush(&store.redis, clock.now(), &store.time);
        Box::pin(async move { flush.await.inspect_err(|e| self.redis.metrics.error(e)) })
    }
}
