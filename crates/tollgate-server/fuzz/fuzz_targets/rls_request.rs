//! Any bytes as the protobuf of Envoy's `RateLimitRequest`, decoded as tonic decodes a gRPC
//! message (prost) and, when it decodes, answered by the real RLS service on a real engine; and
//! requests built from the input with the names the limits use and edge values, encoded and
//! decoded the same way.
//!
//! The first byte picks the engine (bit 0: accuracy, or throughput in shadow mode), raw or built
//! message (bit 1) and how far the clock moves first (bits 4-7); the rest is the message, as it
//! arrives after gRPC's framing.
//!
//! For every input: no panic; the answer is OK or OVER_LIMIT with one status per descriptor (one
//! for none), each OK or OVER_LIMIT, an OVER_LIMIT overall answer naming at least one limited
//! descriptor and an OK one none, valid durations; it encodes and decodes back unchanged; or it
//! is a gRPC error: INVALID_ARGUMENT (an empty domain, and only then) or UNAVAILABLE.
#![no_main]

mod common;

use std::sync::LazyLock;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tollgate::ManualClock;
use tollgate_server::serve::Action;
use tollgate_server::serve::rls::Rls;

struct State {
    engines: common::Engines,
    services: [Rls<ManualClock>; 2],
    runtime: tokio::runtime::Runtime,
}

static STATE: LazyLock<State> = LazyLock::new(|| {
    let engines = common::Engines::new();
    let services = engines.engines.clone().map(|(engine, metrics)| Rls::new(engine, metrics));
    State { engines, services, runtime: common::runtime() }
});

fn pick<'a>(u: &mut Unstructured<'a>, choices: &[&'a str]) -> Result<String> {
    // Mostly names the limits use, sometimes anything.
    if u.ratio(1, 4)? { u.arbitrary() } else { Ok(u.choose(choices)?.to_string()) }
}

/// A request as Envoy would send it, with the limits' names and edge values.
fn build(u: &mut Unstructured<'_>) -> Result<RateLimitRequest> {
    let domain = pick(u, &["api", "other", "", "unknown"])?;
    let mut descriptors = Vec::new();
    for _ in 0..u.int_in_range(0..=3)? {
        let mut entries = Vec::new();
        for _ in 0..u.int_in_range(0..=3)? {
            let key = pick(u, &["req.method", "user", "tenant", ""])?;
            let value = pick(u, &["GET", "POST", "alice", "bob", ""])?;
            entries.push(Entry { key, value });
        }
        descriptors.push(RateLimitDescriptor { entries, ..Default::default() });
    }
    let hits_addend = if u.ratio(1, 2)? { *u.choose(&[0, 1, 2, 3, 7, 10, u32::MAX])? } else { u.arbitrary()? };
    Ok(RateLimitRequest { domain, descriptors, hits_addend })
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else { return };
    let message = if first & 2 != 0 {
        let Ok(request) = build(&mut Unstructured::new(rest)) else { return };
        request.encode_to_vec()
    } else {
        rest.to_vec()
    };
    let Ok(request) = RateLimitRequest::decode(message.as_slice()) else { return };
    let state = &*STATE;
    let shadow = usize::from(first & 1);
    state.engines.clock.advance(Duration::from_millis(u64::from(first >> 4) * 250));
    let descriptors = request.descriptors.len();
    let empty_domain = request.domain.is_empty();
    let metadata = axum::http::HeaderMap::new();
    let answer = state.runtime.block_on(state.services[shadow].answer(request, Action::CheckAndReport, &metadata));

    let response = match answer {
        Err(status) => {
            assert!(
                matches!(status.code(), tonic::Code::InvalidArgument | tonic::Code::Unavailable),
                "a gRPC error that is neither INVALID_ARGUMENT nor UNAVAILABLE: {status:?}"
            );
            assert_eq!(status.code() == tonic::Code::InvalidArgument, empty_domain, "{status:?}");
            assert!(!status.message().is_empty(), "an error that does not say why: {status:?}");
            return;
        }
        Ok(response) => response,
    };
    assert!(!empty_domain, "an empty domain was answered: {response:?}");
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert!([ok, over].contains(&response.overall_code), "{response:?}");
    assert_eq!(response.statuses.len(), descriptors.max(1), "one status per descriptor: {response:?}");
    assert!(response.statuses.iter().all(|s| [ok, over].contains(&s.code)), "{response:?}");
    let limited = response.statuses.iter().any(|s| s.code == over);
    assert_eq!(limited, response.overall_code == over, "overall code and statuses disagree: {response:?}");
    if shadow == 1 {
        assert_eq!(response.overall_code, ok, "shadow mode allows everything: {response:?}");
    }
    for status in &response.statuses {
        if let Some(d) = &status.duration_until_reset {
            assert!(d.seconds >= 0 && (0..1_000_000_000).contains(&d.nanos), "{response:?}");
        }
        if let Some(limit) = &status.current_limit {
            assert!(limit.requests_per_unit >= 1, "{response:?}");
        }
    }
    let bytes = response.encode_to_vec();
    assert_eq!(RateLimitResponse::decode(bytes.as_slice()).as_ref(), Ok(&response), "the answer round-trips");
});
