//! envoy/ratelimit's configuration, read into the same [`Limit`]s as Limitador's format.
//!
//! A file is a `domain` and a tree of `descriptors` (`key`, optional `value`, optional
//! `rate_limit`, nested `descriptors`). envoy/ratelimit takes each descriptor of a request on its
//! own and walks the tree with its entries, one level per entry: at each level the node with the
//! entry's key and value as written if there is one (a wildcard's own text included), else the
//! first wildcard value (`*`) the value matches,
//! else the node with the key and no value — without going back if a deeper level then fails. The
//! rule of the node reached by the last entry applies, if the node has one; a request descriptor
//! longer or shorter than the path has none. The counter is per request descriptor entries: one
//! per distinct value where the node has no value (or a wildcard without `share_threshold`).
//!
//! Each rule becomes one limit:
//!
//! - `namespace` = the domain, `max_value` = `requests_per_unit` (0, or none, denies every
//!   request), the window a calendar `second`, `minute`, `hour` or `day` in UTC, or 7, 30 or 365
//!   days from the epoch for `week`, `month` and `year` (envoy/ratelimit's windows are
//!   `now / unit`, from the Unix epoch: the same boundaries);
//! - `descriptor_keys` = the keys of the path, so that the limit is matched against each request
//!   descriptor on its own and only one with exactly those keys in that order;
//! - a condition per level: `== value` for a node with a value, a wildcard test for a wildcard,
//!   and, to keep the choice envoy/ratelimit makes at that level, `!=` each value (and no match
//!   of each wildcard) that a sibling with the same key takes first — whether that sibling has a
//!   rule or not (`unlimited: true`, no `rate_limit`);
//! - a variable per level without a value (or with a wildcard not `share_threshold`);
//! - `name` = the rule's `name`, `id` = envoy/ratelimit's key of the rule
//!   (`domain.key_value.key`), `shadow: true` for `shadow_mode`, `mode: pooled` for
//!   `quota_mode` ([`Enforcement::Pooled`]; a rule with both is a shadow one), `replaces` as
//!   written;
//! - an `unlimited: true` rule is a limit too, [`Limit::unlimited`]: it applies (so what it
//!   replaces does not) and counts nothing;
//! - the node's `metadata` is the limit's [`Limit::metadata`] (on a node without a rule it is
//!   read and unused, as envoy/ratelimit does).
//!
//! - `detailed_metric` and `value_to_metric` make the rule's statistics per value
//!   ([`Limit::stats_key`]).
//!
//! Each domain also has a limit per unit for the request descriptors that carry their own limit
//! ([`LimitOverride`](crate::LimitOverride), [`Limit::set_by_request`]): such a descriptor is
//! counted against it and no rule — on the counter of the rule it matches when that rule is of
//! the same unit ([`Limit::shared_with_own_limits`]), as envoy/ratelimit's counter is the
//! descriptor's, not the rule's.
//!
//! What has no equivalent is an error at its place: a key twice
//! on one path, and a domain in two files unless merged
//! ([`Policy::parse_envoy_merging_domains`], envoy/ratelimit's `MERGE_DOMAIN_CONFIG`).

use std::fmt::Write as _;
use std::sync::Arc;

use serde::Deserialize;
use serde_saphyr::Spanned;
use tollgate::{Calendar, CalendarUnit};

use crate::error::{PolicyError, Position};
use crate::expr::{Condition, Variable};
use crate::file::yaml_error;
use crate::limit::{AlgorithmKind, Enforcement, Limit, LimitId, Metadata, StatsPart};
use crate::policy::Policy;
use crate::source::SourceText;

