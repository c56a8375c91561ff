//! `--storage memory`: the engine's own counters ([`Loaded`]'s keyed limiters), in accuracy or
//! throughput mode.

use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};

use tollgate::{AllOrNothing, Answer, Clock};
use tollgate_policy::{Enforcement, Hit};
use tollgate_redis::BackendError;

use super::own_limit::OwnLimit;
use super::{Call, Decided, Later, Namespace, Store};
use crate::serve::model::{Action, CounterFilter, CounterList, CounterView, Mode, Pick, Status, StorageKind};

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
            hits.iter().map(|h| self.hasher.hash_one((h.counter.id(), &h.values)) as usize % STRIPES).collect();
        stripes.sort_unstable();
        stripes.dedup();
        stripes.into_iter().map(|i| locks[i].lock().unwrap_or_else(|e| e.into_inner())).collect()
    }

    /// Decides a call by the one all-or-nothing rule ([`AllOrNothing`]); in accuracy mode the
    /// stripes of its counters are held throughout, so no other call sees permits taken and
    /// given back. The counters of limits that [count
    /// past](tollgate_policy::Limit::counts_past) their limit are charged, whatever the outcome.
    fn decide_now<C: Clock>(&self, call: &Call<'_, C>) -> Vec<Status> {
        if call.charge {
            return self.charge_now(call);
        }
        if call.action == Action::CheckAndReport && call.hits.iter().any(|h| h.limit.counts_past()) {
            return self.decide_charging(call);
        }
        let _held = (call.action == Action::CheckAndReport).then(|| self.lock(call.hits));
        self.all_or_nothing(call)
    }

    /// A call some of whose counters count past their limit: those are charged, the others
    /// decided all or nothing — only checked when the call has pooled counters and every one is
    /// over with its hits (envoy/ratelimit's `quota_mode`) — under the stripes of all of them;
    /// statuses in the call's order.
    fn decide_charging<C: Clock>(&self, call: &Call<'_, C>) -> Vec<Status> {
        let _held = self.lock(call.hits);
        let (charged, decided): (Vec<_>, Vec<_>) = call.hits.iter().cloned().partition(|h| h.limit.counts_past());
        let charged: Vec<Status> = charged.iter().map(|hit| charge(call, hit)).collect();
        let limits = call.loaded.policy.limits();
        let pooled = charged.iter().filter(|s| limits[s.limit].enforcement() == Enforcement::Pooled);
        let (pooled, over) = pooled.fold((0, 0), |(n, over), s| {
            let limit = &limits[s.limit];
            (n + 1, over + usize::from(limit.over(s.meta, 0)))
        });
        let action = if pooled > 0 && over == pooled { Action::Check } else { call.action };
        let mut charged = charged.into_iter();
        let mut decided = self.all_or_nothing(&Call { hits: &decided, action, ..*call }).into_iter();
        let mut next = |hit: &Hit<'_>| if hit.limit.counts_past() { charged.next() } else { decided.next() };
        call.hits.iter().map(|hit| next(hit).expect("a status per hit")).collect()
    }

    /// The all-or-nothing decision of a call's counters (their stripes held by the caller).
    fn all_or_nothing<C: Clock>(&self, call: &Call<'_, C>) -> Vec<Status> {
        let (loaded, hits) = (call.loaded, call.hits);
        // A report counts what happened, each counter on its own: a full one stays full, and
        // nothing is limited.
        let reports = call.action == Action::Report;
        let enforces = hits.iter().map(|hit| !reports && hit.limit.enforcement().denies());
        let decided = match call.action {
            Action::Check => AllOrNothing::check(enforces),
            Action::Report | Action::CheckAndReport => AllOrNothing::new(enforces),
        };
        let outcome = decided.run_now(|step| {
            let hit = &hits[step.part()];
            let counters = &*loaded.counters[hit.counter_index];
            // Counters that hold more than the hit's limit (a request's own, or a rule's shared
            // with those) are seen through it; charged ones never come here to be decided.
            if hit.max_value < hit.counter.capacity() && !hit.limit.counts_past() {
                step.run(&OwnLimit { counters, max: hit.max_value }, &hit.values[..], call.hits_on(hit))
            } else {
                step.run(counters, &hit.values[..], call.hits_on(hit))
            }
        });
        (hits.iter().zip(outcome.parts()))
            .map(|(hit, part)| Status {
                limit: hit.index,
                descriptor: hit.descriptor,
                hits: call.hits_on(hit),
                meta: part.meta(),
                limited: !reports && part.is_limited(),
                past: 0,
                charged: false,
            })
            .collect()
    }

    /// Charges each counter its hits, or what is left of its window if less (see
    /// [`Call::charge`]), under the stripes of the call's counters in accuracy mode.
    fn charge_now<C: Clock>(&self, call: &Call<'_, C>) -> Vec<Status> {
        let _held = self.lock(call.hits);
        call.hits.iter().map(|hit| charge(call, hit)).collect()
    }
}

/// Charges a counter its hits, or what is left of its window if less.
fn charge<C: Clock>(call: &Call<'_, C>, hit: &Hit<'_>) -> Status {
    let (counters, key, hits) = (&*call.loaded.counters[hit.counter_index], &hit.values[..], call.hits_on(hit));
    let take = |n| counters.decide(key, n).now().unwrap_or_else(|_| unreachable!("in memory, at once"));
    let meta = match take(hits) {
        Ok(lease) => lease.meta(),
        Err(full) if full.meta().remaining == 0 => full.meta(),
        Err(full) => take(full.meta().remaining).map_or_else(|r| r.meta(), |lease| lease.meta()),
    };
    Status { limit: hit.index, descriptor: hit.descriptor, hits, meta, limited: false, past: 0, charged: false }
}

impl<C: Clock> Store<C> for Memory {
    fn kind(&self) -> StorageKind {
        StorageKind::Memory
    }

    fn mode(&self) -> Mode {
        if self.stripes.is_some() { Mode::Accuracy } else { Mode::Throughput }
    }

    #[inline]
    fn decide<'a>(&'a self, call: Call<'a, C>) -> Decided<'a> {
        Answer::Ready(Ok(self.decide_now(&call)))
    }

    fn list<'a>(&'a self, ns: Namespace<'a, C>, max: usize) -> Later<'a, Result<CounterList, BackendError>> {
        let (loaded, mut counters, mut truncated) = (ns.loaded, Vec::new(), false);
        for &index in loaded.policy.namespace_indexes(ns.name) {
            let limit = &loaded.policy.limits()[index];
            loaded.counters[index].for_each(&mut |values, meta| {
                if counters.len() < max {
                    counters.push(CounterView { limit: index, values: values.clone(), meta: limit.reported(meta) });
                } else {
                    truncated = true;
                }
            });
        }
        Box::pin(std::future::ready(Ok(CounterList { loaded, counters, truncated })))
    }

    fn reset<'a>(&'a self, ns: Namespace<'a, C>, filter: &'a CounterFilter) -> Later<'a, Result<u64, BackendError>> {
        let (loaded, mut reset) = (ns.loaded, 0);
        for &index in loaded.policy.namespace_indexes(ns.name) {
            let limit = &loaded.policy.limits()[index];
            let counters = &loaded.counters[index];
            reset += match filter.pick(limit) {
                Pick::Nothing => 0,
                Pick::One(values) => usize::from(counters.reset(&values)),
                Pick::Matching => counters.reset_matching(&mut |values| filter.matches(limit, values)),
            };
        }
        Box::pin(std::future::ready(Ok(reset as u64)))
    }
}
