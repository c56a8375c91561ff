//! `--storage redis-leased`: the counters of `--storage redis` (the same keys), spent from local
//! leases: each counter a call touches is decided by a [`LeasedLimiter`], which takes slices of
//! the counter's window from Redis in one script call and spends them here, so a hot counter
//! costs a round trip per slice, not per call. Leased hits have left the shared count, so
//! replicas together never admit more than a limit (no overshoot, unlike `redis-cached`); the
//! cost is under-admission: hits leased by a replica that does not spend them before the window
//! ends (bounded by the slices outstanding, which are sized from each replica's own rate).
//!
//! A call is all-or-nothing by the rule every storage follows ([`AllOrNothing`]): when an
//! enforcing counter has no room, the later ones are only checked, and what the call took from
//! the earlier ones goes back to this replica's slices. Listing and resetting
//! are `--storage redis`'s (the keys are the same), except that a listed counter's `remaining`
//! includes what this replica holds unspent (Redis counts leased hits as used; other replicas'
//! unspent slices still do); a reset also forgets this replica's slices of the counters it
//! deleted. On shutdown, what is leased and unspent goes back to Redis.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use tollgate::{AllOrNothing, Answer, Clock, Lease, Meta, Quota, Reply, Step};
use tollgate_redis::counters::WindowCounter;
use tollgate_redis::{BackendError, LeasedLimiter};

use super::RedisStore;
use super::common::{RedisCounters, statuses};
use crate::serve::model::{Action, CounterFilter, CounterList, Mode, StorageKind};
use crate::serve::store::{Call, Decided, Later, Namespace, Store};

/// Counters in Redis, spent from leases held here.
pub(super) struct Leased<C: Clock> {
    redis: RedisCounters,
    /// One limiter per quota (max_value, window): a limiter keeps a slice per Redis key, and the
    /// key names the limit and the values.
    limiters: RwLock<HashMap<(u64, Duration), LeasedLimiter<C>>>,
    /// Most bytes each limiter's per-key state takes (past it, a new key is decided in Redis).
    max_key_bytes: usize,
}

impl<C: Clock> Leased<C> {
    /// Counters in `store`, with at most `max_key_bytes` of per-key state per quota here.
    pub(super) fn new(store: RedisStore, max_key_bytes: usize) -> Leased<C> {
        Leased {
            redis: RedisCounters::new(store, StorageKind::RedisLeased),
            limiters: RwLock::default(),
            max_key_bytes,
        }
    }

    /// The limiter of `counter`'s quota, built on first use.
    fn limiter(&self, counter: &WindowCounter, clock: &C) -> LeasedLimiter<C> {
        let quota_key = (counter.limit, counter.window);
        if let Some(limiter) = self.limiters.read().unwrap_or_else(|e| e.into_inner()).get(&quota_key) {
            return limiter.clone();
        }
        let mut limiters = self.limiters.write().unwrap_or_else(|e| e.into_inner());
        limiters
            .entry(quota_key)
            .or_insert_with(|| {
                let store = &self.redis.store;
                let quota = Quota::window(counter.window, counter.limit).expect("a loaded limit has a usable quota");
                LeasedLimiter::builder(&store.redis, &store.prefix, quota)
                    .whole_keys()
                    .max_key_bytes(self.max_key_bytes)
                    .metrics(self.redis.metrics.clone())
                    .clock(clock.clone())
                    .time(store.time.clone())
                    .build()
                    .expect("one limit with whole keys is a valid leased limiter")
            })
            .clone()
    }

