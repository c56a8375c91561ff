//! `--format envoy`: a directory of envoy/ratelimit's configuration files served end to end over
//! Envoy's RLS (a real tonic client on a free port, a manual clock), reloaded when a file of the
//! directory changes, refused with the file and line when bad; and `tollgate convert` /
//! `check-config --format envoy` on the binary.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use support::{descriptor, generation, server_at, should_rate_limit, temp_dir};
use tollgate_policy::{Format, Policy};
use tollgate_server::serve::{Reloaded, ServeError, Storage};
use tollgate_testkit::RedisServer;

/// envoy/ratelimit's README, example 2.
const MESSAGING: &str = r#"
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"#;

/// Examples 3 (a value before the key alone; 1 instead of the README's 0) and 5 (unlimited).
const EDGE: &str = r#"
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: remote_address
    value: 10.0.0.1
    rate_limit:
      unlimited: true
"#;

/// A file envoy/ratelimit refuses too: a unit it does not know.
const BLACKLIST: &str = "domain: blacklist
descriptors:
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: fortnight
      requests_per_unit: 1
";

/// A directory holding `files`.
fn config_dir(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = temp_dir(name).join("config");
    std::fs::create_dir_all(&dir).unwrap();
    for (file, text) in files {
        std::fs::write(dir.join(file), text).unwrap();
    }
    dir
}

fn code(code: Code) -> i32 {
    code as i32
}

#[tokio::test]
async fn an_envoy_directory_is_served_over_rls_with_envoys_matching_and_windows() {
    let dir = config_dir("envoy-serve", &[("messaging.yaml", MESSAGING), ("edge.yaml", EDGE)]);
    let server = server_at(dir, |c| c.format = Format::Envoy).await.unwrap();
    let mut client = server.rls().await;

    // The README's request: two descriptors, each limited on its own; 5 marketing messages a day.
    let request = || {
        vec![
            descriptor(&[("message_type", "marketing"), ("to_number", "2061111111")]),
            descriptor(&[("to_number", "2061111111")]),
        ]
    };
    for n in 1..=5 {
        let ok = should_rate_limit(&mut client, "messaging", request(), 1).await;
        assert_eq!(ok.overall_code, code(Code::Ok), "message {n}: {ok:?}");
        assert_eq!(ok.statuses[0].limit_remaining, 5 - n);
        assert_eq!(ok.statuses[1].limit_remaining, 100 - n);
    }
    let sixth = should_rate_limit(&mut client, "messaging", request(), 1).await;
    assert_eq!(sixth.overall_code, code(Code::OverLimit), "{sixth:?}");
    assert_eq!(sixth.statuses[0].code, code(Code::OverLimit), "the marketing rule is over");
    assert_eq!(sixth.statuses[1].code, code(Code::Ok));
    assert_eq!(sixth.statuses[1].limit_remaining, 95, "a limited request takes from no counter");
    let day = sixth.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((day.requests_per_unit, day.unit), (5, 4), "5 per DAY (Unit::Day = 4)");
    // Another number has counters of its own; the other rule alone still counts this one.
    let other = vec![descriptor(&[("message_type", "marketing"), ("to_number", "2062222222")])];
    assert_eq!(should_rate_limit(&mut client, "messaging", other, 1).await.overall_code, code(Code::Ok));
    let alone = should_rate_limit(&mut client, "messaging", vec![descriptor(&[("to_number", "2061111111")])], 1).await;
    assert_eq!(alone.statuses[0].limit_remaining, 94);

    // Envoy/ratelimit's windows are `now / unit`: the manual clock starts at the Unix epoch, so 40 s
    // in, a minute rule resets in 20 s, not 60 s after the first hit.
    server.clock.advance(Duration::from_secs(40));
    let ip = |address: &str| vec![descriptor(&[("remote_address", address)])];
    let first = should_rate_limit(&mut client, "edge_proxy_per_ip", ip("50.0.0.5"), 1).await;
    assert_eq!(first.overall_code, code(Code::Ok));
    assert_eq!(first.statuses[0].duration_until_reset.as_ref().unwrap().seconds, 20);
    let second = should_rate_limit(&mut client, "edge_proxy_per_ip", ip("50.0.0.5"), 1).await;
    assert_eq!(second.overall_code, code(Code::OverLimit), "the most specific rule: 1 per minute, not 3");
    for n in 1..=3 {
        let ok = should_rate_limit(&mut client, "edge_proxy_per_ip", ip("50.0.0.1"), 1).await;
        assert_eq!(ok.overall_code, code(Code::Ok), "request {n} from another address");
    }
    let fourth = should_rate_limit(&mut client, "edge_proxy_per_ip", ip("50.0.0.1"), 1).await;
    assert_eq!(fourth.overall_code, code(Code::OverLimit), "OVER_LIMIT at the 4th of 3 per minute");
    for _ in 0..10 {
        let unlimited = should_rate_limit(&mut client, "edge_proxy_per_ip", ip("10.0.0.1"), 1).await;
        assert_eq!(unlimited.overall_code, code(Code::Ok), "unlimited: never counted");
        // As envoy/ratelimit answers an unlimited descriptor: OK, no limit, 4294967295 remaining.
        let status = &unlimited.statuses[0];
        assert_eq!(
            (status.code, status.current_limit.as_ref(), status.limit_remaining),
            (code(Code::Ok), None, u32::MAX)
        );
        assert_eq!(status.duration_until_reset, None);
    }
    // 20 s on, a new minute: the address is allowed again; the day's marketing count is not.
    server.clock.advance(Duration::from_secs(20));
    let next = should_rate_limit(&mut client, "edge_proxy_per_ip", ip("50.0.0.5"), 1).await;
    assert_eq!(next.overall_code, code(Code::Ok), "a new minute at 00:01:00");
    assert_eq!(should_rate_limit(&mut client, "messaging", request(), 1).await.overall_code, code(Code::OverLimit));
    // The next UTC day (the clock is at 00:01:00): the marketing messages are allowed again.
    server.clock.advance(Duration::from_secs(86_400 - 60));
    assert_eq!(should_rate_limit(&mut client, "messaging", request(), 1).await.overall_code, code(Code::Ok));
    server.running.shutdown().await;
}

