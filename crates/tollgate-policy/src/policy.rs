//! A set of limits, indexed by namespace, and matching a request to the counters it touches.

use std::collections::HashMap;
use std::path::Path;

use crate::error::{PolicyError, Position};
use crate::file::parse_limits;
use crate::limit::Limit;
use crate::request::{Descriptor, Facts};
use crate::source::SourceText;

/// The limits of one file, validated and indexed by namespace.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    limits: Vec<Limit>,
    namespaces: HashMap<String, Namespace>,
}

/// One namespace's limits, and whether any of them replaces others (then [`Policy::hits`] takes
/// the replaced ones out).
#[derive(Clone, Debug, Default)]
struct Namespace {
    indexes: Vec<usize>,
    replaces: bool,
}

/// One counter a request touches: a limit that applies to it and the values of the limit's
/// variables (one counter per distinct values).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hit<'p> {
    /// The limit.
    pub limit: &'p Limit,
    /// The limit's index in [`Policy::limits`].
    pub index: usize,
    /// The variables' values, in the limit's order.
    pub values: Vec<String>,
    /// The descriptor the counter is attributed to (for per-descriptor statuses): the first one
    /// a condition or variable of the limit read, else 0.
    pub descriptor: usize,
}

impl PartialEq for Limit {
    fn eq(&self, other: &Limit) -> bool {
        self.id == other.id
    }
}
impl Eq for Limit {}

impl Policy {
    /// Parses and validates limits from YAML text; `source_name` names it in errors.
    ///
    /// ```
    /// use tollgate_policy::{Descriptor, Policy};
    /// let policy = Policy::parse(
    ///     r#"
    /// - namespace: example.org
    ///   max_value: 4
    ///   seconds: 60
    /// - namespace: example.org
    ///   max_value: 2
    ///   seconds: 1
    ///   conditions: ["req.method == 'POST'"]
    /// "#,
    ///     "limits.yaml",
    /// )?;
    /// let post = [Descriptor::from([("req.method", "POST")])];
    /// assert_eq!(policy.hits("example.org", &post).len(), 2);
    /// let get = [Descriptor::from([("req.method", "GET")])];
    /// assert_eq!(policy.hits("example.org", &get).len(), 1);
    /// assert!(policy.hits("other.org", &get).is_empty());
    /// # Ok::<(), tollgate_policy::PolicyError>(())
    /// ```
    pub fn parse(text: &str, source_name: &str) -> Result<Policy, PolicyError> {
        Policy::checked(parse_limits(text, source_name)?)
    }

    /// Parses several texts in Limitador's format as one policy (their limits in order).
    pub fn parse_all(sources: &[SourceText]) -> Result<Policy, PolicyError> {
        let mut limits = Vec::new();
        for source in sources {
            limits.extend(parse_limits(&source.text, &source.name)?);
        }
        Policy::checked(limits)
    }

    /// The policy of these limits, unless two of them count the same requests the same way.
    pub(crate) fn checked(limits: Vec<Limit>) -> Result<Policy, PolicyError> {
        let mut seen: HashMap<_, &Limit> = HashMap::new();
        for limit in &limits {
            if let Some(first) = seen.insert(limit.shape(), limit) {
                let place = if first.source_name == limit.source_name {
                    format!("line {}", first.position.line)
                } else {
                    format!("{}:{}", first.source_name, first.position.line)
                };
                return Err(PolicyError::new(
                    &limit.source_name,
                    limit.position,
                    format!(
                        "duplicate limit: same namespace `{}`, seconds, conditions, variables, algorithm and mode as \
                         the limit at {place}",
                        limit.namespace
                    ),
                ));
            }
        }
        Ok(Policy::from_limits(limits))
    }

