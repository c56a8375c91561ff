//! envoy/ratelimit's behaviour, served end to end: the configs of `examples/envoy/` (written as
//! envoy/ratelimit's test configs are) over Envoy's RLS with a real tonic client, a manual clock,
//! on memory and on Redis where the storage applies. Each test names the envoy/ratelimit source
//! it follows (its repository at `f2fb157`).

mod support;

use std::path::PathBuf;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::{UInt64Value, Value, value::Kind};
use support::{Server, descriptor, server_at, should_rate_limit, temp_dir};
use tollgate_policy::{Format, Policy};
use tollgate_server::serve::{HeaderDraft, STATS_KEYS_PER_LIMIT, ServeConfig, Storage, StorageKind};
use tollgate_testkit::RedisServer;
use tonic::transport::Channel;

const DAY: u64 = 86_400;

fn examples(dir: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/envoy").join(dir)
}

/// The storages a behaviour runs on: memory, and Redis (a server of its own).
fn storages(redis: &RedisServer) -> [Storage; 2] {
    [Storage::Memory, Storage::Redis { url: redis.url(), prefix: format!("p{}:", std::process::id()) }]
}

/// Runs `body` on a server of `examples/envoy/config` on each storage (see [`storages`]),
/// configured by `edit`, with an RLS client; stops each server after.
async fn on_each_storage(
    edit: impl Fn(&mut ServeConfig),
    body: impl AsyncFn(&Server, &mut RateLimitServiceClient<Channel>, &Storage),
) {
    let redis = RedisServer::start();
    for storage in storages(&redis) {
        let server = serve("config", &storage, &edit).await;
        let mut rls = server.rls().await;
        body(&server, &mut rls, &storage).await;
        server.running.shutdown().await;
    }
}

async fn serve(dir: &str, storage: &Storage, edit: impl FnOnce(&mut ServeConfig)) -> Server {
    let storage = storage.clone();
    server_at(examples(dir), move |c| {
        c.format = Format::Envoy;
        c.storage = storage;
        edit(c);
    })
    .await
    .unwrap()
}

fn code(code: Code) -> i32 {
    code as i32
}

/// Code, requests per unit, unit, remaining, of one status.
fn summary(status: &DescriptorStatus) -> (i32, Option<(u32, i32)>, u32) {
    let limit = status.current_limit.as_ref().map(|l| (l.requests_per_unit, l.unit));
    (status.code, limit, status.limit_remaining)
}

fn reset_s(reply: &RateLimitResponse, i: usize) -> i64 {
    reply.statuses[i].duration_until_reset.as_ref().unwrap().seconds
}

#[tokio::test]
async fn requests_per_unit_0_is_over_limit_always_and_takes_nothing_from_the_others() {
    on_each_storage(
        |_| {},
        async |_, rls, storage| {
            let banned = || vec![descriptor(&[("remote_address", "203.0.113.7")]), descriptor(&[("client_id", "app")])];
            for _ in 0..3 {
                let reply = should_rate_limit(rls, "gateway", banned(), 1).await;
                assert_eq!(reply.overall_code, code(Code::OverLimit), "{storage:?}: {reply:?}");
                // As envoy/ratelimit's `GetResponseDescriptorStatus`: OVER_LIMIT, the rule, 0 left.
                let ban = &reply.statuses[0];
                assert_eq!(summary(ban), (code(Code::OverLimit), Some((0, Unit::Second as i32)), 0), "{storage:?}");
                assert_eq!(ban.current_limit.as_ref().unwrap().name, "", "the rule has no name");
                assert_eq!(reset_s(&reply, 0), 1, "a second, from the epoch");
                // All-or-nothing (tollgate's default, documented): a denied call counts on no counter,
                // where envoy/ratelimit would have counted the client's.
                assert_eq!(reply.statuses[1].limit_remaining, 100, "{storage:?}");
            }
            let alone = should_rate_limit(rls, "gateway", vec![descriptor(&[("client_id", "app")])], 1).await;
            assert_eq!(summary(&alone.statuses[0]), (code(Code::Ok), Some((100, Unit::Minute as i32)), 99));
        },
    )
    .await;
}