/// One file as written; every field envoy/ratelimit knows, so that an unknown one is an error
/// and a known one without an equivalent is refused by name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    domain: Option<Spanned<String>>,
    #[serde(default)]
    descriptors: Option<Vec<Spanned<RawDescriptor>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    key: Option<Spanned<String>>,
    value: Option<Spanned<String>>,
    rate_limit: Option<Spanned<RawRateLimit>>,
    #[serde(default)]
    descriptors: Option<Vec<Spanned<RawDescriptor>>>,
    shadow_mode: Option<Spanned<bool>>,
    quota_mode: Option<Spanned<bool>>,
    detailed_metric: Option<Spanned<bool>>,
    value_to_metric: Option<Spanned<bool>>,
    share_threshold: Option<Spanned<bool>>,
    metadata: Option<Spanned<serde_json::Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    unit: Option<Spanned<String>>,
    requests_per_unit: Option<Spanned<i64>>,
    unlimited: Option<Spanned<bool>>,
    name: Option<Spanned<String>>,
    #[serde(default)]
    replaces: Option<Vec<Spanned<RawReplaces>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplaces {
    name: Option<Spanned<String>>,
}

/// What a node matches at its level.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Value {
    /// No value: any value of the key, one counter per value.
    Any,
    /// This value only.
    Exact(String),
    /// A pattern where each `*` is any run of characters.
    Wildcard(String),
}

/// A rule: one that counts, or an `unlimited` one (no unit).
struct Rule {
    max_value: u64,
    /// `None` for `unlimited: true`.
    unit: Option<CalendarUnit>,
    name: Option<String>,
    replaces: Vec<String>,
    /// `shadow_mode` (shadow), `quota_mode` (pooled), else enforce.
    enforcement: Enforcement,
    /// The node's `metadata`, returned for a request that passed the rule.
    metadata: Option<Arc<Metadata>>,
}

/// A descriptor node of the tree, validated.
struct Node {
    key: String,
    value: Value,
    share_threshold: bool,
    /// `value_to_metric`: the request's value of this level goes in the statistics key.
    value_to_metric: bool,
    /// `detailed_metric` (on the rule's node): every value of the request goes in it.
    detailed_metric: bool,
    rule: Option<Rule>,
    children: Vec<Node>,
    at: Position,
}

/// One file's domain and tree.
struct Domain {
    name: String,
    at: Position,
    nodes: Vec<Node>,
}

impl Policy {
    /// Parses envoy/ratelimit's configuration files — each a `domain` and its `descriptors` —
    /// into one policy; see the [module documentation](crate::envoy) for how each rule maps to a limit.
    /// The texts are usually [`crate::Format::Envoy`]'s [`read`](crate::Format::read) of a
    /// directory.
    ///
    /// ```
    /// use tollgate_policy::{Descriptor, Policy, SourceText};
    ///
    /// // envoy/ratelimit's README, example 3.
    /// let yaml = "
    /// domain: edge_proxy_per_ip
    /// descriptors:
    ///   - key: remote_address
    ///     rate_limit:
    ///       unit: second
    ///       requests_per_unit: 10
    ///   - key: remote_address
    ///     value: 50.0.0.5
    ///     rate_limit:
    ///       unit: second
    ///       requests_per_unit: 1
    /// ";
    /// let policy = Policy::parse_envoy(&[SourceText::new("config/edge.yaml", yaml)])?;
    /// let any = &policy.limits()[0];
    /// assert_eq!(any.descriptor_keys(), Some(&["remote_address".to_string()][..]));
    /// assert_eq!(any.conditions()[0].source(), "descriptors[0]['remote_address'] != '50.0.0.5'");
    /// assert_eq!(any.variables()[0].source(), "descriptors[0]['remote_address']");
    /// assert_eq!(any.file_id(), Some("edge_proxy_per_ip.remote_address"));
    ///
    /// let one = [Descriptor::from([("remote_address", "50.0.0.5")])];
    /// let hits = policy.hits("edge_proxy_per_ip", &one);
    /// assert_eq!((hits.len(), hits[0].limit.max_value()), (1, 1), "the most specific rule only");
    ///
    /// let bad = Policy::parse_envoy(&[SourceText::new("config/edge.yaml", "domain: a\ndescriptors:\n  - value: x\n")]);
    /// assert_eq!(bad.unwrap_err().to_string(), "config/edge.yaml:3:5: this descriptor has no `key` (required)");
    /// # Ok::<(), tollgate_policy::PolicyError>(())
    /// ```
    pub fn parse_envoy(sources: &[SourceText]) -> Result<Policy, PolicyError> {
        envoy_policy(sources, false)
    }

