//! Every way a limits file can be wrong gives `file:line:column: message`, never a default.

use tollgate_policy::Policy;

fn error(yaml: &str) -> String {
    Policy::parse(yaml, "limits.yaml").unwrap_err().to_string()
}

const OK: &str = "- namespace: a\n  max_value: 3\n  seconds: 1\n";

#[test]
fn empty_files() {
    let empty = "limits.yaml:1:1: the limits file is empty: write a list of limits (or `[]` for none)";
    assert_eq!(error(""), empty);
    assert_eq!(error("# only a comment\n---\n"), empty);
    assert!(Policy::parse("[]", "limits.yaml").unwrap().is_empty(), "an explicit empty list is no limits");
}

#[test]
fn structure() {
    assert_eq!(
        error(&format!("{OK}  colour: red\n")),
        "limits.yaml:4:3: unknown field `colour`, expected one of namespace, max_value, seconds, name, id, conditions, \
         variables, algorithm, max_counters, at_max_counters, shadow, mode, window, descriptor_keys, replaces, unlimited, metadata"
    );
    assert_eq!(error("namespace: a\n"), "limits.yaml:1:1: expected a list of limits (`- namespace: ...`)");
    assert!(error("- namespace: a\n  max_value: 3\n  seconds: [1\n").starts_with("limits.yaml:3:"));
}

#[test]
fn numbers() {
    let at = |v: &str| error(&format!("- namespace: a\n  max_value: {v}\n  seconds: 1\n"));
    assert_eq!(at("ten"), "limits.yaml:2:14: expected a whole number");
    assert_eq!(at("1.5"), "limits.yaml:2:14: expected a whole number");
    assert_eq!(
        at("99999999999999999999"),
        "limits.yaml:2:14: max_value must be from 0 to 18446744073709551615, got 99999999999999999999"
    );
    // A byte budget: more than one per nanosecond is fine on a window algorithm.
    let loads = |v: &str, algorithm: &str| {
        Policy::parse(
            &format!("- {{namespace: a, max_value: {v}, seconds: 60, algorithm: {algorithm}}}"),
            "limits.yaml",
        )
        .map(|p| p.limits()[0].max_value())
    };
    assert_eq!(loads("18446744073709551615", "fixed_window").unwrap(), u64::MAX);
    assert_eq!(loads("1000000000000", "weighted_window").unwrap(), 1_000_000_000_000);
    assert_eq!(loads("0", "fixed_window").unwrap(), 0, "0 denies every request");
    let refill = loads("1000000000000", "token_bucket").unwrap_err().to_string();
    assert!(refill.contains("more than one permit per nanosecond"), "{refill}");
    assert_eq!(at("-3"), "limits.yaml:2:14: max_value must be from 0 to 18446744073709551615, got -3");
    assert_eq!(
        at("18446744073709551616"),
        "limits.yaml:2:14: max_value must be from 0 to 18446744073709551615, got 18446744073709551616"
    );
    assert_eq!(
        error("- namespace: a\n  max_value: 3\n  seconds: 0\n"),
        "limits.yaml:3:12: seconds must be from 1 to 18446744073709551615, got 0"
    );
}

#[test]
fn missing_fields() {
    assert_eq!(error("- namespace: a\n  max_value: 3\n"), "limits.yaml:1:3: this limit has no `seconds` (required)");
    assert_eq!(error("- max_value: 3\n  seconds: 1\n"), "limits.yaml:1:3: this limit has no `namespace` (required)");
    assert_eq!(
        error(&format!("{OK}- namespace: b\n  seconds: 1\n")),
        "limits.yaml:4:3: this limit has no `max_value` (required)"
    );
    assert_eq!(
        error("- namespace: ' '\n  max_value: 3\n  seconds: 1\n"),
        "limits.yaml:1:14: namespace must not be empty"
    );
}