#[tokio::test]
async fn statuses_carry_envoy_ratelimits_remaining_and_rule_names() {
    on_each_storage(
        |_| {},
        async |_, rls, storage| {
            let address = || vec![descriptor(&[("remote_address", "198.51.100.1")])];
            let eight = should_rate_limit(rls, "gateway", address(), 8).await;
            assert_eq!(summary(&eight.statuses[0]), (code(Code::Ok), Some((10, Unit::Second as i32)), 2));
            assert_eq!(eight.statuses[0].current_limit.as_ref().unwrap().name, "per_address", "the rule's name");
            // Over: 0 remaining, though 2 are left for a smaller request.
            let five = should_rate_limit(rls, "gateway", address(), 5).await;
            assert_eq!(summary(&five.statuses[0]), (code(Code::OverLimit), Some((10, Unit::Second as i32)), 0));
            assert_eq!(should_rate_limit(rls, "gateway", address(), 2).await.overall_code, code(Code::Ok));

            // An unlimited rule: OK, no limit, 4294967295 remaining (`ratelimit.go`, `isUnlimited`),
            // and its `replaces` takes `per_client` out for the whole request.
            let request = vec![descriptor(&[("client_id", "health-checker")]), descriptor(&[("client_id", "app")])];
            for _ in 0..3 {
                let reply = should_rate_limit(rls, "gateway", request.clone(), 1).await;
                assert_eq!(reply.overall_code, code(Code::Ok));
                assert_eq!(summary(&reply.statuses[0]), (code(Code::Ok), None, u32::MAX), "{storage:?}");
                assert_eq!(reply.statuses[0].duration_until_reset, None);
                assert_eq!(summary(&reply.statuses[1]), (code(Code::Ok), None, 0), "per_client replaced: no rule");
            }
            let app = should_rate_limit(rls, "gateway", vec![descriptor(&[("client_id", "app")])], 1).await;
            assert_eq!(app.statuses[0].limit_remaining, 99, "the replaced rule counted none of them");
        },
    )
    .await;
}

#[tokio::test]
async fn week_month_and_year_are_7_30_and_365_days_from_the_epoch() {
    on_each_storage(
        |_| {},
        async |server, rls, storage| {
            // The manual clock starts at 1970-01-01T00:00Z, a Thursday; 3 days on is a Sunday, a day
            // before an ISO week's end and 4 days before envoy/ratelimit's.
            server.clock.advance(Duration::from_secs(3 * DAY));
            let plan = |plan: &str| vec![descriptor(&[("plan", plan), ("account", "a1")])];
            let cases = [
                ("weekly", 1000, Unit::Week, 4 * DAY),
                ("monthly", 4000, Unit::Month, 27 * DAY),
                ("yearly", 50_000, Unit::Year, 362 * DAY),
            ];
            for (name, max, unit, reset) in cases {
                let reply = should_rate_limit(rls, "billing", plan(name), 1).await;
                assert_eq!(summary(&reply.statuses[0]), (code(Code::Ok), Some((max, unit as i32)), max - 1), "{name}");
                assert_eq!(reset_s(&reply, 0) as u64, reset, "{name} on {storage:?}");
            }
            let week = should_rate_limit(rls, "billing", plan("weekly"), 999).await;
            assert_eq!(week.overall_code, code(Code::Ok));
            assert_eq!(should_rate_limit(rls, "billing", plan("weekly"), 1).await.overall_code, code(Code::OverLimit));
            server.clock.advance(Duration::from_secs(4 * DAY - 1));
            assert_eq!(should_rate_limit(rls, "billing", plan("weekly"), 1).await.overall_code, code(Code::OverLimit));
            server.clock.advance(Duration::from_secs(1));
            let next = should_rate_limit(rls, "billing", plan("weekly"), 1).await;
            assert_eq!(next.overall_code, code(Code::Ok), "a new week on day 7, a Thursday");
            assert_eq!(reset_s(&next, 0) as u64, 7 * DAY);
        },
    )
    .await;
}

#[tokio::test]
async fn global_shadow_mode_forces_only_the_overall_code() {
    on_each_storage(
        |c| c.shadow = true,
        async |_, rls, storage| {
            // envoy/ratelimit's SHADOW_MODE (`ratelimit.go`: `finalCode = OK` after the statuses).
            let banned = vec![descriptor(&[("remote_address", "203.0.113.7")])];
            let reply = should_rate_limit(rls, "gateway", banned, 1).await;
            assert_eq!(reply.overall_code, code(Code::Ok), "{storage:?}");
            assert_eq!(summary(&reply.statuses[0]), (code(Code::OverLimit), Some((0, Unit::Second as i32)), 0));
            let address = || vec![descriptor(&[("remote_address", "198.51.100.2")])];
            should_rate_limit(rls, "gateway", address(), 10).await;
            let over = should_rate_limit(rls, "gateway", address(), 1).await;
            assert_eq!((over.overall_code, over.statuses[0].code), (code(Code::Ok), code(Code::OverLimit)));
        },
    )
    .await;
    // A rule's own `shadow_mode` reports its descriptor OK, with 0 remaining once over
    // (`base_limiter.go`: the code is set to OK after the OVER_LIMIT status is built).
    let server = serve("config", &Storage::Memory, |_| {}).await;
    let mut rls = server.rls().await;
    let trial = || vec![descriptor(&[("plan", "trial")])];
    let first = should_rate_limit(&mut rls, "billing", trial(), 20).await;
    assert_eq!(summary(&first.statuses[0]), (code(Code::Ok), Some((20, Unit::Hour as i32)), 0));
    let over = should_rate_limit(&mut rls, "billing", trial(), 1).await;
    assert_eq!(over.overall_code, code(Code::Ok));
    assert_eq!(summary(&over.statuses[0]), (code(Code::Ok), Some((20, Unit::Hour as i32)), 0));
    server.running.shutdown().await;
}