#[tokio::test]
async fn a_bad_envoy_directory_is_refused_with_the_file_and_line() {
    let dir = config_dir("envoy-bad", &[("edge.yaml", EDGE), ("z_blacklist.yaml", BLACKLIST)]);
    let file = dir.join("z_blacklist.yaml").display().to_string();
    let Err(ServeError::Limits(error)) = server_at(dir, |c| c.format = Format::Envoy).await else {
        panic!("a bad directory must not be served")
    };
    assert_eq!(
        error.to_string(),
        format!("{file}:6:13: unknown unit `fortnight`: expected second, minute, hour, day, week, month or year")
    );
}

#[tokio::test]
async fn an_envoy_directory_is_reloaded_when_a_file_changes_and_a_bad_file_is_kept_out() {
    let dir = config_dir("envoy-reload", &[("edge.yaml", EDGE)]);
    let server = server_at(dir.clone(), |c| {
        c.format = Format::Envoy;
        c.watch = true;
    })
    .await
    .unwrap();
    let mut client = server.rls().await;
    let ip = |address: &str| vec![descriptor(&[("remote_address", address)])];
    let three = should_rate_limit(&mut client, "edge_proxy_per_ip", ip("1.1.1.1"), 3).await;
    assert_eq!(three.overall_code, code(Code::Ok));

    // A file changed in place: every file is read again; the rule's counter is kept (same limit).
    std::fs::write(dir.join("edge.yaml"), EDGE.replacen("requests_per_unit: 3", "requests_per_unit: 4", 1)).unwrap();
    assert_eq!(generation(&server, 2).await, 2, "the watcher applied the change");
    let fourth = should_rate_limit(&mut client, "edge_proxy_per_ip", ip("1.1.1.1"), 1).await;
    assert_eq!(fourth.overall_code, code(Code::Ok), "4 per minute now, 3 already counted");
    assert_eq!(fourth.statuses[0].limit_remaining, 0);

    // A new file for a new domain.
    std::fs::write(dir.join("messaging.yaml"), MESSAGING).unwrap();
    assert_eq!(generation(&server, 3).await, 3);
    let sms = vec![descriptor(&[("to_number", "1")])];
    assert_eq!(should_rate_limit(&mut client, "messaging", sms, 1).await.statuses[0].limit_remaining, 99);

    // A bad file: the error names it, and the limits in force stay.
    std::fs::write(dir.join("z_blacklist.yaml"), BLACKLIST).unwrap();
    let error = server.running.reloader.reload().unwrap_err();
    assert_eq!(error.source_name, dir.join("z_blacklist.yaml").display().to_string());
    assert_eq!((error.position.line, error.position.column), (6, 13));
    assert_eq!(server.running.engine.loaded().generation, 3);
    let still = should_rate_limit(&mut client, "edge_proxy_per_ip", ip("1.1.1.1"), 1).await;
    assert_eq!(still.overall_code, code(Code::OverLimit), "the last good limits count on");

    // The bad file removed: back to the limits in force.
    std::fs::remove_file(dir.join("z_blacklist.yaml")).unwrap();
    assert_eq!(server.running.reloader.reload().unwrap(), Reloaded::Unchanged);
    server.running.shutdown().await;
}

