//! Reading the YAML: Limitador's format, with every value's position kept for error messages.

use std::sync::Arc;

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::error::{PolicyError, Position};
use crate::expr::{Condition, Variable};
use crate::limit::{AlgorithmKind, Enforcement, Limit, LimitId, Metadata};

/// One entry as written. Required fields are `Option` so that a missing one is reported by us,
/// at the entry's position, rather than by serde without one.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    namespace: Option<Spanned<String>>,
    /// Up to `u64::MAX`, so read wider than `i64`.
    max_value: Option<Spanned<i128>>,
    /// Limitador's whole number of seconds, or a duration in the core's syntax (`1m`, `1h30m`).
    seconds: Option<Spanned<String>>,
    name: Option<Spanned<String>>,
    /// Limitador's optional id; kept for display, not used to identify counters.
    id: Option<Spanned<String>>,
    // Limitador's examples write `conditions:` with no value: null is an empty list.
    #[serde(default)]
    conditions: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    variables: Option<Vec<Spanned<String>>>,
    algorithm: Option<Spanned<String>>,
    /// Ours: most counters (distinct variable values) kept in memory for this limit.
    max_counters: Option<Spanned<i128>>,
    /// Ours: what a new counter gets when `max_counters` are kept and none is idle.
    at_max_counters: Option<Spanned<String>>,
    /// Ours: count and report, never deny.
    shadow: Option<Spanned<bool>>,
    /// Ours: `enforce` (the default) or `quota` (allow and mark the response).
    mode: Option<Spanned<String>>,
    /// Ours: calendar windows instead of `seconds`.
    window: Option<Spanned<RawWindow>>,
    /// Ours: match each descriptor with exactly these keys on its own (envoy/ratelimit's way).
    descriptor_keys: Option<Spanned<Vec<Spanned<String>>>>,
    /// Ours: names of limits this one replaces when both apply (envoy/ratelimit's `replaces`).
    replaces: Option<Vec<Spanned<String>>>,
    /// Ours: applies and counts nothing, in place of `max_value` and `seconds` (envoy/ratelimit's
    /// `unlimited: true`).
    unlimited: Option<Spanned<bool>>,
    /// Ours: returned to Envoy for the rules a request passed (envoy/ratelimit's rule `metadata`).
    metadata: Option<Spanned<serde_json::Value>>,
}

/// `window: {calendar: second | minute | hour | day | week | month | epoch_week | epoch_month | epoch_year,
/// timezone: UTC | IANA name}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWindow {
    calendar: Spanned<String>,
    timezone: Option<Spanned<String>>,
}

/// Parses and validates every limit of a file, in file order.
pub(crate) fn parse_limits(text: &str, source_name: &str) -> Result<Vec<Limit>, PolicyError> {
    let err = |at: Position, message: String| PolicyError::new(source_name, at, message);
    if text.lines().all(|l| l.trim().is_empty() || l.trim_start().starts_with('#') || l.trim() == "---") {
        return Err(err(
            Position::new(1, 1),
            "the limits file is empty: write a list of limits (or `[]` for none)".into(),
        ));
    }
    let raw: Vec<Spanned<RawLimit>> = serde_saphyr::from_str(text).map_err(|e| yaml_error(source_name, &e))?;
    let source: Arc<str> = source_name.into();
    raw.into_iter().map(|entry| validate(entry, &source)).collect()
}