#[test]
fn expressions() {
    let e = error(&format!("{OK}  conditions: [\"req.method = 'POST'\"]\n"));
    assert!(e.starts_with("limits.yaml:4:16: bad condition: cannot parse `req.method = 'POST'`"), "{e}");
    let e = error(&format!("{OK}  conditions: [\"req.method == POST\"]\n"));
    assert!(e.starts_with("limits.yaml:4:16: bad condition: unknown variable `"), "{e}");
    let e = error(&format!("{OK}  variables:\n    - user\n    - \"descriptors[0].\"\n"));
    assert!(e.starts_with("limits.yaml:6:7: bad variable: cannot parse `descriptors[0].`"), "{e}");
    assert_eq!(
        error(&format!("{OK}  algorithm: leaky\n")),
        "limits.yaml:4:14: unknown algorithm `leaky`: expected token_bucket, fixed_window, sliding_window or weighted_window"
    );
    // In the core's catalogue, but not counted by the server.
    assert_eq!(
        error(&format!("{OK}  algorithm: sliding_log\n")),
        "limits.yaml:4:14: algorithm `sliding_log` is not one a limits file can name: expected token_bucket, \
         fixed_window, sliding_window or weighted_window"
    );
}

#[test]
fn duplicates() {
    assert_eq!(
        error(&format!("{OK}- namespace: a\n  max_value: 5\n  seconds: 1\n")),
        "limits.yaml:4:3: duplicate limit: same namespace `a`, seconds, conditions, variables, algorithm and mode as the \
         limit at line 1"
    );
    let reordered = "- {namespace: a, max_value: 1, seconds: 1, conditions: [\"x == '1'\", \"y == '2'\"]}\n\
                     - {namespace: a, max_value: 2, seconds: 1, conditions: [\"y == '2'\", \"x == '1'\"]}\n";
    assert!(error(reordered).contains("duplicate limit"), "conditions are a set");
    let different = format!("{OK}- namespace: a\n  max_value: 5\n  seconds: 1\n  algorithm: token_bucket\n");
    assert_eq!(Policy::parse(&different, "f").unwrap().len(), 2);
}

#[test]
fn unreadable_file() {
    let e = Policy::load(std::path::Path::new("/nonexistent/limits.yaml")).unwrap_err();
    assert!(e.to_string().starts_with("/nonexistent/limits.yaml: cannot read the limits file"), "{e}");
}