/// A `shadow_mode` rule counts every hit of every request it applies to, as envoy/ratelimit's
/// counters do (`base_limiter.go` increments before it compares): those of a request another
/// descriptor refuses, and those past its limit; its statistics split them as envoy/ratelimit's.
#[tokio::test]
async fn shadow_rules_count_every_hit_of_allowed_and_refused_requests() {
    on_each_storage(
        |_| {},
        async |server, rls, storage| {
            let with_hits = |entries: &[(&str, &str)], hits| {
                let mut d = descriptor(entries);
                d.hits_addend = Some(UInt64Value { value: hits });
                d
            };
            let trial = |hits| with_hits(&[("plan", "trial")], hits);
            let weekly = |hits| with_hits(&[("plan", "weekly"), ("account", "a")], hits);
            let refused = should_rate_limit(rls, "billing", vec![trial(5), weekly(1001)], 1).await;
            assert_eq!(refused.overall_code, code(Code::OverLimit), "{storage:?}");
            let hour = Some((20, Unit::Hour as i32));
            assert_eq!(
                summary(&refused.statuses[0]),
                (code(Code::Ok), hour, 15),
                "counted though refused: {storage:?}"
            );
            assert_eq!(summary(&refused.statuses[1]).2, 0);
            let weekly_left = should_rate_limit(rls, "billing", vec![weekly(0)], 1).await;
            assert_eq!(weekly_left.statuses[0].limit_remaining, 1000, "the refused request took no enforced hit");

            let past = should_rate_limit(rls, "billing", vec![trial(20)], 1).await;
            assert_eq!(past.overall_code, code(Code::Ok));
            assert_eq!(summary(&past.statuses[0]), (code(Code::Ok), hour, 0), "{storage:?}");
            // 25 counted of 20: a check of 0 hits sees it over, as a check of 1 does.
            let request =
                |hits| RateLimitRequest { domain: "billing".into(), descriptors: vec![trial(hits)], hits_addend: 1 };
            let probe = rls.should_rate_limit(request(0)).await.unwrap().into_inner();
            assert_eq!(summary(&probe.statuses[0]), (code(Code::Ok), hour, 0), "{storage:?}");

            let text = server.get("/metrics").await.1;
            let trial_rule = r#"limitador_namespace="billing",rule="billing.plan_trial""#;
            let stat = |name: &str| series(&text, name, trial_rule);
            assert_eq!(stat("tollgate_rule_total_hits"), 25, "{storage:?}: {text}");
            assert_eq!(stat("tollgate_rule_within_limit"), 5, "the refused call's hits counted too");
            assert_eq!((stat("tollgate_rule_over_limit"), stat("tollgate_rule_shadow_mode")), (5, 5), "{storage:?}");
            // On Redis, a call is one round trip, its shadow counters charged in the same script run.
            assert_eq!(redis_round_trips(&text, storage).unwrap_or(4), 4, "{text}");
        },
    )
    .await;
}

#[tokio::test]
async fn merge_domains_reads_one_domain_from_several_files() {
    let Err(error) = server_at(examples("merged"), |c| c.format = Format::Envoy).await else {
        panic!("a domain in two files is refused without --merge-domains")
    };
    let file = examples("merged").join("teams.yaml").display().to_string();
    assert!(error.to_string().starts_with(&format!("{file}:3:9: domain `shared` is also in ")), "{error}");
    assert!(error.to_string().contains("--merge-domains"), "{error}");

    let server = server_at(examples("merged"), |c| c.format = Format::EnvoyMergingDomains).await.unwrap();
    let mut rls = server.rls().await;
    let team = |t: &str| vec![descriptor(&[("team", t)])];
    let ads = should_rate_limit(&mut rls, "shared", team("ads"), 2).await;
    assert_eq!(summary(&ads.statuses[0]), (code(Code::Ok), Some((2, Unit::Second as i32)), 0), "from more-teams.yaml");
    let search = should_rate_limit(&mut rls, "shared", team("search"), 1).await;
    assert_eq!(summary(&search.statuses[0]), (code(Code::Ok), Some((5, Unit::Second as i32)), 4), "from teams.yaml");
    server.running.shutdown().await;

    // Two top-level nodes with the same key and value across merged files are an error.
    let dir = temp_dir("envoy-merge-twice");
    std::fs::copy(examples("merged").join("teams.yaml"), dir.join("a.yaml")).unwrap();
    std::fs::copy(examples("merged").join("teams.yaml"), dir.join("b.yaml")).unwrap();
    let error = Format::EnvoyMergingDomains.load(&dir).unwrap_err();
    assert_eq!(error.source_name, dir.join("b.yaml").display().to_string());
    assert!(error.to_string().contains("the same key and value as the descriptor at "), "{error}");
}