    /// [`Policy::parse_envoy`] as envoy/ratelimit with `MERGE_DOMAIN_CONFIG=true` reads files:
    /// a domain in several files is one domain, its descriptors in file order (the order
    /// [`Format::read`](crate::Format::read) gives), and two top-level descriptors with the same
    /// key and value are an error, as within one file (`src/config/config_impl.go`, `loadConfig`
    /// and `loadDescriptors`).
    ///
    /// ```
    /// use tollgate_policy::{Policy, SourceText};
    /// let a = SourceText::new("a.yaml", "domain: d\ndescriptors:\n  - {key: k1, rate_limit: {unit: second, requests_per_unit: 1}}\n");
    /// let b = SourceText::new("b.yaml", "domain: d\ndescriptors:\n  - {key: k2, rate_limit: {unit: minute, requests_per_unit: 2}}\n");
    /// assert!(Policy::parse_envoy(&[a.clone(), b.clone()]).is_err(), "a domain in two files");
    /// assert_eq!(Policy::parse_envoy_merging_domains(&[a, b])?.len(), 2);
    /// # Ok::<(), tollgate_policy::PolicyError>(())
    /// ```
    pub fn parse_envoy_merging_domains(sources: &[SourceText]) -> Result<Policy, PolicyError> {
        envoy_policy(sources, true)
    }
}

/// The policy of envoy/ratelimit's files; `merge`: a domain may span several.
fn envoy_policy(sources: &[SourceText], merge: bool) -> Result<Policy, PolicyError> {
    // Each domain, the file it was first read from, and the file of each top-level node.
    let mut domains: Vec<(Domain, Arc<str>, Vec<Arc<str>>)> = Vec::with_capacity(sources.len());
    for source in sources {
        let domain = parse_file(&source.text, &source.name)?;
        let file: Arc<str> = source.name.as_str().into();
        let Some((first, first_file, files)) = domains.iter_mut().find(|(d, _, _)| d.name == domain.name) else {
            let files = vec![Arc::clone(&file); domain.nodes.len()];
            domains.push((domain, file, files));
            continue;
        };
        if !merge {
            return Err(PolicyError::new(
                &source.name,
                domain.at,
                format!(
                    "domain `{}` is also in {first_file}:{}: envoy/ratelimit refuses a domain in two files (unless \
                     MERGE_DOMAIN_CONFIG, tollgate's --merge-domains); put its descriptors in one",
                    domain.name, first.at.line
                ),
            ));
        }
        for node in domain.nodes {
            if let Some((i, same)) =
                first.nodes.iter().enumerate().find(|(_, n)| n.key == node.key && n.value == node.value)
            {
                return Err(PolicyError::new(
                    &source.name,
                    node.at,
                    format!(
                        "the same key and value as the descriptor at {}:{} of domain `{}` (one node per key and \
                         value, merged domains too)",
                        files[i], same.at.line, first.name
                    ),
                ));
            }
            first.nodes.push(node);
            files.push(Arc::clone(&file));
        }
    }
    let mut limits = Vec::new();
    for (domain, _, files) in &domains {
        for (i, node) in domain.nodes.iter().enumerate() {
            let mut path = Vec::new();
            emit(domain, std::slice::from_ref(node), &domain.nodes, &mut path, &files[i], &mut limits)?;
        }
    }
    for (domain, file, _) in &domains {
        limits.extend(REQUEST_UNITS.iter().map(|&unit| set_by_request(domain, unit, file)));
    }
    Policy::checked(limits)
}

