//! Prometheus metrics: per-call counters and a latency histogram recorded as calls are decided,
//! and gauges about the limits (max_value, fill, config generation, last reload) computed when
//! `/metrics` is scraped.
//!
//! Names follow Limitador's where it has one (`authorized_calls`, `limited_calls` with
//! `limitador_namespace` and `limit_name` labels), so dashboards carry over.

use std::fmt::Write as _;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use hashbrown::{Equivalent, HashMap};
use metrics::{Counter, Histogram, Unit, counter, gauge, histogram, with_local_recorder};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};
use tollgate::Clock;
use tollgate_policy::Enforcement;

use crate::serve::engine::Engine;
use crate::serve::model::{Bound, CounterTable, Outcome, Status};

/// Buckets of the decision latency histogram, in seconds.
const LATENCY_BUCKETS: &[f64] =
    &[2e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1];

/// The `limitador_namespace` of calls in a namespace the limits do not name: one series for all
/// of them, so that made-up namespaces cannot grow `/metrics` (each would be a series for good).
pub const UNCONFIGURED_NAMESPACE: &str = "(unconfigured)";

/// One server's metrics (not the process-global recorder: several servers can run in one process,
/// as in tests).
pub struct Metrics {
    recorder: PrometheusRecorder,
    latency: Histogram,
    /// `tollgate_requests_refused_total{bound}`, in the order of [`Bound::ALL`].
    refused: [Counter; 4],
    /// `tollgate_unavailable_total{protocol}`, in the order of [`Port`].
    unavailable: [Counter; 2],
    /// The handles of the labelled counters recorded so far (one per series the recorder keeps
    /// anyway, so this grows no faster than the exposition does).
    series: RwLock<HashMap<SeriesKey, Counter>>,
    /// Each limit's envoy/ratelimit statistics, for the limits of one generation.
    rules: RwLock<RuleTable>,
    reload: Mutex<ReloadState>,
}

/// Which port answered a call: its `protocol` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Port {
    /// RLS and Kuadrant's service.
    Grpc = 0,
    /// The HTTP API.
    Http = 1,
}

impl Port {
    fn name(self) -> &'static str {
        match self {
            Port::Grpc => "grpc",
            Port::Http => "http",
        }
    }
}

/// envoy/ratelimit's near-limit ratio (its `NEAR_LIMIT_RATIO` default): hits above this share of
/// a limit count as `near_limit`.
const NEAR_LIMIT_RATIO: f32 = 0.8;

/// The statistics envoy/ratelimit keeps per rule (`src/stats/manager.go`, counted in
/// `src/limiter/base_limiter.go`), one series each per limit, labelled by
/// [`rule_label`].
struct RuleStats {
    total_hits: Counter,
    over_limit: Counter,
    near_limit: Counter,
    within_limit: Counter,
    shadow_mode: Counter,
}

/// Most per-value series of one limit's statistics (envoy/ratelimit's `detailed_metric` and
/// `value_to_metric`, see [`tollgate_policy::Limit::stats_key`]): past them the limit's other
/// values share one series, `key="(other)"`, so that clients sending new values cannot grow
/// `/metrics` without end.
pub const STATS_KEYS_PER_LIMIT: usize = 100;

/// [`RuleStats`] of the limits of one generation, by index (`None` for an unlimited one, and
/// for one whose statistics are per value: those are in `per_value`, made as values come).
#[derive(Default)]
struct RuleTable {
    generation: u64,
    stats: Vec<Option<RuleStats>>,
    per_value: Mutex<HashMap<usize, HashMap<String, RuleStats>>>,
}

/// The `key` of a limit's statistics past [`STATS_KEYS_PER_LIMIT`] values.
const OTHER_KEY: &str = "(other)";

