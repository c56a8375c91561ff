//! # tollgate-policy: the limits file
//!
//! Limitador's limits format, read unchanged, validated with positions, and matched against
//! requests:
//!
//! ```
//! use tollgate_policy::{Descriptor, Policy};
//!
//! let yaml = r#"
//! - namespace: example.org          # Envoy's `domain`
//!   max_value: 2
//!   seconds: 1
//!   name: posts
//!   conditions: ["descriptors[0]['req.method'] == 'POST'"]   # CEL, or the simple req.method == 'POST'
//!   variables: ["descriptors[0].user"]                        # one counter per user
//!   algorithm: token_bucket                                   # ours, optional: fixed_window by default
//! "#;
//! let policy = Policy::parse(yaml, "limits.yaml")?;
//! let request = [Descriptor::from([("req.method", "POST"), ("user", "alice")])];
//! let hits = policy.hits("example.org", &request);
//! assert_eq!(hits.len(), 1);
//! assert_eq!(hits[0].limit.name(), Some("posts"));
//! assert_eq!(hits[0].values, ["alice"]);
//!
//! let bad = Policy::parse("- namespace: a\n  max_value: 1\n", "limits.yaml").unwrap_err();
//! assert_eq!(bad.to_string(), "limits.yaml:1:3: this limit has no `seconds` (required)");
//! # Ok::<(), tollgate_policy::PolicyError>(())
//! ```
//!
//! Fields of a limit: `namespace`, `max_value` (0 to 2^64-1; 0 denies every request and counts
//! nothing), `seconds` (≥ 1; Limitador's whole number, or a duration in the core's syntax that comes to whole seconds, `1m`, `1h30m`: see
//! [`tollgate::parse_duration`]), all required; `name`,
//! `conditions` (all must hold), `variables` (all must have a value), and ours, `algorithm`
//! (`fixed_window` — Limitador's, the default — `token_bucket`, `sliding_window` or
//! `weighted_window`; see [`AlgorithmKind`]), `max_counters` (≥ 1: how many counters, one per
//! distinct combination of variable values, the server keeps in memory for this limit) and
//! `at_max_counters` (`reject`, `evict` or `admit`: what a new counter gets when that many are
//! kept and none is idle; see [`tollgate::AtKeyLimit`]), both defaulting to the server's
//! `--max-counters` and `--at-max-counters`; `shadow: true` (count and report, never deny) and
//! `mode: quota` (allow, and mark the response with the quota exceeded): see [`Enforcement`];
//! `window: {calendar: second | minute | hour | day | week | month, timezone: UTC | IANA name}`
//! instead of `seconds`: fixed windows on the calendar's boundaries (the zone's whole seconds,
//! minutes and hours; midnight for the others; see [`tollgate::Calendar`]), or `epoch_week`,
//! `epoch_month`, `epoch_year`: 7, 30 or 365 days from 1970-01-01 UTC (envoy/ratelimit's `week`,
//! `month` and `year`);
//! `descriptor_keys: [k1, k2]`: the limit is matched against each descriptor of a request on its
//! own — one whose entries have exactly these keys, in this order — reading it as
//! `descriptors[0]`, and each such descriptor counts on its own (envoy/ratelimit's matching; see
//! [`Limit::descriptor_keys`]); `replaces: [name]`: when this limit applies, the limits with these
//! names do not (envoy/ratelimit's `replaces`); `unlimited: true` instead of `max_value` and
//! `seconds`: the limit applies and counts nothing (envoy/ratelimit's, see
//! [`Limit::unlimited`]). Unknown
//! fields, empty files, duplicate limits and expressions that do not parse are errors naming the
//! file, line and column.
//!
//! envoy/ratelimit's configuration (a directory of YAML files, each a `domain` and its tree of
//! `descriptors`) reads into the same limits: [`Format::Envoy`], [`Policy::parse_envoy`], and
//! [`envoy`] for how each rule maps and what has no equivalent (an error at its file and line).
//! [`Policy::to_yaml`] writes any policy back in Limitador's format.
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]
#![forbid(unsafe_code)]

pub mod envoy;
mod error;
mod expr;
mod file;
mod limit;
mod policy;
mod request;
mod source;
mod write;

pub use error::{PolicyError, Position};
pub use expr::{Condition, ExprError, Variable};
pub use limit::{AlgorithmKind, COUNT_PAST_CAPACITY, Enforcement, Limit, LimitId, Metadata, SLIDING_SEGMENTS};
pub use policy::{Hit, Policy};
pub use request::{Descriptor, LimitOverride};
pub use source::{Format, SourceText};