#[tokio::test]
async fn max_value_above_one_per_nanosecond_counts_exactly_on_a_window() {
    let dir = temp_dir("big-max-value");
    let limits = dir.join("limits.yaml");
    // A byte budget: a trillion per minute, charged by each descriptor's own hits_addend.
    std::fs::write(&limits, "- {namespace: bytes, max_value: 1000000000000, seconds: 60}\n").unwrap();
    let redis = RedisServer::start();
    for storage in storages(&redis) {
        let server = server_at(limits.clone(), |c| c.storage = storage.clone()).await.unwrap();
        let mut rls = server.rls().await;
        let charge = |n: u64| {
            let mut d = descriptor(&[("object", "o1")]);
            d.hits_addend = Some(UInt64Value { value: n });
            vec![d]
        };
        let most = should_rate_limit(&mut rls, "bytes", charge(999_999_999_999), 1).await;
        assert_eq!(most.overall_code, code(Code::Ok), "{storage:?}");
        assert_eq!(most.statuses[0].limit_remaining, 1);
        assert_eq!(should_rate_limit(&mut rls, "bytes", charge(2), 1).await.overall_code, code(Code::OverLimit));
        assert_eq!(should_rate_limit(&mut rls, "bytes", charge(1), 1).await.overall_code, code(Code::Ok));
        server.running.shutdown().await;
    }
    // Redis's Lua holds whole numbers exactly up to 2^53: above it, Redis storage is refused.
    std::fs::write(&limits, "- {namespace: bytes, max_value: 9007199254740993, seconds: 60}\n").unwrap();
    let Err(error) = server_at(limits.clone(), |c| c.storage = storages(&redis)[1].clone()).await else {
        panic!("above 2^53 on Redis is refused")
    };
    assert!(error.to_string().contains("max_value above 9007199254740992"), "{error}");
    let memory = server_at(limits, |_| {}).await.unwrap();
    memory.running.shutdown().await;
}

#[test]
fn every_config_in_examples_envoy_loads_and_converts_to_the_same_limits() {
    let config = Format::Envoy.load(&examples("config")).unwrap();
    let merged = Format::EnvoyMergingDomains.load(&examples("merged")).unwrap();
    for policy in [config, merged] {
        let back = Policy::parse(&policy.to_yaml(), "converted.yaml").unwrap();
        let shape = |p: &Policy| {
            let limits = p.rules().iter();
            limits.map(|l| (l.id(), l.max_value(), l.unlimited(), l.calendar().cloned())).collect::<Vec<_>>()
        };
        assert_eq!(shape(&back), shape(&policy), "tollgate convert keeps every field");
    }
}

/// The round trips a server on `storage` made to Redis so far, from its `/metrics` text (`None`
/// when the storage is not Redis).
fn redis_round_trips(text: &str, storage: &Storage) -> Option<u64> {
    let Storage::Redis { prefix, .. } = storage else { return None };
    Some(series(text, "tollgate_redis_decision_seconds_count", &format!("prefix=\"{prefix}\"")))
}

