//! envoy/ratelimit's configuration format: the examples of its README (written again as
//! fixtures in `tests/fixtures/envoy/config`, one file per domain as its runtime directory holds
//! them) load as one policy that matches requests as envoy/ratelimit does, every feature without
//! an equivalent is an error naming the file and line, and the limits written back in
//! Limitador's format read back to the same limits.

use std::path::{Path, PathBuf};

use tollgate::CalendarUnit;
use tollgate_policy::{Descriptor, Enforcement, Format, LimitOverride, Policy, SourceText};

fn fixtures(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/envoy").join(dir)
}

fn config() -> Policy {
    Format::Envoy.load(&fixtures("config")).unwrap()
}

fn d(entries: &[(&str, &str)]) -> Descriptor {
    entries.iter().copied().collect()
}

/// (max_value, descriptor index, variable values) of each counter the request touches.
/// The counting limits a request hits: max value, descriptor, values (unlimited rules apply too,
/// and count nothing: see `example_5_unlimited_descriptors_count_nothing`).
fn hits(policy: &Policy, domain: &str, request: &[Descriptor]) -> Vec<(u64, usize, Vec<String>)> {
    let hits = policy.hits(domain, request).into_iter().filter(|h| !h.limit.unlimited());
    hits.map(|h| (h.limit.max_value(), h.descriptor, h.values)).collect()
}

fn values(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| v.to_string()).collect()
}

/// One file's text as envoy/ratelimit's format: the error, as `file:line:column: message`.
fn error(yaml: &str) -> String {
    Policy::parse_envoy(&[SourceText::new("config/x.yaml", yaml)]).unwrap_err().to_string()
}

#[test]
fn the_readme_examples_load_from_one_directory() {
    let sources = Format::Envoy.read(&fixtures("config")).unwrap();
    let names: Vec<&str> = sources.iter().map(|s| Path::new(&s.name).file_name().unwrap().to_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "edge_proxy_per_ip.yaml",
            "example11.yml",
            "example4.yaml",
            "example6.yaml",
            "example7.yaml",
            "example9.yaml",
            "internal.yaml",
            "messaging.yaml",
            "mongo_cps.yaml"
        ],
        "*.yaml and *.yml in name order; hidden files and other names are not read"
    );
    let policy = config();
    let mut namespaces: Vec<(&str, usize)> = policy.namespaces().map(|n| (n, policy.namespace(n).count())).collect();
    namespaces.sort();
    assert_eq!(
        namespaces,
        [
            ("edge_proxy_per_ip", 2),
            ("example11", 2),
            ("example4", 2),
            ("example6", 2),
            ("example7", 2),
            ("example9", 3),
            ("internal", 2),
            ("messaging", 2),
            ("mongo_cps", 2)
        ],
        "one limit per rule, `unlimited: true` too"
    );
    for limit in policy.rules() {
        assert!(limit.source_name().ends_with(".yaml") || limit.source_name().ends_with(".yml"));
        assert!(limit.descriptor_keys().is_some(), "every envoy limit matches descriptors one by one");
        match limit.calendar() {
            Some(calendar) => assert_eq!(calendar.zone(), "UTC"),
            None => assert!(limit.unlimited(), "only an unlimited rule has no window"),
        }
    }
}

#[test]
fn example_1_counts_each_value_of_a_key() {
    let policy = config();
    assert_eq!(hits(&policy, "mongo_cps", &[d(&[("database", "users")])]), [(500, 0, vec![])]);
    assert_eq!(hits(&policy, "mongo_cps", &[d(&[("database", "default")])]), [(500, 0, vec![])]);
    assert!(hits(&policy, "mongo_cps", &[d(&[("database", "orders")])]).is_empty(), "no rule for other values");
    let limit = &policy.namespace("mongo_cps").next().unwrap();
    assert_eq!(limit.calendar().unwrap().unit(), CalendarUnit::Second, "envoy/ratelimit's `now / 1`");
    assert_eq!(limit.file_id(), Some("mongo_cps.database_users"), "envoy/ratelimit's key of the rule");
}

#[test]
fn example_2_nests_descriptors_and_limits_each_descriptor_of_a_request_on_its_own() {
    let policy = config();
    // The README's request: two descriptors, each matched against the tree on its own.
    let request = [d(&[("message_type", "marketing"), ("to_number", "2061111111")]), d(&[("to_number", "2061111111")])];
    assert_eq!(
        hits(&policy, "messaging", &request),
        [(5, 0, values(&["2061111111"])), (100, 1, values(&["2061111111"]))]
    );
    // Each number has its own counters.
    assert_eq!(hits(&policy, "messaging", &[d(&[("to_number", "2062222222")])]), [(100, 0, values(&["2062222222"]))]);
    // The placeholder alone has no rule, and other message types have none.
    assert!(hits(&policy, "messaging", &[d(&[("message_type", "marketing")])]).is_empty());
    assert!(hits(&policy, "messaging", &[d(&[("message_type", "alert"), ("to_number", "1")])]).is_empty());
    let day = policy.namespace("messaging").next().unwrap();
    assert_eq!(day.calendar().unwrap().unit(), CalendarUnit::Day, "a UTC day: envoy/ratelimit's now / 86400");
}