impl RuleStats {
    /// The series of `limit`'s statistics, of one per-value `key` if given; registered with the
    /// recorder in force.
    fn new(limit: &tollgate_policy::Limit, key: Option<&str>) -> RuleStats {
        let mut labels = vec![("limitador_namespace", limit.namespace().to_string()), ("rule", rule_label(limit))];
        labels.extend(key.map(|key| ("key", key.to_string())));
        RuleStats {
            total_hits: counter!("tollgate_rule_total_hits", &labels),
            over_limit: counter!("tollgate_rule_over_limit", &labels),
            near_limit: counter!("tollgate_rule_near_limit", &labels),
            within_limit: counter!("tollgate_rule_within_limit", &labels),
            shadow_mode: counter!("tollgate_rule_shadow_mode", &labels),
        }
    }

    /// Adds `hits` on a limit of `limit` that had `before` used, as envoy/ratelimit splits them:
    /// those past the limit `over_limit` (and `shadow_mode` for a shadow limit), those past
    /// [`NEAR_LIMIT_RATIO`] of it `near_limit`, the rest of an admitted call `within_limit`.
    fn add(&self, limit: u64, before: u64, hits: u64, shadow: bool) {
        let after = before.saturating_add(hits);
        // As envoy/ratelimit computes it, in float32.
        let near = (limit as f32 * NEAR_LIMIT_RATIO).floor() as u64;
        self.total_hits.increment(hits);
        if after > limit {
            let over = if before >= limit { hits } else { after - limit };
            self.over_limit.increment(over);
            if before < limit {
                self.near_limit.increment(limit - near.max(before));
            }
            if shadow {
                self.shadow_mode.increment(over);
            }
        } else {
            self.within_limit.increment(hits);
            if after > near {
                self.near_limit.increment(if before >= near { hits } else { after - near });
            }
        }
    }
}

/// The `rule` label of a limit's statistics: its name, else envoy/ratelimit's key of the rule
/// (`domain.key_value.key`, its stats key), else the limit's id — one series per limit whatever
/// it is named.
fn rule_label(limit: &tollgate_policy::Limit) -> String {
    limit.name().or(limit.file_id()).map_or_else(|| limit.id().to_string(), str::to_string)
}

/// Describes the RLQS series (`serve::protocol::rlqs`) in the recorder in force.
fn describe_rlqs() {
    let gauges = [
        ("tollgate_rlqs_streams", "RLQS streams open (one per Envoy instance)"),
        ("tollgate_rlqs_buckets", "RLQS buckets the open streams report on"),
        ("tollgate_rlqs_instances", "RLQS instances holding a share of each limit"),
        (
            "tollgate_rlqs_assigned_hits_per_second",
            "What the RLQS assignments in force may admit of each limit, in hits per second",
        ),
    ];
    for (name, help) in gauges {
        metrics::describe_gauge!(name, help);
    }
    let counters = [
        (
            "tollgate_rlqs_ignored_buckets_total",
            "RLQS buckets left without an assignment, per reason (empty_bucket_id, oversize, max_buckets_per_stream, max_buckets)",
        ),
        ("tollgate_rlqs_reported_allowed_total", "Requests RLQS instances reported allowed, per limit"),
        ("tollgate_rlqs_reported_denied_total", "Requests RLQS instances reported denied, per limit"),
    ];
    for (name, help) in counters {
        metrics::describe_counter!(name, help);
    }
}

/// The labels of a limit's RLQS series: its namespace and name, as the decision metrics'.
fn rlqs_labels(namespace: &str, limit: &tollgate_policy::Limit) -> Vec<(&'static str, String)> {
    vec![("limitador_namespace", namespace.to_string()), ("limit_name", rule_label(limit))]
}

/// A labelled counter: its name, `limitador_namespace`, and `limit_name` for the per-limit ones.
#[derive(Hash, PartialEq, Eq)]
struct SeriesKey {
    metric: &'static str,
    namespace: Box<str>,
    limit: Option<Box<str>>,
}

