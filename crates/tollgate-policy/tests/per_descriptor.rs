//! Ours, optional: `descriptor_keys` (a limit matched against each descriptor of a request on its
//! own, by its exact keys in order, as envoy/ratelimit matches) and `replaces` (a limit that,
//! when it applies, takes named limits out of the request, as envoy/ratelimit's `replaces`).

use tollgate_policy::{Descriptor, Policy};

fn error(yaml: &str) -> String {
    Policy::parse(yaml, "limits.yaml").unwrap_err().to_string()
}

/// (limit name, descriptor index, values) of each counter a request touches.
fn hits(policy: &Policy, request: &[Descriptor]) -> Vec<(String, usize, Vec<String>)> {
    policy
        .hits("sms", request)
        .into_iter()
        .map(|h| (h.limit.name().unwrap_or("-").to_string(), h.descriptor, h.values))
        .collect()
}

const PER_NUMBER: &str = r#"
- namespace: sms
  name: marketing
  max_value: 5
  seconds: 86400
  descriptor_keys: [message_type, to_number]
  conditions: ["descriptors[0]['message_type'] == 'marketing'"]
  variables: ["descriptors[0]['to_number']"]
- namespace: sms
  name: any
  max_value: 100
  seconds: 86400
  descriptor_keys: [to_number]
  variables: ["descriptors[0]['to_number']"]
"#;

#[test]
fn each_descriptor_is_matched_on_its_own_by_its_exact_keys() {
    let policy = Policy::parse(PER_NUMBER, "limits.yaml").unwrap();
    let d = |entries: &[(&str, &str)]| entries.iter().copied().collect::<Descriptor>();
    let request = [
        d(&[("message_type", "marketing"), ("to_number", "2061111111")]),
        d(&[("to_number", "2061111111")]),
        d(&[("to_number", "2062222222")]),
    ];
    assert_eq!(
        hits(&policy, &request),
        [
            ("marketing".to_string(), 0, vec!["2061111111".to_string()]),
            ("any".to_string(), 1, vec!["2061111111".to_string()]),
            ("any".to_string(), 2, vec!["2062222222".to_string()]),
        ]
    );
    // Other keys, another order, one key more or less: not these limits.
    for other in [
        d(&[("to_number", "1"), ("message_type", "marketing")]),
        d(&[("message_type", "marketing")]),
        d(&[("to_number", "1"), ("extra", "x")]),
        d(&[("message_type", "marketing"), ("to_number", "1"), ("extra", "x")]),
    ] {
        assert!(hits(&policy, std::slice::from_ref(&other)).is_empty(), "{other:?}");
    }
    // Conditions read the descriptor being matched, not the request's first one.
    let transactional = [d(&[("to_number", "3")]), d(&[("message_type", "transactional"), ("to_number", "3")])];
    assert_eq!(hits(&policy, &transactional), [("any".to_string(), 0, vec!["3".to_string()])]);
    // The same descriptor twice counts twice, as two hits on one counter.
    let twice = [d(&[("to_number", "4")]), d(&[("to_number", "4")])];
    assert_eq!(hits(&policy, &twice).len(), 2);
}

#[test]
fn descriptor_keys_are_part_of_a_limits_identity() {
    let one = Policy::parse("- {namespace: sms, max_value: 1, seconds: 1, descriptor_keys: [a]}", "x").unwrap();
    let two = Policy::parse("- {namespace: sms, max_value: 1, seconds: 1, descriptor_keys: [b]}", "x").unwrap();
    let none = Policy::parse("- {namespace: sms, max_value: 1, seconds: 1}", "x").unwrap();
    let (one, two, none) = (&one.limits()[0], &two.limits()[0], &none.limits()[0]);
    assert_ne!(one.id(), two.id());
    assert_ne!(one.id(), none.id());
    assert_eq!(one.descriptor_keys(), Some(&["a".to_string()][..]));
    assert_eq!(none.descriptor_keys(), None);
    // Same keys and nothing else different: the second is a duplicate.
    let dup = "- {namespace: sms, max_value: 1, seconds: 1, descriptor_keys: [a]}\n\
               - {namespace: sms, max_value: 2, seconds: 1, descriptor_keys: [a]}\n";
    assert!(error(dup).starts_with("limits.yaml:2:3: duplicate limit"), "{}", error(dup));
}

#[test]
fn bad_descriptor_keys_name_the_place() {
    assert_eq!(
        error("- {namespace: a, max_value: 1, seconds: 1, descriptor_keys: []}"),
        "limits.yaml:1:61: descriptor_keys is empty: name the keys of the descriptors it matches"
    );
    assert_eq!(
        error("- {namespace: a, max_value: 1, seconds: 1, descriptor_keys: [k, '']}"),
        "limits.yaml:1:65: an empty key in descriptor_keys"
    );
    assert_eq!(
        error("- {namespace: a, max_value: 1, seconds: 1, descriptor_keys: [k, j, k]}"),
        "limits.yaml:1:68: `k` twice in descriptor_keys: a limit reads an entry by its key"
    );
}

/// envoy/ratelimit's README, example 7: the second rule replaces the first when both apply.
const REPLACES: &str = r#"
- namespace: sms
  name: specific_limit
  max_value: 5
  seconds: 1
  descriptor_keys: [key_1, user]
  conditions: ["descriptors[0]['key_1'] == 'value_1'", "descriptors[0]['user'] == 'bkthomps'"]
- namespace: sms
  name: wider
  max_value: 10
  seconds: 1
  descriptor_keys: [key_2, user]
  conditions: ["descriptors[0]['key_2'] == 'value_2'", "descriptors[0]['user'] == 'bkthomps'"]
  replaces: [specific_limit]
"#;

#[test]
fn a_limit_that_applies_takes_the_limits_it_replaces_out() {
    let policy = Policy::parse(REPLACES, "limits.yaml").unwrap();
    let first = Descriptor::from([("key_1", "value_1"), ("user", "bkthomps")]);
    let second = Descriptor::from([("key_2", "value_2"), ("user", "bkthomps")]);
    let names = |request: &[Descriptor]| hits(&policy, request).into_iter().map(|h| h.0).collect::<Vec<_>>();
    assert_eq!(names(std::slice::from_ref(&first)), ["specific_limit"]);
    assert_eq!(names(std::slice::from_ref(&second)), ["wider"]);
    assert_eq!(names(&[first, second]), ["wider"], "both apply: the replaced one does not count");
    assert_eq!(policy.limits()[1].replaces(), ["specific_limit"]);
    assert_eq!(
        error("- {namespace: a, name: x, max_value: 1, seconds: 1, replaces: [x]}"),
        "limits.yaml:1:64: the limit `x` replaces itself"
    );
    assert_eq!(
        error("- {namespace: a, max_value: 1, seconds: 1, replaces: ['']}"),
        "limits.yaml:1:55: an empty name in `replaces`"
    );
}

#[test]
fn limits_know_their_file() {
    let policy = Policy::parse("- {namespace: a, max_value: 1, seconds: 1}", "dir/limits.yaml").unwrap();
    assert_eq!(policy.limits()[0].source_name(), "dir/limits.yaml");
}
