//! What a caller asks about: a namespace and the descriptors of one request.

use std::cell::OnceCell;
use std::collections::HashMap;
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
        Descriptor { entries: iter.into_iter().map(|(k, v)| (k.into(), v.into())).collect(), hits: None }
    }
}

impl From<HashMap<String, String>> for Descriptor {
    fn from(map: HashMap<String, String>) -> Descriptor {
        let mut entries: Vec<_> = map.into_iter().collect();
        // A map has no order; sorting makes evaluation (and which entry wins) deterministic.
        entries.sort();
        Descriptor { entries, hits: None }
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
