//! `--storage redis-leased`: the counters of `--storage redis` (the same keys), spent from local
//! leases: each counter a call touches is decided by a [`LeasedLimiter`], which takes slices of
//! the counter's window from Redis in one script call and spends them here, so a hot counter
//! costs a round trip per slice, not per call. Leased hits have left the shared count, so
//! replicas together never admit more than a limit (no overshoot, unlike `redis-cached`); the
//! cost is under-admission: hits leased by a replica that does not spend them before the window
//! ends (bounded by the slices outstanding, which are sized from each replica's own rate).
//!
//! A call is all-or-nothing as with the other storages: when an enforcing counter has no room,
//! what the call took from the others goes back to this replica's slices. Listing and resetting
//! are `--storage redis`'s (the keys are the same); a reset also forgets this replica's slices
//! of the counters it deleted. On shutdown, what is leased and unspent goes back to Redis.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tollgate::{Clock, Lease, Meta, Quota};
use tollgate_policy::Policy;
use tollgate_redis::counters::WindowCounter;
use tollgate_redis::{BackendError, LeasedLimiter};

use super::redis::{InRedis, chosen_by, statuses};
use super::{Answer, Call, Later, RedisStore, Store, redis_accepts};
use crate::serve::admin::{CounterFilter, CounterList};
use crate::serve::engine::{Action, Loaded, Mode, Status, StorageError, StorageKind};

/// Counters in Redis, spent from leases held here.
pub(crate) struct Leased<C: Clock> {
    redis: InRedis,
    /// One limiter per quota (max_value, window): a limiter keeps a slice per Redis key, and the
    /// key names the limit and the values.
    limiters: RwLock<HashMap<(u64, Duration), LeasedLimiter<C>>>,
    /// Most bytes each limiter's per-key state takes (past it, a new key is decided in Redis).
    max_key_bytes: usize,
}

impl<C: Clock> Leased<C> {
    /// Counters in `store`, with at most `max_key_bytes` of per-key state per quota here.
    pub(crate) fn new(store: RedisStore, max_key_bytes: usize) -> Leased<C> {
        Leased { redis: InRedis::new(store), limiters: RwLock::default(), max_key_bytes }
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
                let quota = Quota::per(counter.window, counter.limit).expect("a loaded limit has a usable quota");
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

    /// Decides every counter of a call: each counter's state after the call, and whether it
    /// alone had no room.
    async fn decide_all(
        &self,
        call: &Call<'_, C>,
        counters: &[WindowCounter],
    ) -> Result<Vec<(Meta, bool)>, BackendError> {
        let mut decided = Vec::with_capacity(counters.len());
        let mut taken: Vec<(usize, LeasedLimiter<C>, Lease)> = Vec::new();
        let mut denied = false;
        for (i, counter) in counters.iter().enumerate() {
            let limiter = self.limiter(counter, call.clock);
            // Once an enforcing counter has denied the call, the others are only looked at:
            // taking and giving back would hold their budget in this replica's slices.
            let answer = if denied || call.action == Action::Check {
                limiter.check_or_error(&counter.key, counter.hits).await.map(|a| a.map(|meta| (meta, None)))
            } else {
                limiter.try_acquire_or_error(&counter.key, counter.hits).await.map(|a| a.map(|l| (l.meta(), Some(l))))
            };
            let answer = match answer {
                Ok(answer) => answer,
                Err(error) => {
                    // What this call took goes back before the error is answered.
                    give_back(counters, taken).await;
                    return Err(error);
                }
            };
            match answer {
                Ok((meta, lease)) => {
                    decided.push((meta, false));
                    taken.extend(lease.map(|lease| (i, limiter, lease)));
                }
                Err(no) => {
                    denied |= counter.enforce && call.action != Action::Report;
                    // A report counts what fits, each counter on its own, and limits nothing.
                    decided.push((no.meta(), call.action != Action::Report));
                }
            }
        }
        if denied {
            for (i, _, lease) in &taken {
                decided[*i].0.remaining = decided[*i].0.remaining.saturating_add(lease.permits());
            }
            give_back(counters, taken).await;
        }
        Ok(decided)
    }
}

/// Gives leases a call took back to this replica's slices (no round trip).
async fn give_back<C: Clock>(counters: &[WindowCounter], taken: Vec<(usize, LeasedLimiter<C>, Lease)>) {
    for (i, limiter, lease) in taken {
        if let Err(error) = limiter.give_back(&counters[i].key, lease).await {
            tracing::warn!(%error, key = %counters[i].key, "giving back a lease failed; its hits stay taken");
        }
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

    fn accepts(&self, policy: &Policy) -> Result<(), StorageError> {
        redis_accepts(policy, StorageKind::RedisLeased)
    }

    fn decide<'a>(&'a self, call: Call<'a, C>) -> Answer<'a, Result<Vec<Status>, BackendError>> {
        let (counters, slots) = self.redis.windows(&call);
        Answer::Later(Box::pin(async move {
            let decided = self.decide_all(&call, &counters).await?;
            Ok(statuses(call.hits, &slots, &decided))
        }))
    }

    fn list<'a>(
        &'a self,
        loaded: Arc<Loaded<C>>,
        namespace: &'a str,
        max: usize,
        clock: &'a C,
    ) -> Later<'a, Result<CounterList<C>, BackendError>> {
        Box::pin(self.redis.list_now(loaded, namespace, max, clock))
    }

    fn reset<'a>(
        &'a self,
        loaded: &'a Loaded<C>,
        namespace: &'a str,
        filter: &'a CounterFilter,
        clock: &'a C,
    ) -> Later<'a, Result<u64, BackendError>> {
        Box::pin(async move {
            let reset = self.redis.reset_now(loaded, namespace, filter, clock).await?;
            let chosen = chosen_by(loaded, &self.redis.store.prefix, namespace, filter);
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