/// [`SeriesKey`] borrowed, to look one up without allocating (hashes as the owned one does).
#[derive(Hash)]
struct SeriesRef<'a> {
    metric: &'static str,
    namespace: &'a str,
    limit: Option<&'a str>,
}

impl Equivalent<SeriesKey> for SeriesRef<'_> {
    fn equivalent(&self, key: &SeriesKey) -> bool {
        self.metric == key.metric && self.namespace == &*key.namespace && self.limit == key.limit.as_deref()
    }
}

#[derive(Default)]
struct ReloadState {
    errors: u64,
    failed_since_good: u64,
    last_error: Option<String>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Metrics {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full("tollgate_decision_seconds".into()), LATENCY_BUCKETS)
            .expect("buckets are not empty")
            // A histogram too (the exporter's default for histograms is a summary).
            .set_buckets_for_metric(Matcher::Full("tollgate_redis_decision_seconds".into()), LATENCY_BUCKETS)
            .expect("buckets are not empty")
            .build_recorder();
        with_local_recorder(&recorder, || {
            metrics::describe_counter!("authorized_calls", "Calls allowed, per namespace");
            metrics::describe_counter!("authorized_hits", "Hits (delta) of allowed calls, per namespace");
            metrics::describe_counter!("limited_calls", "Calls limited, per namespace and limiting limit");
            metrics::describe_counter!(
                "shadow_limited_calls",
                "Calls a shadow limit (or --shadow) would have limited, per limit: allowed"
            );
            metrics::describe_counter!(
                "quota_exceeded_calls",
                "Calls over a quota limit (mode: quota), per limit: allowed and marked"
            );
            metrics::describe_histogram!("tollgate_decision_seconds", Unit::Seconds, "Time to decide one call");
            for (name, help) in [
                ("tollgate_rule_total_hits", "Hits asked of each limit (envoy/ratelimit's total_hits), per rule"),
                ("tollgate_rule_over_limit", "Hits past each limit (envoy/ratelimit's over_limit), per rule"),
                ("tollgate_rule_near_limit", "Hits past 80% of each limit, up to it (envoy/ratelimit's near_limit)"),
                ("tollgate_rule_within_limit", "Hits of calls within each limit (envoy/ratelimit's within_limit)"),
                ("tollgate_rule_shadow_mode", "Hits past a shadow limit (envoy/ratelimit's shadow_mode), per rule"),
            ] {
                metrics::describe_counter!(name, help);
            }
        });
        with_local_recorder(&recorder, describe_rlqs);
        // Both series from the start: a rate over them, and an alert on it, need no first failure.
        let unavailable = with_local_recorder(&recorder, || {
            metrics::describe_counter!(
                "tollgate_unavailable_total",
                "Calls answered unavailable (gRPC UNAVAILABLE, HTTP 503) because the storage could not decide, per protocol"
            );
            [Port::Grpc, Port::Http].map(|port| counter!("tollgate_unavailable_total", "protocol" => port.name()))
        });
        let latency = with_local_recorder(&recorder, || histogram!("tollgate_decision_seconds"));
        let refused = with_local_recorder(&recorder, || {
            metrics::describe_counter!(
                "tollgate_requests_refused_total",
                "Calls refused before deciding for their size, per bound (--max-value-bytes: value_bytes, ...)"
            );
            Bound::ALL.map(|bound| counter!("tollgate_requests_refused_total", "bound" => bound.name()))
        });
        Metrics {
            recorder,
            latency,
            refused,
            unavailable,
            series: RwLock::default(),
            rules: RwLock::default(),
            reload: Mutex::new(ReloadState::default()),
        }
    }

    /// Runs `f` with this server's recorder as the `metrics` facade's: handles registered in it
    /// (a Redis store's, built by `f`) are rendered on this server's `/metrics`.
    pub(crate) fn recording<T>(&self, f: impl FnOnce() -> T) -> T {
        with_local_recorder(&self.recorder, f)
    }

    /// Records one decided call: allowed or limited (by the first enforcing limit without room),
    /// `hits` added to `authorized_hits` when allowed, and each shadow or quota limit it went over
    /// (`shadow_limited_calls`, `quota_exceeded_calls`, labelled with the limit's name).
    /// A namespace the limits do not name is labelled [`UNCONFIGURED_NAMESPACE`].
    pub fn record(&self, namespace: &str, outcome: &Outcome, hits: u64, took: Duration) {
        self.latency.record(took.as_secs_f64());
        let name = |s: &Status| outcome.limit(s).name().unwrap_or("");
        if outcome.allowed {
            self.add("authorized_calls", namespace, None, 1, outcome);
            if hits > 0 {
                self.add("authorized_hits", namespace, None, hits, outcome);
            }
        } else if let Some(by) = outcome.statuses.iter().find(|s| s.limited) {
            self.add("limited_calls", namespace, Some(name(by)), 1, outcome);
        }
        for (status, enforcement) in outcome.marked() {
            let metric = match enforcement {
                Enforcement::Quota | Enforcement::Pooled => "quota_exceeded_calls",
                _ => "shadow_limited_calls",
            };
            // By rule, so that two unnamed shadow limits are two series.
            self.add(metric, namespace, Some(&rule_label(outcome.limit(status))), 1, outcome);
        }
        if hits > 0 {
            self.add_rule_stats(outcome, false);
        }
    }

    /// Adds each counter's hits to its limit's [`RuleStats`]; `report`: the hits were counted
    /// without a decision (as far as each counter had room).
    fn add_rule_stats(&self, outcome: &Outcome, report: bool) {
        let fresh = |table: &RuleTable| table.generation == outcome.generation() && !table.stats.is_empty();
        {
            let table = self.rules.read().unwrap_or_else(|e| e.into_inner());
            if fresh(&table) {
                return self.add_to_rule_table(&table, outcome, report);
            }
        }
        let mut table = self.rules.write().unwrap_or_else(|e| e.into_inner());
        if !fresh(&table) {
            *table = self.rule_table(outcome);
        }
        self.add_to_rule_table(&table, outcome, report);
    }

    /// Adds each counter's hits of `outcome` to its limit's [`RuleStats`] in `table`.
    fn add_to_rule_table(&self, table: &RuleTable, outcome: &Outcome, report: bool) {
        for status in &outcome.statuses {
            let (limit, max_value) = (outcome.limit(status), outcome.max_value(status));
            // A pooled limit's counter holds what is past the limit too.
            let used = max_value.saturating_sub(status.meta.remaining).saturating_add(status.past);
            // What the call took is in `used`: envoy/ratelimit's "before" excludes it. A limit
            // that counts past its limit is charged whatever the outcome.
            let took = report || status.charged || (!status.limited && !outcome.would_limit);
            let before = if took { used.saturating_sub(status.hits) } else { used };
            let add = |stats: &RuleStats| {
                stats.add(max_value, before, status.hits, limit.enforcement() == Enforcement::Shadow)
            };
            if let Some(key) = outcome.stats_key(status) {
                let mut per_value = table.per_value.lock().unwrap_or_else(|e| e.into_inner());
                let series = per_value.entry(status.limit).or_default();
                let key = if series.contains_key(key) || series.len() < STATS_KEYS_PER_LIMIT { key } else { OTHER_KEY };
                if let Some(stats) = series.get(key) {
                    add(stats);
                } else {
                    let stats = with_local_recorder(&self.recorder, || RuleStats::new(limit, Some(key)));
                    add(&stats);
                    series.insert(key.to_string(), stats);
                }
            } else if let Some(Some(stats)) = table.stats.get(status.limit) {
                add(stats);
            }
        }
    }
    /// The statistics of the limits `outcome` was decided on.
    fn rule_table(&self, outcome: &Outcome) -> RuleTable {
        let policy = &outcome.loaded().policy;
        let stats = with_local_recorder(&self.recorder, || {
            (policy.limits().iter())
                // A limit set by requests has no rule to keep statistics for (envoy/ratelimit's
                // are per descriptor value then: unbounded).
                .map(|limit| {
                    (!limit.unlimited() && !limit.has_stats_key() && !limit.set_by_request())
                        .then(|| RuleStats::new(limit, None))
                })
                .collect()
        });
        RuleTable { generation: outcome.generation(), stats, per_value: Mutex::default() }
    }

    /// Records a call refused for its size: over `bound`.
    pub fn refused(&self, bound: Bound) {
        self.refused[Bound::ALL.iter().position(|b| *b == bound).expect("every bound is in ALL")].increment(1);
    }

    /// Records a call answered unavailable (gRPC `UNAVAILABLE`, HTTP 503): the storage could not
    /// decide (Redis failed or missed `--redis-deadline`).
    pub(crate) fn unavailable(&self, port: Port) {
        self.unavailable[port as usize].increment(1);
    }

    /// RLQS: `delta` streams opened (positive) or closed (negative), in
    /// `tollgate_rlqs_streams`.
    pub(crate) fn rlqs_streams(&self, delta: i64) {
        with_local_recorder(&self.recorder, || gauge!("tollgate_rlqs_streams").increment(delta as f64));
    }

    /// RLQS: `delta` buckets reported on for the first time (positive) or gone with their
    /// stream (negative), in `tollgate_rlqs_buckets`.
    pub(crate) fn rlqs_buckets(&self, delta: i64) {
        with_local_recorder(&self.recorder, || gauge!("tollgate_rlqs_buckets").increment(delta as f64));
    }

    /// RLQS: a bucket of a report left without an assignment, and why (`empty_bucket_id`,
    /// `oversize`, `max_buckets_per_stream`, `max_buckets`).
    pub(crate) fn rlqs_ignored(&self, reason: &'static str) {
        with_local_recorder(&self.recorder, || counter!("tollgate_rlqs_ignored_buckets_total", "reason" => reason))
            .increment(1);
    }

    /// RLQS: what an instance reported of one limit's bucket: requests it allowed and denied
    /// (`outcome`: the bucket's counters read on the same limits).
    pub(crate) fn rlqs_usage(
        &self,
        namespace: &str,
        limit: &tollgate_policy::Limit,
        allowed: u64,
        denied: u64,
        outcome: &Outcome,
    ) {
        let label = rule_label(limit);
        self.add("tollgate_rlqs_reported_allowed_total", namespace, Some(&label), allowed, outcome);
        self.add("tollgate_rlqs_reported_denied_total", namespace, Some(&label), denied, outcome);
    }

    /// RLQS: after an assignment on `limit`, how many instances hold a share of it and the hits
    /// per second their assignments may admit in all.
    pub(crate) fn rlqs_assigned(&self, namespace: &str, limit: &tollgate_policy::Limit, instances: usize, rate: f64) {
        let labels = rlqs_labels(namespace, limit);
        with_local_recorder(&self.recorder, || {
            gauge!("tollgate_rlqs_instances", &labels).set(instances as f64);
            gauge!("tollgate_rlqs_assigned_hits_per_second", &labels).set(rate);
        });
    }

    /// Records hits reported without a decision (Kuadrant's `Report`), decided as `outcome`; a
    /// namespace the limits do not name is labelled [`UNCONFIGURED_NAMESPACE`].
    pub fn record_report(&self, namespace: &str, outcome: &Outcome, hits: u64) {
        self.add("authorized_hits", namespace, None, hits, outcome);
        self.add_rule_stats(outcome, true);
    }

    /// Adds `n` to one labelled counter. Its handle is registered once and kept: building the
    /// labels and finding the series on every call would cost more than the decision. Whether
    /// the limits name the namespace is asked only when its series is not found.
    fn add(&self, metric: &'static str, namespace: &str, limit: Option<&str>, n: u64, outcome: &Outcome) {
        let found = |namespace| {
            let key = SeriesRef { metric, namespace, limit };
            let series = self.series.read().unwrap_or_else(|e| e.into_inner());
            series.get(&key).map(|counter| counter.increment(n)).is_some()
        };
        if found(namespace) {
            return;
        }
        let mut namespace = namespace;
        if !outcome.names_namespace(namespace) {
            namespace = UNCONFIGURED_NAMESPACE;
            if found(namespace) {
                return;
            }
        }
        let counter = with_local_recorder(&self.recorder, || match limit {
            None => counter!(metric, "limitador_namespace" => namespace.to_string()),
            Some(limit) => {
                counter!(metric, "limitador_namespace" => namespace.to_string(), "limit_name" => limit.to_string())
            }
        });
        counter.increment(n);
        let owned = SeriesKey { metric, namespace: namespace.into(), limit: limit.map(Into::into) };
        self.series.write().unwrap_or_else(|e| e.into_inner()).insert(owned, counter);
    }

    /// Folds recorded latencies into the histogram. Samples are buffered until then, so this must
    /// run periodically (the server does it every few seconds) or memory grows with traffic.
    pub fn upkeep(&self) {
        self.recorder.handle().run_upkeep();
    }

    /// Records a reload that failed (the last good limits stay in force).
    pub fn reload_failed(&self, error: &str) {
        let mut state = self.reload.lock().unwrap_or_else(|e| e.into_inner());
        state.errors += 1;
        state.failed_since_good += 1;
        state.last_error = Some(error.to_string());
    }

    /// Records a reload that succeeded.
    pub fn reload_succeeded(&self) {
        let mut state = self.reload.lock().unwrap_or_else(|e| e.into_inner());
        state.last_error = None;
        state.failed_since_good = 0;
    }

    /// Reloads rejected since the last good one, and the last rejection's reason.
    pub fn reload_state(&self) -> (u64, Option<String>) {
        let state = self.reload.lock().unwrap_or_else(|e| e.into_inner());
        (state.failed_since_good, state.last_error.clone())
    }

    /// The Prometheus text exposition of everything.
    pub fn render<C: Clock + Clone>(&self, engine: &Engine<C>) -> String {
        let mut out = self.recorder.handle().render();
        let _ =
            writeln!(out, "# HELP limitador_up 1 while the server is up\n# TYPE limitador_up gauge\nlimitador_up 1");
        let (loaded, fill) = engine.fill();
        let _ = writeln!(out, "# HELP tollgate_limit_max_value Configured max_value of each limit");
        let _ = writeln!(out, "# TYPE tollgate_limit_max_value gauge");
        for limit in loaded.policy.rules() {
            let _ = writeln!(out, "tollgate_limit_max_value{{{}}} {}", labels(limit), limit.max_value());
        }
        let _ = writeln!(
            out,
            "# HELP tollgate_limit_fill Use of max_value by each limit's fullest in-memory counter (0 to 1)"
        );
        let _ = writeln!(out, "# TYPE tollgate_limit_fill gauge");
        for (limit, fill) in loaded.policy.rules().iter().zip(fill) {
            let _ = writeln!(out, "tollgate_limit_fill{{{}}} {fill}", labels(limit));
        }
        self.render_counter_tables(&mut out, engine);
        if let Some((bytes, max)) = engine.cached_bytes() {
            let _ = writeln!(
                out,
                "# HELP tollgate_redis_cached_bytes Bytes of the counters redis-cached keeps here (keys and entries)\n\
                 # TYPE tollgate_redis_cached_bytes gauge\ntollgate_redis_cached_bytes {bytes}\n\
                 # HELP tollgate_redis_cached_bytes_max Most bytes they may take (--max-counter-bytes); calls past it \
                 are decided in Redis\n# TYPE tollgate_redis_cached_bytes_max gauge\ntollgate_redis_cached_bytes_max {max}"
            );
        }
        let state = self.reload.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "# HELP tollgate_config_generation Limits loaded so far (1 = the file read at start)");
        let _ = writeln!(out, "# TYPE tollgate_config_generation gauge");
        let _ = writeln!(out, "tollgate_config_generation {}", loaded.generation);
        let _ = writeln!(out, "# HELP tollgate_config_reload_errors_total Reloads rejected (bad file)");
        let _ = writeln!(out, "# TYPE tollgate_config_reload_errors_total counter");
        let _ = writeln!(out, "tollgate_config_reload_errors_total {}", state.errors);
        let _ = writeln!(
            out,
            "# HELP tollgate_config_last_reload_failed 1 while the last reload was rejected; the label says why"
        );
        let _ = writeln!(out, "# TYPE tollgate_config_last_reload_failed gauge");
        match &state.last_error {
            Some(error) => {
                let _ = writeln!(out, "tollgate_config_last_reload_failed{{error=\"{}\"}} 1", escape(error));
            }
            None => {
                let _ = writeln!(out, "tollgate_config_last_reload_failed 0");
            }
        }
        out
    }
}

