//! `--storage memory`: the engine's own counters ([`Loaded`]'s keyed limiters), in accuracy or
//! throughput mode.

use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};

use tollgate::Clock;
use tollgate_policy::{Hit, Policy};
use tollgate_redis::BackendError;

use super::{Answer, Call, Later, Store};
use crate::serve::admin::{CounterFilter, CounterList, Pick};
use crate::serve::engine::{Action, CounterView, Loaded, Mode, Status, StorageError, StorageKind};

/// Lock stripes for accuracy mode: a request locks the stripes of the counters it touches (in
/// index order, so two requests never wait on each other in a cycle). More stripes, fewer false
/// conflicts; 4096 mutexes cost 16-64 KiB.
const STRIPES: usize = 4096;

/// Counters in memory. In accuracy mode a call holds the lock stripes of every counter it touches
/// while it decides; in throughput mode it holds none.
pub(crate) struct Memory {
    /// `None` in throughput mode.
    stripes: Option<Box<[Mutex<()>]>>,
    hasher: hashbrown::DefaultHashBuilder,
}

impl Memory {
    pub(crate) fn new(mode: Mode) -> Memory {
        let stripes = match mode {
            Mode::Accuracy => Some((0..STRIPES).map(|_| Mutex::new(())).collect()),
            Mode::Throughput => None,
        };
        Memory { stripes, hasher: Default::default() }
    }

    /// Locks the stripes of every counter `hits` touches, in stripe order (none in throughput mode).
    fn lock(&self, hits: &[Hit<'_>]) -> Vec<MutexGuard<'_, ()>> {
        let Some(locks) = &self.stripes else { return Vec::new() };
        let mut stripes: Vec<usize> =
            hits.iter().map(|h| self.hasher.hash_one((h.limit.id(), &h.values)) as usize % STRIPES).collect();
        stripes.sort_unstable();
        stripes.dedup();
        stripes.into_iter().map(|i| locks[i].lock().unwrap_or_else(|e| e.into_inner())).collect()
    }

    fn decide_now<C: Clock>(&self, call: &Call<'_, C>) -> Vec<Status> {
        let (loaded, hits) = (call.loaded, call.hits);
        let mut statuses = Vec::with_capacity(hits.len());
        let status =
            |hit: &Hit<'_>, meta, limited| Status { limit: hit.index, descriptor: hit.descriptor, meta, limited };
        match call.action {
            Action::Check => {
                for hit in hits {
                    let decided = loaded.counters[hit.index].check(&hit.values, call.hits_on(hit));
                    statuses.push(status(hit, decided.unwrap_or_else(|r| r.meta()), decided.is_err()));
                }
            }
            Action::Report => {
                for hit in hits {
                    // A report counts what happened; a counter already full stays full.
                    let meta = match loaded.counters[hit.index].take(&hit.values, call.hits_on(hit)) {
                        Ok(lease) => lease.meta(),
                        Err(rejected) => rejected.meta(),
                    };
                    statuses.push(status(hit, meta, false));
                }
            }
            Action::CheckAndReport => {
                let _held = self.lock(hits);
                let mut taken = Vec::with_capacity(hits.len());
                let mut limited = false;
                for hit in hits {
                    let counters = &loaded.counters[hit.index];
                    let delta = call.hits_on(hit);
                    if limited {
                        // Already limited: report the others' state, take nothing more.
                        let decided = counters.check(&hit.values, delta);
                        statuses.push(status(hit, decided.unwrap_or_else(|r| r.meta()), decided.is_err()));
                        continue;
                    }
                    match counters.take(&hit.values, delta) {
                        Ok(lease) => {
                            statuses.push(status(hit, lease.meta(), false));
                            taken.push((statuses.len() - 1, hit.index, &hit.values, lease));
                        }
                        Err(rejected) => {
                            statuses.push(status(hit, rejected.meta(), true));
                            // A shadow or quota limit without room takes nothing and stops nothing.
                            limited = hit.limit.enforcement().denies();
                        }
                    }
                }
                if limited {
                    // All or nothing. In accuracy mode the locks are still held, so no other
                    // request saw these permits gone.
                    for (i, index, values, lease) in taken {
                        let counters = &loaded.counters[index];
                        counters.give_back(values, lease);
                        statuses[i].meta = counters.check(values, 0).unwrap_or_else(|r| r.meta());
                    }
                }
            }
        }
        statuses
    }
}

impl<C: Clock> Store<C> for Memory {
    fn kind(&self) -> StorageKind {
        StorageKind::Memory
    }

    fn mode(&self) -> Mode {
        if self.stripes.is_some() { Mode::Accuracy } else { Mode::Throughput }
    }

    fn accepts(&self, _policy: &Policy) -> Result<(), StorageError> {
        Ok(())
    }

    #[inline]
    fn decide<'a>(&'a self, call: Call<'a, C>) -> Answer<'a, Result<Vec<Status>, BackendError>> {
        Answer::Now(Ok(self.decide_now(&call)))
    }

    fn list<'a>(
        &'a self,
        loaded: Arc<Loaded<C>>,
        namespace: &'a str,
        max: usize,
        _clock: &'a C,
    ) -> Later<'a, Result<CounterList<C>, BackendError>> {
        let mut counters = Vec::new();
        let mut truncated = false;
        for &index in loaded.policy.namespace_indexes(namespace) {
            loaded.counters[index].for_each(|values, meta| {
                if counters.len() < max {
                    counters.push(CounterView { limit: index, values: values.clone(), meta });
                } else {
                    truncated = true;
                }
            });
        }
        Box::pin(std::future::ready(Ok(CounterList { loaded, counters, truncated })))
    }

    fn reset<'a>(
        &'a self,
        loaded: &'a Loaded<C>,
        namespace: &'a str,
        filter: &'a CounterFilter,
        _clock: &'a C,
    ) -> Later<'a, Result<u64, BackendError>> {
        let mut reset = 0;
        for &index in loaded.policy.namespace_indexes(namespace) {
            let limit = &loaded.policy.limits()[index];
            let counters = &loaded.counters[index];
            reset += match filter.pick(limit) {
                Pick::Nothing => 0,
                Pick::One(values) => usize::from(counters.reset(&values)),
                Pick::Matching => counters.reset_matching(|values| filter.matches(limit, values)),
            };
        }
        Box::pin(std::future::ready(Ok(reset as u64)))
    }
}
