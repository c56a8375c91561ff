//! The deployment artifacts held to the server they deploy: every metric and label that
//! `deploy/grafana/tollgate.json` and `deploy/prometheus/alerts.yaml` name is one a running server
//! exports on `/metrics` (servers in memory, with TLS and the admin listener as deploy/kubernetes
//! runs it, on Redis and on redis-cached, after decisions over HTTP and gRPC, limited ones, shadow
//! and quota ones, an RLQS stream and a rejected reload, so that every series exists); and the
//! gRPC health that a Kubernetes `grpc` probe asks (service "") answers SERVING.
//! `.ci/deploy-check` checks the rest of deploy/ (the Kubernetes schemas, PromQL's syntax).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use support::fleet::Envoy;
use support::{Server, descriptor, server_with, should_rate_limit};
use tollgate_server::serve::{Storage, TlsFiles};
use tollgate_testkit::RedisServer;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Labels Prometheus adds to every series of a target: a query may name them though no server
/// exports them.
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

/// Series Prometheus makes itself, not the server.
const PROMETHEUS_SERIES: [&str; 1] = ["up"];

/// Beside examples/limits.yaml's: a shadow and a quota limit (`shadow_limited_calls`,
/// `quota_exceeded_calls`), and one for RLQS to share out (`tollgate_rlqs_assigned_*`).
const EXTRA_LIMITS: &str = r#"
- namespace: deploy.test
  name: shadowed
  max_value: 1
  seconds: 60
  shadow: true
- namespace: deploy.test
  name: quota
  max_value: 1
  seconds: 60
  mode: quota
- namespace: deploy.rlqs
  name: shared
  max_value: 1000
  seconds: 10
"#;

/// Fixed windows only, for the Redis storages.
const REDIS_LIMITS: &str = r#"
- namespace: example.org
  name: all requests
  max_value: 2
  seconds: 60
  variables: ["descriptors[0].user_id"]