/// A metric family about counter tables: name, type, help, and its value for one table.
type Family = (&'static str, &'static str, &'static str, fn(&CounterTable) -> String);

impl Metrics {
    /// Each limit's in-memory counters against their cap (`--max-counters`), and what new
    /// counters met at the cap: rejected, evicting another, or admitted without being kept.
    fn render_counter_tables<C: Clock + Clone>(&self, out: &mut String, engine: &Engine<C>) {
        let (loaded, tables) = engine.counter_tables();
        let rows = || loaded.policy.limits().iter().zip(&tables);
        let families: [Family; 7] = [
            ("tollgate_counters", "gauge", "In-memory counters kept by each limit", |t| t.kept.to_string()),
            ("tollgate_counters_max", "gauge", "Most in-memory counters each limit keeps (--max-counters)", |t| {
                t.max.to_string()
            }),
            (
                "tollgate_counters_bytes",
                "gauge",
                "Bytes the in-memory counters of each limit take: their values' text and table entries",
                |t| t.bytes.to_string(),
            ),
            (
                "tollgate_counters_bytes_max",
                "gauge",
                "Most bytes the in-memory counters of each limit take (--max-counter-bytes)",
                |t| t.max_bytes.to_string(),
            ),
            (
                "tollgate_counters_rejected_at_max_total",
                "counter",
                "New counters rejected because the limit keeps its maximum counters or bytes (at_max_counters: reject)",
                |t| t.rejected_at_max.to_string(),
            ),
            (
                "tollgate_counters_evicted_at_max_total",
                "counter",
                "Counters evicted for a new one because the limit keeps its maximum counters or bytes \
                 (at_max_counters: evict)",
                |t| t.evicted_at_max.to_string(),
            ),
            (
                "tollgate_counters_admitted_unstored_at_max_total",
                "counter",
                "Requests on new counters allowed without counting because the limit keeps its maximum \
                 counters or bytes (at_max_counters: admit)",
                |t| t.admitted_unstored_at_max.to_string(),
            ),
        ];
        for (name, kind, help, value) in families {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (limit, table) in rows() {
                let policy = if name == "tollgate_counters_max" {
                    format!(",at_max_counters=\"{}\"", table.at_max.name())
                } else {
                    String::new()
                };
                let _ = writeln!(out, "{name}{{{}{policy}}} {}", labels(limit), value(table));
            }
        }
    }
}

fn labels(limit: &tollgate_policy::Limit) -> String {
    format!(
        "limitador_namespace=\"{}\",limit_name=\"{}\",limit_id=\"{}\"",
        escape(limit.namespace()),
        escape(limit.name().unwrap_or("")),
        limit.id()
    )
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}