#[test]
fn example_3_tries_the_value_before_the_key_alone() {
    let policy = config();
    let edge = |ip: &str| hits(&policy, "edge_proxy_per_ip", &[d(&[("remote_address", ip)])]);
    assert_eq!(edge("50.0.0.1"), [(10, 0, values(&["50.0.0.1"]))]);
    assert_eq!(edge("50.0.0.5"), [(1, 0, vec![])], "the most specific rule only, not both");
}

#[test]
fn example_4_matches_descriptors_of_the_rules_depth_only() {
    let policy = config();
    let two = [d(&[("key", "value"), ("subkey", "subvalue")])];
    assert_eq!(hits(&policy, "example4", &two), [(200, 0, values(&["subvalue"]))], "the nested rule, not the first");
    assert_eq!(hits(&policy, "example4", &[d(&[("key", "value")])]), [(300, 0, vec![])]);
    let three = [d(&[("key", "value"), ("subkey", "x"), ("more", "y")])];
    assert!(hits(&policy, "example4", &three).is_empty(), "deeper than any rule");
    let order = [d(&[("subkey", "x"), ("key", "value")])];
    assert!(hits(&policy, "example4", &order).is_empty(), "entries are matched in order");
}

#[test]
fn example_5_unlimited_descriptors_count_nothing() {
    let policy = config();
    assert!(hits(&policy, "internal", &[d(&[("ldap", "anything")])]).is_empty());
    let ldap = policy.hits("internal", &[d(&[("ldap", "anything")])]);
    assert_eq!(ldap.len(), 1, "the unlimited rule applies");
    assert!(ldap[0].limit.unlimited() && !ldap[0].limit.denies_all());
    assert_eq!(hits(&policy, "internal", &[d(&[("azure", "a")])]), [(100, 0, values(&["a"]))]);
}

#[test]
fn example_6_shadow_mode_is_a_shadow_limit() {
    let policy = config();
    let user = |name: &str| {
        let request = [d(&[("service", "auth-service"), ("user", name)])];
        policy.hits("example6", &request).into_iter().map(|h| (h.limit.max_value(), h.limit.enforcement())).collect()
    };
    let a: Vec<_> = user("user-a");
    assert_eq!(a, [(10, Enforcement::Shadow)]);
    assert_eq!(user("user-b"), [(20, Enforcement::Enforce)]);
    assert_eq!(user("user-c"), []);
    let shadow = policy.namespace("example6").next().unwrap();
    assert_eq!(shadow.variables()[0].source(), "descriptors[0]['service']", "one counter per service");
}

/// `quota_mode` is a pooled limit; with `shadow_mode` too it only counts, as envoy/ratelimit
/// reports such a rule OK before it counts its quota descriptors.
#[test]
fn quota_mode_is_a_pooled_limit() {
    let yaml = "domain: d\ndescriptors:\n  - key: service\n    value: a\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: service\n    value: b\n    quota_mode: true\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 0}\n";
    let policy = Policy::parse_envoy(&[SourceText::new("config/quota.yaml", yaml)]).unwrap();
    let kinds: Vec<_> = policy.rules().iter().map(|l| (l.enforcement(), l.capacity(), l.denies_all())).collect();
    assert_eq!(kinds, [(Enforcement::Pooled, 1 << 53, false), (Enforcement::Shadow, 1 << 53, true)]);
    let back = Policy::parse(&policy.to_yaml(), "converted.yaml").unwrap();
    assert_eq!(back.limits()[0].enforcement(), Enforcement::Pooled);
    assert_eq!(back.limits()[0].id(), policy.rules()[0].id());
}

