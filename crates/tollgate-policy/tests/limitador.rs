//! Limitador's own limits files, in its documented format, load unchanged and mean what they
//! mean there.

use tollgate_policy::{Descriptor, Policy};

/// limitador-server/examples/limits.yaml (v2, CEL): empty `conditions:`/`variables:` values.
const EXAMPLES_V2: &str = r#"---
- namespace: test_namespace
  max_value: 1000000
  seconds: 60
  conditions:
  variables:
- namespace: test_namespace
  max_value: 5
  seconds: 60
  conditions:
    - "descriptors[0]['req.method'] == 'POST'"
  variables:
    - descriptors[0]['user_id']
"#;

/// limitador-server/sandbox/limits.yaml (v2).
const SANDBOX: &str = r#"---
- namespace: test_namespace
  max_value: 10
  seconds: 60
  conditions:
    - "descriptors[0]['req.method'] == 'GET'"
    - "descriptors[0]['req.path'] != '/json'"
  variables: []
- namespace: test_namespace
  max_value: 5
  seconds: 60
  conditions:
    - "descriptors[0]['req.method'] == 'POST'"
    - "descriptors[0]['req.path'] != '/json'"
  variables: []
- namespace: test_namespace
  max_value: 50000
  seconds: 10
  conditions:
    - "descriptors[0]['req.method'] == 'GET'"
    - "descriptors[0]['req.path'] == '/json'"
  variables: []
"#;

/// doc/server/configuration.md (v2, dotted access).
const DOCS: &str = r#"
- namespace: example.org
  max_value: 10
  seconds: 60
  conditions:
    - "descriptors[0].req_method == 'GET'"
  variables:
    - descriptors[0].user_id
"#;

/// limitador-server/examples/limits.yaml at server-v1.6.0 (the simple syntax, `-` on its own line).
const EXAMPLES_V1: &str = r#"---
-
  namespace: test_namespace
  max_value: 1000000
  seconds: 60
  conditions:
  variables:
-
  namespace: test_namespace
  max_value: 5
  seconds: 60
  conditions:
    - "req.method == 'POST'"
  variables:
    - user_id
"#;

/// With an `id` and `name`, as Limitador's Limit accepts.
const WITH_ID: &str = r#"
- id: my-limit
  name: per app
  namespace: ns
  max_value: 3
  seconds: 1
  conditions: []
  variables: ["descriptors[0].app_id"]
"#;

fn counted(policy: &Policy, namespace: &str, entries: &[(&str, &str)]) -> Vec<(u64, Vec<String>)> {
    let request = [entries.iter().copied().collect::<Descriptor>()];
    policy.hits(namespace, &request).into_iter().map(|h| (h.limit.max_value(), h.values)).collect()
}

#[test]
fn v1_and_v2_examples_mean_the_same() {
    for (yaml, name) in [(EXAMPLES_V2, "v2"), (EXAMPLES_V1, "v1")] {
        let policy = Policy::parse(yaml, name).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(policy.len(), 2);
        let post = counted(&policy, "test_namespace", &[("req.method", "POST"), ("user_id", "u1")]);
        assert_eq!(post, [(1_000_000, vec![]), (5, vec!["u1".to_string()])], "{name}");
        let get = counted(&policy, "test_namespace", &[("req.method", "GET"), ("user_id", "u1")]);
        assert_eq!(get, [(1_000_000, vec![])], "{name}");
        let anonymous = counted(&policy, "test_namespace", &[("req.method", "POST")]);
        assert_eq!(anonymous, [(1_000_000, vec![])], "{name}: without user_id the per-user limit does not apply");
    }
}

#[test]
fn sandbox_conditions() {
    let policy = Policy::parse(SANDBOX, "sandbox").unwrap();
    let max = |entries: &[(&str, &str)]| -> Vec<u64> {
        counted(&policy, "test_namespace", entries).into_iter().map(|(m, _)| m).collect()
    };
    assert_eq!(max(&[("req.method", "GET"), ("req.path", "/")]), [10]);
    assert_eq!(max(&[("req.method", "POST"), ("req.path", "/")]), [5]);
    assert_eq!(max(&[("req.method", "GET"), ("req.path", "/json")]), [50000]);
    assert_eq!(max(&[("req.method", "GET")]), Vec::<u64>::new(), "a missing key fails != too");
}

#[test]
fn docs_and_ids() {
    let policy = Policy::parse(DOCS, "docs").unwrap();
    assert_eq!(counted(&policy, "example.org", &[("req_method", "GET"), ("user_id", "7")]), [(10, vec!["7".into()])]);
    let policy = Policy::parse(WITH_ID, "ids").unwrap();
    let limit = &policy.limits()[0];
    assert_eq!((limit.file_id(), limit.name()), (Some("my-limit"), Some("per app")));
}

#[test]
fn identity_ignores_max_value_and_name() {
    let a = Policy::parse(EXAMPLES_V2, "a").unwrap();
    let b = Policy::parse(&EXAMPLES_V2.replace("max_value: 5", "max_value: 7"), "b").unwrap();
    assert_eq!(a.limits()[1].id(), b.limits()[1].id(), "same counters when only max_value changes");
    let c = Policy::parse(
        &EXAMPLES_V2.replace("seconds: 60\n  conditions:\n    -", "seconds: 30\n  conditions:\n    -"),
        "c",
    )
    .unwrap();
    assert_ne!(a.limits()[1].id(), c.limits()[1].id());
}

#[test]
fn every_algorithm_name_reads_as_its_own_algorithm() {
    use tollgate_policy::AlgorithmKind;
    for (name, kind) in [
        ("fixed_window", AlgorithmKind::FixedWindow),
        ("token_bucket", AlgorithmKind::TokenBucket),
        ("sliding_window", AlgorithmKind::SlidingWindow),
        ("weighted_window", AlgorithmKind::WeightedWindow),
    ] {
        let yaml = format!("- namespace: a\n  max_value: 10\n  seconds: 60\n  algorithm: {name}\n");
        let policy = Policy::parse(&yaml, "limits.yaml").unwrap();
        assert_eq!(policy.limits()[0].algorithm(), kind, "{name}");
        assert_eq!(kind.name(), name);
    }
    // Two limits that differ only by algorithm count separately.
    let both = "- {namespace: a, max_value: 10, seconds: 60, algorithm: sliding_window}\n\
                - {namespace: a, max_value: 10, seconds: 60, algorithm: weighted_window}\n";
    let policy = Policy::parse(both, "limits.yaml").unwrap();
    assert_ne!(policy.limits()[0].id(), policy.limits()[1].id());
}
