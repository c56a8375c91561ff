//! Writing limits back as a limits file in Limitador's format (with Tollgate's optional fields
//! where a limit uses them), which [`Policy::parse`] reads back to the same limits — but for
//! per-value statistics ([`Limit::stats_key`](crate::Limit::stats_key)), which the format has no
//! field for: a comment says where they were.

use std::fmt::Write as _;

use crate::limit::{AlgorithmKind, Enforcement, Limit};
use crate::policy::Policy;

impl Policy {
    /// The limits as one limits file in Limitador's format: each preceded by a comment with the
    /// file and line it came from, fields Limitador knows first, Tollgate's after them only where
    /// a limit uses them. [`Policy::parse`] reads it back to limits with the same ids, values,
    /// conditions and variables (`tollgate convert` prints it).
    ///
    /// ```
    /// use tollgate_policy::{Policy, SourceText};
    ///
    /// let envoy = "domain: sms\ndescriptors:\n  - key: to\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    /// let policy = Policy::parse_envoy(&[SourceText::new("config/sms.yaml", envoy)])?;
    /// let yaml = policy.to_yaml();
    /// assert_eq!(
    ///     yaml,
    ///     r#"# config/sms.yaml:3:5
    /// - namespace: "sms"
    ///   id: "sms.to"
    ///   max_value: 5
    ///   window: {calendar: "minute", timezone: "UTC"}
    ///   descriptor_keys: ["to"]
    ///   conditions: []
    ///   variables: ["descriptors[0]['to']"]
    /// "#
    /// );
    /// let back = Policy::parse(&yaml, "converted.yaml")?;
    /// assert_eq!(back.limits()[0].id(), policy.limits()[0].id());
    /// # Ok::<(), tollgate_policy::PolicyError>(())
    /// ```
    pub fn to_yaml(&self) -> String {
        if self.is_empty() {
            return "[]\n".to_string();
        }
        let mut out = String::new();
        for limit in self.rules() {
            write_limit(&mut out, limit);
        }
        out
    }
}

fn write_limit(out: &mut String, limit: &Limit) {
    let at = limit.position();
    let _ = writeln!(out, "# {}:{}:{}", limit.source_name(), at.line, at.column);
    let _ = writeln!(out, "- namespace: {}", quoted(limit.namespace()));
    if let Some(id) = limit.file_id() {
        let _ = writeln!(out, "  id: {}", quoted(id));
    }
    if let Some(name) = limit.name() {
        let _ = writeln!(out, "  name: {}", quoted(name));
    }
    match limit.calendar() {
        _ if limit.unlimited() => out.push_str("  unlimited: true\n"),
        Some(calendar) => {
            let _ = writeln!(out, "  max_value: {}", limit.max_value());
            let _ = writeln!(
                out,
                "  window: {{calendar: {}, timezone: {}}}",
                quoted(calendar.unit().name()),
                quoted(calendar.zone())
            );
        }
        None => {
            let _ = writeln!(out, "  max_value: {}", limit.max_value());
            let _ = writeln!(out, "  seconds: {}", limit.seconds());
        }
    }
    if let Some(keys) = limit.descriptor_keys() {
        let _ = writeln!(out, "  descriptor_keys: {}", list(keys.iter().map(String::as_str)));
    }
    let _ = writeln!(out, "  conditions: {}", list(limit.conditions().iter().map(|c| c.source())));
    let _ = writeln!(out, "  variables: {}", list(limit.variables().iter().map(|v| v.source())));
    if limit.algorithm() != AlgorithmKind::FixedWindow {
        let _ = writeln!(out, "  algorithm: {}", limit.algorithm().name());
    }
    match limit.enforcement() {
        Enforcement::Enforce => {}
        Enforcement::Shadow => out.push_str("  shadow: true\n"),
        Enforcement::Quota => out.push_str("  mode: quota\n"),
        Enforcement::Pooled => out.push_str("  mode: pooled\n"),
    }
    if !limit.replaces().is_empty() {
        let _ = writeln!(out, "  replaces: {}", list(limit.replaces().iter().map(String::as_str)));
    }
    if let Some(max) = limit.max_counters() {
        let _ = writeln!(out, "  max_counters: {max}");
    }
    if let Some(at_max) = limit.at_max_counters() {
        let _ = writeln!(out, "  at_max_counters: {}", at_max.name());
    }
    if limit.has_stats_key() {
        // Said where it is lost: the limit is the same, its statistics are per limit again.
        out.push_str(
            "  # per-value statistics (envoy/ratelimit's detailed_metric, value_to_metric): none in this format\n",
        );
    }
    if let Some(metadata) = limit.metadata() {
        // JSON is YAML's flow style: it reads back as the same mapping.
        let _ = writeln!(out, "  metadata: {}", serde_json::to_string(metadata).expect("a JSON map serialises"));
    }
}

fn list<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let items: Vec<String> = items.map(quoted).collect();
    format!("[{}]", items.join(", "))
}

/// A YAML double-quoted scalar: any text, with `"`, `\` and control characters escaped.
fn quoted(text: &str) -> String {
    quote(text, '"')
}

/// `text` between `quote`s, with the quote, `\` and control characters escaped as `\n`, `\r`,
/// `\t` or `\uXXXX`: a YAML double-quoted scalar, and a CEL string literal (in either quote).
pub(crate) fn quote(text: &str, quote: char) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}