    /// Reads and parses a limits file.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        Policy::parse(&Policy::read(path)?, &path.display().to_string())
    }

    /// Reads a limits file's text (for callers that keep it, e.g. to notice when it changes).
    pub fn read(path: &Path) -> Result<String, PolicyError> {
        std::fs::read_to_string(path).map_err(|e| {
            PolicyError::new(
                &path.display().to_string(),
                Position::default(),
                format!("cannot read the limits file: {e}"),
            )
        })
    }

    pub(crate) fn from_limits(limits: Vec<Limit>) -> Policy {
        let mut namespaces: HashMap<String, Namespace> = HashMap::new();
        for (i, limit) in limits.iter().enumerate() {
            let namespace = namespaces.entry(limit.namespace.clone()).or_default();
            namespace.indexes.push(i);
            namespace.replaces |= !limit.replaces.is_empty();
        }
        Policy { limits, namespaces }
    }

    /// Every limit, in file order.
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    /// The limits of one namespace, in file order (empty for an unknown namespace).
    pub fn namespace<'p>(&'p self, namespace: &str) -> impl Iterator<Item = &'p Limit> + 'p {
        self.namespace_indexes(namespace).iter().map(|&i| &self.limits[i])
    }

    /// The indexes in [`Policy::limits`] of one namespace's limits.
    pub fn namespace_indexes(&self, namespace: &str) -> &[usize] {
        self.namespaces.get(namespace).map(|n| n.indexes.as_slice()).unwrap_or_default()
    }

    /// The namespaces that have limits.
    pub fn namespaces(&self) -> impl Iterator<Item = &str> {
        self.namespaces.keys().map(String::as_str)
    }

    /// The counters a request in `namespace` with these descriptors touches: every limit of the
    /// namespace whose conditions all hold and whose variables all have a value — once for the
    /// request, or, for a limit with [`Limit::descriptor_keys`], once for each descriptor with
    /// those keys — less the limits that an applying limit [replaces](Limit::replaces). Costs one
    /// pass over that namespace's limits, never over the others.
    ///
    /// ```
    /// use tollgate_policy::{Descriptor, Policy};
    /// let policy = Policy::parse(
    ///     "- {namespace: sms, max_value: 5, seconds: 60, descriptor_keys: [to], variables: ['descriptors[0].to']}",
    ///     "limits.yaml",
    /// )?;
    /// let request = [Descriptor::from([("to", "+1")]), Descriptor::from([("to", "+2")]), Descriptor::from([("to", "+3"), ("x", "y")])];
    /// let hits = policy.hits("sms", &request);
    /// let counted: Vec<_> = hits.iter().map(|h| (h.descriptor, h.values[0].as_str())).collect();
    /// assert_eq!(counted, [(0, "+1"), (1, "+2")], "the third has another key too");
    /// # Ok::<(), tollgate_policy::PolicyError>(())
    /// ```
    pub fn hits<'p>(&'p self, namespace: &str, descriptors: &[Descriptor]) -> Vec<Hit<'p>> {
        let Some(ns) = self.namespaces.get(namespace) else { return Vec::new() };
        let facts = Facts::new(descriptors);
        let mut hits = Vec::new();
        for &index in &ns.indexes {
            let limit = &self.limits[index];
            let Some(keys) = &limit.descriptor_keys else {
                if let Some((values, descriptor)) = applies(limit, &facts) {
                    hits.push(Hit { limit, index, values, descriptor: descriptor.unwrap_or(0) });
                }
                continue;
            };
            for (at, d) in descriptors.iter().enumerate() {
                if d.entries.len() != keys.len() || !d.entries.iter().zip(keys).all(|((k, _), key)| k == key) {
                    continue;
                }
                if let Some((values, _)) = applies(limit, &Facts::new(std::slice::from_ref(d))) {
                    hits.push(Hit { limit, index, values, descriptor: at });
                }
            }
        }
        if ns.replaces {
            let replaced: Vec<&str> = hits.iter().flat_map(|h| h.limit.replaces.iter().map(String::as_str)).collect();
            if !replaced.is_empty() {
                hits.retain(|h| h.limit.name.as_deref().is_none_or(|name| !replaced.contains(&name)));
            }
        }
        hits
    }

    /// Number of limits.
    pub fn len(&self) -> usize {
        self.limits.len()
    }

    /// True when there are no limits.
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }
}

/// The limit's variables' values and the first descriptor it read, when its conditions all hold
/// and its variables all have a value for these descriptors.
fn applies(limit: &Limit, facts: &Facts<'_>) -> Option<(Vec<String>, Option<usize>)> {
    let mut descriptor = None;
    for condition in &limit.conditions {
        if !condition.holds(facts) {
            return None;
        }
        descriptor = descriptor.or_else(|| condition.descriptor(facts));
    }
    let mut values = Vec::with_capacity(limit.variables.len());
    for variable in &limit.variables {
        let (from, value) = variable.value(facts)?;
        descriptor = descriptor.or(from);
        values.push(value);
    }
    Some((values, descriptor))
}