/// The value of one series in a Prometheus text exposition, 0 when absent.
fn series(text: &str, name: &str, labels: &str) -> u64 {
    let prefix = format!("{name}{{{labels}}} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)).map_or(0, |v| v.parse().unwrap())
}

#[tokio::test]
async fn each_rule_has_envoy_ratelimits_statistics_in_a_series_of_its_own() {
    let server = serve("config", &Storage::Memory, |_| {}).await;
    let mut rls = server.rls().await;
    // per_address: 10 a second. 7 within; 2 more reach past 8 (80%); 3 more, 1 of them over:
    // refused (all-or-nothing), counted as envoy/ratelimit counts them.
    let address = || vec![descriptor(&[("remote_address", "198.51.100.3")])];
    for hits in [7, 2, 3] {
        should_rate_limit(&mut rls, "gateway", address(), hits).await;
    }
    // Two unnamed shadow rules would share one series if labelled by name: the trial plan's is
    // labelled by its envoy/ratelimit key.
    let trial = || vec![descriptor(&[("plan", "trial")])];
    should_rate_limit(&mut rls, "billing", trial(), 25).await;
    let text = server.get("/metrics").await.1;
    let per_address = r#"limitador_namespace="gateway",rule="per_address""#;
    let stat = |name: &str, labels: &str| series(&text, name, labels);
    assert_eq!(stat("tollgate_rule_total_hits", per_address), 12, "{text}");
    assert_eq!(stat("tollgate_rule_within_limit", per_address), 9);
    // 9 -> 12 of 10: 1 hit within the near band (9 -> 10), 2 over; 8 -> 9 was near too.
    assert_eq!(stat("tollgate_rule_near_limit", per_address), 2);
    assert_eq!(stat("tollgate_rule_over_limit", per_address), 2);
    let trial_rule = r#"limitador_namespace="billing",rule="billing.plan_trial""#;
    assert_eq!(stat("tollgate_rule_total_hits", trial_rule), 25);
    assert_eq!(stat("tollgate_rule_over_limit", trial_rule), 5);
    assert_eq!(stat("tollgate_rule_shadow_mode", trial_rule), 5);
    assert_eq!(stat("shadow_limited_calls", trial_rule.replace("rule=", "limit_name=").as_str()), 1);
    server.running.shutdown().await;
}

#[tokio::test]
async fn rate_limit_headers_describe_limits_not_unlimited_rules() {
    let server = serve("config", &Storage::Memory, |c| c.rate_limit_headers = Some(HeaderDraft::Draft03)).await;
    let mut rls = server.rls().await;
    let unlimited = vec![descriptor(&[("client_id", "health-checker")])];
    let reply = should_rate_limit(&mut rls, "gateway", unlimited, 1).await;
    assert!(reply.response_headers_to_add.is_empty(), "{:?}", reply.response_headers_to_add);
    let both = vec![descriptor(&[("client_id", "health-checker")]), descriptor(&[("remote_address", "192.0.2.1")])];
    let reply = should_rate_limit(&mut rls, "gateway", both, 1).await;
    let header = |name: &str| reply.response_headers_to_add.iter().find(|h| h.key == name).map(|h| h.value.clone());
    assert_eq!(header("x-ratelimit-limit").unwrap(), "10, 10;w=1;name=\"per_address\"");
    assert_eq!(header("x-ratelimit-remaining").unwrap(), "9");
    server.running.shutdown().await;
}

/// A protobuf value as JSON, to compare whole structs in one assertion.
fn json(value: &Value) -> serde_json::Value {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(b)) => (*b).into(),
        Some(Kind::NumberValue(n)) => (*n).into(),
        Some(Kind::StringValue(s)) => s.clone().into(),
        Some(Kind::ListValue(list)) => list.values.iter().map(json).collect(),
        Some(Kind::StructValue(s)) => s.fields.iter().map(|(k, v)| (k.clone(), json(v))).collect(),
    }
}

fn dynamic_metadata(reply: &RateLimitResponse) -> serde_json::Value {
    let metadata = reply.dynamic_metadata.clone().expect("the reply has dynamic_metadata");
    json(&Value { kind: Some(Kind::StructValue(metadata)) })
}

/// envoy/ratelimit's `RESPONSE_DYNAMIC_METADATA` (`src/service/ratelimit.go`,
/// `ratelimitToMetadata`; its `test/service/ratelimit_test.go`, `TestMetadataReturned...`).
#[tokio::test]
async fn dynamic_metadata_describes_the_request_and_the_rules_it_passed() {
    on_each_storage(
        |c| c.response_dynamic_metadata = true,
        async |_, rls, storage| {
            let both = || vec![descriptor(&[("service", "service_1")]), descriptor(&[("service", "service_2")])];
            let first = should_rate_limit(rls, "services", both(), 0).await;
            assert_eq!(first.overall_code, code(Code::Ok));
            let described = serde_json::json!({
                "domain": "services",
                "descriptors": [{"entries": ["service=service_1"]}, {"entries": ["service=service_2"]}],
                // Both passed: their metadata merged, in descriptor order.
                "metadata": {"name": "service_1", "service_with_quota": {"name": "service_2"}, "weight": 2.0},
            });
            assert_eq!(dynamic_metadata(&first), described, "{storage:?}");

            // service_1 is out of quota: only service_2's metadata, and the request's hits_addend.
            let second = should_rate_limit(rls, "services", both(), 1).await;
            assert_eq!(second.overall_code, code(Code::OverLimit));
            let mut expected = described.clone();
            expected["metadata"] = serde_json::json!({"service_with_quota": {"name": "service_2"}, "weight": 2.0});
            expected["hitsAddend"] = 1.0.into();
            assert_eq!(dynamic_metadata(&second), expected, "{storage:?}");

            // A descriptor's own hits_addend and limit are described as sent.
            let mut own = descriptor(&[("service", "service_2")]);
            own.hits_addend = Some(UInt64Value { value: 0 });
            own.limit = Some(RateLimitOverride { requests_per_unit: 5, unit: RateLimitUnit::Hour as i32 });
            let third = should_rate_limit(rls, "services", vec![own], 0).await;
            let descriptors = &dynamic_metadata(&third)["descriptors"];
            let sent = serde_json::json!([{
                "entries": ["service=service_2"],
                "hitsAddend": 0.0,
                "limit": "requests_per_unit:5 unit:HOUR",
            }]);
            assert_eq!(descriptors, &sent);
        },
    )
    .await;
    // Off by default: no description, as envoy/ratelimit's default.
    let server = serve("config", &Storage::Memory, |_| {}).await;
    let mut rls = server.rls().await;
    let reply = should_rate_limit(&mut rls, "services", vec![descriptor(&[("service", "service_1")])], 1).await;
    assert_eq!(reply.dynamic_metadata, None);
    server.running.shutdown().await;
}