"#;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_the_alerts_name_only_series_and_labels_the_server_exports() {
    let mut scrape = Scrape::default();

    // In memory: examples/limits.yaml (what deploy/kubernetes/configmap.yaml carries) and three more.
    let limits = read("examples/limits.yaml") + EXTRA_LIMITS;
    let memory = server_with(&limits, |_| {}).await;
    decide(&memory).await;
    rlqs(&memory).await;
    // A limits file that does not load: counted, and its error a label.
    std::fs::write(&memory.limits, "- namespace: broken\n  max_value: 1\n").unwrap();
    memory.running.reloader.reload().unwrap_err();
    let text = memory.get("/metrics").await.1;
    assert!(text.contains("tollgate_config_last_reload_failed{error="), "{text}");
    scrape.add(&text);

    // As deploy/kubernetes runs it: TLS with client certificates on the decision listeners, and
    // /metrics (with the TLS series) and /status on the admin listener.
    let dir = support::temp_dir("deploy-tls");
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(["localhost".to_string()]).unwrap();
    std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), signing_key.serialize_pem()).unwrap();
    let tls = server_with(&limits, |config| {
        config.tls = Some(TlsFiles::new(dir.join("tls.crt"), dir.join("tls.key")).with_client_ca(dir.join("tls.crt")));
        config.admin = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let admin = tls.running.admin.expect("an admin listener");
    assert_eq!(get(&tls, &format!("http://{admin}/status")).await.0, 200, "the probes' /status");
    let text = get(&tls, &format!("http://{admin}/metrics")).await.1;
    assert!(text.contains("tollgate_tls_handshake_failures_total{"), "{text}");
    scrape.add(&text);

    // On Redis and redis-cached: the storages' own series.
    let redis = RedisServer::start();
    for storage in [
        Storage::Redis { url: redis.url(), prefix: "deploy:".into() },
        Storage::RedisCached { url: redis.url(), prefix: "deploy-cached:".into(), flush: Duration::from_secs(3600) },
    ] {
        let server = server_with(REDIS_LIMITS, |config| config.storage = storage).await;
        let mut client = server.rls().await;
        for user in ["alice", "alice", "alice", "bob"] {
            let d = descriptor(&[("user_id", user)]);
            should_rate_limit(&mut client, "example.org", vec![d], 1).await;
        }
        scrape.add(&server.get("/metrics").await.1);
    }
    assert!(scrape.samples.contains_key("tollgate_redis_errors_total"), "{:?}", scrape.samples.keys());

    let mut errors = Vec::new();
    let dashboard = check_dashboard(&read("deploy/grafana/tollgate.json"), &scrape, &mut errors);
    let alerts = check_alerts(&read("deploy/prometheus/alerts.yaml"), &scrape, &mut errors);
    assert!(errors.is_empty(), "names the server does not export:\n{}", errors.join("\n"));

    // Not vacuous: the parser found what the files are about.
    assert!(dashboard.metrics.len() >= 25, "dashboard metrics: {:?}", dashboard.metrics);
    assert!(alerts.metrics.len() >= 10, "alert metrics: {:?}", alerts.metrics);
    for metric in
        ["authorized_calls", "limited_calls", "tollgate_decision_seconds_bucket", "tollgate_redis_errors_total"]
    {
        assert!(dashboard.metrics.contains(metric), "the dashboard shows {metric}: {:?}", dashboard.metrics);
    }
    for label in ["limitador_namespace", "limit_name", "le", "kind", "prefix", "error"] {
        assert!(dashboard.labels.contains(label), "the dashboard uses {label}: {:?}", dashboard.labels);
    }
    for metric in [
        "limited_calls",
        "tollgate_redis_errors_total",
        "tollgate_config_last_reload_failed",
        "tollgate_tls_reload_errors_total",
        "up",
    ] {
        assert!(alerts.metrics.contains(metric), "an alert on {metric}: {:?}", alerts.metrics);
    }
}

/// GET `url` with the server's HTTP client: status and body.
async fn get(server: &Server, url: &str) -> (u16, String) {
    let request = hyper::Request::get(url).body(Full::new(Bytes::new())).unwrap();
    let response = server.http.request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Decisions over HTTP and gRPC: allowed, limited (the `posts` limit, 2 a second, then `all
/// requests`, 4 a minute), and over a shadow and a quota limit.
async fn decide(server: &Server) {
    let post = r#"{"namespace":"example.org","values":{"req.method":"POST","user_id":"alice"},"delta":1}"#;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(server.post("/check_and_report", post).await.0);
    }
    assert_eq!(statuses, [200, 200, 429]);
    for _ in 0..2 {
        let (status, _, body) =
            server.post("/check_and_report", r#"{"namespace":"deploy.test","values":{},"delta":1}"#).await;
        assert_eq!(status, 200, "shadow and quota limits allow: {body}");
    }
    let mut client = server.rls().await;
    let mut codes = Vec::new();
    for _ in 0..3 {
        let d = descriptor(&[("req.method", "GET"), ("user_id", "bob")]);
        codes.push(should_rate_limit(&mut client, "example.org", vec![d], 1).await.overall_code);
    }
    assert_eq!(codes, [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32]);

    // What `grpc: {port: 8081}` in a Kubernetes probe asks: the server as a whole, service "".
    let address = format!("http://{}", server.running.grpc);
    let channel = tonic::transport::Channel::from_shared(address).unwrap().connect().await.unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let request = HealthCheckRequest { service: service.to_string() };
        let status = health.check(request).await.unwrap().into_inner().status;
        assert_eq!(status, ServingStatus::Serving as i32, "health of {service:?}");
    }
}

/// An RLQS stream: a bucket reported, and one with an empty id (ignored).
async fn rlqs(server: &Server) {
    let mut envoy = Envoy::new(server.running.grpc, "deploy.rlqs", &server.clock, Duration::from_secs(1));
    assert!(envoy.request(&[("user_id", "carol")]).await);
    envoy.request(&[]).await;
    assert!(envoy.answers >= 1, "the server answered the reports");
}

/// What a `/metrics` exposition holds: each sample's name with the label names seen on it, and
/// each family's type.
#[derive(Default)]
struct Scrape {
    samples: BTreeMap<String, BTreeSet<String>>,
    types: BTreeMap<String, String>,
}

impl Scrape {
    fn add(&mut self, text: &str) {
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(family) = line.strip_prefix("# TYPE ") {
                let (name, kind) = family.split_once(' ').unwrap_or_else(|| panic!("{line}"));
                self.types.insert(name.to_string(), kind.to_string());
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let (name, labels) = sample(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            self.samples.entry(name).or_default().extend(labels);
        }
    }

    fn labels(&self, metric: &str) -> Option<&BTreeSet<String>> {
        self.samples.get(metric)
    }
}

/// One sample line's name and label names (values quoted, with `\\`, `\"` and `\n` escapes).
fn sample(line: &str) -> Result<(String, Vec<String>), String> {
    let end = line.find(['{', ' ']).ok_or("no value")?;
    let name = line[..end].to_string();
    let mut labels = Vec::new();
    if line[end..].starts_with('{') {
        let mut rest = &line[end + 1..];
        loop {
            rest = rest.trim_start_matches(',');
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let (label, after) = rest.split_once("=\"").ok_or("a label without a quoted value")?;
            labels.push(label.to_string());
            let mut chars = after.char_indices();
            let close = loop {
                match chars.next().ok_or("an unterminated label value")? {
                    (_, '\\') => {
                        chars.next();
                    }
                    (i, '"') => break i,
                    _ => {}
                }
            };
            rest = &after[close + 1..];
        }
        if !rest.starts_with(' ') {
            return Err("no value after the labels".into());
        }
    }
    Ok((name, labels))
}

/// The names an expression uses: metrics with the labels of their matchers, and the labels of
/// its `by`, `without`, `on`, `ignoring`, `group_left` and `group_right` clauses.
#[derive(Debug, Default)]
struct Names {
    metrics: Vec<(String, Vec<String>)>,
    grouping: BTreeSet<String>,
}

const GROUPING: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];
const KEYWORDS: [&str; 8] = ["and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"];
/// PromQL's aggregations and functions.
const FUNCTIONS: &str = "sum min max avg count stddev stdvar topk bottomk quantile count_values group \
    abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month day_of_week day_of_year \
    days_in_month delta deriv exp floor histogram_quantile holt_winters hour idelta increase irate label_join \
    label_replace ln log2 log10 minute month predict_linear rate resets round scalar sgn sort sort_desc sqrt time \
    timestamp vector year avg_over_time min_over_time max_over_time sum_over_time count_over_time \
    quantile_over_time stddev_over_time stdvar_over_time last_over_time present_over_time";

/// Reads the names out of a PromQL expression: identifiers followed by `(` are functions (which
/// must be PromQL's), by `{` or nothing metrics; strings, `[ranges]`, numbers and durations are
/// skipped.
fn promql_names(expr: &str) -> Result<Names, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = Names::default();
    let mut i = 0;
    let skip_space = |mut i: usize| {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        i
    };
    let ident = |mut i: usize| {
        let start = i;
        while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
            i += 1;
        }
        (chars[start..i].iter().collect::<String>(), i)
    };
    let string = |i: usize| -> Result<usize, String> {
        let quote = chars[i];
        let mut j = i + 1;
        while j < chars.len() && chars[j] != quote {
            j += if chars[j] == '\\' && quote != '`' { 2 } else { 1 };
        }
        if j >= chars.len() { Err(format!("an unterminated string at {i}")) } else { Ok(j + 1) }
    };
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() || "()+-*/%^=!<>,".contains(c) {
            i += 1;
        } else if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '"' || c == '\'' || c == '`' {
            i = string(i)?;
        } else if c == '[' {
            i += chars[i..].iter().position(|&c| c == ']').ok_or("an unclosed [")? + 1;
        } else if c == '{' {
            return Err(format!("a selector without a metric name at {i}"));
        } else if c.is_ascii_digit() || c == '.' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                let exponent = matches!(chars[i], 'e' | 'E') && chars[i - 1].is_ascii_digit();
                i += 1;
                if exponent && i < chars.len() && matches!(chars[i], '+' | '-') {
                    i += 1;
                }
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let (word, end) = ident(i);
            let next = skip_space(end);
            let lower = word.to_ascii_lowercase();
            // `sum by (x) (...)`: an aggregation whose grouping comes first.
            let grouped = GROUPING[..2].contains(&ident(next).0.to_ascii_lowercase().as_str());
            let paren = chars.get(next) == Some(&'(');
            if GROUPING.contains(&lower.as_str()) {
                i = end;
                if paren {
                    let close = next + chars[next..].iter().position(|&c| c == ')').ok_or("an unclosed (")?;
                    let list: String = chars[next + 1..close].iter().collect();
                    names.grouping.extend(list.split(',').map(str::trim).filter(|l| !l.is_empty()).map(String::from));
                    i = close + 1;
                }
            } else if KEYWORDS.contains(&lower.as_str()) {
                i = end;
            } else if paren || grouped {
                if !FUNCTIONS.split_whitespace().any(|f| f == word) {
                    return Err(format!("`{word}` is not a PromQL function"));
                }
                i = end;
            } else {
                let mut matchers = Vec::new();
                i = end;
                if chars.get(next) == Some(&'{') {
                    i = next + 1;
                    loop {
                        i = skip_space(i);
                        match chars.get(i) {
                            None => return Err("an unclosed {".into()),
                            Some('}') => {
                                i += 1;
                                break;
                            }
                            Some(',') => i += 1,
                            Some(_) => {
                                let (label, end) = ident(i);
                                if label.is_empty() {
                                    return Err(format!("a bad matcher at {i} in {word}{{...}}"));
                                }
                                matchers.push(label);
                                i = skip_space(end);
                                while i < chars.len() && "=!~".contains(chars[i]) {
                                    i += 1;
                                }
                                i = skip_space(i);
                                if !matches!(chars.get(i), Some('"' | '\'' | '`')) {
                                    return Err(format!("a matcher without a string at {i} in {word}{{...}}"));
                                }
                                i = string(i)?;
                            }
                        }
                    }
                }
                names.metrics.push((word, matchers));
            }
        } else {
            return Err(format!("unexpected `{c}` at {i}"));
        }
    }
    Ok(names)
}

