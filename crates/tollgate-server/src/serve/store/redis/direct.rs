//! `--storage redis`: fixed windows in Redis, a call decided in one script run (all-or-nothing in
//! `counters.lua`, so its mode is accuracy); listing and resetting by key (see [`super::common`]).

use tollgate::{Answer, Clock};
use tollgate_redis::BackendError;

use super::RedisStore;
use super::common::RedisCounters;
use crate::serve::model::{CounterFilter, CounterList, StorageKind};
use crate::serve::store::{Call, Decided, Later, Namespace, Store};

/// Counters in Redis, one round trip per call.
pub(super) struct InRedis {
    counters: RedisCounters,
}

impl InRedis {
    /// The store, with its metrics registered with the recorder in force now.
    pub(super) fn new(store: RedisStore) -> InRedis {
        InRedis { counters: RedisCounters::new(store, StorageKind::Redis) }
    }
}

impl<C: Clock> Store<C> for InRedis {
    fn kind(&self) -> StorageKind {
        StorageKind::Redis
    }

    fn decide<'a>(&'a self, call: Call<'a, C>) -> Decided<'a> {
        Answer::Pending(self.counters.decide(call))
    }

    fn list<'a>(&'a self, ns: Namespace<'a, C>, max: usize) -> Later<'a, Result<CounterList, BackendError>> {
        Box::pin(self.counters.list_now(ns.loaded, ns.name, max, |_, _| 0))
    }

    fn reset<'a>(&'a self, ns: Namespace<'a, C>, filter: &'a CounterFilter) -> Later<'a, Result<u64, BackendError>> {
        Box::pin(async move { self.counters.reset_now(&ns.loaded, ns.name, filter).await })
    }
}