/// `quota_mode`, as envoy/ratelimit's `integration-test/scripts/multiservice-tokenquota.sh` uses
/// it: check both services with 0 hits, route to the first whose status is OK, charge it 1 on
/// the response path. Overall OVER_LIMIT only when every quota descriptor is over
/// (`src/service/ratelimit.go`, `shouldRateLimitWorker`); a quota counts past its limit.
#[tokio::test]
async fn quota_mode_refuses_only_when_every_quota_is_over_and_counts_past_the_limit() {
    on_each_storage(
        |_| {},
        async |server, rls, storage| {
            let check = || {
                let mut services =
                    vec![descriptor(&[("service", "service_1")]), descriptor(&[("service", "service_2")])];
                for d in &mut services {
                    d.hits_addend = Some(UInt64Value { value: 0 });
                }
                services
            };
            let mut served = Vec::new();
            for request in 1..=6 {
                let reply = should_rate_limit(rls, "token-quota", check(), 0).await;
                if reply.overall_code != code(Code::Ok) {
                    assert!(reply.statuses.iter().all(|s| s.code == code(Code::OverLimit)), "{storage:?}: {reply:?}");
                    served.push(None);
                    continue;
                }
                let service = if reply.statuses[0].code == code(Code::Ok) { "service_1" } else { "service_2" };
                served.push(Some(service));
                should_rate_limit(rls, "token-quota", vec![descriptor(&[("service", service)])], 1).await;
                assert!(request < 6, "{storage:?}: request {request} served by {service}");
            }
            // Each quota serves one more than its limit: the charge that takes it over is the
            // response of a request already served (as the script says: 2 for service_1, 3 for 2).
            let one = Some("service_1");
            let two = Some("service_2");
            assert_eq!(served, [one, one, two, two, two, None], "{storage:?}");
            // Counted as envoy/ratelimit counts them: service_1's second charge is past its limit.
            let text = server.get("/metrics").await.1;
            let service_1 = r#"limitador_namespace="token-quota",rule="service_1_quota""#;
            let stat = |name: &str| series(&text, name, service_1);
            let counted = [
                stat("tollgate_rule_total_hits"),
                stat("tollgate_rule_within_limit"),
                stat("tollgate_rule_over_limit"),
            ];
            assert_eq!(counted, [2, 1, 1], "{storage:?}: {text}");

            // An unlimited quota descriptor is not one of the request's quotas (envoy/ratelimit's
            // `isUnlimited` skips it): service_1 and service_2 are over, so the request is.
            let mut with_internal = check();
            with_internal.push(descriptor(&[("service", "internal")]));
            let internal = should_rate_limit(rls, "token-quota", with_internal, 0).await;
            assert_eq!(internal.overall_code, code(Code::OverLimit), "{storage:?}: {internal:?}");
            assert_eq!(summary(&internal.statuses[2]), (code(Code::Ok), None, u32::MAX));

            // Over: the status says so, with the rule and 0 remaining.
            let over = should_rate_limit(rls, "token-quota", check(), 0).await;
            assert_eq!(summary(&over.statuses[0]), (code(Code::OverLimit), Some((1, Unit::Minute as i32)), 0));
            assert_eq!(over.statuses[0].current_limit.as_ref().unwrap().name, "service_1_quota");

            // An ordinary rule is all-or-nothing and refuses on its own; a request its quotas refuse
            // takes nothing from it, while the quota counts the hit.
            let with_tenant =
                |service: &str| vec![descriptor(&[("service", service)]), descriptor(&[("tenant", "t1")])];
            let refused = should_rate_limit(rls, "token-quota", with_tenant("service_2"), 1).await;
            assert_eq!(refused.overall_code, code(Code::OverLimit), "{storage:?}");
            server.clock.advance(Duration::from_secs(60));
            for _ in 0..4 {
                let fine = should_rate_limit(rls, "token-quota", vec![descriptor(&[("tenant", "t1")])], 1).await;
                assert_eq!(fine.overall_code, code(Code::Ok), "a new minute: the tenant's 4");
            }
            let tenant_over = should_rate_limit(rls, "token-quota", with_tenant("service_2"), 1).await;
            assert_eq!(tenant_over.overall_code, code(Code::OverLimit), "{storage:?}: the tenant is over");
            assert_eq!(tenant_over.statuses[0].code, code(Code::Ok), "service_2 had room");
            // Its quota was charged all the same (envoy/ratelimit counts every quota hit).
            let left = should_rate_limit(rls, "token-quota", check(), 0).await;
            assert_eq!(left.statuses[1].limit_remaining, 1, "{storage:?}: {left:?}");
            // On Redis each of the 20 calls is one round trip: the quotas are charged, and decide
            // whether the call is refused, in the same script run as the tenant's rule.
            let text = server.get("/metrics").await.1;
            assert_eq!(redis_round_trips(&text, storage).unwrap_or(20), 20, "{text}");
        },
    )
    .await;
}