/// Statistics keys per value, as envoy/ratelimit's `test/config/config_test.go` expects them
/// (`TestValueToMetric_*`, and `detailed_metric`: every entry's `key_value`).
#[test]
fn detailed_metric_and_value_to_metric_make_statistics_keys_per_value() {
    let rule = "rate_limit: {unit: second, requests_per_unit: 1}";
    let cases = [
        (
            format!(
                "- key: route\n  value_to_metric: true\n  descriptors:\n    - key: http_method\n      value_to_metric: true\n      descriptors:\n        - key: subject_id\n          {rule}\n"
            ),
            vec![("route", "draw"), ("http_method", "GET"), ("subject_id", "123")],
            Some("d.route_draw.http_method_GET.subject_id"),
        ),
        (
            format!("- key: k1\n  value_to_metric: true\n  descriptors:\n    - key: k2\n      {rule}\n"),
            vec![("k1", "A"), ("k2", "foo")],
            Some("d.k1_A.k2"),
        ),
        (
            format!(
                "- key: k1\n  descriptors:\n    - key: k2\n      value_to_metric: true\n      descriptors:\n        - key: k3\n          {rule}\n"
            ),
            vec![("k1", "X"), ("k2", "Y"), ("k3", "Z")],
            Some("d.k1.k2_Y.k3"),
        ),
        (
            format!(
                "- key: k1\n  value: X\n  descriptors:\n    - key: k2\n      detailed_metric: true\n      {rule}\n"
            ),
            vec![("k1", "X"), ("k2", "foo")],
            Some("d.k1_X.k2_foo"),
        ),
        (
            format!("- key: path\n  value: '/api/*'\n  detailed_metric: true\n  {rule}\n"),
            vec![("path", "/api/users")],
            Some("d.path_/api/users"),
        ),
        (
            format!("- key: path\n  value: '/api/*'\n  share_threshold: true\n  detailed_metric: true\n  {rule}\n"),
            vec![("path", "/api/users")],
            None,
        ),
        (format!("- key: k1\n  {rule}\n"), vec![("k1", "A")], None),
        // An unlimited rule keeps no statistics.
        ("- key: k1\n  detailed_metric: true\n  rate_limit: {unlimited: true}\n".to_string(), vec![("k1", "A")], None),
    ];
    for (descriptors, entries, expected) in cases {
        let yaml =
            format!("domain: d\ndescriptors:\n{}", descriptors.lines().map(|l| format!("  {l}\n")).collect::<String>());
        let policy =
            Policy::parse_envoy(&[SourceText::new("config/d.yaml", &yaml)]).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
        let hits = policy.hits("d", &[d(&entries)]);
        assert_eq!(hits.len(), 1, "{yaml}");
        assert_eq!(hits[0].limit.stats_key(&hits[0].values).as_deref(), expected, "{yaml}");
        // Converted, the limit is the same and says what it lost.
        let converted = policy.to_yaml();
        assert_eq!(converted.contains("# per-value statistics"), expected.is_some(), "{converted}");
        assert_eq!(Policy::parse(&converted, "converted.yaml").unwrap().limits()[0].id(), hits[0].limit.id());
    }
}

#[test]
fn example_7_replaces_takes_the_named_rule_out_when_both_apply() {
    let policy = config();
    let first = d(&[("key_1", "value_1"), ("user", "bkthomps")]);
    let second = d(&[("key_2", "value_2"), ("user", "bkthomps")]);
    assert_eq!(hits(&policy, "example7", std::slice::from_ref(&first)), [(5, 0, vec![])]);
    assert_eq!(hits(&policy, "example7", std::slice::from_ref(&second)), [(10, 0, vec![])]);
    assert_eq!(hits(&policy, "example7", &[first, second]), [(10, 1, vec![])], "the 5/s rule is replaced");
}

#[test]
fn example_9_wildcards_match_anywhere_and_count_per_value() {
    let policy = config();
    let one = |key: &str, value: &str| hits(&policy, "example9", &[d(&[(key, value)])]);
    assert_eq!(one("key1", "value1"), [(20, 0, values(&["value1"]))]);
    assert_eq!(one("key1", "valueXYZ"), [(20, 0, values(&["valueXYZ"]))]);
    assert!(one("key1", "other").is_empty());
    assert_eq!(one("path", "/api/123/action"), [(20, 0, values(&["/api/123/action"]))]);
    assert!(one("path", "/api/123/other").is_empty());
    assert_eq!(one("route", "/api/v1/resource/123/action").len(), 1);
    assert!(one("route", "/api/v1/resource/123/other").is_empty());
}

#[test]
fn example_11_share_threshold_is_one_counter_for_every_match() {
    let policy = config();
    let shared = hits(&policy, "example11", &[d(&[("files", "files/a.pdf")]), d(&[("files", "files/b.csv")])]);
    assert_eq!(shared, [(10, 0, vec![]), (10, 1, vec![])], "both on the one counter of the rule");
    let own = hits(&policy, "example11", &[d(&[("files_no_share", "files_no_share/a.pdf")])]);
    assert_eq!(own, [(10, 0, values(&["files_no_share/a.pdf"]))]);
    // A descriptor's own limit is keyed by its value, the shared rule's counter by the pattern
    // (envoy/ratelimit's `ShareThresholdKeyPattern`): not the same counter; without the pattern,
    // the rule's.
    let asked = LimitOverride { requests_per_unit: 3, unit: CalendarUnit::Hour };
    let on = |key: &str, value: &str| {
        let hit = policy.hits("example11", &[d(&[(key, value)]).with_limit(asked)]).remove(0);
        (hit.counter.set_by_request(), hit.values)
    };
    assert_eq!(on("files", "files/a.pdf"), (true, values(&["files", "files/a.pdf"])));
    assert_eq!(on("files_no_share", "files_no_share/a.pdf"), (false, values(&["files_no_share/a.pdf"])));
}

