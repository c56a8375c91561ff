//! Compile-time check: policies, layers and services can be shared across threads and tasks, as
//! tower and axum require; the response future and body can move between threads.

use std::net::IpAddr;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use tollgate::{Concurrency, Keyed, TokenBucket};
use tollgate_redis::RedisLimiter;
use tollgate_tower::{
    Both, ClientIp, Denied, Extension, Global, Header, KeyFn, Policy, PolicyPermit, PolicyState, RateLimit,
    RateLimitBody, RateLimitLayer, RequestInfo, ResponseFuture,
};

fn assert_send_sync<T: Send + Sync>() {}
fn assert_send<T: Send>() {}

type PerIp = Policy<ClientIp, Keyed<IpAddr, TokenBucket>>;
type InFlight = Policy<Header, Keyed<Bytes, Concurrency>>;
type Distributed = Policy<Global, RedisLimiter>;
type ByFn = Policy<KeyFn<fn(&RequestInfo<'_>) -> Option<String>>, Keyed<String, TokenBucket>>;

#[test]
fn public_types_are_send_and_sync() {
    assert_send_sync::<PerIp>();
    assert_send_sync::<InFlight>();
    assert_send_sync::<Distributed>();
    assert_send_sync::<ByFn>();
    assert_send_sync::<Policy<Extension<u64>, Keyed<u64, TokenBucket>>>();
    assert_send_sync::<Both<PerIp, InFlight>>();
    assert_send_sync::<RateLimitLayer<PerIp>>();
    assert_send_sync::<RateLimitLayer<Both<Both<PerIp, InFlight>, Distributed>>>();
    assert_send_sync::<RateLimit<Router, PerIp>>();
    assert_send_sync::<RateLimit<Router, Both<PerIp, Distributed>>>();
    assert_send_sync::<PolicyPermit>();
    assert_send_sync::<Denied>();
    assert_send_sync::<PolicyState>();
    // Futures and bodies only need to move between threads.
    assert_send::<ResponseFuture<Router, Body, PerIp>>();
    assert_send::<ResponseFuture<Router, Body, Both<PerIp, Distributed>>>();
    assert_send::<RateLimitBody<Body>>();
}