/// A descriptor's own limit, as envoy/ratelimit's `GetLimit` uses it (`src/config/config_impl.go`):
/// instead of the configured rule, for any descriptor of a known domain, enforced, unnamed, one
/// counter per domain, unit and entries — the rule's counter when the descriptor matches a rule of
/// that unit, as envoy/ratelimit's key is the descriptor's (`src/limiter/cache_key.go`), so the
/// descriptor with and without its own limit counts one count. All-or-nothing holds across it.
#[tokio::test]
async fn a_descriptors_own_limit_is_counted_instead_of_the_rules() {
    on_each_storage(
        |_| {},
        async |server, rls, storage| {
            let own = |entries: &[(&str, &str)], requests_per_unit, unit: RateLimitUnit| {
                let mut d = descriptor(entries);
                d.limit = Some(RateLimitOverride { requests_per_unit, unit: unit as i32 });
                d
            };
            let acme = || own(&[("tenant", "acme")], 2, RateLimitUnit::Minute);
            for remaining in [1, 0] {
                let reply = should_rate_limit(rls, "tenants", vec![acme()], 1).await;
                assert_eq!(summary(&reply.statuses[0]), (code(Code::Ok), Some((2, Unit::Minute as i32)), remaining));
                assert_eq!(reply.statuses[0].current_limit.as_ref().unwrap().name, "", "{storage:?}");
                assert_eq!(reset_s(&reply, 0), 60, "a minute, from the epoch");
            }
            let over = should_rate_limit(rls, "tenants", vec![acme()], 1).await;
            assert_eq!(over.overall_code, code(Code::OverLimit), "{storage:?}");
            assert_eq!(summary(&over.statuses[0]), (code(Code::OverLimit), Some((2, Unit::Minute as i32)), 0));

            // Without its own limit, the rule, on the same counter: acme's 2 hits are counted.
            let beta = || descriptor(&[("tenant", "beta")]);
            let rule = should_rate_limit(rls, "tenants", vec![descriptor(&[("tenant", "acme")]), beta()], 1).await;
            let counted: Vec<_> = rule.statuses.iter().map(summary).collect();
            let per_minute = Some((100, Unit::Minute as i32));
            assert_eq!(counted, [(code(Code::Ok), per_minute, 97), (code(Code::Ok), per_minute, 99)], "{storage:?}");
            // And the rule's hit is on the count a larger own limit sees: 3 of 5, then 4.
            let five = should_rate_limit(rls, "tenants", vec![own(&[("tenant", "acme")], 5, RateLimitUnit::Minute)], 1);
            assert_eq!(
                summary(&five.await.statuses[0]),
                (code(Code::Ok), Some((5, Unit::Minute as i32)), 1),
                "{storage:?}"
            );
            // Another unit is another counter.
            let per_second =
                should_rate_limit(rls, "tenants", vec![own(&[("tenant", "acme")], 1, RateLimitUnit::Second)], 1).await;
            assert_eq!(summary(&per_second.statuses[0]), (code(Code::Ok), Some((1, Unit::Second as i32)), 0));

            // All-or-nothing: acme is over, so beta's counter takes nothing.
            let both = should_rate_limit(rls, "tenants", vec![acme(), beta()], 1).await;
            assert_eq!(both.overall_code, code(Code::OverLimit));
            assert_eq!(summary(&both.statuses[1]), (code(Code::Ok), per_minute, 99), "{storage:?}");

            // A descriptor no rule matches, and 0 per unit: always over.
            let any = || own(&[("path", "/upload"), ("method", "PUT")], 1, RateLimitUnit::Hour);
            assert_eq!(should_rate_limit(rls, "tenants", vec![any()], 1).await.overall_code, code(Code::Ok));
            let again = should_rate_limit(rls, "tenants", vec![any()], 1).await;
            assert_eq!(summary(&again.statuses[0]), (code(Code::OverLimit), Some((1, Unit::Hour as i32)), 0));
            let banned =
                should_rate_limit(rls, "tenants", vec![own(&[("tenant", "x")], 0, RateLimitUnit::Day)], 1).await;
            assert_eq!(banned.overall_code, code(Code::OverLimit));
            // A domain without rules has no limits, its own or not.
            assert_eq!(should_rate_limit(rls, "nowhere", vec![any()], 1).await.overall_code, code(Code::Ok));

            // The next minute, acme starts again.
            server.clock.advance(Duration::from_secs(60));
            let next = should_rate_limit(rls, "tenants", vec![acme()], 1).await;
            assert_eq!(summary(&next.statuses[0]), (code(Code::Ok), Some((2, Unit::Minute as i32)), 1), "{storage:?}");

            // A unit envoy/ratelimit does not know is refused, naming the descriptor.
            let mut unknown = descriptor(&[("tenant", "acme")]);
            unknown.limit = Some(RateLimitOverride { requests_per_unit: 1, unit: 0 });
            let request = RateLimitRequest { domain: "tenants".into(), descriptors: vec![unknown], hits_addend: 1 };
            let refused = rls.should_rate_limit(request).await.unwrap_err();
            assert_eq!(refused.code(), tonic::Code::InvalidArgument);
            assert!(
                refused.message().starts_with("descriptor 0: its limit's unit 0 is not one of SECOND"),
                "{refused}"
            );
        },
    )
    .await;
}

