//! Listing and resetting a namespace's counters (`GET` and `DELETE /counters/{namespace}`), with
//! whichever storage the engine has.
//!
//! - In memory, each limit's keyed limiter is read, and reset, in place.
//! - In Redis, a namespace's counters are its keys `{prefix}{namespace}:*` (the namespace is
//!   their hash tag, so they are on one node of a cluster). They are found by SCAN, a bounded
//!   step per call ([`SCAN_COUNT`] keys of the keyspace looked at), each key read back as
//!   (limit id, values) and matched with the loaded limit of that id: keys of limits no longer
//!   loaded are skipped, and expire on their own. A reset that names every variable of a limit
//!   deletes that one key without a scan. Time is the one decisions use (Redis `TIME`, or the
//!   engine's clock with [`RedisStore::use_engine_clock`]), and a calendar limit's counter is
//!   live in the calendar window of that time only, as `Engine::call` decides it.
//! - With `redis-cached`, this replica's pending hits are flushed first, so that a listing and a
//!   reset see what it counted; a reset then deletes in Redis and forgets the local copies with
//!   no flush in between (see [`super::cache`]). Other replicas keep their local copy of a reset
//!   counter until they flush hits for it or its window ends: a reset meant for every replica is
//!   sent to each.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tollgate::{Clock, Meta};
use tollgate_policy::{Limit, LimitId, Variable};
use tollgate_redis::{BackendError, StoredWindow, WindowKey, delete_windows, glob_escape, scan_windows};

use super::engine::{CounterView, Engine, Loaded, RedisStore, Store, counter_key};

/// Keys of the keyspace one SCAN step looks at (not how many it returns).
pub const SCAN_COUNT: usize = 1000;

/// Counters deleted per script call.
const DELETE_BATCH: usize = 500;

/// A namespace's live counters, at most the number asked for.
#[derive(Debug)]
pub struct CounterList<C: Clock> {
    /// The limits the counters are of ([`CounterView::limit`] indexes them).
    pub loaded: Arc<Loaded<C>>,
    /// The counters, in no particular order.
    pub counters: Vec<CounterView>,
    /// True when the namespace had more live counters than were listed.
    pub truncated: bool,
}

/// Which counters a reset chooses: those whose variables have every given value.
///
/// A pair `(name, value)` holds for a counter when one of its limit's variables is called `name`
/// and has `value`. A variable is called by the text it is written as in the limits file (the
/// key of `set_variables` in a listing), and, when it reads one descriptor entry
/// (`descriptors[0].user_id`), by that entry's key too (`user_id`), as `/check` bodies name it.
/// So `{"user_id": "alice"}` chooses every counter of alice's, in every limit with a `user_id`
/// variable, whatever its other variables; limits without one keep their counters. No pairs
/// choose every counter.
///
/// ```
/// use tollgate_server::serve::CounterFilter;
/// let alice = CounterFilter::new([("user_id".to_string(), "alice".to_string())]);
/// assert!(!alice.is_everything());
/// assert!(CounterFilter::everything().is_everything());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CounterFilter {
    pairs: Vec<(String, String)>,
}

/// What a filter chooses among one limit's counters.
#[derive(Debug, PartialEq, Eq)]
enum Pick {
    /// None of them: a name is no variable of the limit.
    Nothing,
    /// The one counter with these values.
    One(Vec<String>),
    /// Those [`CounterFilter::matches`] says.
    Matching,
}

impl CounterFilter {
    /// Counters whose variables have each of these values.
    pub fn new(pairs: impl IntoIterator<Item = (String, String)>) -> CounterFilter {
        let mut pairs: Vec<_> = pairs.into_iter().collect();
        pairs.sort();
        pairs.dedup();
        CounterFilter { pairs }
    }

    /// Every counter.
    pub fn everything() -> CounterFilter {
        CounterFilter::default()
    }

    /// True when it chooses every counter.
    pub fn is_everything(&self) -> bool {
        self.pairs.is_empty()
    }

    fn calls(variable: &Variable, name: &str) -> bool {
        variable.source() == name || variable.descriptor_key() == Some(name)
    }

    fn pick(&self, limit: &Limit) -> Pick {
        let variables = limit.variables();
        let named: Vec<Vec<usize>> = self
            .pairs
            .iter()
            .map(|(name, _)| (0..variables.len()).filter(|&i| Self::calls(&variables[i], name)).collect())
            .collect();
        if named.iter().any(Vec::is_empty) {
            return Pick::Nothing;
        }
        // One counter when each pair names one variable and each variable is named once.
        let mut value: Vec<Option<&str>> = vec![None; variables.len()];
        for (which, (_, v)) in named.iter().zip(&self.pairs) {
            match which.as_slice() {
                [i] if value[*i].is_none() => value[*i] = Some(v),
                _ => return Pick::Matching,
            }
        }
        match value.into_iter().collect::<Option<Vec<&str>>>() {
            Some(values) if !values.is_empty() => Pick::One(values.into_iter().map(str::to_owned).collect()),
            _ => Pick::Matching,
        }
    }