/// What one file's expressions use, over all of them.
#[derive(Debug, Default)]
struct Used {
    metrics: BTreeSet<String>,
    labels: BTreeSet<String>,
}

/// Checks one expression against the scrape: each metric is a sample the server exports (a
/// `_bucket` of a histogram), each matcher's label is on that metric, and each grouping label,
/// each `{{label}}` of `templates` (legends, `$labels.x` of annotations) is on one of the
/// expression's metrics. Errors name `place` and the expression.
fn check_expr(
    place: &str,
    expr: &str,
    templates: &[String],
    scrape: &Scrape,
    used: &mut Used,
    errors: &mut Vec<String>,
) {
    let names = match promql_names(expr) {
        Ok(names) => names,
        Err(e) => return errors.push(format!("{place}: `{expr}`: cannot read it: {e}")),
    };
    if names.metrics.is_empty() {
        errors.push(format!("{place}: `{expr}`: no metric"));
    }
    let mut available: BTreeSet<&str> = TARGET_LABELS.into_iter().collect();
    for (metric, matchers) in &names.metrics {
        used.metrics.insert(metric.clone());
        used.labels.extend(matchers.iter().cloned());
        if PROMETHEUS_SERIES.contains(&metric.as_str()) {
            for label in matchers.iter().filter(|l| !TARGET_LABELS.contains(&l.as_str())) {
                errors.push(format!("{place}: `{expr}`: Prometheus's {metric} has no label {label}"));
            }
            continue;
        }
        let Some(labels) = scrape.labels(metric) else {
            errors.push(format!("{place}: `{expr}`: metric {metric} is not in the server's /metrics"));
            continue;
        };
        if let Some(family) = metric.strip_suffix("_bucket") {
            let kind = scrape.types.get(family).map(String::as_str);
            if kind != Some("histogram") {
                errors.push(format!("{place}: `{expr}`: {metric}, but {family} is a {kind:?}, not a histogram"));
            }
        }
        available.extend(labels.iter().map(String::as_str));
        for label in matchers {
            if !labels.contains(label) && !TARGET_LABELS.contains(&label.as_str()) && label != "__name__" {
                errors.push(format!("{place}: `{expr}`: metric {metric} has no label {label} (it has {labels:?})"));
            }
        }
    }
    let referenced = names.grouping.iter().cloned().chain(templates.iter().cloned());
    for label in referenced {
        used.labels.insert(label.clone());
        if !available.contains(label.as_str()) {
            errors.push(format!("{place}: `{expr}`: label {label} is on none of its metrics ({available:?})"));
        }
    }
}