fn validate(entry: Spanned<RawLimit>, source: &Arc<str>) -> Result<Limit, PolicyError> {
    let source_name = &**source;
    let at = Position::from(entry.referenced);
    let raw = entry.value;
    let err = |at: Position, message: String| PolicyError::new(source_name, at, message);
    let missing = |field: &str| err(at, format!("this limit has no `{field}` (required)"));

    let namespace = raw.namespace.ok_or_else(|| missing("namespace"))?;
    if namespace.value.trim().is_empty() {
        return Err(err(namespace.referenced.into(), "namespace must not be empty".into()));
    }
    let unlimited = raw.unlimited.filter(|u| u.value);
    if let Some(u) = &unlimited
        && (raw.max_value.is_some() || raw.seconds.is_some() || raw.window.is_some())
    {
        let why = "`unlimited: true` with `max_value`, `seconds` or `window`: an unlimited limit counts nothing";
        return Err(err(u.referenced.into(), why.into()));
    }
    // 0 denies every request the limit applies to (Limitador's and envoy/ratelimit's way to ban).
    let max_value = match (&unlimited, raw.max_value) {
        (Some(_), _) => u64::MAX,
        (None, max_value) => at_least(0, max_value.ok_or_else(|| missing("max_value"))?, "max_value", source_name)?,
    };
    let calendar = raw.window.map(|w| calendar(w, source_name)).transpose()?;
    let seconds = match (&calendar, raw.seconds) {
        (None, None) if unlimited.is_some() => 1,
        (None, None) => return Err(missing("seconds")),
        (None, Some(seconds)) => whole_seconds(seconds, source_name)?,
        (Some(calendar), None) => calendar.nominal().as_secs(),
        (Some(_), Some(seconds)) => {
            return Err(err(
                seconds.referenced.into(),
                "`seconds` and `window` together: a calendar window is as long as its unit (a minute, a day, a month...)".into(),
            ));
        }
    };
    let algorithm = match raw.algorithm {
        // Limitador counts in fixed windows.
        None => AlgorithmKind::FixedWindow,
        Some(a) => {
            let known = || AlgorithmKind::names_where(|s| s.limits_file);
            match AlgorithmKind::from_name(a.value.trim()) {
                Some(kind) if kind.support().limits_file => kind,
                Some(kind) => {
                    let why = format!("algorithm `{kind}` is not one a limits file can name: expected {}", known());
                    return Err(err(a.referenced.into(), why));
                }
                None => {
                    return Err(err(
                        a.referenced.into(),
                        format!("unknown algorithm `{}`: expected {}", a.value, known()),
                    ));
                }
            }
        }
    };
    let enforcement = enforcement(raw.shadow, raw.mode, source_name)?;
    if enforcement == Enforcement::Pooled && algorithm != AlgorithmKind::FixedWindow {
        return Err(err(
            at,
            format!("`mode: pooled` counts in fixed windows only (it counts past its limit), not {}", algorithm.name()),
        ));
    }
    if calendar.is_some() && !algorithm.support().calendar {
        let known = AlgorithmKind::names_where(|s| s.calendar);
        return Err(err(at, format!("calendar windows count as {known} only, not {}", algorithm.name())));
    }
    let max_counters = raw
        .max_counters
        .map(|m| {
            let at = m.referenced;
            let n = at_least(1, m, "max_counters", source_name)?;
            usize::try_from(n)
                .ok()
                .and_then(std::num::NonZeroUsize::new)
                .ok_or_else(|| err(at.into(), format!("max_counters is too large: {n}")))
        })
        .transpose()?;
    let at_max_counters = raw
        .at_max_counters
        .map(|a| {
            tollgate::AtKeyLimit::from_name(a.value.trim()).ok_or_else(|| {
                err(
                    a.referenced.into(),
                    format!("unknown at_max_counters `{}`: expected reject, evict or admit", a.value),
                )
            })
        })
        .transpose()?;
    let conditions = raw
        .conditions
        .unwrap_or_default()
        .into_iter()
        .map(|c| Condition::parse(&c.value).map_err(|m| err(c.referenced.into(), format!("bad condition: {m}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let variables = raw
        .variables
        .unwrap_or_default()
        .into_iter()
        .map(|v| Variable::parse(&v.value).map_err(|m| err(v.referenced.into(), format!("bad variable: {m}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let descriptor_keys = raw.descriptor_keys.map(|keys| descriptor_keys(keys, source_name)).transpose()?;
    let replaces = raw
        .replaces
        .unwrap_or_default()
        .into_iter()
        .map(|r| {
            let name = r.value.trim();
            if name.is_empty() {
                Err(err(r.referenced.into(), "an empty name in `replaces`".into()))
            } else if raw.name.as_ref().is_some_and(|n| n.value == name) {
                Err(err(r.referenced.into(), format!("the limit `{name}` replaces itself")))
            } else {
                Ok(name.to_string())
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut limit = Limit {
        namespace: namespace.value,
        max_value,
        seconds,
        name: raw.name.map(|n| n.value),
        file_id: raw.id.map(|i| i.value),
        conditions,
        variables,
        algorithm,
        max_counters,
        at_max_counters,
        enforcement,
        unlimited: unlimited.is_some(),
        calendar,
        descriptor_keys,
        replaces,
        metadata: raw.metadata.map(|m| metadata(m, source_name)).transpose()?,
        stats_key: None,
        source_name: Arc::clone(source),
        position: at,
        set_by_request: false,
        shared_with_own_limits: false,
        id: LimitId(0),
    };
    let quota = match limit.quota() {
        Ok(quota) => quota,
        // A limit of 0 counts nothing: there is no rate to check.
        Err(tollgate::QuotaError::ZeroLimit) => {
            limit.id = limit.compute_id();
            return Ok(limit);
        }
        Err(e) => return Err(err(at, format!("{max_value} per {seconds} s is not a usable quota: {e}"))),
    };
    if algorithm == AlgorithmKind::SlidingWindow {
        tollgate::SlidingWindow::new(quota, crate::limit::SLIDING_SEGMENTS)
            .map_err(|e| err(at, format!("{max_value} per {seconds} s cannot be a sliding window: {e}")))?;
    }
    limit.id = limit.compute_id();
    Ok(limit)
}

/// `metadata:`, which must be a mapping (a `google.protobuf.Struct` when it is returned).
pub(crate) fn metadata(value: Spanned<serde_json::Value>, source_name: &str) -> Result<Arc<Metadata>, PolicyError> {
    match value.value {
        serde_json::Value::Object(map) => Ok(Arc::new(map)),
        other => Err(PolicyError::new(
            source_name,
            value.referenced.into(),
            format!("`metadata` must be a mapping (names to values), got {other}"),
        )),
    }
}

/// `descriptor_keys: [k1, k2]`: at least one key, none empty, none twice (a limit reads an entry
/// by its key, so a key that comes twice could not be read at its second place).
pub(crate) fn descriptor_keys(
    keys: Spanned<Vec<Spanned<String>>>,
    source_name: &str,
) -> Result<Vec<String>, PolicyError> {
    let err = |at: serde_saphyr::Location, message: String| PolicyError::new(source_name, at.into(), message);
    if keys.value.is_empty() {
        return Err(err(
            keys.referenced,
            "descriptor_keys is empty: name the keys of the descriptors it matches".into(),
        ));
    }
    let mut seen: Vec<String> = Vec::with_capacity(keys.value.len());
    for key in keys.value {
        if key.value.is_empty() {
            return Err(err(key.referenced, "an empty key in descriptor_keys".into()));
        }
        if seen.contains(&key.value) {
            return Err(err(
                key.referenced,
                format!("`{}` twice in descriptor_keys: a limit reads an entry by its key", key.value),
            ));
        }
        seen.push(key.value);
    }
    Ok(seen)
}

/// `window: {calendar, timezone}`: a [`tollgate::Calendar`], UTC unless a zone is named.
fn calendar(window: Spanned<RawWindow>, source_name: &str) -> Result<tollgate::Calendar, PolicyError> {
    let RawWindow { calendar, timezone } = window.value;
    let unit = tollgate::CalendarUnit::from_name(calendar.value.trim()).ok_or_else(|| {
        PolicyError::new(
            source_name,
            calendar.referenced.into(),
            format!(
                "unknown calendar `{}`: expected second, minute, hour, day, week, month, epoch_week, epoch_month or \
                 epoch_year",
                calendar.value
            ),
        )
    })?;
    let (zone, at) = match &timezone {
        Some(tz) => (tz.value.trim(), Position::from(tz.referenced)),
        None => ("UTC", Position::from(window.referenced)),
    };
    tollgate::Calendar::new(unit, zone).map_err(|e| PolicyError::new(source_name, at, e.to_string()))
}

/// `shadow: true` and `mode: enforce | quota`: one [`Enforcement`]. Both at once is refused: a
/// quota limit never denies already, and a shadow one would hide the marks it exists to make.
fn enforcement(
    shadow: Option<Spanned<bool>>,
    mode: Option<Spanned<String>>,
    source_name: &str,
) -> Result<Enforcement, PolicyError> {
    let mode = match mode {
        None => None,
        Some(m) => match m.value.trim() {
            "enforce" => None,
            "quota" => Some((m, Enforcement::Quota)),
            "pooled" => Some((m, Enforcement::Pooled)),
            other => {
                return Err(PolicyError::new(
                    source_name,
                    m.referenced.into(),
                    format!("unknown mode `{other}`: expected enforce (the default), quota or pooled"),
                ));
            }
        },
    };
    match (shadow.filter(|s| s.value), mode) {
        (Some(s), Some((_, enforcement))) => Err(PolicyError::new(
            source_name,
            s.referenced.into(),
            match enforcement {
                Enforcement::Quota => "`shadow: true` and `mode: quota` together: a quota limit never denies already; \
                                       choose one"
                    .to_string(),
                other => format!("`shadow: true` and `mode: {}` together: choose one", other.name()),
            },
        )),
        (Some(_), None) => Ok(Enforcement::Shadow),
        (None, Some((_, enforcement))) => Ok(enforcement),
        (None, None) => Ok(Enforcement::Enforce),
    }
}

/// A whole number from `min` to `u64::MAX`.
fn at_least(min: u64, value: Spanned<i128>, field: &str, source_name: &str) -> Result<u64, PolicyError> {
    match u64::try_from(value.value) {
        Ok(v) if v >= min => Ok(v),
        _ => Err(PolicyError::new(
            source_name,
            value.referenced.into(),
            format!("{field} must be from {min} to {}, got {}", u64::MAX, value.value),
        )),
    }
}

/// `seconds:` as Limitador writes it (`60`), or as a duration read by [`tollgate::parse_duration`]
/// (`1m`, `1h30m`) that must come to whole seconds.
fn whole_seconds(value: Spanned<String>, source_name: &str) -> Result<u64, PolicyError> {
    let at = Position::from(value.referenced);
    let err = |message: String| PolicyError::new(source_name, at, message);
    let text = value.value.trim();
    if let Ok(n) = text.parse::<i128>() {
        return at_least(
            1,
            Spanned { value: n, referenced: value.referenced, defined: value.defined },
            "seconds",
            source_name,
        );
    }
    let d = tollgate::parse_duration(text).map_err(|e| err(format!("seconds: {e}")))?;
    if d.subsec_nanos() != 0 {
        return Err(err(format!("seconds must be whole seconds, got {text:?} ({d:?})")));
    }
    Ok(d.as_secs())
}

pub(crate) fn yaml_error(source_name: &str, e: &serde_saphyr::Error) -> PolicyError {
    let at = e.location().map(Position::from).unwrap_or_default();
    // The library's Display adds its own position and a snippet; keep the first line, without
    // the position, since ours leads the message.
    let full = e.to_string();
    let first = full.lines().next().unwrap_or("invalid YAML").trim();
    let message = first.strip_prefix("error: ").unwrap_or(first);
    let message = match message.rfind(" at line ") {
        Some(i) => &message[..i],
        None => message,
    };
    let message = match message.strip_prefix("line ").and_then(|m| m.split_once(": ")) {
        Some((_, rest)) => rest,
        None => message,
    };
    let message = match message {
        "invalid i64" | "invalid i128" => "expected a whole number".to_string(),
        "expected sequence start" => "expected a list of limits (`- namespace: ...`)".to_string(),
        other => other.to_string(),
    };
    PolicyError::new(source_name, at, message)
}