/// The units a descriptor's own limit can ask for: envoy/ratelimit's (`UnitToDivider`).
const REQUEST_UNITS: [CalendarUnit; 7] = [
    CalendarUnit::Second,
    CalendarUnit::Minute,
    CalendarUnit::Hour,
    CalendarUnit::Day,
    CalendarUnit::EpochWeek,
    CalendarUnit::EpochMonth,
    CalendarUnit::EpochYear,
];

/// The limit that `domain`'s descriptors with their own limit in `unit` count against
/// ([`Limit::set_by_request`]): its windows are a rule's in that unit; its counters count up to
/// [`COUNT_PAST_CAPACITY`](crate::COUNT_PAST_CAPACITY), each request's own limit applied to
/// them by whoever decides.
fn set_by_request(domain: &Domain, unit: CalendarUnit, file: &Arc<str>) -> Limit {
    let calendar = Calendar::new(unit, "UTC").expect("UTC is a known zone");
    let mut limit = Limit {
        namespace: domain.name.clone(),
        max_value: crate::COUNT_PAST_CAPACITY,
        seconds: calendar.nominal().as_secs(),
        name: None,
        file_id: Some(format!("{}.(descriptor limit per {})", domain.name, unit.name())),
        conditions: Vec::new(),
        variables: Vec::new(),
        algorithm: AlgorithmKind::FixedWindow,
        max_counters: None,
        at_max_counters: None,
        enforcement: Enforcement::Enforce,
        unlimited: false,
        calendar: Some(calendar),
        descriptor_keys: None,
        replaces: Vec::new(),
        metadata: None,
        stats_key: None,
        source_name: Arc::clone(file),
        position: domain.at,
        set_by_request: true,
        shared_with_own_limits: false,
        id: LimitId(0),
    };
    limit.id = limit.compute_id();
    limit
}

fn parse_file(text: &str, file: &str) -> Result<Domain, PolicyError> {
    if text.lines().all(|l| l.trim().is_empty() || l.trim_start().starts_with('#') || l.trim() == "---") {
        return Err(PolicyError::new(
            file,
            Position::new(1, 1),
            "the file is empty: write a `domain` and its `descriptors`",
        ));
    }
    let raw: Spanned<RawConfig> = serde_saphyr::from_str(text).map_err(|e| yaml_error(file, &e))?;
    let at = Position::from(raw.referenced);
    let raw = raw.value;
    let domain = raw.domain.ok_or_else(|| PolicyError::new(file, at, "this file has no `domain` (required)"))?;
    if domain.value.trim().is_empty() {
        return Err(PolicyError::new(file, domain.referenced.into(), "`domain` is empty"));
    }
    let nodes = nodes(raw.descriptors.unwrap_or_default(), file)?;
    Ok(Domain { name: domain.value, at: domain.referenced.into(), nodes })
}

/// The nodes of one level: each validated, no two with the same key and value.
fn nodes(raw: Vec<Spanned<RawDescriptor>>, file: &str) -> Result<Vec<Node>, PolicyError> {
    let mut nodes: Vec<Node> = Vec::with_capacity(raw.len());
    for descriptor in raw {
        let node = node(descriptor, file)?;
        if let Some(first) = nodes.iter().find(|n| n.key == node.key && n.value == node.value) {
            return Err(PolicyError::new(
                file,
                node.at,
                format!(
                    "the same key and value as the descriptor at line {} (one node per key and value)",
                    first.at.line
                ),
            ));
        }
        nodes.push(node);
    }
    Ok(nodes)
}