/// The labels a Grafana legend names: `{{label}}`.
fn legend_labels(legend: &str) -> Vec<String> {
    legend.split("{{").skip(1).filter_map(|s| s.split_once("}}")).map(|(label, _)| label.trim().to_string()).collect()
}

/// Every query of the dashboard: panels' targets, and the template variables' `label_values`.
fn check_dashboard(json: &str, scrape: &Scrape, errors: &mut Vec<String>) -> Used {
    let file = "deploy/grafana/tollgate.json";
    let dashboard: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut used = Used::default();
    let mut targets = 0;
    let mut visit = vec![&dashboard["panels"]];
    while let Some(node) = visit.pop() {
        for panel in node.as_array().into_iter().flatten() {
            visit.push(&panel["panels"]);
            for target in panel["targets"].as_array().into_iter().flatten() {
                let Some(expr) = target["expr"].as_str() else { continue };
                targets += 1;
                let place = format!("{file}, panel {:?}", panel["title"].as_str().unwrap_or("?"));
                let legend = legend_labels(target["legendFormat"].as_str().unwrap_or(""));
                check_expr(&place, expr, &legend, scrape, &mut used, errors);
            }
        }
    }
    assert!(targets >= 20, "{file}: {targets} queries found");
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"].as_str().or(variable["query"].as_str()).unwrap_or("");
        let place = format!("{file}, variable {}", variable["name"]);
        let Some((selector, label)) =
            query.strip_prefix("label_values(").and_then(|q| q.strip_suffix(')')).and_then(|q| q.rsplit_once(','))
        else {
            errors.push(format!("{place}: `{query}`: not label_values(metric, label)"));
            continue;
        };
        check_expr(&place, selector, &[label.trim().to_string()], scrape, &mut used, errors);
    }
    used
}