    fn all(&self) -> Vec<LeasedLimiter<C>> {
        self.limiters.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// Decides every counter of a call by the one all-or-nothing rule ([`AllOrNothing`]): each
    /// counter's state after the call, and whether it alone had no room.
    async fn decide_all(
        &self,
        call: &Call<'_, C>,
        counters: &[WindowCounter],
    ) -> Result<Vec<(Meta, bool)>, BackendError> {
        // A report counts what fits, each counter on its own, and limits nothing.
        let reports = call.action == Action::Report;
        let enforces = counters.iter().map(|c| !reports && c.enforce);
        let mut decided = match call.action {
            Action::Check => AllOrNothing::check(enforces),
            Action::Report | Action::CheckAndReport => AllOrNothing::new(enforces),
        };
        let limiters: Vec<LeasedLimiter<C>> = counters.iter().map(|c| self.limiter(c, call.clock)).collect();
        while let Some(step) = decided.step() {
            let i = step.part();
            let (limiter, key, n) = (&limiters[i], counters[i].key.as_str(), counters[i].hits);
            let reply = match step {
                Step::Take(_) => limiter.try_acquire_or_error(key, n).await.map(Reply::Took),
                Step::Check(_) => limiter.check_or_error(key, n).await.map(Reply::Checked),
                // Given back to this replica's slice: its state is known here, no round trip.
                Step::Probe(_) => limiter.check_or_error(key, 0).await.map(Reply::Checked),
                Step::GiveBack(_, lease) => {
                    give_back(limiter, key, lease).await;
                    Ok(Reply::GaveBack)
                }
            };
            match reply {
                Ok(reply) => decided.reply(reply),
                Err(error) => {
                    // What this call took goes back before the error is answered.
                    for (i, lease) in decided.abandon() {
                        give_back(&limiters[i], &counters[i].key, lease).await;
                    }
                    return Err(error);
                }
            }
        }
        Ok(decided.finish().parts().iter().map(|part| (part.meta(), !reports && part.is_limited())).collect())
    }
}

/// Gives a lease a call took back to this replica's slice (no round trip).
async fn give_back<C: Clock>(limiter: &LeasedLimiter<C>, key: &str, lease: Lease) {
    if let Err(error) = limiter.give_back(key, lease).await {
        tracing::warn!(%error, %key, "giving back a lease failed; its hits stay taken");
    }
}

impl<C: Clock> Store<C> for Leased<C> {
    fn kind(&self) -> StorageKind {
        StorageKind::RedisLeased
    }

    /// A call's counters are decided one after the other, and what a limited call took from
    /// some goes back: all-or-nothing, as in accuracy mode, but not under one lock.
    fn mode(&self) -> Mode {
        Mode::Throughput
    }

    fn decide<'a>(&'a self, call: Call<'a, C>) -> Decided<'a> {
        let (counters, slots) = self.redis.windows(&call);
        Answer::Pending(Box::pin(async move {
            let decided = self.decide_all(&call, &counters).await?;
            Ok(statuses(&call, &slots, &decided))
        }))
    }

    fn list<'a>(&'a self, ns: Namespace<'a, C>, max: usize) -> Later<'a, Result<CounterList, BackendError>> {
        // Redis counts what is leased out as used: this replica's unspent slices are added back,
        // so one replica lists what it admitted; other replicas' unspent slices still count.
        let held = |key: &str, limit: &tollgate_policy::Limit| {
            let limiters = self.limiters.read().unwrap_or_else(|e| e.into_inner());
            limiters.get(&(limit.max_value(), limit.window())).map_or(0, |limiter| limiter.held(key))
        };
        Box::pin(self.redis.list_now(ns.loaded, ns.name, max, held))
    }

    fn reset<'a>(&'a self, ns: Namespace<'a, C>, filter: &'a CounterFilter) -> Later<'a, Result<u64, BackendError>> {
        Box::pin(async move {
            let reset = self.redis.reset_now(&ns.loaded, ns.name, filter).await?;
            let chosen = self.redis.chosen_by(&ns.loaded, ns.name, filter);
            for limiter in self.all() {
                limiter.forget(&chosen);
            }
            Ok(reset)
        })
    }

    /// Returns every slice's unspent hits to Redis.
    fn close<'a>(&'a self, _clock: &'a C) -> Later<'a, Result<(), BackendError>> {
        Box::pin(async move {
            for limiter in self.all() {
                let returned = limiter.release().await?;
                tracing::debug!(returned, "leased hits returned to redis");
            }
            Ok(())
        })
    }
}