fn node(descriptor: Spanned<RawDescriptor>, file: &str) -> Result<Node, PolicyError> {
    let at = Position::from(descriptor.referenced);
    let raw = descriptor.value;
    let err = |at: Position, message: String| PolicyError::new(file, at, message);
    let key = raw.key.ok_or_else(|| err(at, "this descriptor has no `key` (required)".into()))?;
    if key.value.is_empty() {
        return Err(err(key.referenced.into(), "`key` is empty".into()));
    }
    let value = match raw.value.map(|v| v.value) {
        // envoy/ratelimit reads an empty value as none.
        None => Value::Any,
        Some(v) if v.is_empty() => Value::Any,
        Some(v) if v.contains('*') => Value::Wildcard(v),
        Some(v) => Value::Exact(v),
    };
    let metadata = raw.metadata.map(|m| crate::file::metadata(m, file)).transpose()?;
    let share_threshold = match raw.share_threshold {
        Some(s) if s.value && !matches!(value, Value::Wildcard(_)) => {
            return Err(err(
                s.referenced.into(),
                "`share_threshold: true` needs a wildcard value (one with `*`), as in envoy/ratelimit".into(),
            ));
        }
        Some(s) => s.value,
        None => false,
    };
    // A shadow rule never reports over, so in quota mode too it only counts (envoy/ratelimit
    // turns its status OK before it counts quota descriptors).
    let enforcement = match (raw.shadow_mode.is_some_and(|s| s.value), raw.quota_mode.is_some_and(|q| q.value)) {
        (true, _) => Enforcement::Shadow,
        (false, true) => Enforcement::Pooled,
        (false, false) => Enforcement::Enforce,
    };
    let rule = match raw.rate_limit {
        Some(rate_limit) => Some(rule(rate_limit, enforcement, metadata, file)?),
        None => None,
    };
    let children = nodes(raw.descriptors.unwrap_or_default(), file)?;
    let value_to_metric = raw.value_to_metric.is_some_and(|v| v.value);
    let detailed_metric = raw.detailed_metric.is_some_and(|d| d.value);
    Ok(Node { key: key.value, value, share_threshold, value_to_metric, detailed_metric, rule, children, at })
}

/// A `rate_limit` block.
fn rule(
    rate_limit: Spanned<RawRateLimit>,
    enforcement: Enforcement,
    metadata: Option<Arc<Metadata>>,
    file: &str,
) -> Result<Rule, PolicyError> {
    let at = Position::from(rate_limit.referenced);
    let raw = rate_limit.value;
    let err = |at: Position, message: String| PolicyError::new(file, at, message);
    let name = raw.name.map(|n| n.value).filter(|n| !n.is_empty());
    let mut replaces = Vec::new();
    for entry in raw.replaces.unwrap_or_default() {
        let replaced = entry.value.name.map(|n| n.value).unwrap_or_default();
        if replaced.is_empty() {
            return Err(err(entry.referenced.into(), "a `replaces` entry without a `name`".into()));
        }
        if name.as_deref() == Some(replaced.as_str()) {
            return Err(err(entry.referenced.into(), format!("the rule `{replaced}` replaces itself")));
        }
        replaces.push(replaced);
    }
    if raw.unlimited.is_some_and(|u| u.value) {
        if let Some(unit) = raw.unit {
            return Err(err(
                unit.referenced.into(),
                "`unit` with `unlimited: true`: an unlimited rule has no unit (envoy/ratelimit refuses it too)".into(),
            ));
        }
        return Ok(Rule { max_value: u64::MAX, unit: None, name, replaces, enforcement, metadata });
    }
    let unit = raw.unit.ok_or_else(|| err(at, "this rate_limit has no `unit` (required)".into()))?;
    let unit_at = Position::from(unit.referenced);
    let unit = match unit.value.trim().to_ascii_lowercase().as_str() {
        "second" => CalendarUnit::Second,
        "minute" => CalendarUnit::Minute,
        "hour" => CalendarUnit::Hour,
        "day" => CalendarUnit::Day,
        // envoy/ratelimit's windows are `now / divider` from the epoch, its week, month and
        // year 7, 30 and 365 days (`src/utils/utilities.go`, `UnitToDivider`).
        "week" => CalendarUnit::EpochWeek,
        "month" => CalendarUnit::EpochMonth,
        "year" => CalendarUnit::EpochYear,
        _ => {
            return Err(err(
                unit_at,
                format!("unknown unit `{}`: expected second, minute, hour, day, week, month or year", unit.value),
            ));
        }
    };
    // envoy/ratelimit reads a missing `requests_per_unit` as 0, and 0 denies every request (its
    // README's way to ban an address).
    let max_value = match raw.requests_per_unit.map(|r| (u32::try_from(r.value), r)) {
        None => 0,
        Some((Ok(n), _)) => u64::from(n),
        Some((Err(_), requests)) => {
            return Err(err(
                requests.referenced.into(),
                format!("requests_per_unit must be from 0 to 4294967295 (a uint32), got {}", requests.value),
            ));
        }
    };
    Ok(Rule { max_value, unit: Some(unit), name, replaces, enforcement, metadata })
}

