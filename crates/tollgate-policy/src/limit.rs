//! One validated limit: how many hits per how many seconds, for which requests, counted per what.

use std::sync::Arc;
use std::time::Duration;

use tollgate::{Quota, QuotaError};

use crate::error::Position;
use crate::expr::{Condition, Variable};

/// Segments of a `sliding_window` limit: hits leave the window a tenth of it at a time, so there is
/// no fixed edge where a full window's worth can follow another at once.
pub const SLIDING_SEGMENTS: u64 = 10;

/// How a limit counts: the core's catalogue, of which a limits file names the algorithms whose
/// [`support`](AlgorithmKind::support) says `limits_file` (`fixed_window`, Limitador's and the
/// default, `token_bucket`, `sliding_window` in [`SLIDING_SEGMENTS`] segments, `weighted_window`).
pub use tollgate::AlgorithmKind;

/// What a limit does with a request it has no room for.
///
/// ```
/// use tollgate_policy::{Enforcement, Policy};
///
/// let yaml = "- {namespace: a, max_value: 1, seconds: 60, shadow: true}\n\
///             - {namespace: a, max_value: 9, seconds: 60, mode: quota, name: monthly}";
/// let policy = Policy::parse(yaml, "limits.yaml")?;
/// assert_eq!(policy.limits()[0].enforcement(), Enforcement::Shadow);
/// assert_eq!(policy.limits()[1].enforcement(), Enforcement::Quota);
/// assert!(!Enforcement::Quota.denies());
/// # Ok::<(), tollgate_policy::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Enforcement {
    /// The request is denied (Limitador's only behaviour; `mode: enforce`, the default).
    #[default]
    Enforce,
    /// The limit counts and reports, and never denies (`shadow: true`): a new limit tried on
    /// real traffic before it is enforced (envoy/ratelimit's `shadow_mode`). Metrics label what
    /// it would have limited. A fixed window counts every hit of every request it applies to,
    /// past its limit, allowed or not, as envoy/ratelimit's (see [`Limit::counts_past`]).
    Shadow,
    /// The request is allowed and the response marked with the quota exceeded (`mode: quota`):
    /// billing-style quotas where going over is charged or reported, not refused.
    Quota,
    /// One of a request's alternative quotas (`mode: pooled`, envoy/ratelimit's `quota_mode`):
    /// the request is denied only when *every* pooled limit it touches is over, and a pooled
    /// limit counts every hit, past its limit and whether the request is allowed or not — so a
    /// check of 0 hits sees it over once it was charged past its limit (envoy/ratelimit's
    /// `src/service/ratelimit.go`, `shouldRateLimitWorker`). Fixed windows only.
    Pooled,
}

impl Enforcement {
    /// False when the limit does not deny a request on its own (shadow, quota and pooled limits).
    pub fn denies(self) -> bool {
        self == Enforcement::Enforce
    }

    /// The name used in limits files and metrics (`enforce`, `shadow`, `quota`, `pooled`).
    pub fn name(self) -> &'static str {
        match self {
            Enforcement::Enforce => "enforce",
            Enforcement::Shadow => "shadow",
            Enforcement::Quota => "quota",
            Enforcement::Pooled => "pooled",
        }
    }
}

/// What the counters of a limit that [counts past](Limit::counts_past) its limit (pooled limits,
/// shadow fixed windows) and of the limits [set by requests](Limit::set_by_request) hold at
/// most: 2<sup>53</sup>, the largest whole number Redis's Lua holds exactly.
pub const COUNT_PAST_CAPACITY: u64 = 1 << 53;

/// A limit's [`metadata`](Limit::metadata): a mapping from names to any YAML values, as JSON
/// values (what `google.protobuf.Struct` carries).
pub type Metadata = serde_json::Map<String, serde_json::Value>;

/// How a limit's per-value statistics key is written (see [`Limit::stats_key`]).
#[derive(Debug)]
pub(crate) struct StatsTemplate {
    pub(crate) parts: Vec<StatsPart>,
}

/// A piece of a [`StatsTemplate`].
#[derive(Debug)]
pub(crate) enum StatsPart {
    /// Written as it is.
    Text(String),
    /// `_` and the value of this variable.
    Value(usize),
    /// `_` and the value of this variable, nothing when it is empty.
    NonEmptyValue(usize),
}