/// envoy/ratelimit chooses one node per level from the entry alone and does not go back: a
/// request that takes the node with the value and then finds nothing below it has no rule, even
/// if the node without a value would have had one.
#[test]
fn a_level_is_chosen_by_its_entry_alone_with_no_going_back() {
    let yaml = r#"
domain: walk
descriptors:
  - key: a
    value: x
    descriptors:
      - key: b
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: a
    value: y*
    descriptors:
      - key: c
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: a
    descriptors:
      - key: c
        rate_limit: {unit: minute, requests_per_unit: 3}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: ip
    value: 10.0.0.1
    rate_limit: {unlimited: true}
  - key: ip
    value: 10.0.0.2
"#;
    let policy = Policy::parse_envoy(&[SourceText::new("walk.yaml", yaml)]).unwrap();
    let one = |entries: &[(&str, &str)]| hits(&policy, "walk", &[d(entries)]);
    assert_eq!(one(&[("a", "x"), ("b", "1")]), [(1, 0, values(&["1"]))]);
    assert!(one(&[("a", "x"), ("c", "1")]).is_empty(), "a=x goes below `value: x`, where there is no c");
    assert_eq!(one(&[("a", "yes"), ("c", "1")]), [(2, 0, values(&["yes", "1"]))]);
    assert_eq!(one(&[("a", "z"), ("c", "1")]), [(3, 0, values(&["z", "1"]))]);
    // A more specific node stops the key alone whether it counts (unlimited) or has no rule.
    assert_eq!(one(&[("ip", "10.0.0.9")]), [(4, 0, values(&["10.0.0.9"]))]);
    assert!(one(&[("ip", "10.0.0.1")]).is_empty(), "unlimited");
    assert!(one(&[("ip", "10.0.0.2")]).is_empty(), "a node without a rule");
}

/// envoy/ratelimit looks a value up as written before it tries wildcards, so a wildcard's own
/// text reaches that wildcard's node even where an earlier wildcard matches it (found by the model
/// test below).
#[test]
fn a_wildcards_own_text_is_found_before_any_wildcard() {
    let yaml = r#"
domain: lit
descriptors:
  - key: a
    value: "x*"
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: a
    value: "x**"
    rate_limit: {unit: minute, requests_per_unit: 2}
"#;
    let policy = Policy::parse_envoy(&[SourceText::new("lit.yaml", yaml)]).unwrap();
    let one = |v: &str| hits(&policy, "lit", &[d(&[("a", v)])]);
    assert_eq!(one("x**"), [(2, 0, values(&["x**"]))], "the second node, by its own text");
    assert_eq!(one("xyz"), [(1, 0, values(&["xyz"]))], "the first wildcard that matches");
    assert_eq!(one("x*"), [(1, 0, values(&["x*"]))]);
    let back = Policy::parse(&policy.to_yaml(), "converted.yaml").unwrap();
    assert_eq!(hits(&back, "lit", &[d(&[("a", "x**")])]), one("x**"));
}

#[test]
fn units_are_clock_windows_in_utc_and_case_does_not_matter() {
    for (unit, calendar, seconds) in [
        ("second", CalendarUnit::Second, 1),
        ("Minute", CalendarUnit::Minute, 60),
        ("HOUR", CalendarUnit::Hour, 3600),
        ("day", CalendarUnit::Day, 86_400),
    ] {
        let yaml =
            format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {unit}, requests_per_unit: 7}}\n");
        let policy = Policy::parse_envoy(&[SourceText::new("u.yaml", yaml)]).unwrap();
        let limit = &policy.rules()[0];
        assert_eq!((limit.calendar().unwrap().unit(), limit.seconds(), limit.max_value()), (calendar, seconds, 7));
    }
}

#[test]
fn a_bad_directory_names_the_file_and_line() {
    let err = Format::Envoy.load(&fixtures("bad")).unwrap_err();
    let file = fixtures("bad").join("b_fortnight.yaml").display().to_string();
    assert_eq!(err.source_name, file);
    assert_eq!((err.position.line, err.position.column), (13, 13));
    assert_eq!(
        err.to_string(),
        format!("{file}:13:13: unknown unit `fortnight`: expected second, minute, hour, day, week, month or year")
    );
}