/// Emits a limit for each rule of `nodes` and under them, depth first, in file order; `nodes`
/// are among `siblings` (their level); `path` holds each level's node and its siblings.
fn emit<'d>(
    domain: &Domain,
    nodes: &'d [Node],
    siblings: &'d [Node],
    path: &mut Vec<(&'d Node, &'d [Node])>,
    file: &Arc<str>,
    limits: &mut Vec<Limit>,
) -> Result<(), PolicyError> {
    for node in nodes {
        path.push((node, siblings));
        if let Some(rule) = &node.rule {
            limits.push(limit(domain, path, rule, file)?);
        }
        emit(domain, &node.children, &node.children, path, file, limits)?;
        path.pop();
    }
    Ok(())
}

/// The limit of the rule at the end of `path`.
fn limit(domain: &Domain, path: &[(&Node, &[Node])], rule: &Rule, file: &Arc<str>) -> Result<Limit, PolicyError> {
    let (node, _) = path[path.len() - 1];
    for (i, (level, _)) in path.iter().enumerate() {
        if let Some((again, _)) = path[i + 1..].iter().find(|(n, _)| n.key == level.key) {
            return Err(PolicyError::new(
                file,
                again.at,
                format!(
                    "key `{}` again on the path of the rule at line {} (first at line {}): tollgate reads a \
                     descriptor's entry by its key, so it cannot tell the two entries apart",
                    level.key, node.at.line, level.at.line
                ),
            ));
        }
    }
    let bug = |what: &str, source: &str, e: crate::ExprError| {
        PolicyError::new(file, node.at, format!("cannot express this rule: {what} `{source}`: {e}"))
    };
    let mut conditions = Vec::new();
    let mut variables = Vec::new();
    let mut envoy_key = domain.name.clone();
    let mut stats_key = StatsKey::default();
    for (level, siblings) in path {
        stats_key.level(level, node.detailed_metric, variables.len());
        let entry = format!("descriptors[0][{}]", cel_string(&level.key));
        level_conditions(level, siblings, &entry, &mut conditions);
        let counted = match &level.value {
            Value::Any => true,
            Value::Wildcard(_) => !level.share_threshold,
            Value::Exact(_) => false,
        };
        if counted {
            variables.push(entry);
        }
        envoy_key.push('.');
        envoy_key.push_str(&level.key);
        if let Value::Exact(v) | Value::Wildcard(v) = &level.value {
            let _ = write!(envoy_key, "_{v}");
        }
    }
    let conditions =
        conditions.iter().map(|c| Condition::parse(c).map_err(|e| bug("condition", c, e))).collect::<Result<_, _>>()?;
    let variables =
        variables.iter().map(|v| Variable::parse(v).map_err(|e| bug("variable", v, e))).collect::<Result<_, _>>()?;
    let calendar = (rule.unit.map(|unit| Calendar::new(unit, "UTC")).transpose())
        .map_err(|e| PolicyError::new(file, node.at, e.to_string()))?;
    let mut limit = Limit {
        namespace: domain.name.clone(),
        max_value: rule.max_value,
        // An unlimited rule counts nothing, in no window.
        seconds: calendar.as_ref().map_or(1, |c| c.nominal().as_secs()),
        name: rule.name.clone(),
        file_id: Some(envoy_key),
        conditions,
        variables,
        algorithm: AlgorithmKind::FixedWindow,
        max_counters: None,
        at_max_counters: None,
        enforcement: rule.enforcement,
        unlimited: rule.unit.is_none(),
        calendar,
        descriptor_keys: Some(path.iter().map(|(n, _)| n.key.clone()).collect()),
        replaces: rule.replaces.clone(),
        metadata: rule.metadata.clone(),
        // An unlimited rule keeps no statistics, per value or not.
        stats_key: stats_key.finish(&domain.name).filter(|_| rule.unit.is_some()),
        source_name: Arc::clone(file),
        position: node.at,
        set_by_request: false,
        // A share_threshold level keys envoy/ratelimit's counter by its pattern, where a
        // descriptor's own limit keys it by the value.
        shared_with_own_limits: rule.unit.is_some() && !path.iter().any(|(n, _)| n.share_threshold),
        id: LimitId(0),
    };
    limit.id = limit.compute_id();
    Ok(limit)
}