/// A limit from the limits file, validated.
#[derive(Clone, Debug)]
pub struct Limit {
    pub(crate) namespace: String,
    pub(crate) max_value: u64,
    pub(crate) seconds: u64,
    pub(crate) name: Option<String>,
    pub(crate) file_id: Option<String>,
    pub(crate) conditions: Vec<Condition>,
    pub(crate) variables: Vec<Variable>,
    pub(crate) algorithm: AlgorithmKind,
    pub(crate) max_counters: Option<std::num::NonZeroUsize>,
    pub(crate) at_max_counters: Option<tollgate::AtKeyLimit>,
    pub(crate) enforcement: Enforcement,
    pub(crate) unlimited: bool,
    pub(crate) calendar: Option<tollgate::Calendar>,
    pub(crate) descriptor_keys: Option<Vec<String>>,
    pub(crate) replaces: Vec<String>,
    pub(crate) metadata: Option<Arc<Metadata>>,
    pub(crate) stats_key: Option<Arc<StatsTemplate>>,
    pub(crate) source_name: Arc<str>,
    pub(crate) position: Position,
    pub(crate) set_by_request: bool,
    pub(crate) shared_with_own_limits: bool,
    pub(crate) id: LimitId,
}

/// A limit's identity: what it counts, not how much it allows. Derived from namespace, seconds,
/// conditions (as a set), variables, algorithm, calendar, descriptor keys and, for a shadow or
/// quota limit, its [`Enforcement`] (so a shadow copy of an enforced limit has counters of its
/// own) — not
/// `max_value` or `name`, as Limitador — so
/// it is equal in every process and across reloads while those are unchanged, and counters are
/// kept (in memory across a reload, in Redis across replicas) when only `max_value` changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LimitId(pub u64);

