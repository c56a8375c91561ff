//! `--storage redis`: fixed windows in Redis, a call decided in one script run (all-or-nothing in
//! `counters.lua`); listing and resetting by key (see [`super::common`]).

use std::sync::Arc;

use tollgate::Clock;
use tollgate_redis::BackendError;

use super::RedisStore;
use super::common::RedisCounters;
use crate::serve::model::{CounterFilter, CounterList, Loaded, Mode, Status, StorageKind};
use crate::serve::store::{Answer, Call, Later, Store};

/// Counters in Redis, one round trip per call.
pub(super) struct InRedis {
    counters: RedisCounters,
}

impl InRedis {
    /// The store, with its metrics registered with the recorder in force now.
    pub(super) fn new(store: RedisStore) -> InRedis {
        InRedis { counters: RedisCounters::new(store) }
    }
}

impl<C: Clock> Store<C> for InRedis {
    fn kind(&self) -> StorageKind {
        StorageKind::Redis
    }

    /// One script run decides every counter of a call atomically.
    fn mode(&self) -> Mode {
        Mode::Accuracy
    }

    fn decide<'a>(&'a self, call: Call<'a, C>) -> Answer<'a, Result<Vec<Status>, BackendError>> {
        Answer::Later(self.counters.decide(call))
    }

    fn list<'a>(
        &'a self,
        loaded: Arc<Loaded>,
        namespace: &'a str,
        max: usize,
        _clock: &'a C,
    ) -> Later<'a, Result<CounterList, BackendError>> {
        Box::pin(self.counters.list_now(loaded, namespace, max))
    }

    fn reset<'a>(
        &'a self,
        loaded: &'a Loaded,
        namespace: &'a str,
        filter: &'a CounterFilter,
        _clock: &'a C,
    ) -> Later<'a, Result<u64, BackendError>> {
        Box::pin(self.counters.reset_now(loaded, namespace, filter))
    }
}
