//! A set of limits, indexed by namespace, and matching a request to the counters it touches.

use std::collections::HashMap;
use std::path::Path;

use crate::error::{PolicyError, Position};
use crate::file::parse_limits;
use crate::limit::Limit;
use crate::request::{Descriptor, Facts};

/// The limits of one file, validated and indexed by namespace.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    limits: Vec<Limit>,
    namespaces: HashMap<String, Vec<usize>>,
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
        let limits = parse_limits(text, source_name)?;
        let mut seen: HashMap<_, Position> = HashMap::new();
        for limit in &limits {
            if let Some(first) = seen.insert(limit.shape(), limit.position) {
                return Err(PolicyError::new(
                    source_name,
                    limit.position,
                    format!(
                        "duplicate limit: same namespace `{}`, seconds, conditions, variables, algorithm and mode as \
                         the limit at line {}",
                        limit.namespace, first.line
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

    fn from_limits(limits: Vec<Limit>) -> Policy {
        let mut namespaces: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, limit) in limits.iter().enumerate() {
            namespaces.entry(limit.namespace.clone()).or_default().push(i);
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
        self.namespaces.get(namespace).map(Vec::as_slice).unwrap_or_default()
    }

    /// The namespaces that have limits.
    pub fn namespaces(&self) -> impl Iterator<Item = &str> {
        self.namespaces.keys().map(String::as_str)
    }

    /// The counters a request in `namespace` with these descriptors touches: every limit of the
    /// namespace whose conditions all hold and whose variables all have a value. Costs one pass
    /// over that namespace's limits, never over the others.
    pub fn hits<'p>(&'p self, namespace: &str, descriptors: &[Descriptor]) -> Vec<Hit<'p>> {
        let facts = Facts::new(descriptors);
        let mut hits = Vec::new();
        'limits: for &index in self.namespace_indexes(namespace) {
            let limit = &self.limits[index];
            let mut descriptor = None;
            for condition in &limit.conditions {
                if !condition.holds(&facts) {
                    continue 'limits;
                }
                descriptor = descriptor.or_else(|| condition.descriptor(&facts));
            }
            let mut values = Vec::with_capacity(limit.variables.len());
            for variable in &limit.variables {
                let Some((from, value)) = variable.value(&facts) else { continue 'limits };
                descriptor = descriptor.or(from);
                values.push(value);
            }
            hits.push(Hit { limit, index, values, descriptor: descriptor.unwrap_or(0) });
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