impl std::fmt::Display for LimitId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl Limit {
    /// The namespace (Envoy's `domain`).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }
    /// Hits allowed per window; 0 denies every request the limit applies to, and counts nothing.
    pub fn max_value(&self) -> u64 {
        self.max_value
    }
    /// True for `max_value: 0` (envoy/ratelimit's `requests_per_unit: 0`): the limit denies every
    /// request it applies to, and there is nothing to count.
    pub fn denies_all(&self) -> bool {
        // A pooled limit of 0 counts: a request is over it, a check of 0 hits not until then.
        self.max_value == 0 && self.enforcement != Enforcement::Pooled
    }
    /// True for a limit whose counters count every hit of every request it applies to, past the
    /// limit and whatever the request's outcome, as envoy/ratelimit's counters do
    /// (`src/limiter/base_limiter.go`, `GetResponseDescriptorStatus`, which increments before it
    /// compares): [pooled](Enforcement::Pooled) limits, and [shadow](Enforcement::Shadow) fixed
    /// windows (envoy/ratelimit's `shadow_mode`) where the storage charges them (memory and
    /// `--storage redis`; the storages with local copies count a shadow limit's admitted hits, up
    /// to the limit).
    pub fn counts_past(&self) -> bool {
        match self.enforcement {
            Enforcement::Pooled => true,
            Enforcement::Shadow => self.algorithm == AlgorithmKind::FixedWindow,
            Enforcement::Enforce | Enforcement::Quota => false,
        }
    }
    /// What the limit's counters hold: `max_value`, or for a limit that [counts
    /// past](Limit::counts_past) it or whose counters are [shared with requests' own
    /// limits](Limit::shared_with_own_limits) [`COUNT_PAST_CAPACITY`] (the limit is then applied
    /// to [`Limit::count`] by whoever decides, and a new `max_value` applies to the counts kept).
    pub fn capacity(&self) -> u64 {
        if self.counts_past() || self.shared_with_own_limits {
            COUNT_PAST_CAPACITY.max(self.max_value)
        } else {
            self.max_value
        }
    }
    /// The hits a counter of this limit holds, from its state as the counter reports it (its
    /// limit is the [`capacity`](Limit::capacity)).
    pub fn count(&self, counted: tollgate::Meta) -> u64 {
        counted.limit.saturating_sub(counted.remaining)
    }
    /// True when a counter holding `counted` (as its counters report it) is past `max_value`
    /// with `asked` more hits: how a limit that [counts past](Limit::counts_past) it is applied.
    pub fn over(&self, counted: tollgate::Meta, asked: u64) -> bool {
        self.count(counted).saturating_add(asked) > self.max_value
    }
    /// A counter's state as the limit reports it: as its counters hold it, but for a limit whose
    /// counters hold more than `max_value` ([`Limit::capacity`]) what is left of `max_value` (0
    /// past it).
    ///
    /// ```
    /// use tollgate::Meta;
    /// use tollgate_policy::Policy;
    ///
    /// let policy = Policy::parse("- {namespace: a, max_value: 2, seconds: 60, mode: pooled}", "limits.yaml")?;
    /// let limit = &policy.limits()[0];
    /// assert_eq!(limit.capacity(), 1 << 53);
    /// let counted = Meta { limit: 1 << 53, remaining: (1 << 53) - 1, reset_ns: 5, retry_ns: None };
    /// assert_eq!(limit.count(counted), 1);
    /// assert_eq!(limit.reported(counted), Meta { limit: 2, remaining: 1, ..counted });
    /// let past = Meta { remaining: (1 << 53) - 5, ..counted };
    /// assert_eq!(limit.reported(past), Meta { limit: 2, remaining: 0, ..counted });
    /// # Ok::<(), tollgate_policy::PolicyError>(())
    /// ```
    pub fn reported(&self, meta: tollgate::Meta) -> tollgate::Meta {
        if self.capacity() == self.max_value {
            return meta;
        }
        tollgate::Meta { limit: self.max_value, remaining: self.max_value.saturating_sub(self.count(meta)), ..meta }
    }
    /// True for a limit whose hits allowed per window each request's descriptor sets
    /// ([`Descriptor::limit`](crate::Descriptor::limit), see [`LimitOverride`](crate::LimitOverride)):
    /// one per domain and unit of a policy read from envoy/ratelimit's format, not written in
    /// the file (not among [`Policy::rules`](crate::Policy::rules)). Its `max_value` is what its
    /// counters hold at most, [`COUNT_PAST_CAPACITY`]; the request's is [`Hit::max_value`](crate::Hit::max_value).
    pub fn set_by_request(&self) -> bool {
        self.set_by_request
    }
    /// True for an envoy/ratelimit rule whose counters the request descriptors it matches count
    /// on also when they carry their own limit in the rule's unit ([`Hit::counter`](crate::Hit::counter)):
    /// envoy/ratelimit keys a counter by domain, descriptor entries and window, not by rule
    /// (`src/limiter/cache_key.go`, `GenerateCacheKey`), so a descriptor counted against its own
    /// limit and the same descriptor counted against the rule share one count. Every counted
    /// rule but one with a `share_threshold` wildcard (its key has the pattern, a descriptor's own
    /// limit the value). Its counters then hold up to [`COUNT_PAST_CAPACITY`] ([`Limit::capacity`]).
    pub fn shared_with_own_limits(&self) -> bool {
        self.shared_with_own_limits
    }
    /// The window, in seconds.
    pub fn seconds(&self) -> u64 {
        self.seconds
    }
    /// The optional name (used in metrics and responses).
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
    /// The optional `id` field of the file (Limitador's; informational).
    pub fn file_id(&self) -> Option<&str> {
        self.file_id.as_deref()
    }
    /// The conditions, all of which must hold.
    pub fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
    /// The variables: one counter per distinct combination of their values.
    pub fn variables(&self) -> &[Variable] {
        &self.variables
    }
    /// How the limit counts.
    pub fn algorithm(&self) -> AlgorithmKind {
        self.algorithm
    }
    /// The most counters (distinct combinations of variable values) kept in memory for this
    /// limit, if the file sets it (`max_counters`; the server's `--max-counters` otherwise).
    pub fn max_counters(&self) -> Option<std::num::NonZeroUsize> {
        self.max_counters
    }
    /// What a new counter gets when `max_counters` are kept and none is idle, if the file sets it
    /// (`at_max_counters: reject | evict | admit`; the server's `--at-max-counters` otherwise).
    pub fn at_max_counters(&self) -> Option<tollgate::AtKeyLimit> {
        self.at_max_counters
    }
    /// True for envoy/ratelimit's `unlimited: true` rule: the limit applies to a request (so the
    /// limits it [replaces](Limit::replaces) do not) and counts nothing; envoy/ratelimit answers
    /// it with no current limit and 4294967295 remaining. Its `max_value` is `u64::MAX`.
    pub fn unlimited(&self) -> bool {
        self.unlimited
    }
    /// What the limit does with a request it has no room for (`shadow: true`, `mode: quota`).
    pub fn enforcement(&self) -> Enforcement {
        self.enforcement
    }
    /// The calendar its windows follow (`window: {calendar: month, timezone: UTC}`), if any:
    /// then [`Limit::seconds`] is the calendar's nominal length (a day, 7 days, 30 days).
    pub fn calendar(&self) -> Option<&tollgate::Calendar> {
        self.calendar.as_ref()
    }
    /// The keys of the descriptors the limit applies to one by one (`descriptor_keys`), if it
    /// sets them: then each descriptor of a request whose entries have exactly these keys, in
    /// this order, is matched on its own — its conditions and variables read that descriptor as
    /// `descriptors[0]` — and counts on its own (envoy/ratelimit's matching). Without them the
    /// limit reads the request's descriptors together, as Limitador's.
    pub fn descriptor_keys(&self) -> Option<&[String]> {
        self.descriptor_keys.as_deref()
    }
    /// The names of the limits this one replaces (`replaces`, envoy/ratelimit's): when this limit
    /// applies to a request, limits of the namespace with one of these names do not.
    pub fn replaces(&self) -> &[String] {
        &self.replaces
    }
    /// What the file says about the limit for whoever reads the answers (`metadata`, a mapping:
    /// envoy/ratelimit's rule `metadata`), if anything. The limit's counting ignores it; the RLS
    /// server returns it in `dynamic_metadata` for the rules a request passed, with
    /// `--response-dynamic-metadata`.
    ///
    /// ```
    /// use tollgate_policy::Policy;
    ///
    /// let yaml = "- {namespace: a, max_value: 1, seconds: 60, metadata: {service: {name: billing}}}";
    /// let policy = Policy::parse(yaml, "limits.yaml")?;
    /// let metadata = policy.limits()[0].metadata().expect("it has some");
    /// assert_eq!(metadata["service"]["name"], "billing");
    /// # Ok::<(), tollgate_policy::PolicyError>(())
    /// ```
    pub fn metadata(&self) -> Option<&Metadata> {
        self.metadata.as_deref()
    }
    /// The key of the statistics of the counter with these variable `values`, when the limit
    /// keeps them per value: envoy/ratelimit's stats key for a rule with `detailed_metric` (every
    /// entry's `key_value`) or `value_to_metric` levels (those levels' values), e.g.
    /// `gateway.remote_address_192.0.2.1`; `None` for a limit whose statistics are per limit.
    ///
    /// ```
    /// use tollgate_policy::{Policy, SourceText};
    ///
    /// let yaml = "domain: gateway\ndescriptors:\n  - key: remote_address\n    detailed_metric: true\n    \
    ///             rate_limit: {unit: second, requests_per_unit: 10}\n";
    /// let policy = Policy::parse_envoy(&[SourceText::new("gateway.yaml", yaml)])?;
    /// let limit = &policy.limits()[0];
    /// assert_eq!(limit.stats_key(&["192.0.2.1".to_string()]).as_deref(), Some("gateway.remote_address_192.0.2.1"));
    /// # Ok::<(), tollgate_policy::PolicyError>(())
    /// ```
    pub fn stats_key(&self, values: &[String]) -> Option<String> {
        let template = self.stats_key.as_ref()?;
        let value = |i: usize| values.get(i).map_or("", String::as_str);
        let mut key = String::new();
        for part in &template.parts {
            match part {
                StatsPart::Text(text) => key.push_str(text),
                StatsPart::Value(i) => {
                    key.push('_');
                    key.push_str(value(*i));
                }
                StatsPart::NonEmptyValue(i) if value(*i).is_empty() => {}
                StatsPart::NonEmptyValue(i) => {
                    key.push('_');
                    key.push_str(value(*i));
                }
            }
        }
        Some(key)
    }
    /// True when the limit keeps its statistics per value (see [`Limit::stats_key`]).
    pub fn has_stats_key(&self) -> bool {
        self.stats_key.is_some()
    }
    /// The file (or other source name) the limit was read from.
    pub fn source_name(&self) -> &str {
        &self.source_name
    }
    /// Where the limit starts in its file.
    pub fn position(&self) -> Position {
        self.position
    }
    /// The limit's identity (see [`LimitId`]).
    pub fn id(&self) -> LimitId {
        self.id
    }
    /// The window as a duration.
    pub fn window(&self) -> Duration {
        Duration::from_secs(self.seconds)
    }
    /// The quota: [`capacity`](Limit::capacity) (`max_value`) per `seconds` — as a [`Quota::window`] for a windowed algorithm,
    /// so more than one hit per nanosecond is fine there. [`QuotaError::ZeroLimit`] for a limit
    /// that [denies all](Limit::denies_all).
    pub fn quota(&self) -> Result<Quota, QuotaError> {
        if self.algorithm.support().windowed {
            Quota::window(self.window(), self.capacity())
        } else {
            Quota::per(self.window(), self.capacity())
        }
    }

