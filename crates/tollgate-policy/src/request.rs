//! What a caller asks about: a namespace and the descriptors of one request.

use std::cell::OnceCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// One descriptor: ordered key/value entries (an Envoy `RateLimitDescriptor`, or the `values` map
/// of an HTTP check).
///
/// ```
/// use tollgate_policy::Descriptor;
/// let d = Descriptor::from([("req.method", "POST"), ("user", "alice")]);
/// assert_eq!(d.get("user"), Some("alice"));
/// assert_eq!(d.get("missing"), None);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// The entries, in the order the caller sent them.
    pub entries: Vec<(String, String)>,
    /// Hits for the counters attributed to this descriptor, instead of the request's (Envoy's
    /// per-descriptor `hits_addend`, which Kuadrant sets to count LLM tokens); `None` takes the
    /// request's. `Some(0)` counts nothing for them: a probe.
    pub hits: Option<u64>,
    /// The limit this descriptor asks to be counted against instead of the configured rules
    /// (Envoy's descriptor `limit`): see [`LimitOverride`].
    pub limit: Option<LimitOverride>,
}

/// A descriptor's own limit (Envoy's `RateLimitDescriptor.limit`, set by Envoy's
/// `limit.dynamic_metadata` and by Envoy Gateway to apply one policy across tenants): in a
/// policy read from envoy/ratelimit's format, the descriptor is counted against it and no
/// configured rule, as envoy/ratelimit's `GetLimit` does (`src/config/config_impl.go`): a
/// counter per domain, unit and the descriptor's entries, in the unit's window (the same
/// windows as a rule's), enforced, neither shadow nor quota, without a name. Limitador's format
/// has no such counters: there the override is not read, as Limitador does not.
///
/// ```
/// use tollgate::CalendarUnit;
/// use tollgate_policy::{Descriptor, LimitOverride, Policy, SourceText};
///
/// let yaml = "domain: api\ndescriptors:\n  - {key: tenant, rate_limit: {unit: minute, requests_per_unit: 100}}\n";
/// let policy = Policy::parse_envoy(&[SourceText::new("api.yaml", yaml)])?;
/// let asked = LimitOverride { requests_per_unit: 5, unit: CalendarUnit::Second };
/// let hits = policy.hits("api", &[Descriptor::from([("tenant", "acme")]).with_limit(asked)]);
/// assert_eq!(hits.len(), 1);
/// assert!(hits[0].limit.set_by_request());
/// assert_eq!((hits[0].max_value, hits[0].values.clone()), (5, vec!["tenant".to_string(), "acme".into()]));
/// # Ok::<(), tollgate_policy::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitOverride {
    /// Hits allowed per window; 0 refuses every request that counts a hit.
    pub requests_per_unit: u64,
    /// The window: envoy/ratelimit's units are `Second` to `Day` and its 7, 30 and 365 days
    /// from the epoch (`EpochWeek`, `EpochMonth`, `EpochYear`).
    pub unit: tollgate::CalendarUnit,
}

impl Descriptor {
    /// The same descriptor counting `hits` for its counters instead of the request's.
    ///
    /// ```
    /// use tollgate_policy::Descriptor;
    /// let d = Descriptor::from([("model", "gpt")]).with_hits(500);
    /// assert_eq!((d.hits, d.hits_or(1)), (Some(500), 500));
    /// assert_eq!(Descriptor::from([("model", "gpt")]).hits_or(1), 1);
    /// ```
    #[must_use]
    pub fn with_hits(self, hits: u64) -> Descriptor {
        Descriptor { hits: Some(hits), ..self }
    }

    /// The same descriptor counted against its own limit (see [`LimitOverride`]).
    #[must_use]
    pub fn with_limit(self, limit: LimitOverride) -> Descriptor {
        Descriptor { limit: Some(limit), ..self }
    }

    /// This descriptor's hits, or the request's `delta` when it sets none.
    pub fn hits_or(&self, delta: u64) -> u64 {
        self.hits.unwrap_or(delta)
    }

    /// The value of the first entry named `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

impl<K: Into<String>, V: Into<String>, const N: usize> From<[(K, V); N]> for Descriptor {
    fn from(entries: [(K, V); N]) -> Descriptor {
        entries.into_iter().collect()
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Descriptor {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Descriptor {
        Descriptor { entries: iter.into_iter().map(|(k, v)| (k.into(), v.into())).collect(), hits: None, limit: None }
    }
}

impl From<HashMap<String, String>> for Descriptor {
    fn from(map: HashMap<String, String>) -> Descriptor {
        let mut entries: Vec<_> = map.into_iter().collect();
        // A map has no order; sorting makes evaluation (and which entry wins) deterministic.
        entries.sort();
        Descriptor { entries, hits: None, limit: None }
    }
}

impl From<BTreeMap<String, String>> for Descriptor {
    /// The entries in the map's order (by key), the order the `HashMap` conversion sorts them
    /// into: a request body read into a `BTreeMap` is neither hashed nor sorted again.
    fn from(map: BTreeMap<String, String>) -> Descriptor {
        Descriptor { entries: map.into_iter().collect(), hits: None, limit: None }
    }
}

/// The descriptors of one request, with the CEL view of them built only if a CEL expression
/// that the fast paths do not cover needs it.
pub(crate) struct Facts<'a> {
    pub(crate) descriptors: &'a [Descriptor],
    cel: OnceCell<cel::Value>,
}

impl<'a> Facts<'a> {
    pub(crate) fn new(descriptors: &'a [Descriptor]) -> Facts<'a> {
        Facts { descriptors, cel: OnceCell::new() }
    }

    /// `descriptors` as CEL sees it: a list of maps from key to value.
    pub(crate) fn cel_descriptors(&self) -> &cel::Value {
        self.cel.get_or_init(|| {
            let list = self
                .descriptors
                .iter()
                .map(|d| {
                    let map: HashMap<String, cel::Value> =
                        d.entries.iter().map(|(k, v)| (k.clone(), cel::Value::String(Arc::new(v.clone())))).collect();
                    cel::Value::from(map)
                })
                .collect::<Vec<_>>();
            cel::Value::List(Arc::new(list))
        })
    }
}
