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
    /// How many of `limits` are the file's rules: the limits [set by requests](Limit::set_by_request) follow them.
    rules: usize,
    namespaces: HashMap<String, Namespace>,
}

/// One namespace's limits, and whether any of them replaces others (then [`Policy::hits`] takes
/// the replaced ones out).
#[derive(Clone, Debug, Default)]
struct Namespace {
    indexes: Vec<usize>,
    replaces: bool,
    /// The limits that descriptors with their own limit count against, one per unit (see
    /// [`Limit::set_by_request`]).
    by_request: Vec<usize>,
}

/// One counter a request touches: a limit that applies to it and the values of the limit's
/// variables (one counter per distinct values).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hit<'p> {
    /// The limit.
    pub limit: &'p Limit,
    /// The limit's index in [`Policy::limits`].
    pub index: usize,
    /// The values that pick the counter among [`Hit::counter`]'s: its variables' values in its
    /// order (for a limit [set by the request](Limit::set_by_request), the descriptor's entries,
    /// keys and values).
    pub values: Vec<String>,
    /// The descriptor the counter is attributed to (for per-descriptor statuses): the first one
    /// a condition or variable of the limit read, else 0.
    pub descriptor: usize,
    /// The hits the counter allows per window: the limit's `max_value`, or, for a limit
    /// [set by the request](Limit::set_by_request), the descriptor's own.
    pub max_value: u64,
    /// The limit whose counters hold this hit: `limit`, but for a descriptor's own limit
    /// counted, as envoy/ratelimit counts it, on the counter of the rule the descriptor matches
    /// in the same unit ([`Limit::shared_with_own_limits`]), that rule. Stores count on it;
    /// `limit` says how the hit is decided and reported.
    pub counter: &'p Limit,
    /// [`Hit::counter`]'s index in [`Policy::limits`].
    pub counter_index: usize,
}

impl<'p> Hit<'p> {
    /// A hit counted on its limit's own counters, against the limit's `max_value`.
    fn on(limit: &'p Limit, index: usize, values: Vec<String>, descriptor: usize) -> Hit<'p> {
        Hit { limit, index, values, descriptor, max_value: limit.max_value, counter: limit, counter_index: index }
    }
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

    /// The policy of `limits`: the file's rules, then the limits [set by
    /// requests](Limit::set_by_request).
    pub(crate) fn from_limits(limits: Vec<Limit>) -> Policy {
        let mut namespaces: HashMap<String, Namespace> = HashMap::new();
        let rules = limits.iter().take_while(|l| !l.set_by_request).count();
        assert!(limits[rules..].iter().all(|l| l.set_by_request), "the limits set by requests come last");
        for (i, limit) in limits.iter().enumerate() {
            let namespace = namespaces.entry(limit.namespace.clone()).or_default();
            if limit.set_by_request {
                namespace.by_request.push(i);
                continue;
            }
            namespace.indexes.push(i);
            namespace.replaces |= !limit.replaces.is_empty();
        }
        Policy { limits, rules, namespaces }
    }

    /// Every limit a request can count against, by index ([`Hit::index`]): the file's
    /// [rules](Policy::rules), in file order, then those [set by
    /// requests](Limit::set_by_request).
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    /// The limits the file wrote, in file order: [`Policy::limits`] without those [set by
    /// requests](Limit::set_by_request), which have no rule to show.
    ///
    /// ```
    /// use tollgate_policy::{Policy, SourceText};
    /// let yaml = "domain: api\ndescriptors:\n  - {key: tenant, rate_limit: {unit: minute, requests_per_unit: 100}}\n";
    /// let policy = Policy::parse_envoy(&[SourceText::new("api.yaml", yaml)])?;
    /// assert_eq!(policy.rules().len(), 1);
    /// assert!(policy.limits().len() > 1, "and one limit per unit for descriptors with their own");
    /// # Ok::<(), tollgate_policy::PolicyError>(())
    /// ```
    pub fn rules(&self) -> &[Limit] {
        &self.limits[..self.rules]
    }

    /// The limits of one namespace, in file order (empty for an unknown namespace).
    pub fn namespace<'p>(&'p self, namespace: &str) -> impl Iterator<Item = &'p Limit> + 'p {
        self.namespace_indexes(namespace).iter().map(|&i| &self.limits[i])
    }

