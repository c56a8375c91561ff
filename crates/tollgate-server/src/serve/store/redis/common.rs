//! What the Redis stores share: a call's counters as Redis windows, decided in one script run
//! (all-or-nothing in `counters.lua`), and listing and resetting by key.
//!
//! A namespace's counters are its keys `{prefix}{namespace}:*` (the namespace is their hash tag,
//! so they are on one node of a cluster). They are found by SCAN, a bounded step per call
//! ([`SCAN_COUNT`] keys of the keyspace looked at), each key read back as (limit id, values) and
//! matched with the loaded limit of that id: keys of limits no longer loaded are skipped, and
//! expire on their own. A reset that names every variable of a limit deletes that one key without
//! a scan. Time is the one decisions use (the store's [`RedisTime`]: Redis `TIME`, or the engine's
//! clock with [`TimeSource::Server`](super::TimeSource::Server)), and a calendar limit's counter is
//! live in the calendar window of that time only, as decisions see it.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use tollgate::{Clock, Meta};
use tollgate_policy::{Enforcement, Limit, LimitId};
use tollgate_redis::counters::{
    CountersMode, StoredWindow, WindowCounter, WindowKey, decide_windows, delete_windows, scan_windows,
};
use tollgate_redis::{BackendError, Keyspace, RedisMetrics, RedisTime};

use super::RedisStore;
use crate::serve::model::{
    Action, CounterFilter, CounterList, CounterView, Loaded, Pick, Status, StorageKind, limits_by_id,
};
use crate::serve::store::{Call, Later};

/// Keys of the keyspace one SCAN step looks at (not how many it returns).
pub const SCAN_COUNT: usize = 1000;

/// Counters deleted per script call.
const DELETE_BATCH: usize = 500;

/// Counters in Redis on one prefix: what every Redis store decides, lists and resets with.
pub(super) struct RedisCounters {
    pub(super) store: RedisStore,
    /// The store's prefix, where its counters are.
    keyspace: Keyspace,
    /// `tollgate_redis_*{prefix}`: what a `RedisLimiter` on the same prefix would record.
    pub(super) metrics: RedisMetrics,
    /// True when the store charges the limits that count past their limit
    /// ([`StorageKind::counts_past`](crate::serve::StorageKind::counts_past)): their counters
    /// then hold up to their capacity, else up to `max_value`.
    counts_past: bool,
}

impl RedisCounters {
    /// The store (of `kind`), with its metrics registered with the recorder in force now.
    pub(super) fn new(store: RedisStore, kind: StorageKind) -> RedisCounters {
        let metrics = RedisMetrics::new(&store.prefix);
        let counts_past = kind.counts_past();
        RedisCounters { keyspace: Keyspace::new(store.prefix.as_str()), store, metrics, counts_past }
    }

    /// Decides a call in one script run on Redis: each counter's status, in the order of
    /// `call.hits`.
    pub(super) fn decide<'a, C: Clock>(&'a self, call: Call<'a, C>) -> Later<'a, Result<Vec<Status>, BackendError>> {
        let (counters, slots) = self.windows(&call);
        let mode = match call.action {
            _ if call.charge => CountersMode::Flush,
            Action::Check => CountersMode::Check,
            Action::Report => CountersMode::Report,
            Action::CheckAndReport => CountersMode::Take,
        };
        Box::pin(async move {
            let decided =
                self.measured(decide_windows(&self.store.redis, &counters, mode, &self.store.time)).await?.counters;
            Ok(statuses(&call, &slots, &decided))
        })
    }