/// A rule's statistics key with the request's values in it, as envoy/ratelimit builds it with
/// `detailed_metric` (every entry's `key_value`, a `share_threshold` wildcard's pattern) or
/// `value_to_metric` (the value at those levels only, `key` alone when it is empty), from
/// `src/config/config_impl.go`, `GetLimit`.
#[derive(Default)]
struct StatsKey {
    parts: Vec<StatsPart>,
    /// True once a part reads a request's value.
    per_value: bool,
}

impl StatsKey {
    /// Adds a level; `variable` is the index its variable has, if it counts per value.
    fn level(&mut self, level: &Node, detailed: bool, variable: usize) {
        let text = |s: &mut StatsKey, t: String| s.parts.push(StatsPart::Text(t));
        text(self, format!(".{}", level.key));
        let value = match &level.value {
            Value::Exact(v) => Some(StatsPart::Text(format!("_{v}"))),
            Value::Wildcard(pattern) if level.share_threshold => Some(StatsPart::Text(format!("_{pattern}"))),
            Value::Wildcard(_) if detailed => Some(StatsPart::Value(variable)),
            Value::Wildcard(_) if level.value_to_metric => Some(StatsPart::Value(variable)),
            Value::Wildcard(pattern) => Some(StatsPart::Text(format!("_{pattern}"))),
            Value::Any if detailed => Some(StatsPart::Value(variable)),
            Value::Any if level.value_to_metric => Some(StatsPart::NonEmptyValue(variable)),
            Value::Any => None,
        };
        self.per_value |= matches!(value, Some(StatsPart::Value(_) | StatsPart::NonEmptyValue(_)));
        self.parts.extend(value);
    }

    fn finish(self, domain: &str) -> Option<Arc<crate::limit::StatsTemplate>> {
        let mut parts = vec![StatsPart::Text(domain.to_string())];
        parts.extend(self.parts);
        self.per_value.then(|| Arc::new(crate::limit::StatsTemplate { parts }))
    }
}

