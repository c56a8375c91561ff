//! `--storage redis`: fixed windows in Redis, a call decided in one script run (all-or-nothing in
//! `counters.lua`); listing and resetting by key.
//!
//! A namespace's counters are its keys `{prefix}{namespace}:*` (the namespace is their hash tag,
//! so they are on one node of a cluster). They are found by SCAN, a bounded step per call
//! ([`SCAN_COUNT`] keys of the keyspace looked at), each key read back as (limit id, values) and
//! matched with the loaded limit of that id: keys of limits no longer loaded are skipped, and
//! expire on their own. A reset that names every variable of a limit deletes that one key without
//! a scan. Time is the one decisions use (Redis `TIME`, or the engine's clock with
//! [`TimeSource::Server`](super::TimeSource::Server)), and a calendar limit's counter is live in
//! the calendar window of that time only, as decisions see it.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use tollgate::{Clock, Meta};
use tollgate_policy::{Hit, Limit, LimitId, Policy};
use tollgate_redis::{
    BackendError, CountersMode, RedisMetrics, StoredWindow, WindowCounter, WindowKey, decide_windows, delete_windows,
    glob_escape, scan_windows,
};

use super::{Answer, Call, Later, RedisStore, Store, redis_accepts};
use crate::serve::admin::{CounterFilter, CounterList, Pick, limits_by_id};
use crate::serve::engine::{Action, CounterView, Loaded, Mode, Status, StorageError, StorageKind};

/// Keys of the keyspace one SCAN step looks at (not how many it returns).
pub const SCAN_COUNT: usize = 1000;

/// Counters deleted per script call.
const DELETE_BATCH: usize = 500;

/// Counters in Redis, one round trip per call.
pub(crate) struct InRedis {
    pub(crate) store: RedisStore,
    /// `tollgate_redis_*{prefix}`: what a `RedisLimiter` on the same prefix would record.
    pub(crate) metrics: RedisMetrics,
}

impl InRedis {
    /// The store, with its metrics registered with the recorder in force now.
    pub(crate) fn new(store: RedisStore) -> InRedis {
        let metrics = RedisMetrics::new(&store.prefix);
        InRedis { store, metrics }
    }