    /// Whether a counter key of `namespace` is one `filter` chooses (a key of a limit no longer
    /// loaded, or of another namespace, is not).
    pub(super) fn chosen_by<'a>(
        &'a self,
        loaded: &'a Loaded,
        namespace: &'a str,
        filter: &'a CounterFilter,
    ) -> impl Fn(&str) -> bool + 'a {
        let by_id = limits_by_id(loaded, namespace);
        move |key| {
            parse_counter_key(&self.keyspace, namespace, key)
                .and_then(|(id, values)| Some(filter.matches(by_id.get(&id)?.1, &values)))
                .unwrap_or(false)
        }
    }

    /// A decision's round trip, timed (real time, even on a test clock: it measures Redis) and
    /// its failure counted.
    pub(super) async fn measured<T>(
        &self,
        call: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        let started = Instant::now();
        let answer = call.await;
        self.metrics.decided(started.elapsed());
        answer.inspect_err(|e| self.metrics.error(e))
    }

    /// The counters of a call as Redis counts them, each key once (see [`merge_repeated`]), and
    /// for each hit the index of its counter.
    pub(super) fn windows<C: Clock>(&self, call: &Call<'_, C>) -> (Vec<WindowCounter>, Vec<usize>) {
        let charged = |hit: &tollgate_policy::Hit<'_>| self.counts_past && hit.limit.counts_past();
        let counters = call
            .hits
            .iter()
            .map(|hit| WindowCounter {
                key: counter_key(&self.keyspace, call.namespace, hit.counter.id(), &hit.values),
                // A charged counter holds what it can; any other is decided against the hit's
                // limit (a request's own, on a counter it may share with a rule, included).
                limit: if charged(hit) { hit.limit.capacity() } else { hit.max_value },
                window: hit.counter.window(),
                hits: call.hits_on(hit),
                enforce: hit.limit.enforcement().denies(),
                charge: charged(hit),
                pooled: (hit.limit.enforcement() == Enforcement::Pooled).then(|| hit.limit.max_value()),
                calendar: hit.limit.calendar().map(|c| self.store.time.window_us(|unix| c.window_at(unix))),
                opened_ago: std::time::Duration::ZERO,
            })
            .collect();
        merge_repeated(counters)
    }

    /// Up to `max` live counters of `namespace`, at the store's time; `held` says how many hits
    /// of a counter (by its Redis key and limit) this process holds unspent, which Redis counts
    /// as used.
    pub(super) async fn list_now(
        &self,
        loaded: Arc<Loaded>,
        namespace: &str,
        max: usize,
        held: impl Fn(&str, &Limit) -> u64,
    ) -> Result<CounterList, BackendError> {
        let by_id = limits_by_id(&loaded, namespace);
        let calendars = self.calendars(by_id.values().map(|(_, limit)| *limit));
        let mut counters = Vec::new();
        let mut truncated = false;
        if !by_id.is_empty() {
            let mut seen = HashSet::new();
            self.scan(namespace, |now_us, window| {
                let Some((id, values)) = parse_counter_key(&self.keyspace, namespace, &window.key) else { return true };
                let Some(&(index, limit)) = by_id.get(&id) else { return true };
                let calendar = calendars.get(&id).copied();
                let Some((remaining, reset_us)) = window.state(limit.max_value(), calendar, now_us) else {
                    return true;
                };
                let remaining = remaining.saturating_add(held(&window.key, limit)).min(limit.max_value());
                if values.len() != limit.variables().len() || !seen.insert(window.key) {
                    return true;
                }
                if counters.len() == max {
                    truncated = true;
                    return false;
                }
                let meta = Meta {
                    limit: limit.max_value(),
                    remaining,
                    reset_ns: reset_us.saturating_mul(1000),
                    retry_ns: None,
                };
                counters.push(CounterView { limit: index, values, meta });
                true
            })
            .await?;
        }
        Ok(CounterList { loaded, counters, truncated })
    }

    /// Deletes the counters of `namespace` that `filter` chooses; returns how many were live.
    pub(super) async fn reset_now(
        &self,
        loaded: &Loaded,
        namespace: &str,
        filter: &CounterFilter,
    ) -> Result<u64, BackendError> {
        let store = &self.store;
        let calendars = self.calendars(loaded.policy.namespace(namespace));
        let key = |key: String, limit: &Limit| WindowKey {
            key,
            window: limit.window(),
            calendar: calendars.get(&limit.id()).copied(),
        };
        let mut exact = Vec::new();
        let mut scanned = HashMap::new();
        for &index in loaded.policy.namespace_indexes(namespace) {
            let limit = &loaded.policy.limits()[index];
            match filter.pick(limit) {
                Pick::Nothing => {}
                Pick::One(values) => {
                    exact.push(key(counter_key(&self.keyspace, namespace, limit.id(), &values), limit))
                }
                Pick::Matching => {
                    scanned.insert(limit.id(), limit);
                }
            }
        }
        let mut reset = 0;
        for batch in exact.chunks(DELETE_BATCH) {
            reset += delete_windows(&store.redis, batch, &store.time).await?;
        }
        if scanned.is_empty() {
            return Ok(reset);
        }
        let mut seen = HashSet::new();
        let mut chosen = Vec::new();
        // Found keys are deleted a page at a time, between steps of the scan (which a delete
        // does not disturb: SCAN still returns every key present throughout).
        let mut cursor = 0;
        loop {
            let page = scan_windows(&store.redis, &self.keyspace, namespace, cursor, SCAN_COUNT, &store.time).await?;
            for window in page.windows {
                let Some((id, values)) = parse_counter_key(&self.keyspace, namespace, &window.key) else { continue };
                let Some(limit) = scanned.get(&id) else { continue };
                if filter.matches(limit, &values) && seen.insert(window.key.clone()) {
                    chosen.push(key(window.key, limit));
                }
            }
            for batch in chosen.chunks(DELETE_BATCH) {
                reset += delete_windows(&store.redis, batch, &store.time).await?;
            }
            chosen.clear();
            cursor = page.cursor;
            if cursor == 0 {
                return Ok(reset);
            }
        }
    }

    /// The current calendar window (µs, on the clock Redis decides with) of each calendar limit.
    fn calendars<'l>(&self, limits: impl Iterator<Item = &'l Limit>) -> HashMap<LimitId, (u64, u64)> {
        let time: &RedisTime = &self.store.time;
        limits
            .filter_map(|limit| {
                let calendar = limit.calendar()?;
                Some((limit.id(), time.window_us(|unix| calendar.window_at(unix))))
            })
            .collect()
    }

    /// Scans the counters of `namespace`, calling `found` with each step's time (µs) and each
    /// counter found, until the scan ends or `found` says to stop.
    async fn scan(
        &self,
        namespace: &str,
        mut found: impl FnMut(u64, StoredWindow) -> bool,
    ) -> Result<(), BackendError> {
        let mut cursor = 0;
        loop {
            let page = scan_windows(&self.store.redis, &self.keyspace, namespace, cursor, SCAN_COUNT, &self.store.time)
                .await?;
            for window in page.windows {
                if !found(page.now_us, window) {
                    return Ok(());
                }
            }
            cursor = page.cursor;
            if cursor == 0 {
                return Ok(());
            }
        }
    }
}