    /// The indexes in [`Policy::limits`] of one namespace's rules (not the limits [set by
    /// requests](Limit::set_by_request)).
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
    /// those keys — less the limits that an applying limit [replaces](Limit::replaces). A
    /// descriptor with its own limit ([`Descriptor::limit`]) is counted against that alone when
    /// the namespace has limits [set by requests](Limit::set_by_request) (envoy/ratelimit's
    /// format), per its entries. Costs one pass over that namespace's limits, never over the
    /// others.
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
        // The rule each descriptor with its own limit matches: their hits go on its counter.
        let mut own = Vec::new();
        for &index in &ns.indexes {
            let limit = &self.limits[index];
            let Some(keys) = &limit.descriptor_keys else {
                if let Some((values, descriptor)) = applies(limit, &facts) {
                    hits.push(Hit::on(limit, index, values, descriptor.unwrap_or(0)));
                }
                continue;
            };
            for (at, d) in descriptors.iter().enumerate() {
                if d.entries.len() != keys.len() || !d.entries.iter().zip(keys).all(|((k, _), key)| k == key) {
                    continue;
                }
                if let Some((values, _)) = applies(limit, &Facts::new(std::slice::from_ref(d))) {
                    if d.limit.is_some() && !ns.by_request.is_empty() {
                        own.push((at, index, values));
                    } else {
                        hits.push(Hit::on(limit, index, values, at));
                    }
                }
            }
        }
        if !ns.by_request.is_empty() {
            self.hits_set_by_request(&ns.by_request, descriptors, &own, &mut hits);
        }
        if ns.replaces {
            let replaced: Vec<&str> = hits.iter().flat_map(|h| h.limit.replaces.iter().map(String::as_str)).collect();
            if !replaced.is_empty() {
                hits.retain(|h| h.limit.name.as_deref().is_none_or(|name| !replaced.contains(&name)));
            }
        }
        hits
    }

    /// The hits of the descriptors with their own limit, on the limit of its unit among
    /// `by_request`: counted on the counter of the rule the descriptor matches (`matched`:
    /// descriptor, rule, the rule's values) when it is [shared](Limit::shared_with_own_limits)
    /// and of that unit, else on one of the limit's per descriptor entries (keys and values).
    fn hits_set_by_request<'p>(
        &'p self,
        by_request: &[usize],
        descriptors: &[Descriptor],
        matched: &[(usize, usize, Vec<String>)],
        hits: &mut Vec<Hit<'p>>,
    ) {
        let unit_of = |limit: &Limit| limit.calendar.as_ref().map(tollgate::Calendar::unit);
        for (at, d) in descriptors.iter().enumerate() {
            let Some(asked) = d.limit else { continue };
            // envoy/ratelimit finds one rule per descriptor; the policy's conditions keep it so.
            let rule = matched.iter().filter(|(m, _, _)| *m == at).min_by_key(|(_, r, _)| *r);
            let Some(&index) = by_request.iter().find(|&&i| unit_of(&self.limits[i]) == Some(asked.unit)) else {
                continue;
            };
            let limit = &self.limits[index];
            let on_rule = rule.filter(|(_, r, _)| {
                let rule = &self.limits[*r];
                rule.shared_with_own_limits && unit_of(rule) == Some(asked.unit)
            });
            let (counter_index, values) = match on_rule {
                Some((_, r, values)) => (*r, values.clone()),
                None => (index, d.entries.iter().flat_map(|(k, v)| [k.clone(), v.clone()]).collect()),
            };
            let (descriptor, max_value, counter) = (at, asked.requests_per_unit, &self.limits[counter_index]);
            hits.push(Hit { limit, index, values, descriptor, max_value, counter, counter_index });
        }
    }

    /// Number of [rules](Policy::rules).
    pub fn len(&self) -> usize {
        self.rules
    }

    /// True when there are no [rules](Policy::rules).
    pub fn is_empty(&self) -> bool {
        self.rules == 0
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