#[test]
fn expression_errors_are_typed_and_name_the_expression() {
    use tollgate_policy::{Condition, ExprError, Variable};
    assert_eq!(Condition::parse("  ").unwrap_err(), ExprError::Empty { what: "condition" });
    assert_eq!(Variable::parse("").unwrap_err(), ExprError::Empty { what: "variable" });
    match Condition::parse(" req.method == POST ").unwrap_err() {
        ExprError::UnknownVariable { name, expression } => {
            assert_eq!((name.as_str(), expression.as_str()), ("POST", "req.method == POST"))
        }
        other => panic!("expected an unknown variable, got {other:?}"),
    }
    match Variable::parse("descriptors[0].").unwrap_err() {
        ExprError::Syntax { expression, reason } => {
            assert_eq!(expression, "descriptors[0].");
            assert!(!reason.is_empty());
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
}

#[test]
fn seconds_may_be_a_duration_in_the_core_syntax() {
    let seconds = |v: &str| {
        Policy::parse(&format!("- namespace: a\n  max_value: 3\n  seconds: {v}\n"), "limits.yaml")
            .map(|p| p.limits()[0].seconds())
            .map_err(|e| e.to_string())
    };
    assert_eq!(seconds("60"), Ok(60));
    assert_eq!(seconds("1m"), Ok(60));
    assert_eq!(seconds("1h30m"), Ok(5400));
    assert_eq!(seconds("'90s'"), Ok(90));
    assert_eq!(
        seconds("fast"),
        Err("limits.yaml:3:12: seconds: invalid duration \"fast\": \"fast\" is not a duration: expected number at 0 \
             (expected a duration such as 250ms, 10s, 1m30s, 2h)"
            .into())
    );
    assert_eq!(seconds("0s"), Err("limits.yaml:3:12: seconds: invalid duration \"0s\": \"0s\" is zero; it must be longer than zero (expected a duration such as 250ms, 10s, 1m30s, 2h)".into()));
    assert_eq!(seconds("1500ms"), Err("limits.yaml:3:12: seconds must be whole seconds, got \"1500ms\" (1.5s)".into()));
}

#[test]
fn max_counters_and_what_happens_there_are_checked() {
    assert_eq!(
        error(&format!("{OK}  max_counters: 0\n")),
        "limits.yaml:4:17: max_counters must be from 1 to 18446744073709551615, got 0"
    );
    assert_eq!(error(&format!("{OK}  max_counters: lots\n")), "limits.yaml:4:17: expected a whole number");
    assert_eq!(
        error(&format!("{OK}  at_max_counters: drop\n")),
        "limits.yaml:4:20: unknown at_max_counters `drop`: expected reject, evict or admit"
    );
    let policy =
        Policy::parse(&format!("{OK}  max_counters: 1000\n  at_max_counters: evict\n"), "limits.yaml").unwrap();
    let limit = &policy.limits()[0];
    assert_eq!(limit.max_counters().map(|n| n.get()), Some(1000));
    assert_eq!(limit.at_max_counters(), Some(tollgate::AtKeyLimit::EvictNearestIdle));
    let plain = Policy::parse(OK, "limits.yaml").unwrap();
    assert_eq!((plain.limits()[0].max_counters(), plain.limits()[0].at_max_counters()), (None, None));
}

#[test]
fn shadow_and_mode() {
    assert_eq!(
        error(&format!("{OK}  mode: audit\n")),
        "limits.yaml:4:9: unknown mode `audit`: expected enforce (the default), quota or pooled"
    );
    assert_eq!(
        error(&format!("{OK}  mode: pooled\n  shadow: true\n")),
        "limits.yaml:5:11: `shadow: true` and `mode: pooled` together: choose one"
    );
    assert_eq!(
        error(&format!("{OK}  mode: pooled\n  algorithm: token_bucket\n")),
        "limits.yaml:1:3: `mode: pooled` counts in fixed windows only (it counts past its limit), not token_bucket"
    );
    let pooled = Policy::parse(&format!("{OK}  mode: pooled\n"), "limits.yaml").unwrap();
    assert_eq!(pooled.limits()[0].enforcement(), tollgate_policy::Enforcement::Pooled);
    assert!(pooled.to_yaml().contains("  mode: pooled\n"), "{}", pooled.to_yaml());
    assert_eq!(
        error(&format!("{OK}  mode: quota\n  shadow: true\n")),
        "limits.yaml:5:11: `shadow: true` and `mode: quota` together: a quota limit never denies already; choose one"
    );
    assert!(error(&format!("{OK}  shadow: maybe\n")).starts_with("limits.yaml:4:11:"));
    // A shadow copy of an enforced limit is another limit (its own counters), not a duplicate;
    // `shadow: false` and `mode: enforce` are the enforced limit itself.
    let copy = format!("{OK}- {{namespace: a, max_value: 1, seconds: 1, shadow: true}}\n");
    let policy = Policy::parse(&copy, "limits.yaml").unwrap();
    assert_ne!(policy.limits()[0].id(), policy.limits()[1].id());
    assert!(
        error(&format!("{OK}- {{namespace: a, max_value: 1, seconds: 1, shadow: false, mode: enforce}}\n"))
            .contains("duplicate limit")
    );
}

#[test]
fn calendar_windows() {
    let at = |window: &str| error(&format!("- namespace: a\n  max_value: 3\n  window: {window}\n"));
    assert_eq!(
        at("{calendar: fortnight}"),
        "limits.yaml:3:22: unknown calendar `fortnight`: expected second, minute, hour, day, week, month, epoch_week, epoch_month or epoch_year"
    );
    assert_eq!(
        at("{calendar: day, timezone: Mars/Base}"),
        "limits.yaml:3:37: unknown time zone \"Mars/Base\": expected UTC or an IANA name such as Europe/Berlin"
    );
    assert!(at("{calendar: day, tz: UTC}").contains("unknown field `tz`"));
    assert_eq!(
        error("- {namespace: a, max_value: 3, seconds: 60, window: {calendar: day}}\n"),
        "limits.yaml:1:41: `seconds` and `window` together: a calendar window is as long as its unit (a minute, a day, a month...)"
    );
    assert_eq!(
        error("- {namespace: a, max_value: 3, window: {calendar: day}, algorithm: token_bucket}\n"),
        "limits.yaml:1:3: calendar windows count as fixed_window only, not token_bucket"
    );
    let policy = Policy::parse(
        "- {namespace: a, max_value: 3, window: {calendar: month, timezone: Europe/Berlin}}\n\
         - {namespace: a, max_value: 3, seconds: 2592000}\n",
        "limits.yaml",
    )
    .unwrap();
    let month = policy.limits()[0].calendar().unwrap();
    assert_eq!((month.unit().name(), month.zone()), ("month", "Europe/Berlin"));
    assert_eq!(policy.limits()[0].seconds(), 30 * 86_400, "the nominal month");
    assert_ne!(policy.limits()[0].id(), policy.limits()[1].id(), "a calendar month is not 30 days from the first hit");
}