/// Each hit's status from what its counter (at `slots[i]`) answered.
pub(super) fn statuses<C: Clock>(call: &Call<'_, C>, slots: &[usize], decided: &[(Meta, bool)]) -> Vec<Status> {
    (call.hits.iter().zip(slots))
        .map(|(hit, &slot)| {
            let (meta, limited) = decided.get(slot).copied().unwrap_or_default();
            Status {
                limit: hit.index,
                descriptor: hit.descriptor,
                hits: call.hits_on(hit),
                meta,
                limited,
                past: 0,
                charged: false,
            }
        })
        .collect()
}

/// The counters of a call with each key once, their hits summed, and for each counter given the
/// index of its key in the result. A limit matched against each descriptor on its own
/// ([`Limit::descriptor_keys`]) touches one counter twice when two descriptors give it the same
/// values; Redis's script and the cache read a key's count once per call, so each key must come
/// once (the hits then fit or not together, as they would one after the other).
fn merge_repeated(counters: Vec<WindowCounter>) -> (Vec<WindowCounter>, Vec<usize>) {
    let mut merged: Vec<WindowCounter> = Vec::with_capacity(counters.len());
    let mut slots = Vec::with_capacity(counters.len());
    for counter in counters {
        match merged.iter().position(|m| m.key == counter.key) {
            Some(i) => {
                merged[i].hits = merged[i].hits.saturating_add(counter.hits);
                slots.push(i);
            }
            None => {
                slots.push(merged.len());
                merged.push(counter);
            }
        }
    }
    (merged, slots)
}

/// The Redis key of one counter: [`Keyspace::key`] under the namespace (the hash tag, so all
/// counters of a call are on one Cluster node), named by the limit's id, with the variables'
/// values (length-prefixed, so no value can forge another key); [`parse_counter_key`] reads it back.
pub(crate) fn counter_key(keyspace: &Keyspace, namespace: &str, limit: LimitId, values: &[String]) -> String {
    keyspace.key(namespace, &limit.to_string(), values)
}

/// The limit's id and the variables' values of a [`counter_key`] of `namespace`.
fn parse_counter_key(keyspace: &Keyspace, namespace: &str, key: &str) -> Option<(LimitId, Vec<String>)> {
    let (id, values) = keyspace.parse(namespace, key)?;
    if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let id = LimitId(u64::from_str_radix(id, 16).ok()?);
    Some((id, values.into_iter().map(str::to_owned).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_key_parses_back_to_its_limit_and_values() {
        let values = vec!["a:1:b".to_string(), String::new(), "12".to_string(), "é:".to_string()];
        let space = Keyspace::new("rl:");
        let key = counter_key(&space, "ns:{x}", LimitId(0xfeed), &values);
        // Deployed counters live under these keys: the layout must not move.
        assert_eq!(key, "rl:{ns:{x}}:000000000000feed:5:a:1:b:0::2:12:3:é:");
        assert_eq!(parse_counter_key(&space, "ns:{x}", &key), Some((LimitId(0xfeed), values)));
        assert_eq!(
            parse_counter_key(&space, "ns:{x}", &counter_key(&space, "ns:{x}", LimitId(7), &[])),
            Some((LimitId(7), vec![]))
        );
        let head = space.head("ns:{x}");
        for bad in ["", "000000000000007", "000000000000000g", "0000000000000007:3:ab", "0000000000000007:x:ab"] {
            assert_eq!(parse_counter_key(&space, "ns:{x}", &format!("{head}{bad}")), None, "{bad}");
        }
        assert_eq!(parse_counter_key(&space, "ns:{x}", "other:{ns:{x}}:0000000000000007"), None);
    }
}