/// redis-cached and redis-leased decide on local copies, which cannot tell whether every pooled
/// limit of a request is over: they refuse `mode: pooled` at load, naming the limit (and every
/// envoy/ratelimit rule, a calendar window, already).
#[test]
fn the_storages_with_local_copies_refuse_pooled_limits() {
    let policy =
        Policy::parse("- {namespace: api, name: quota, max_value: 1, seconds: 60, mode: pooled}", "l.yaml").unwrap();
    for storage in [StorageKind::RedisCached, StorageKind::RedisLeased] {
        let error = storage.accepts(&policy).unwrap_err().to_string();
        let expected = format!(
            "line 1: `mode: pooled` (envoy/ratelimit's quota_mode) is not available with --storage {storage} (use \
             memory or redis): limit `quota` of namespace `api`"
        );
        assert_eq!(error, expected);
    }
    assert!(StorageKind::Redis.accepts(&policy).is_ok() && StorageKind::Memory.accepts(&policy).is_ok());
}

/// `detailed_metric` and `value_to_metric`: envoy/ratelimit's stats key per value
/// (`src/config/config_impl.go`, `GetLimit`), as the `key` label of the rule's statistics, at
/// most STATS_KEYS_PER_LIMIT values per rule.
#[tokio::test]
async fn per_value_statistics_carry_envoy_ratelimits_key_up_to_a_cap() {
    let server = serve("config", &Storage::Memory, |_| {}).await;
    let mut rls = server.rls().await;
    let call = |entries: &[(&str, &str)]| vec![descriptor(entries)];
    for _ in 0..6 {
        should_rate_limit(&mut rls, "api", call(&[("path", "/v1/users"), ("method", "GET")]), 1).await;
    }
    should_rate_limit(&mut rls, "api", call(&[("route", "checkout"), ("user", "u1")]), 2).await;
    for i in 0..STATS_KEYS_PER_LIMIT + 5 {
        let path = format!("/v1/items/{i}");
        should_rate_limit(&mut rls, "api", call(&[("path", &path), ("method", "POST")]), 1).await;
    }
    let text = server.get("/metrics").await.1;
    let stat = |name: &str, labels: &str| series(&text, name, labels);
    let users = r#"limitador_namespace="api",rule="api.path_/v1/*.method",key="api.path_/v1/users.method_GET""#;
    assert_eq!(stat("tollgate_rule_total_hits", users), 6, "{text}");
    assert_eq!(stat("tollgate_rule_over_limit", users), 1);
    let route = r#"limitador_namespace="api",rule="api.route.user",key="api.route_checkout.user""#;
    assert_eq!(stat("tollgate_rule_within_limit", route), 2);
    // The first item was the detailed rule's 2nd value: 98 more have a series, 6 share one.
    let first = r#"limitador_namespace="api",rule="api.path_/v1/*.method",key="api.path_/v1/items/0.method_POST""#;
    assert_eq!(stat("tollgate_rule_total_hits", first), 1);
    let other = r#"limitador_namespace="api",rule="api.path_/v1/*.method",key="(other)""#;
    assert_eq!(stat("tollgate_rule_total_hits", other), 6);
    let keys =
        text.lines().filter(|l| l.starts_with("tollgate_rule_total_hits{") && l.contains("rule=\"api.path_")).count();
    assert_eq!(keys, STATS_KEYS_PER_LIMIT + 1, "the cap, and (other)");
    assert!(!text.contains(r#"rule="api.path_/v1/*.method"}"#), "no series without its key: {text}");
    server.running.shutdown().await;
}
