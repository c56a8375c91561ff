//! Parsing never panics, whatever the input: arbitrary bytes, YAML-shaped text (Limitador's and
//! envoy/ratelimit's formats), and expressions.

use proptest::prelude::*;
use tollgate_policy::{Condition, Descriptor, Policy, SourceText, Variable};

fn field() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("namespace: a".to_string()),
        Just("max_value: 3".to_string()),
        Just("seconds: 1".to_string()),
        "max_value: -?[0-9]{0,21}",
        "seconds: [0-9a-z.]{0,6}",
        "conditions: \\[\"[ -~]{0,30}\"\\]",
        "variables: \\[[ -~]{0,20}\\]",
        "algorithm: [a-z_]{0,15}",
        "[a-z_]{1,8}: [ -~]{0,10}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text(text in "\\PC{0,200}") {
        let _ = Policy::parse(&text, "fuzz");
    }

    #[test]
    fn arbitrary_envoy_text(text in "\\PC{0,200}") {
        let _ = Policy::parse_envoy(&[SourceText::new("fuzz", text)]);
    }

    #[test]
    fn envoy_shaped(
        lines in prop::collection::vec(
            prop_oneof![
                Just("domain: d".to_string()),
                Just("descriptors:".to_string()),
                "  - key: [a-z*]{0,3}",
                "    value: [ -~]{0,6}",
                "    rate_limit: \\{unit: [a-z]{0,7}, requests_per_unit: -?[0-9]{0,11}\\}",
                "    rate_limit: \\{unlimited: (true|false)\\}",
                "    (shadow_mode|share_threshold|quota_mode): (true|false)",
                "    descriptors:",
                "      - key: [a-z]{1,2}",
                "        value: [a-z*]{0,4}",
                "        rate_limit: \\{unit: minute, requests_per_unit: [0-9]{1,3}\\}",
            ],
            0..12,
        )
    ) {
        let text = lines.join("\n");
        if let Ok(policy) = Policy::parse_envoy(&[SourceText::new("fuzz", text.as_str())]) {
            let request = [Descriptor::from([("a", "x")]), Descriptor::from([("a", "x"), ("b", "y*")])];
            let _ = policy.hits("d", &request);
            Policy::parse(&policy.to_yaml(), "converted").unwrap();
        }
    }

    #[test]
    fn yaml_shaped(entries in prop::collection::vec(prop::collection::vec(field(), 0..6), 0..4)) {
        let mut text = String::new();
        for fields in entries {
            for (i, f) in fields.iter().enumerate() {
                text.push_str(if i == 0 { "- " } else { "  " });
                text.push_str(f);
                text.push('\n');
            }
        }
        if let Ok(policy) = Policy::parse(&text, "fuzz") {
            let request = [Descriptor::from([("req.method", "POST"), ("a", "1")])];
            for ns in policy.namespaces().map(str::to_string).collect::<Vec<_>>() {
                let _ = policy.hits(&ns, &request);
            }
        }
    }

    #[test]
    fn expressions(source in "[ -~]{0,60}", key in "[a-z.]{1,8}", value in "[ -~]{0,8}") {
        let request = [Descriptor::from([(key.as_str(), value.as_str())]), Descriptor::default()];
        if let Ok(policy) = Policy::parse(
            &format!("- {{namespace: n, max_value: 1, seconds: 1, conditions: [{:?}]}}", source),
            "fuzz",
        ) {
            let _ = policy.hits("n", &request);
        }
        let _ = Condition::parse(&source);
        let _ = Variable::parse(&source);
    }
}