/// One rule of a Prometheus rule file: its name, its expression, and its own lines.
struct Rule {
    name: String,
    expr: String,
    text: String,
}

/// The rules of a rule file as written in deploy/prometheus (no YAML parser among the crate's
/// dependencies): each `- alert:` item up to the next, its `expr:` inline (quoted or not) or a
/// `|`/`>` block of the lines indented deeper. `.ci/deploy-check` reads the same file with a YAML
/// parser and checks its structure.
fn rules(yaml: &str) -> Vec<Rule> {
    let lines: Vec<&str> = yaml.lines().collect();
    let starts: Vec<usize> =
        (0..lines.len()).filter(|&i| lines[i].trim_start().starts_with("- alert:")).chain([lines.len()]).collect();
    let mut rules = Vec::new();
    for pair in starts.windows(2) {
        let own = &lines[pair[0]..pair[1]];
        let name = own[0].trim_start().trim_start_matches("- alert:").trim().to_string();
        let exprs: Vec<usize> = (0..own.len()).filter(|&i| own[i].trim_start().starts_with("expr:")).collect();
        assert_eq!(exprs.len(), 1, "alert {name}: one expr, found {}", exprs.len());
        let at = exprs[0];
        let indent = own[at].len() - own[at].trim_start().len();
        let value = own[at].trim_start().trim_start_matches("expr:").trim();
        let expr = if value.starts_with('|') || value.starts_with('>') {
            let block = own[at + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
                .map(|l| l.trim())
                .collect::<Vec<_>>();
            block.join("\n").trim().to_string()
        } else if value.len() >= 2
            && ((value.starts_with('"') && value.ends_with('"')) || (value.starts_with('\'') && value.ends_with('\'')))
        {
            value[1..value.len() - 1].to_string()
        } else {
            value.to_string()
        };
        assert!(!expr.is_empty(), "alert {name}: an empty expr");
        rules.push(Rule { name, expr, text: own.join("\n") });
    }
    rules
}

/// Every alert's expression, and the `$labels.x` its annotations print.
fn check_alerts(yaml: &str, scrape: &Scrape, errors: &mut Vec<String>) -> Used {
    let file = "deploy/prometheus/alerts.yaml";
    let rules = rules(yaml);
    assert!(rules.len() >= 8, "{file}: {} alerts found", rules.len());
    assert_eq!(rules.len(), yaml.matches("expr:").count(), "{file}: every expr belongs to an alert");
    let mut used = Used::default();
    for rule in &rules {
        let printed: Vec<String> = rule
            .text
            .split("$labels.")
            .skip(1)
            .map(|s| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect())
            .collect();
        check_expr(&format!("{file}, alert {}", rule.name), &rule.expr, &printed, scrape, &mut used, errors);
    }
    used
}

/// The checker itself refuses what a scrape lacks: a metric, a matcher's label, a grouping label,
/// a legend's label, a misspelt function, a `_bucket` of a counter.
#[test]
fn the_checker_refuses_names_the_scrape_lacks() {
    let mut scrape = Scrape::default();
    scrape.add(
        "# TYPE limited_calls counter\n\
         limited_calls{limitador_namespace=\"a\",limit_name=\"x, \\\"y\\\"\"} 1\n\
         # TYPE tollgate_decision_seconds histogram\n\
         tollgate_decision_seconds_bucket{le=\"0.1\"} 1\n\
         tollgate_decision_seconds_sum 0.1\n\
         # TYPE authorized_calls counter\n\
         authorized_calls_bucket{le=\"1\"} 1\n",
    );
    assert_eq!(
        scrape.labels("limited_calls").unwrap().iter().collect::<Vec<_>>(),
        ["limit_name", "limitador_namespace"]
    );
    let check = |expr: &str, legend: &[&str]| {
        let (mut used, mut errors) = (Used::default(), Vec::new());
        let legend: Vec<String> = legend.iter().map(|s| s.to_string()).collect();
        check_expr("test", expr, &legend, &scrape, &mut used, &mut errors);
        errors
    };
    let good = r#"sum by (limit_name, instance) (rate(limited_calls{limitador_namespace=~"$ns", job="j"}[$__rate_interval])) / 1e-3
        + histogram_quantile(0.99, sum by (le) (rate(tollgate_decision_seconds_bucket[5m]))) + up{job="x"} offset 5m"#;
    assert_eq!(check(good, &["limit_name"]), Vec::<String>::new());
    for (bad, legend, named) in [
        ("rate(tollgate_not_exported_total[5m])", &[][..], "tollgate_not_exported_total"),
        (r#"rate(limited_calls{colour="red"}[5m])"#, &[], "colour"),
        ("sum by (kind) (rate(limited_calls[5m]))", &[], "kind"),
        ("sum(rate(limited_calls[5m]))", &["prefix"], "prefix"),
        ("histogram_quantil(0.9, rate(tollgate_decision_seconds_bucket[5m]))", &[], "histogram_quantil"),
        ("rate(authorized_calls_bucket[5m])", &[], "not a histogram"),
        ("tollgate_decision_seconds", &[], "tollgate_decision_seconds"),
        (r#"up{pod="x"}"#, &[], "pod"),
        ("vector(1)", &[], "no metric"),
    ] {
        let errors = check(bad, legend);
        assert!(errors.iter().any(|e| e.contains(named)), "{bad}: {errors:?}");
    }
    let alerts = rules(
        "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: |\n      sum by (x) (\n        y)\n    for: 1m\n  - alert: B\n    expr: 'z > 1'\n",
    );
    assert_eq!(
        alerts.iter().map(|r| (r.name.as_str(), r.expr.as_str())).collect::<Vec<_>>(),
        [("A", "sum by (x) (\ny)"), ("B", "z > 1")]
    );
}