#[test]
fn what_has_no_equivalent_is_an_error_at_its_place() {
    let rule = |extra: &str| format!("domain: d\ndescriptors:\n  - key: k\n{extra}");
    let cases = [
        (rule("    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), "config/x.yaml:4:24: unknown unit `fortnight`: expected second, minute, hour, day, week, month or year"),
        (rule("    rate_limit: {unit: second, requests_per_unit: -1}\n"), "config/x.yaml:4:51: requests_per_unit must be from 0 to 4294967295 (a uint32), got -1"),
        (rule("    rate_limit: {requests_per_unit: 1}\n"), "config/x.yaml:4:17: this rate_limit has no `unit` (required)"),
        (rule("    rate_limit: {unit: second, requests_per_unit: 4294967296}\n"), "config/x.yaml:4:51: requests_per_unit must be from 0 to 4294967295 (a uint32), got 4294967296"),
        (rule("    rate_limit: {unlimited: true, unit: second}\n"), "config/x.yaml:4:41: `unit` with `unlimited: true`"),
        (rule("    rate_limit: {name: a, unit: second, requests_per_unit: 1, replaces: [{name: a}]}\n"), "config/x.yaml:4:74: the rule `a` replaces itself"),
        (rule("    metadata: [team, a]\n"), "config/x.yaml:4:15: `metadata` must be a mapping (names to values), got [\"team\",\"a\"]"),
        (rule("    share_threshold: true\n"), "config/x.yaml:4:22: `share_threshold: true` needs a wildcard value"),
        (rule("    colour: red\n"), "config/x.yaml:4:5: unknown field `colour`"),
        (rule("    rate_limit: {unit: second, requests_per_unit: 1, per: x}\n"), "config/x.yaml:4:54: unknown field `per`"),
        ("domain: d\ndescriptors:\n  - value: x\n".to_string(), "config/x.yaml:3:5: this descriptor has no `key` (required)"),
        ("domain: d\ndescriptors:\n  - key: ''\n".to_string(), "config/x.yaml:3:10: `key` is empty"),
        ("descriptors: []\n".to_string(), "config/x.yaml:1:1: this file has no `domain` (required)"),
        ("domain: ''\n".to_string(), "config/x.yaml:1:9: `domain` is empty"),
        ("# nothing\n".to_string(), "config/x.yaml:1:1: the file is empty"),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n".to_string(),
            "config/x.yaml:5:5: the same key and value as the descriptor at line 3",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: k\n        rate_limit: {unit: second, requests_per_unit: 1}\n".to_string(),
            "config/x.yaml:5:9: key `k` again on the path of the rule at line 5 (first at line 3)",
        ),
    ];
    let wrong: Vec<String> = cases
        .iter()
        .map(|(yaml, expected)| (yaml, expected, error(yaml)))
        .filter(|(_, expected, got)| !got.starts_with(*expected))
        .map(|(yaml, expected, got)| format!("{yaml}  got: {got}\n want: {expected}..."))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

/// A node's `metadata` is its rule's, whatever YAML it holds (envoy/ratelimit's
/// `test/config/metadata.yaml`), and `tollgate convert` keeps it.
#[test]
fn a_rules_metadata_is_read_as_written_and_converts() {
    let yaml = "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    metadata: {unused: true}\n    descriptors:\n      - key: subkey1\n        rate_limit: {unit: second, requests_per_unit: 5}\n        metadata:\n          name: service_1\n      - key: subkey1\n        value: subvalue1\n        rate_limit: {unit: second, requests_per_unit: 10}\n  - key: key2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n    metadata:\n      service_with_quota: {name: service_2, weights: [1, 2.5], on: yes, off: ~}\n";
    let policy = Policy::parse_envoy(&[SourceText::new("config/metadata.yaml", yaml)]).unwrap();
    let metadata: Vec<Option<String>> =
        policy.rules().iter().map(|l| l.metadata().map(|m| serde_json::Value::Object(m.clone()).to_string())).collect();
    assert_eq!(
        metadata,
        [
            Some(r#"{"name":"service_1"}"#.to_string()),
            None,
            Some(r#"{"service_with_quota":{"name":"service_2","off":null,"on":true,"weights":[1,2.5]}}"#.to_string()),
        ]
    );
    let back = Policy::parse(&policy.to_yaml(), "converted.yaml").unwrap();
    let again: Vec<_> = back.limits().iter().map(|l| l.metadata().cloned()).collect();
    assert_eq!(again, policy.rules().iter().map(|l| l.metadata().cloned()).collect::<Vec<_>>());
}

#[test]
fn a_domain_in_two_files_is_refused_and_an_empty_directory_is_an_error() {
    let one = SourceText::new("config/a.yaml", "domain: d\n");
    let two = SourceText::new("config/b.yaml", "# again\ndomain: d\n");
    let err = Policy::parse_envoy(&[one, two]).unwrap_err().to_string();
    assert!(err.starts_with("config/b.yaml:2:9: domain `d` is also in config/a.yaml:1: "), "{err}");

    let empty = std::env::temp_dir().join(format!("tollgate-envoy-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("notes.txt"), "not yaml").unwrap();
    let err = Format::Envoy.load(&empty).unwrap_err();
    assert_eq!(err.to_string(), format!("{}: no YAML files (*.yaml, *.yml) in this directory", empty.display()));
    let _ = std::fs::remove_dir_all(&empty);
    assert!(Format::Envoy.load(&fixtures("missing")).unwrap_err().to_string().contains("cannot read"));
    // One file is read as a directory of one.
    let one = Format::Envoy.load(&fixtures("config").join("messaging.yaml")).unwrap();
    assert_eq!(one.len(), 2);
}

/// A Kubernetes ConfigMap volume: each file a symbolic link to `..data/<file>`, `..data` a link
/// to a hidden timestamped directory. Each file is read once, through its link.
#[cfg(unix)]
#[test]
fn a_configmap_volume_reads_each_file_once() {
    use std::os::unix::fs::symlink;
    let volume = std::env::temp_dir().join(format!("tollgate-envoy-configmap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&volume);
    let version = volume.join("..2026_11_24_10_00_00.1");
    std::fs::create_dir_all(&version).unwrap();
    std::fs::copy(fixtures("config").join("messaging.yaml"), version.join("messaging.yaml")).unwrap();
    std::fs::copy(fixtures("config").join("internal.yaml"), version.join("internal.yaml")).unwrap();
    symlink("..2026_11_24_10_00_00.1", volume.join("..data")).unwrap();
    symlink("..data/messaging.yaml", volume.join("messaging.yaml")).unwrap();
    symlink("..data/internal.yaml", volume.join("internal.yaml")).unwrap();
    let sources = Format::Envoy.read(&volume).unwrap();
    let names: Vec<String> = sources.iter().map(|s| s.name.clone()).collect();
    let expected: Vec<String> =
        ["internal.yaml", "messaging.yaml"].iter().map(|f| volume.join(f).display().to_string()).collect();
    assert_eq!(names, expected);
    assert_eq!(Format::Envoy.parse(&sources).unwrap().len(), 4, "three rules and an unlimited one");
    let _ = std::fs::remove_dir_all(&volume);
}

#[test]
fn written_in_limitadors_format_the_limits_read_back_the_same() {
    let policy = config();
    let yaml = policy.to_yaml();
    let back = Policy::parse(&yaml, "converted.yaml").unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    assert_eq!(back.len(), policy.len());
    for (a, b) in policy.rules().iter().zip(back.limits()) {
        assert_eq!(a.id(), b.id(), "{yaml}");
        assert_eq!(
            (a.namespace(), a.max_value(), a.seconds(), a.name()),
            (b.namespace(), b.max_value(), b.seconds(), b.name())
        );
        assert_eq!((a.file_id(), a.enforcement(), a.replaces()), (b.file_id(), b.enforcement(), b.replaces()));
        assert_eq!((a.descriptor_keys(), a.calendar()), (b.descriptor_keys(), b.calendar()));
        assert_eq!(a.metadata(), b.metadata());
        let sources = |l: &tollgate_policy::Limit| {
            let c: Vec<String> = l.conditions().iter().map(|c| c.source().to_string()).collect();
            let v: Vec<String> = l.variables().iter().map(|v| v.source().to_string()).collect();
            (c, v)
        };
        assert_eq!(sources(a), sources(b));
    }
    // And they match the same requests the same way.
    let requests: [(&str, Vec<Descriptor>); 5] = [
        ("messaging", vec![d(&[("message_type", "marketing"), ("to_number", "1")]), d(&[("to_number", "1")])]),
        ("edge_proxy_per_ip", vec![d(&[("remote_address", "50.0.0.5")])]),
        (
            "example7",
            vec![d(&[("key_1", "value_1"), ("user", "bkthomps")]), d(&[("key_2", "value_2"), ("user", "bkthomps")])],
        ),
        ("example9", vec![d(&[("path", "/api/1/action")]), d(&[("key1", "value.x")])]),
        ("example11", vec![d(&[("files", "files/a")])]),
    ];
    for (domain, request) in &requests {
        assert_eq!(hits(&policy, domain, request), hits(&back, domain, request), "{domain}");
    }
    // Quotes and backslashes in keys and values survive both languages (YAML, then CEL).
    let odd = "domain: \"q'd\"\ndescriptors:\n  - key: \"we'ird\\\\key\"\n    value: \"a\\\"b'c*\"\n    rate_limit: {unit: second, requests_per_unit: 2}\n";
    let policy = Policy::parse_envoy(&[SourceText::new("odd.yaml", odd)]).unwrap();
    let back = Policy::parse(&policy.to_yaml(), "converted.yaml").unwrap();
    let request = [d(&[("we'ird\\key", "a\"b'c-and-more")])];
    assert_eq!(hits(&policy, "q'd", &request), [(2, 0, values(&["a\"b'c-and-more"]))]);
    assert_eq!(hits(&back, "q'd", &request), hits(&policy, "q'd", &request));
    assert_eq!(back.limits()[0].id(), policy.rules()[0].id());
}

/// A reference model of envoy/ratelimit's lookup (`GetLimit` in its `config_impl.go`): a tree of
/// generated rules, serialised as its YAML, must give for every generated request descriptor the
/// rule and counter values the model gives — loaded as envoy's format and after a round trip
/// through Limitador's.
mod against_a_model {
    use proptest::prelude::*;
    use tollgate_policy::{Descriptor, Policy, SourceText};

    #[derive(Clone, Debug)]
    struct Node {
        key: String,
        value: Option<String>,
        /// `Some(n)`: n per minute; `None`: no rule, or `unlimited` when the flag is set.
        rule: Option<u32>,
        unlimited: bool,
        children: Vec<Node>,
    }

    /// Keys `a`, `b` at the first level and `c`, `d` below (a key twice on a path is refused,
    /// tested elsewhere).
    fn node(keys: [&'static str; 2], children: impl Strategy<Value = Vec<Node>>) -> impl Strategy<Value = Node> {
        (
            prop::sample::select(keys.to_vec()),
            prop_oneof![Just(None), "[xy*]{1,3}".prop_map(Some)],
            prop_oneof![Just(None), (1u32..5).prop_map(Some)],
            any::<bool>(),
            children,
        )
            .prop_map(|(key, value, rule, unlimited, children)| Node {
                key: key.to_string(),
                value,
                unlimited: unlimited && rule.is_none(),
                rule,
                children: dedup(children),
            })
    }

    /// Siblings with the same key and value are an error (tested elsewhere): keep the first.
    fn dedup(nodes: Vec<Node>) -> Vec<Node> {
        let mut kept: Vec<Node> = Vec::new();
        for n in nodes {
            if !kept.iter().any(|k| k.key == n.key && k.value == n.value) {
                kept.push(n);
            }
        }
        kept
    }

    fn tree() -> impl Strategy<Value = Vec<Node>> {
        let leaf = node(["c", "d"], Just(Vec::new()));
        let middle = node(["a", "b"], prop::collection::vec(leaf, 0..4));
        prop::collection::vec(middle, 0..6).prop_map(dedup)
    }

    fn yaml(nodes: &[Node], indent: usize, out: &mut String) {
        let pad = " ".repeat(indent);
        for n in nodes {
            out.push_str(&format!("{pad}- key: {}\n", n.key));
            if let Some(v) = &n.value {
                out.push_str(&format!("{pad}  value: \"{v}\"\n"));
            }
            match (n.rule, n.unlimited) {
                (Some(r), _) => out.push_str(&format!("{pad}  rate_limit: {{unit: minute, requests_per_unit: {r}}}\n")),
                (None, true) => out.push_str(&format!("{pad}  rate_limit: {{unlimited: true}}\n")),
                (None, false) => {}
            }
            if !n.children.is_empty() {
                out.push_str(&format!("{pad}  descriptors:\n"));
                yaml(&n.children, indent + 4, out);
            }
        }
    }

    fn wildcard(pattern: &str, value: &str) -> bool {
        // Each `*` any run; checked by brute force over the pattern's parts.
        fn go(p: &[u8], v: &[u8]) -> bool {
            match p.split_first() {
                None => v.is_empty(),
                Some((b'*', rest)) => (0..=v.len()).any(|i| go(rest, &v[i..])),
                Some((c, rest)) => v.first() == Some(c) && go(rest, &v[1..]),
            }
        }
        go(pattern.as_bytes(), value.as_bytes())
    }

    /// envoy/ratelimit's walk: (requests_per_unit, counter values) of the rule that applies.
    fn model(tree: &[Node], entries: &[(String, String)]) -> Option<(u64, Vec<String>)> {
        let mut level = tree;
        let mut values = Vec::new();
        for (i, (k, v)) in entries.iter().enumerate() {
            let exact = level.iter().find(|n| n.key == *k && n.value.as_deref() == Some(v.as_str()));
            let wild = || {
                level
                    .iter()
                    .find(|n| n.key == *k && n.value.as_ref().is_some_and(|p| p.contains('*') && wildcard(p, v)))
            };
            let any = || level.iter().find(|n| n.key == *k && n.value.is_none());
            let node = exact.or_else(wild).or_else(any)?;
            if node.value.as_ref().is_none_or(|p| p.contains('*')) {
                values.push(v.clone());
            }
            if i == entries.len() - 1 {
                return node.rule.map(|r| (u64::from(r), values));
            }
            if node.children.is_empty() {
                return None;
            }
            level = &node.children;
        }
        None
    }

    fn hits(policy: &Policy, entries: &[(String, String)]) -> Vec<(u64, Vec<String>)> {
        let request = [entries.iter().cloned().collect::<Descriptor>()];
        let counted = policy.hits("d", &request).into_iter().filter(|h| !h.limit.unlimited());
        counted.map(|h| (h.limit.max_value(), h.values)).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

        #[test]
        fn every_request_finds_the_rule_envoy_ratelimit_finds(
            tree in tree(),
            requests in prop::collection::vec(
                (
                    (prop::sample::select(vec!["a", "b", "c"]), "[xy*]{1,3}"),
                    prop::option::of((prop::sample::select(vec!["c", "d", "a"]), "[xy*]{1,3}")),
                    prop::option::of((prop::sample::select(vec!["c", "d"]), "[xy]{1,2}")),
                ),
                1..12,
            ),
        ) {
            let mut text = String::from("domain: d\ndescriptors:\n");
            yaml(&tree, 2, &mut text);
            let policy = Policy::parse_envoy(&[SourceText::new("model.yaml", text.as_str())]);
            let policy = policy.unwrap_or_else(|e| panic!("{e}\n{text}"));
            let back = Policy::parse(&policy.to_yaml(), "converted.yaml").unwrap();
            for (first, second, third) in requests {
                let entries: Vec<(String, String)> =
                    [Some(first), second, third].into_iter().flatten().map(|(k, v)| (k.to_string(), v)).collect();
                let want: Vec<_> = model(&tree, &entries).into_iter().collect();
                prop_assert_eq!(&hits(&policy, &entries), &want, "{:?}\n{}", entries, text);
                prop_assert_eq!(&hits(&back, &entries), &want, "round trip {:?}", entries);
            }
        }
    }
}

/// A descriptor's own limit (envoy/ratelimit's `GetLimit`): counted against its domain's limit of
/// that unit instead of any rule, one counter per entries; the other descriptors as before; not
/// in Limitador's format, which has no such limits; and not among the rules a policy writes.
#[test]
fn a_descriptors_own_limit_takes_the_place_of_the_rules() {
    let policy = config();
    let own = |unit| LimitOverride { requests_per_unit: 7, unit };
    let users = || d(&[("database", "users")]);
    let request = [users().with_limit(own(CalendarUnit::Hour)), users()];
    let found = policy.hits("mongo_cps", &request);
    let counted: Vec<_> = found.iter().map(|h| (h.limit.set_by_request(), h.max_value, h.descriptor)).collect();
    assert_eq!(counted, [(false, 500, 1), (true, 7, 0)], "the rule counts the second descriptor only");
    let own_hit = &found[1];
    assert_eq!(own_hit.values, values(&["database", "users"]));
    assert_eq!(own_hit.limit.calendar().map(|c| c.unit()), Some(CalendarUnit::Hour));
    assert_eq!(own_hit.limit.name(), None);
    assert_eq!((own_hit.counter.id(), own_hit.counter_index), (own_hit.limit.id(), own_hit.index), "its own counter");
    // In the unit of the rule it matches, it counts on the rule's counter (envoy/ratelimit's key
    // is the descriptor's), against its own limit.
    let per_second = policy.hits("mongo_cps", &[users().with_limit(own(CalendarUnit::Second))]).remove(0);
    let rule = &found[0];
    assert!(per_second.limit.set_by_request() && rule.counter.shared_with_own_limits());
    assert_eq!((per_second.counter_index, &per_second.values, per_second.max_value), (rule.index, &rule.values, 7));
    // Each unit is a limit of its own; an unknown domain has none.
    let day = [users().with_limit(own(CalendarUnit::EpochMonth))];
    assert_ne!(policy.hits("mongo_cps", &day)[0].limit.id(), own_hit.limit.id());
    assert!(policy.hits("nowhere", &day).is_empty());
    // Not a rule: not written back, not counted by len().
    assert!(policy.rules().iter().all(|l| !l.set_by_request()));
    assert!(policy.limits().len() > policy.len());
    let back = Policy::parse(&policy.to_yaml(), "back.yaml").unwrap();
    assert_eq!(back.len(), policy.len());
    // Limitador's format reads no descriptor's own limit: the limits file decides.
    let limitador =
        Policy::parse("- {namespace: a, max_value: 1, seconds: 60, variables: ['descriptors[0].k']}", "l.yaml")
            .unwrap();
    let asked = [d(&[("k", "v")]).with_limit(own(CalendarUnit::Second))];
    let only = limitador.hits("a", &asked);
    assert_eq!((only.len(), only[0].max_value, only[0].limit.set_by_request()), (1, 1, false));
}