    /// True when the counter of `limit` with `values` (in the limit's variable order) is chosen.
    fn matches(&self, limit: &Limit, values: &[String]) -> bool {
        let variables = limit.variables();
        variables.len() == values.len()
            && self.pairs.iter().all(|(name, v)| {
                variables.iter().zip(values).any(|(variable, value)| value == v && Self::calls(variable, name))
            })
    }
}

/// `{prefix}{namespace}:`: what every counter key of the namespace starts with.
fn key_head(prefix: &str, namespace: &str) -> String {
    format!("{prefix}{{{namespace}}}:")
}

/// The inverse of [`counter_key`] after its head: the limit's id and the variables' values.
fn parse_key(head: &str, key: &str) -> Option<(LimitId, Vec<String>)> {
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

/// The namespace's limits by id: (index in the policy, the limit).
fn limits_by_id<'l, C: Clock>(loaded: &'l Loaded<C>, namespace: &str) -> HashMap<LimitId, (usize, &'l Limit)> {
    let limits = loaded.policy.limits();
    loaded.policy.namespace_indexes(namespace).iter().map(|&i| (limits[i].id(), (i, &limits[i]))).collect()
}

impl<C: Clock + Clone> Engine<C> {
    /// Up to `max` live counters of `namespace`, from whichever storage the engine has; the
    /// list says when there were more. An error means Redis could not answer.
    ///
    /// ```
    /// use tollgate::ManualClock;
    /// use tollgate_policy::{Descriptor, Policy};
    /// use tollgate_server::serve::{Action, Engine, Mode};
    ///
    /// let policy = Policy::parse("- {namespace: api, max_value: 5, seconds: 60, variables: [user]}", "limits.yaml")?;
    /// let engine = Engine::new(policy, Mode::Accuracy, false, ManualClock::new());
    /// for user in ["ann", "bob", "cat"] {
    ///     engine.decide("api", &[Descriptor::from([("user", user)])], 1, Action::CheckAndReport);
    /// }
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let list = engine.list_counters("api", 2).await.unwrap();
    /// assert_eq!((list.counters.len(), list.truncated), (2, true));
    /// assert_eq!(list.counters[0].meta.remaining, 4);
    /// # });
    /// # Ok::<(), tollgate_policy::PolicyError>(())
    /// ```
    pub async fn list_counters(&self, namespace: &str, max: usize) -> Result<CounterList<C>, BackendError> {
        let store = match &self.store {
            Store::Memory => return Ok(self.list_memory(namespace, max)),
            Store::Redis(store) => store,
            Store::RedisCached(store, _) => {
                self.flush().await?;
                store
            }
        };
        let loaded = self.loaded();
        let by_id = limits_by_id(&loaded, namespace);
        let calendars = self.calendars(store, by_id.values().map(|(_, limit)| *limit));
        let mut counters = Vec::new();
        let mut truncated = false;
        if !by_id.is_empty() {
            let head = key_head(&store.prefix, namespace);
            let mut seen = HashSet::new();
            self.scan(store, &head, |now_us, window| {
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

    /// Forgets the counters of `namespace` that `filter` chooses, with whichever storage the
    /// engine has: each starts its next window full. Returns how many held hits (the counters a
    /// listing would have shown). An error means Redis could not answer; the counters deleted
    /// before it stay deleted.
    ///
    /// ```
    /// use tollgate::ManualClock;
    /// use tollgate_policy::{Descriptor, Policy};
    /// use tollgate_server::serve::{Action, CounterFilter, Engine, Mode};
    ///
    /// let policy = Policy::parse("- {namespace: api, max_value: 1, seconds: 60, variables: [user]}", "limits.yaml")?;
    /// let engine = Engine::new(policy, Mode::Accuracy, false, ManualClock::new());
    /// let ann = [Descriptor::from([("user", "ann")])];
    /// assert!(engine.decide("api", &ann, 1, Action::CheckAndReport).allowed);
    /// assert!(!engine.decide("api", &ann, 1, Action::CheckAndReport).allowed);
    /// let filter = CounterFilter::new([("user".to_string(), "ann".to_string())]);
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// assert_eq!(engine.reset_counters("api", &filter).await.unwrap(), 1);
    /// # });
    /// assert!(engine.decide("api", &ann, 1, Action::CheckAndReport).allowed, "ann starts again");
    /// # Ok::<(), tollgate_policy::PolicyError>(())
    /// ```
    pub async fn reset_counters(&self, namespace: &str, filter: &CounterFilter) -> Result<u64, BackendError> {
        match &self.store {
            Store::Memory => Ok(self.reset_memory(namespace, filter)),
            Store::Redis(store) => self.reset_redis(store, namespace, filter).await,
            Store::RedisCached(store, cache) => {
                let held = cache.hold_flushes().await;
                let now = self.clock.now();
                cache.flush_held(&held, &store.redis, now, store.use_engine_clock.then_some(now / 1000)).await?;
                let reset = self.reset_redis(store, namespace, filter).await?;
                let loaded = self.loaded();
                let by_id = limits_by_id(&loaded, namespace);
                let head = key_head(&store.prefix, namespace);
                cache.forget(&held, |key| {
                    parse_key(&head, key)
                        .and_then(|(id, values)| Some(filter.matches(by_id.get(&id)?.1, &values)))
                        .unwrap_or(false)
                });
                Ok(reset)
            }
        }
    }

    fn list_memory(&self, namespace: &str, max: usize) -> CounterList<C> {
        let loaded = self.loaded();
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
        CounterList { loaded, counters, truncated }
    }

    fn reset_memory(&self, namespace: &str, filter: &CounterFilter) -> u64 {
        let loaded = self.loaded();
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
        reset as u64
    }

    async fn reset_redis(
        &self,
        store: &RedisStore,
        namespace: &str,
        filter: &CounterFilter,
    ) -> Result<u64, BackendError> {
        let loaded = self.loaded();
        let now = store.use_engine_clock.then(|| self.clock.now() / 1000);
        let calendars = self.calendars(store, loaded.policy.namespace(namespace));
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
    fn calendars<'l>(
        &self,
        store: &RedisStore,
        limits: impl Iterator<Item = &'l Limit>,
    ) -> HashMap<LimitId, (u64, u64)> {
        limits
            .filter_map(|limit| Some((limit.id(), self.calendar_us(limit.calendar()?, store.use_engine_clock))))
            .collect()
    }

    /// Scans the keys starting with `head`, calling `found` with each step's time (µs) and each
    /// counter found, until the scan ends or `found` says to stop.
    async fn scan(
        &self,
        store: &RedisStore,
        head: &str,
        mut found: impl FnMut(u64, StoredWindow) -> bool,
    ) -> Result<(), BackendError> {
        let now = store.use_engine_clock.then(|| self.clock.now() / 1000);
        let pattern = format!("{}*", glob_escape(head));
        let mut cursor = 0;
        loop {
            let page = scan_windows(&store.redis, head, &pattern, cursor, SCAN_COUNT, now).await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_policy::Policy;

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

    #[test]
    fn a_filter_picks_one_counter_when_it_names_every_variable_once() {
        let yaml = r#"
- {namespace: a, max_value: 1, seconds: 1, variables: ["descriptors[0].user", tier]}
- {namespace: a, max_value: 1, seconds: 1, variables: [user]}
- {namespace: a, max_value: 1, seconds: 1, variables: ["descriptors[0].user", "descriptors[1].user"]}
- {namespace: a, max_value: 1, seconds: 1}
"#;
        let policy = Policy::parse(yaml, "limits.yaml").unwrap();
        let [both, user, twice, global] = policy.limits() else { panic!() };
        let f = |pairs: &[(&str, &str)]| CounterFilter::new(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let ann = f(&[("user", "ann")]);
        assert_eq!(ann.pick(both), Pick::Matching);
        assert_eq!(ann.pick(user), Pick::One(s(&["ann"])));
        assert_eq!(ann.pick(twice), Pick::Matching);
        assert_eq!(ann.pick(global), Pick::Nothing);
        assert!(ann.matches(both, &s(&["ann", "gold"])) && !ann.matches(both, &s(&["bob", "gold"])));
        assert!(ann.matches(twice, &s(&["bob", "ann"])), "either of the two variables reading `user`");
        let written = f(&[("descriptors[0].user", "ann"), ("tier", "gold")]);
        assert_eq!(written.pick(both), Pick::One(s(&["ann", "gold"])));
        assert_eq!(written.pick(user), Pick::Nothing, "no variable `tier`");
        assert_eq!(f(&[("user", "ann"), ("descriptors[0].user", "bob")]).pick(both), Pick::Matching);
        assert!(!f(&[("user", "ann"), ("descriptors[0].user", "bob")]).matches(both, &s(&["ann", "x"])));
        let everything = CounterFilter::everything();
        assert_eq!(everything.pick(global), Pick::Matching);
        assert!(everything.matches(global, &[]) && everything.matches(both, &s(&["x", "y"])));
    }
}
