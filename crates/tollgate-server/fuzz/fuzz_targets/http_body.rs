//! Any bytes as the body of `POST /check`, `/report` and `/check_and_report`, through the real
//! router on a real engine; and well-formed bodies built from the input, with edge values (deltas
//! near `u64::MAX`, empty and odd strings, every `response_headers`).
//!
//! The first byte picks the route (bits 0-1), raw or built body (bit 2), the engine (bit 3:
//! accuracy, or throughput in shadow mode) and how far the clock moves first (bits 4-7).
//!
//! For every input: no panic; the status is 200, 429, 400 or 503; a 400 says what is wrong, and
//! a built body is never a 400 unless its `response_headers` is not one the API knows; 200 and
//! 429 answer `null` as JSON; `/report`, shadow mode, an unknown namespace and a delta of 0 are
//! never 429; RateLimit headers, when asked for, are numbers where numbers belong.
#![no_main]

mod common;

use std::sync::LazyLock;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

struct State {
    engines: common::Engines,
    routers: [Router; 2],
    runtime: tokio::runtime::Runtime,
}

static STATE: LazyLock<State> = LazyLock::new(|| {
    let engines = common::Engines::new();
    let routers =
        engines.engines.clone().map(|(engine, metrics)| tollgate_server::serve::http::router(engine, metrics));
    State { engines, routers, runtime: common::runtime() }
});

const ROUTES: [&str; 4] = ["/check", "/report", "/check_and_report", "/check_and_report"];
const HEADERS: [&str; 7] = ["DraftVersion03", "draft03", "draft10", "DraftVersion10", "", "none", "None"];

/// A well-formed body, and whether its `response_headers` is one the API knows.
struct Built {
    json: serde_json::Value,
    known_headers: bool,
    known_namespace: bool,
    headers_asked: bool,
    delta: u64,
}

fn pick<'a>(u: &mut Unstructured<'a>, choices: &[&'a str]) -> Result<String> {
    // Mostly names the limits use, sometimes anything.
    if u.ratio(1, 4)? { u.arbitrary() } else { Ok(u.choose(choices)?.to_string()) }
}

fn build(u: &mut Unstructured<'_>) -> Result<Built> {
    let namespace = pick(u, &["api", "other", "", "unknown"])?;
    let mut values = serde_json::Map::new();
    for _ in 0..u.int_in_range(0..=4)? {
        let key = pick(u, &["req.method", "user", "tenant", "descriptors[0].user", ""])?;
        let value = pick(u, &["GET", "POST", "alice", "bob", "", "\u{0}\n\"'"])?;
        values.insert(key, value.into());
    }
    let delta: u64 = if u.ratio(1, 2)? {
        *u.choose(&[0, 1, 2, 3, 7, 10, u32::MAX as u64, 5_000_000_000, 1 << 63, u64::MAX - 1, u64::MAX])?
    } else {
        u.arbitrary()?
    };
    let mut json = serde_json::json!({ "namespace": namespace, "delta": delta });
    if !values.is_empty() || u.arbitrary()? {
        json["values"] = values.into();
    }
    let (mut known_headers, mut headers_asked) = (true, false);
    match u.int_in_range(0..=3)? {
        0 => {}
        1 => json["response_headers"] = serde_json::Value::Null,
        2 => {
            let headers: String = u.arbitrary()?;
            known_headers = HEADERS.contains(&headers.as_str());
            headers_asked = known_headers && !matches!(headers.as_str(), "" | "none" | "None");
            json["response_headers"] = headers.into();
        }
        _ => {
            let headers = *u.choose(&HEADERS)?;
            headers_asked = !matches!(headers, "" | "none" | "None");
            json["response_headers"] = headers.into();
        }
    }
    Ok(Built {
        json,
        known_headers,
        known_namespace: ["api", "other"].contains(&namespace.as_str()),
        headers_asked,
        delta,
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else { return };
    let state = &*STATE;
    let route = ROUTES[usize::from(first & 3)];
    let built = first & 4 != 0;
    let shadow = usize::from(first >> 3 & 1);
    state.engines.clock.advance(Duration::from_millis(u64::from(first >> 4) * 250));

    let (body, expect) = if built {
        let Ok(b) = build(&mut Unstructured::new(rest)) else { return };
        (serde_json::to_vec(&b.json).expect("a JSON value serializes"), Some(b))
    } else {
        (rest.to_vec(), None)
    };
    let request = Request::post(route)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("a valid request");
    let router = state.routers[shadow].clone();
    let (parts, text) = state.runtime.block_on(async move {
        let response = router.oneshot(request).await.expect("the router is infallible");
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.expect("a full body").to_bytes();
        (parts, String::from_utf8(bytes.to_vec()).expect("the answer is UTF-8"))
    });

    let status = parts.status;
    assert!(
        [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS, StatusCode::BAD_REQUEST, StatusCode::SERVICE_UNAVAILABLE]
            .contains(&status),
        "{route}: status {status}: {text}"
    );
    if status == StatusCode::BAD_REQUEST {
        let reason = text
            .strip_prefix("invalid request body: ")
            .or_else(|| text.strip_prefix("invalid response_headers `"))
            .unwrap_or_else(|| panic!("{route}: a 400 that does not say what is wrong: {text:?}"));
        assert!(!reason.trim().is_empty(), "{route}: a 400 without a reason: {text:?}");
        if let Some(b) = &expect {
            assert!(!b.known_headers, "{route}: a well-formed body {} is a 400: {text}", b.json);
            assert!(text.starts_with("invalid response_headers `"), "{route}: {}: {text}", b.json);
        }
        return;
    }
    if status == StatusCode::SERVICE_UNAVAILABLE {
        panic!("{route}: 503 with in-memory counters: {text}");
    }
    assert_eq!(text, "null", "{route}: {status}");
    assert_eq!(parts.headers[header::CONTENT_TYPE], "application/json");
    if status == StatusCode::TOO_MANY_REQUESTS {
        assert_ne!(route, "/report", "a report is never limited");
        assert_eq!(shadow, 0, "shadow mode allows everything");
    }
    let Some(b) = expect else { return };
    assert!(b.known_headers, "{route}: unknown response_headers accepted: {}", b.json);
    if !b.known_namespace {
        assert_eq!(status, StatusCode::OK, "{route}: an unknown namespace is limited: {}", b.json);
    }
    if b.delta == 0 {
        assert_eq!(status, StatusCode::OK, "{route}: no hits are limited: {}", b.json);
    }
    if !b.headers_asked {
        assert!(
            !parts.headers.keys().any(|k| k.as_str().contains("ratelimit")),
            "{route}: RateLimit headers nobody asked for: {:?}",
            parts.headers
        );
    }
    for name in ["x-ratelimit-remaining", "x-ratelimit-reset"] {
        if let Some(value) = parts.headers.get(name) {
            let value = value.to_str().expect("ASCII");
            assert!(value.parse::<u64>().is_ok(), "{route}: {name}: {value:?} for {}", b.json);
        }
    }
});
