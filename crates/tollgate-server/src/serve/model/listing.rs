//! Listing a namespace's counters (`GET /counters/{namespace}`: a [`CounterList`] of
//! [`CounterView`]s) and resetting them (`DELETE`: which ones a [`CounterFilter`] over the values
//! of the limits' variables chooses). Each store lists and resets its own counters
//! (`crate::serve::store`).

use std::collections::HashMap;
use std::sync::Arc;

use tollgate::Meta;
use tollgate_policy::{Limit, LimitId, Variable};

use super::loaded::Loaded;

/// One live counter, as `GET /counters/{namespace}` lists it.
#[derive(Clone, Debug)]
pub struct CounterView {
    /// Index of the limit in the policy's limits.
    pub limit: usize,
    /// The variables' values.
    pub values: Vec<String>,
    /// The counter's state now.
    pub meta: Meta,
}

/// A namespace's live counters, at most the number asked for.
#[derive(Debug)]
pub struct CounterList {
    /// The limits the counters are of ([`CounterView::limit`] indexes them).
    pub loaded: Arc<Loaded>,
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
pub(crate) enum Pick {
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

    pub(crate) fn pick(&self, limit: &Limit) -> Pick {
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
    pub(crate) fn matches(&self, limit: &Limit, values: &[String]) -> bool {
        let variables = limit.variables();
        variables.len() == values.len()
            && self.pairs.iter().all(|(name, v)| {
                variables.iter().zip(values).any(|(variable, value)| value == v && Self::calls(variable, name))
            })
    }
}

/// The namespace's limits by id: (index in the policy, the limit).
pub(crate) fn limits_by_id<'l>(loaded: &'l Loaded, namespace: &str) -> HashMap<LimitId, (usize, &'l Limit)> {
    let limits = loaded.policy.limits();
    loaded.policy.namespace_indexes(namespace).iter().map(|&i| (limits[i].id(), (i, &limits[i]))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_policy::Policy;

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