    /// A decision's round trip, timed (real time, even on a test clock: it measures Redis) and
    /// its failure counted.
    pub(crate) async fn measured<T>(
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
    pub(crate) fn windows<C: Clock>(&self, call: &Call<'_, C>) -> (Vec<WindowCounter>, Vec<usize>) {
        let counters = call
            .hits
            .iter()
            .map(|hit| WindowCounter {
                key: redis_key(&self.store.prefix, call.namespace, hit),
                limit: hit.limit.max_value(),
                window: hit.limit.window(),
                hits: call.hits_on(hit),
                enforce: hit.limit.enforcement().denies(),
                calendar: hit.limit.calendar().map(|c| self.store.calendar_us(c, call.clock)),
                opened_ago: std::time::Duration::ZERO,
            })
            .collect();
        merge_repeated(counters)
    }

    /// Up to `max` live counters of `namespace`.
    pub(crate) async fn list_now<C: Clock>(
        &self,
        loaded: Arc<Loaded>,
        namespace: &str,
        max: usize,
        clock: &C,
    ) -> Result<CounterList, BackendError> {
        let by_id = limits_by_id(&loaded, namespace);
        let calendars = self.calendars(by_id.values().map(|(_, limit)| *limit), clock);
        let mut counters = Vec::new();
        let mut truncated = false;
        if !by_id.is_empty() {
            let head = key_head(&self.store.prefix, namespace);
            let mut seen = HashSet::new();
            self.scan(&head, clock, |now_us, window| {
                let Some((id, values)) = parse_key(&head, &window.key) else { return true };
                let Some(&(index, limit)) = by_id.get(&id) else { return true };
                let calendar = calendars.get(&id).copied();
                let Some((remaining, reset_us)) = window.state(limit.max_value(), limit.window(), calendar, now_us)
                else {
                    return true;
                };
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
    pub(crate) async fn reset_now<C: Clock>(
        &self,
        loaded: &Loaded,
        namespace: &str,
        filter: &CounterFilter,
        clock: &C,
    ) -> Result<u64, BackendError> {
        let (store, now) = (&self.store, self.store.now_us(clock));
        let calendars = self.calendars(loaded.policy.namespace(namespace), clock);
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
                Pick::One(values) => exact.push(key(counter_key(&store.prefix, namespace, limit.id(), &values), limit)),
                Pick::Matching => {
                    scanned.insert(limit.id(), limit);
                }
            }
        }
        let mut reset = 0;
        for batch in exact.chunks(DELETE_BATCH) {
            reset += delete_windows(&store.redis, batch, now).await?;
        }
        if scanned.is_empty() {
            return Ok(reset);
        }
        let head = key_head(&store.prefix, namespace);
        let mut seen = HashSet::new();
        let mut chosen = Vec::new();
        // Found keys are deleted a page at a time, between steps of the scan (which a delete
        // does not disturb: SCAN still returns every key present throughout).
        let mut cursor = 0;
        loop {
            let page =
                scan_windows(&store.redis, &head, &format!("{}*", glob_escape(&head)), cursor, SCAN_COUNT, now).await?;
            for window in page.windows {
                let Some((id, values)) = parse_key(&head, &window.key) else { continue };
                let Some(limit) = scanned.get(&id) else { continue };
                if filter.matches(limit, &values) && seen.insert(window.key.clone()) {
                    chosen.push(key(window.key, limit));
                }
            }
            for batch in chosen.chunks(DELETE_BATCH) {
                reset += delete_windows(&store.redis, batch, now).await?;
            }
            chosen.clear();
            cursor = page.cursor;
            if cursor == 0 {
                return Ok(reset);
            }
        }
    }

    /// The current calendar window (µs, on the clock Redis decides with) of each calendar limit.
    fn calendars<'l, C: Clock>(
        &self,
        limits: impl Iterator<Item = &'l Limit>,
        clock: &C,
    ) -> HashMap<LimitId, (u64, u64)> {
        limits.filter_map(|limit| Some((limit.id(), self.store.calendar_us(limit.calendar()?, clock)))).collect()
    }

    /// Scans the keys starting with `head`, calling `found` with each step's time (µs) and each
    /// counter found, until the scan ends or `found` says to stop.
    async fn scan<C: Clock>(
        &self,
        head: &str,
        clock: &C,
        mut found: impl FnMut(u64, StoredWindow) -> bool,
    ) -> Result<(), BackendError> {
        let now = self.store.now_us(clock);
        let pattern = format!("{}*", glob_escape(head));
        let mut cursor = 0;
        loop {
            let page = scan_windows(&self.store.redis, head, &pattern, cursor, SCAN_COUNT, now).await?;
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

impl<C: Clock> Store<C> for InRedis {
    fn kind(&self) -> StorageKind {
        StorageKind::Redis
    }

    /// One script run decides every counter of a call atomically.
    fn mode(&self) -> Mode {
        Mode::Accuracy
    }

    fn accepts(&self, policy: &Policy) -> Result<(), StorageError> {
        redis_accepts(policy, StorageKind::Redis)
    }

    fn decide<'a>(&'a self, call: Call<'a, C>) -> Answer<'a, Result<Vec<Status>, BackendError>> {
        let (counters, slots) = self.windows(&call);
        let mode = match call.action {
            Action::Check => CountersMode::Check,
            Action::Report => CountersMode::Report,
            Action::CheckAndReport => CountersMode::Take,
        };
        let now = self.store.now_us(call.clock);
        Answer::Later(Box::pin(async move {
            let decided = self.measured(decide_windows(&self.store.redis, &counters, mode, now)).await?.counters;
            Ok(statuses(call.hits, &slots, &decided))
        }))
    }

    fn list<'a>(
        &'a self,
        loaded: Arc<Loaded>,
        namespace: &'a str,
        max: usize,
        clock: &'a C,
    ) -> Later<'a, Result<CounterList, BackendError>> {
        Box::pin(self.list_now(loaded, namespace, max, clock))
    }

    fn reset<'a>(
        &'a self,
        loaded: &'a Loaded,
        namespace: &'a str,
        filter: &'a CounterFilter,
        clock: &'a C,
    ) -> Later<'a, Result<u64, BackendError>> {
        Box::pin(self.reset_now(loaded, namespace, filter, clock))
    }
}

/// Each hit's status from what its counter (at `slots[i]`) answered.
pub(crate) fn statuses(hits: &[Hit<'_>], slots: &[usize], decided: &[(Meta, bool)]) -> Vec<Status> {
    hits.iter()
        .zip(slots)
        .map(|(hit, &slot)| {
            let (meta, limited) = decided.get(slot).copied().unwrap_or_default();
            Status { limit: hit.index, descriptor: hit.descriptor, meta, limited }
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

/// `{prefix}{namespace}:{limit id}:{values}`: the namespace is the hash tag, so all counters of a
/// call are on one Cluster node; values are length-prefixed so no value can forge another key.
fn redis_key(prefix: &str, namespace: &str, hit: &Hit<'_>) -> String {
    counter_key(prefix, namespace, hit.limit.id(), &hit.values)
}

/// The Redis key of one counter: see [`redis_key`] (and [`parse_key`], its inverse).
pub(crate) fn counter_key(prefix: &str, namespace: &str, limit: LimitId, values: &[String]) -> String {
    let mut key = format!("{prefix}{{{namespace}}}:{limit}");
    for value in values {
        use std::fmt::Write as _;
        let _ = write!(key, ":{}:{value}", value.len());
    }
    key
}

/// Whether a counter key of `namespace` is one `filter` chooses (a key of a limit no longer
/// loaded, or of another namespace, is not).
pub(crate) fn chosen_by<'a>(
    loaded: &'a Loaded,
    prefix: &str,
    namespace: &'a str,
    filter: &'a CounterFilter,
) -> impl Fn(&str) -> bool + 'a {
    let by_id = limits_by_id(loaded, namespace);
    let head = key_head(prefix, namespace);
    move |key| {
        parse_key(&head, key).and_then(|(id, values)| Some(filter.matches(by_id.get(&id)?.1, &values))).unwrap_or(false)
    }
}

/// `{prefix}{namespace}:`: what every counter key of the namespace starts with.
pub(crate) fn key_head(prefix: &str, namespace: &str) -> String {
    format!("{prefix}{{{namespace}}}:")
}

/// The inverse of [`counter_key`] after its head: the limit's id and the variables' values.
pub(crate) fn parse_key(head: &str, key: &str) -> Option<(LimitId, Vec<String>)> {
    let rest = key.strip_prefix(head)?;
    let (id, mut rest) = rest.split_at_checked(16)?;
    if !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let id = LimitId(u64::from_str_radix(id, 16).ok()?);
    let mut values = Vec::new();
    while !rest.is_empty() {
        let (len, after) = rest.strip_prefix(':')?.split_once(':')?;
        let len: usize = if len.bytes().all(|b| b.is_ascii_digit()) { len.parse().ok()? } else { return None };
        values.push(after.get(..len)?.to_owned());
        rest = &after[len..];
    }
    Some((id, values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_key_parses_back_to_its_limit_and_values() {
        let values = vec!["a:1:b".to_string(), String::new(), "12".to_string(), "é:".to_string()];
        let head = key_head("rl:", "ns:{x}");
        let key = counter_key("rl:", "ns:{x}", LimitId(0xfeed), &values);
        assert_eq!(parse_key(&head, &key), Some((LimitId(0xfeed), values)));
        assert_eq!(parse_key(&head, &counter_key("rl:", "ns:{x}", LimitId(7), &[])), Some((LimitId(7), vec![])));
        for bad in ["", "000000000000007", "000000000000000g", "0000000000000007:3:ab", "0000000000000007:x:ab"] {
            assert_eq!(parse_key(&head, &format!("{head}{bad}")), None, "{bad}");
        }
        assert_eq!(parse_key(&head, "other:{ns:{x}}:0000000000000007"), None);
    }
}