#[tokio::test]
async fn on_redis_envoy_rules_count_in_the_same_windows_and_redis_cached_names_the_file() {
    let redis = RedisServer::start();
    let dir = config_dir("envoy-redis", &[("edge.yaml", EDGE)]);
    let storage = Storage::Redis { url: redis.url(), prefix: "e:".into() };
    let server = server_at(dir.clone(), |c| {
        c.format = Format::Envoy;
        c.storage = storage;
    })
    .await
    .unwrap();
    let mut client = server.rls().await;
    server.clock.advance(Duration::from_secs(45));
    let ip = || vec![descriptor(&[("remote_address", "50.0.0.1")])];
    let first = should_rate_limit(&mut client, "edge_proxy_per_ip", ip(), 3).await;
    assert_eq!(first.overall_code, code(Code::Ok));
    assert_eq!(first.statuses[0].duration_until_reset.as_ref().unwrap().seconds, 15, "the minute ends at :60");
    assert_eq!(should_rate_limit(&mut client, "edge_proxy_per_ip", ip(), 1).await.overall_code, code(Code::OverLimit));
    server.clock.advance(Duration::from_secs(15));
    assert_eq!(should_rate_limit(&mut client, "edge_proxy_per_ip", ip(), 1).await.overall_code, code(Code::Ok));
    server.running.shutdown().await;

    let storage = Storage::RedisCached { url: redis.url(), prefix: "c:".into(), flush: Duration::from_secs(3600) };
    let Err(error) = server_at(dir.clone(), |c| {
        c.format = Format::Envoy;
        c.storage = storage;
    })
    .await
    else {
        panic!("redis-cached counts no calendar windows")
    };
    let file = dir.join("edge.yaml").display().to_string();
    assert!(
        error
            .to_string()
            .starts_with(&format!("{file}:4:5: calendar windows are not available with --storage redis-cached")),
        "{error}"
    );
}

fn tollgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate")).args(args).output().expect("the tollgate binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn convert_prints_limits_that_check_config_and_the_policy_read_back_the_same() {
    let dir = config_dir("envoy-convert", &[("messaging.yaml", MESSAGING), ("edge.yaml", EDGE)]);
    let path = dir.to_str().unwrap();
    let converted = tollgate(&["convert", "--from", "envoy", path]);
    assert!(converted.status.success(), "{}", text(&converted.stderr));
    let yaml = text(&converted.stdout);
    assert!(yaml.contains("descriptor_keys: [\"message_type\", \"to_number\"]"), "{yaml}");
    assert!(yaml.contains(&format!("# {}:", Path::new(path).join("messaging.yaml").display())), "{yaml}");

    let file = dir.parent().unwrap().join("converted.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let checked = tollgate(&["check-config", file.to_str().unwrap()]);
    assert!(checked.status.success(), "{}", text(&checked.stderr));
    assert!(text(&checked.stdout).contains(": 5 limits, valid"), "{}", text(&checked.stdout));
    let envoy = Format::Envoy.load(&dir).unwrap();
    let back = Policy::parse(&yaml, "converted.yaml").unwrap();
    let ids = |p: &Policy| p.rules().iter().map(|l| (l.id(), l.max_value())).collect::<Vec<_>>();
    assert_eq!(ids(&back), ids(&envoy), "the same limits: counters carry over between the two files");

    let direct = tollgate(&["check-config", "--format", "envoy", path]);
    assert!(direct.status.success(), "{}", text(&direct.stderr));
    let out = text(&direct.stdout);
    assert!(out.contains("messaging.yaml:8: messaging: 5 per calendar day in UTC (fixed_window)"), "{out}");
    assert!(out.contains("each descriptor with keys [message_type, to_number]"), "{out}");
}

/// check-config says what each rule does beyond counting: unlimited, shadow, quota mode (pooled),
/// metadata, per-value statistics.
#[test]
fn check_config_describes_what_each_rule_does() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/envoy/config");
    let out = tollgate(&["check-config", "--format", "envoy", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = text(&out.stdout);
    for line in [
        "gateway.yaml:20: gateway: unlimited (counts nothing), id ",
        "      shadow: counts every hit, allowed or not (memory, redis), and reports; never denies",
        "      mode pooled: denies when every pooled limit of the request is over",
        "      metadata {\"service_with_quota\":{\"name\":\"service_2\"},\"weight\":2}",
        "      statistics per value (detailed_metric, value_to_metric)",
    ] {
        assert!(out.contains(line), "{line}\n{out}");
    }
}

#[test]
fn convert_and_check_config_exit_2_with_the_file_and_line_of_a_bad_directory() {
    let dir = config_dir("envoy-convert-bad", &[("edge.yaml", EDGE), ("z_blacklist.yaml", BLACKLIST)]);
    let file = dir.join("z_blacklist.yaml").display().to_string();
    for args in [["convert", "--from", "envoy"], ["check-config", "--format", "envoy"]] {
        let out = tollgate(&[args[0], args[1], args[2], dir.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "nothing printed on stdout for a bad input");
        assert!(
            text(&out.stderr).starts_with(&format!("error: {file}:6:13: unknown unit `fortnight`")),
            "{}",
            text(&out.stderr)
        );
    }
}