/// The conditions that make a request entry with `node`'s key reach `node` among `siblings`:
/// its own value test, and not any value a sibling with the same key takes first. envoy/ratelimit
/// looks the value up as written first (which finds a wildcard node too, by its own text), then
/// tries the wildcards in file order, then the key alone.
fn level_conditions(node: &Node, siblings: &[Node], entry: &str, conditions: &mut Vec<String>) {
    let before_node = siblings.iter().position(|s| std::ptr::eq(s, node)).unwrap_or(siblings.len());
    let others = siblings.iter().enumerate().filter(|(i, s)| *i != before_node && s.key == node.key);
    match &node.value {
        Value::Exact(v) => conditions.push(format!("{entry} == {}", cel_string(v))),
        Value::Wildcard(pattern) => {
            let mut all = vec![wildcard_test(entry, pattern)];
            let mut literal_shadowed = false;
            for (i, other) in others {
                match &other.value {
                    // A sibling's value written out is found by the exact lookup, before any
                    // wildcard (a wildcard's own text too).
                    Value::Exact(v) | Value::Wildcard(v) if wildcard_matches(pattern, v) => {
                        all.push(format!("{entry} != {}", cel_string(v)));
                    }
                    _ => {}
                }
                if let Value::Wildcard(earlier) = &other.value
                    && i < before_node
                {
                    all.push(format!("!({})", wildcard_test(entry, earlier)));
                    literal_shadowed |= wildcard_matches(earlier, pattern);
                }
            }
            if literal_shadowed {
                // This pattern's own text reaches it by the exact lookup, though an earlier
                // wildcard matches it.
                conditions.push(format!("{entry} == {} || ({})", cel_string(pattern), all.join(" && ")));
            } else {
                conditions.extend(all);
            }
        }
        Value::Any => {
            for (_, other) in others {
                match &other.value {
                    Value::Exact(v) => conditions.push(format!("{entry} != {}", cel_string(v))),
                    Value::Wildcard(pattern) => conditions.push(format!("!({})", wildcard_test(entry, pattern))),
                    Value::Any => {}
                }
            }
        }
    }
}

/// A CEL test of `entry` against a wildcard pattern: `startsWith` for a trailing `*`, else an
/// anchored regular expression with each `*` as `.*`.
fn wildcard_test(entry: &str, pattern: &str) -> String {
    if let Some(prefix) = pattern.strip_suffix('*')
        && !prefix.contains('*')
    {
        return format!("{entry}.startsWith({})", cel_string(prefix));
    }
    let mut regex = String::from("(?s)^");
    for (i, part) in pattern.split('*').enumerate() {
        if i > 0 {
            regex.push_str(".*");
        }
        for c in part.chars() {
            if "\\.+*?()|[]{}^$#&-~".contains(c) {
                regex.push('\\');
            }
            regex.push(c);
        }
    }
    regex.push('$');
    format!("{entry}.matches({})", cel_string(&regex))
}

/// envoy/ratelimit's wildcard match: each `*` is any run of characters, the parts in order.
fn wildcard_matches(pattern: &str, value: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return first == value;
    }
    if value.len() < parts.iter().map(|p| p.len()).sum::<usize>() {
        return false;
    }
    let Some(rest) = value.strip_prefix(first).and_then(|r| r.strip_suffix(last)) else { return false };
    let mut rest = rest;
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

/// A CEL string literal in single quotes.
fn cel_string(text: &str) -> String {
    crate::write::quote(text, '\'')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_as_envoy_ratelimit_does() {
        assert!(wildcard_matches("files/*", "files/a.pdf"));
        assert!(wildcard_matches("files/*", "files/"));
        assert!(!wildcard_matches("files/*", "file"));
        assert!(wildcard_matches("/api/*/action", "/api/123/action"));
        assert!(!wildcard_matches("/api/*/action", "/api/123/other"));
        assert!(wildcard_matches("/api/*/resource/*/action", "/api/v1/resource/9/action"));
        assert!(!wildcard_matches("ab*ba", "aba"), "prefix and suffix may not overlap");
        assert!(wildcard_matches("*", ""));
        assert!(wildcard_matches("exact", "exact"));
    }

    #[test]
    fn strings_are_quoted_for_cel() {
        assert_eq!(cel_string("a'b\\c"), r"'a\'b\\c'");
        assert_eq!(cel_string("line\nnext\u{1}"), r"'line\nnext\u0001'");
        assert_eq!(wildcard_test("e", "v*"), "e.startsWith('v')");
        assert_eq!(wildcard_test("e", "/a.*/b"), r"e.matches('(?s)^/a\\..*/b$')");
    }
}
