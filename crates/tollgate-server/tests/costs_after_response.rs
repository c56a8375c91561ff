//! Costs known only after the response (LLM tokens), the way Envoy and Kuadrant ask: check with
//! 0 hits on the request, charge the cost when the stream is done (Envoy's
//! `apply_on_stream_done` with the tokens as `hits_addend`; Kuadrant's `CheckRateLimit`, then
//! `Report`). The budget is a `mode: pooled` limit, which counts every hit past its limit, so a
//! response that used more than was left makes the next check over, until the window ends.
//! docs/server.md, "Costs known after the response", is the recipe these tests hold true; how
//! far it overshoots beside the library's reserve/settle is `tollgate simulate --costs`'s.

mod support;

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use support::{Server, descriptor, server_with, should_rate_limit};
use tollgate_server::serve::Storage;
use tollgate_testkit::RedisServer;

const BUDGET: &str = r#"
- namespace: llm
  name: tokens-per-minute
  max_value: 1000
  seconds: 60
  variables: ["descriptors[0].user"]
  mode: pooled
"#;

async fn each_storage(body: impl AsyncFn(&Server, &Storage)) {
    let redis = RedisServer::start();
    for storage in [Storage::Memory, Storage::Redis { url: redis.url(), prefix: format!("c{}:", std::process::id()) }] {
        let server = server_with(BUDGET, |c| c.storage = storage.clone()).await;
        body(&server, &storage).await;
        server.running.shutdown().await;
    }
}

/// The request path's descriptor: the user, with its own `hits_addend` of 0 (a check; a
/// request-level 0 means 1, as Envoy sends it).
fn check(user: &str) -> RateLimitRequest {
    let mut d = descriptor(&[("user", user)]);
    d.hits_addend = Some(UInt64Value { value: 0 });
    RateLimitRequest { domain: "llm".into(), descriptors: vec![d], hits_addend: 0 }
}

/// The stream-done descriptor: the tokens the response used.
fn charge(user: &str, tokens: u32) -> RateLimitRequest {
    RateLimitRequest { domain: "llm".into(), descriptors: vec![descriptor(&[("user", user)])], hits_addend: tokens }
}

#[tokio::test]
async fn envoy_checks_with_0_hits_and_charges_the_tokens_when_the_stream_is_done() {
    each_storage(async |server, storage| {
        let mut rls = server.rls().await;
        let ok = Code::Ok as i32;
        let over = Code::OverLimit as i32;
        let first = rls.should_rate_limit(check("alice")).await.unwrap().into_inner();
        assert_eq!((first.overall_code, first.statuses[0].limit_remaining), (ok, 1000), "{storage:?}");
        // 700, then 600 tokens: the second response takes the budget 300 past its limit. Envoy
        // ignores the answer to a stream-done call; the tokens are counted all the same.
        rls.should_rate_limit(charge("alice", 700)).await.unwrap();
        let ok_still = rls.should_rate_limit(check("alice")).await.unwrap().into_inner();
        assert_eq!((ok_still.overall_code, ok_still.statuses[0].limit_remaining), (ok, 300), "{storage:?}");
        rls.should_rate_limit(charge("alice", 600)).await.unwrap();
        let after = rls.should_rate_limit(check("alice")).await.unwrap().into_inner();
        assert_eq!((after.overall_code, after.statuses[0].limit_remaining), (over, 0), "{storage:?}: 1,300 used");
        let bob = should_rate_limit(&mut rls, "llm", check("bob").descriptors, 0).await;
        assert_eq!(bob.overall_code, ok, "{storage:?}: another user's budget");
        server.clock.advance(Duration::from_secs(60));
        let next = rls.should_rate_limit(check("alice")).await.unwrap().into_inner();
        assert_eq!((next.overall_code, next.statuses[0].limit_remaining), (ok, 1000), "{storage:?}: a new minute");
    })
    .await;
}

#[tokio::test]
async fn kuadrant_checks_then_reports_the_tokens() {
    each_storage(async |server, storage| {
        let ok = Code::Ok as i32;
        let over = Code::OverLimit as i32;
        let checked = server.kuadrant("CheckRateLimit", check("alice")).await.unwrap();
        assert_eq!(checked.overall_code, ok, "{storage:?}");
        server.kuadrant("Report", charge("alice", 1_300)).await.unwrap();
        let after = server.kuadrant("CheckRateLimit", check("alice")).await.unwrap();
        assert_eq!((after.overall_code, after.statuses[0].limit_remaining), (over, 0), "{storage:?}: 1,300 reported");
    })
    .await;
}