    /// What makes two limits count the same requests the same way; two limits with equal shapes
    /// in one file are a mistake (which max_value is meant?).
    pub(crate) fn shape(&self) -> Shape {
        let mut conditions: Vec<String> = self.conditions.iter().map(|c| c.source().trim().to_string()).collect();
        conditions.sort();
        let variables = self.variables.iter().map(|v| v.source().trim().to_string()).collect();
        let calendar = self.calendar.as_ref().map_or_else(String::new, |c| format!("{}@{}", c.unit().name(), c.zone()));
        Shape {
            namespace: self.namespace.clone(),
            seconds: self.seconds,
            conditions,
            variables,
            algorithm: self.algorithm,
            enforcement: self.enforcement,
            calendar,
            descriptor_keys: self.descriptor_keys.clone(),
            unlimited: self.unlimited,
            set_by_request: self.set_by_request,
        }
    }

    pub(crate) fn compute_id(&self) -> LimitId {
        let Shape {
            namespace,
            seconds,
            conditions,
            variables,
            algorithm,
            enforcement,
            calendar,
            descriptor_keys,
            unlimited,
            set_by_request,
        } = self.shape();
        let mut h = Fnv::default();
        h.write(namespace.as_bytes());
        h.write(&seconds.to_le_bytes());
        for c in &conditions {
            h.write(b"c");
            h.write(c.as_bytes());
        }
        for v in &variables {
            h.write(b"v");
            h.write(v.as_bytes());
        }
        h.write(algorithm.name().as_bytes());
        // Enforced limits keep the ids they had before shadow and quota limits existed.
        if enforcement != Enforcement::Enforce {
            h.write(enforcement.name().as_bytes());
        }
        if !calendar.is_empty() {
            h.write(calendar.as_bytes());
        }
        // Limits that read the request's descriptors together keep the ids they had before.
        for key in descriptor_keys.iter().flatten() {
            h.write(b"k");
            h.write(key.as_bytes());
        }
        if unlimited {
            h.write(b"unlimited");
        }
        if set_by_request {
            h.write(b"set_by_request");
        }
        LimitId(h.0)
    }
}

/// What makes two limits count the same requests the same way (see [`Limit::shape`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Shape {
    pub(crate) namespace: String,
    pub(crate) seconds: u64,
    pub(crate) conditions: Vec<String>,
    pub(crate) variables: Vec<String>,
    pub(crate) algorithm: AlgorithmKind,
    pub(crate) enforcement: Enforcement,
    pub(crate) calendar: String,
    pub(crate) descriptor_keys: Option<Vec<String>>,
    pub(crate) unlimited: bool,
    pub(crate) set_by_request: bool,
}

/// FNV-1a: stable across processes and Rust versions, unlike `DefaultHasher`.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes.iter().chain(&[0xff]) {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}
