//! Any text as a condition and as a variable, evaluated against requests built from the input:
//! never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_policy::{Descriptor, Policy};

fuzz_target!(|data: (String, String, Vec<(String, String)>)| {
    let (condition, variable, entries) = data;
    let yaml =
        format!("- {{namespace: n, max_value: 1, seconds: 1, conditions: [{condition:?}], variables: [{variable:?}]}}");
    if let Ok(policy) = Policy::parse(&yaml, "fuzz.yaml") {
        let request = [entries.into_iter().collect::<Descriptor>(), Descriptor::default()];
        let _ = policy.hits("n", &request);
    }
});
