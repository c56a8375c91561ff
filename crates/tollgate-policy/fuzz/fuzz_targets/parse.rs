//! Any bytes as a limits file: parsing either succeeds or returns an error, never panics; a
//! policy that parses can match requests.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_policy::{Descriptor, Policy};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(policy) = Policy::parse(text, "fuzz.yaml") {
        let request = [Descriptor::from([("req.method", "POST"), ("user_id", "u")])];
        let namespaces: Vec<String> = policy.namespaces().map(str::to_string).collect();
        for namespace in namespaces {
            let _ = policy.hits(&namespace, &request);
        }
    }
});
