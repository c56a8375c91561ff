//! The HTTP API, Limitador's shapes, through a real HTTP client.

mod support;

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use support::server;
use tollgate_server::serve::Mode;

const LIMITS: &str = r#"
- namespace: ns
  name: per app
  max_value: 2
  seconds: 60
  conditions: ["descriptors[0]['req.method'] == 'GET'"]
  variables: ["descriptors[0].app_id"]
"#;

fn call(app: &str, delta: u64, headers: bool) -> String {
    let extra = if headers { r#","response_headers":"DraftVersion03""# } else { "" };
    format!(r#"{{"namespace":"ns","values":{{"req.method":"GET","app_id":"{app}"}},"delta":{delta}{extra}}}"#)
}

#[tokio::test]
async fn check_report_and_check_and_report() {
    let server = server(LIMITS, Mode::Accuracy, false, false).await;
    let (status, _, body) = server.post("/check", &call("a", 2, false)).await;
    assert_eq!((status, body.as_str()), (200, "null"));
    assert_eq!(server.post("/check", &call("a", 3, false)).await.0, 429, "3 > max_value");
    assert_eq!(server.get("/counters/ns").await.1, "[]", "check counts nothing");

    assert_eq!(server.post("/report", &call("a", 1, false)).await.0, 200);
    let (status, headers, _) = server.post("/check_and_report", &call("a", 1, true)).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-ratelimit-limit"], "2, 2;w=60;name=\"per app\"");
    assert_eq!(headers["x-ratelimit-remaining"], "0");
    assert_eq!(headers["x-ratelimit-reset"], "60");
    let (status, headers, body) = server.post("/check_and_report", &call("a", 1, true)).await;
    assert_eq!((status, body.as_str()), (429, "null"));
    assert_eq!(headers["x-ratelimit-remaining"], "0");
    assert_eq!(server.post("/check_and_report", &call("b", 1, false)).await.0, 200, "another app, another counter");

    server.clock.advance(Duration::from_secs(15));
    let counters: serde_json::Value = serde_json::from_str(&server.get("/counters/ns").await.1).unwrap();
    let mut counters = counters.as_array().unwrap().clone();
    counters.sort_by_key(|c| c["set_variables"]["descriptors[0].app_id"].as_str().unwrap().to_string());
    assert_eq!(counters.len(), 2);
    assert_eq!(counters[0]["set_variables"], serde_json::json!({"descriptors[0].app_id": "a"}));
    assert_eq!((counters[0]["remaining"].as_u64(), counters[0]["expires_in_seconds"].as_u64()), (Some(0), Some(45)));
    assert_eq!(counters[1]["remaining"].as_u64(), Some(1));
    assert_eq!(counters[0]["limit"]["max_value"], 2);

    let limits: serde_json::Value = serde_json::from_str(&server.get("/limits/ns").await.1).unwrap();
    assert_eq!(limits[0]["name"], "per app");
    assert_eq!(limits[0]["conditions"][0], "descriptors[0]['req.method'] == 'GET'");
    assert_eq!(server.get("/limits/unknown").await.1, "[]");

    let (status, _, _) = server.post("/check_and_report", r#"{"namespace":"unknown","values":{},"delta":1}"#).await;
    assert_eq!(status, 200, "unknown namespace is allowed");
}

#[tokio::test]
async fn bad_bodies_are_400_with_the_reason() {
    let server = server(LIMITS, Mode::Accuracy, false, false).await;
    for (body, reason) in [
        ("{not json", "invalid request body: key must be a string"),
        (r#"{"values":{},"delta":1}"#, "missing field `namespace`"),
        (r#"{"namespace":"ns","values":{},"delta":-1}"#, "invalid value: integer `-1`"),
        (r#"{"namespace":"ns","values":{"a":1},"delta":1}"#, "invalid type: integer `1`, expected a string"),
        (r#"{"namespace":"ns","delta":1,"colour":"red"}"#, "unknown field `colour`"),
        (r#"{"namespace":"ns","delta":1,"response_headers":"v99"}"#, "invalid response_headers `v99`"),
        (r#"{"namespace":"unknown","delta":4294967296}"#, "invalid delta 4294967296: at most 4294967295"),
        (r#"{"namespace":"ns","delta":18446744073709551615}"#, "invalid delta 18446744073709551615"),
    ] {
        for path in ["/check", "/report", "/check_and_report"] {
            let (status, _, text) = server.post(path, body).await;
            assert_eq!(status, 400, "{path} {body}");
            assert!(text.contains(reason), "{path} {body}: {text}");
        }
    }
    // A body that is not UTF-8 (a Latin-1 "é" in a value), refused before it is read as JSON.
    let latin1 = b"{\"namespace\":\"ns\",\"values\":{\"user\":\"\xe9\"},\"delta\":1}";
    for path in ["/check", "/report", "/check_and_report"] {
        let (status, _, text) = server.post(path, latin1).await;
        assert_eq!(status, 400, "{path}");
        assert!(
            text.contains("invalid request body: invalid utf-8 sequence of 1 bytes from index 36"),
            "{path}: {text}"
        );
    }
    assert_eq!(server.get("/counters/ns").await.1, "[]", "nothing counted");
}

#[tokio::test]
async fn metrics_and_status() {
    let server = server(LIMITS, Mode::Accuracy, false, false).await;
    for _ in 0..3 {
        server.post("/check_and_report", &call("a", 1, false)).await;
    }
    let (status, text) = server.get("/metrics").await;
    assert_eq!(status, 200);
    for line in [
        "authorized_calls{limitador_namespace=\"ns\"} 2",
        "authorized_hits{limitador_namespace=\"ns\"} 2",
        "limited_calls{limitador_namespace=\"ns\",limit_name=\"per app\"} 1",
        "tollgate_decision_seconds_count 3",
        "limitador_up 1",
        "tollgate_limit_fill{limitador_namespace=\"ns\",limit_name=\"per app\",limit_id=",
        "tollgate_config_generation 1",
        "tollgate_config_last_reload_failed 0",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(text.contains("limit_id=\"") && text.contains("\"} 1\n"), "fill of a full counter is 1");
    let max = text.lines().find(|l| l.starts_with("tollgate_limit_max_value{")).unwrap();
    assert!(max.ends_with(" 2"), "{max}");
    let status: serde_json::Value = serde_json::from_str(&server.get("/status").await.1).unwrap();
    assert_eq!((status["config_version"].as_u64(), status["mode"].as_str()), (Some(1), Some("accuracy")));
}

#[tokio::test]
async fn namespaces_the_limits_do_not_name_share_one_metric_series() {
    let server = server(LIMITS, Mode::Accuracy, false, false).await;
    for i in 0..50 {
        let body = format!(r#"{{"namespace":"made-up-{i}","values":{{}},"delta":2}}"#);
        assert_eq!(server.post("/check_and_report", &body).await.0, 200);
    }
    // Kuadrant's Report, on a made-up domain too.
    let report = RateLimitRequest {
        domain: "made-up-rls".into(),
        descriptors: vec![support::descriptor(&[("k", "v")])],
        hits_addend: 3,
    };
    server.kuadrant("Report", report).await.unwrap();
    server.post("/check_and_report", &call("a", 1, false)).await;
    let text = server.get("/metrics").await.1;
    assert!(text.contains("authorized_calls{limitador_namespace=\"(unconfigured)\"} 50"), "{text}");
    assert!(text.contains("authorized_hits{limitador_namespace=\"(unconfigured)\"} 103"), "{text}");
    assert!(!text.contains("made-up"), "no series per made-up namespace:\n{text}");
    assert!(text.contains("authorized_calls{limitador_namespace=\"ns\"} 1"), "a named one keeps its own:\n{text}");
}

#[tokio::test]
async fn shadow_mode_allows_counts_and_reports() {
    let server = server(LIMITS, Mode::Accuracy, true, false).await;
    let statuses: Vec<u16> = {
        let mut s = Vec::new();
        for _ in 0..4 {
            s.push(server.post("/check_and_report", &call("a", 1, false)).await.0);
        }
        s
    };
    assert_eq!(statuses, [200, 200, 200, 200], "shadow mode allows everything");
    let counters: serde_json::Value = serde_json::from_str(&server.get("/counters/ns").await.1).unwrap();
    assert_eq!(counters[0]["remaining"], 0, "counts what it would have allowed, no more");
    let text = server.get("/metrics").await.1;
    assert!(text.contains("shadow_limited_calls{limitador_namespace=\"ns\",limit_name=\"per app\"} 2"), "{text}");
    assert!(!text.contains("\nlimited_calls{"), "{text}");
}

/// A flood of distinct variable values against a limit that keeps at most 64 counters: the cap
/// holds, and `/metrics` says what the new counters met there.
#[tokio::test]
async fn counters_are_capped_and_what_happens_at_the_cap_is_in_metrics() {
    let limits = format!("{LIMITS}  max_counters: 64\n");
    let server = server(&limits, Mode::Accuracy, false, false).await;
    let mut limited = 0;
    for app in 0..200 {
        let (status, headers, _) = server.post("/check_and_report", &call(&app.to_string(), 1, true)).await;
        if status == 429 {
            limited += 1;
            // Told when a counter goes idle (a fixed window: when the first one's window ends),
            // not "never".
            assert_eq!(headers["x-ratelimit-reset"], "60", "{headers:?}");
        }
    }
    let text = server.get("/metrics").await.1;
    for line in [
        "tollgate_counters{limitador_namespace=\"ns\",limit_name=\"per app\",limit_id=",
        "tollgate_counters_rejected_at_max_total{limitador_namespace=\"ns\",limit_name=\"per app\",limit_id=",
        "tollgate_counters_evicted_at_max_total{",
        "tollgate_counters_admitted_unstored_at_max_total{",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    let value = |name: &str| {
        let line = text.lines().find(|l| l.starts_with(&format!("{name}{{"))).unwrap();
        line.rsplit(' ').next().unwrap().parse::<u64>().unwrap()
    };
    // A cap this small is one shard: the first 64 values kept, the rest limited.
    let kept = value("tollgate_counters");
    assert_eq!(kept, 64, "{kept} counters kept");
    assert_eq!(value("tollgate_counters_max"), 64);
    assert_eq!((value("tollgate_counters_rejected_at_max_total"), limited), (200 - kept, 200 - kept));
    assert_eq!(value("tollgate_counters_evicted_at_max_total"), 0);
    assert!(text.contains("at_max_counters=\"reject\"} 64"), "{text}");
    // Once the window of the counters kept is over, new values are counted again.
    server.clock.advance(Duration::from_secs(60));
    assert_eq!(server.post("/check_and_report", &call("new", 1, false)).await.0, 200);
}
