//! The layer's allow path allocates nothing of its own: a request through `RateLimit` over a no-op
//! service makes exactly the allocations the no-op service alone makes (counted by a global
//! allocator, on this thread, after a first request has created the key).

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use futures::executor::block_on;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use tollgate::{Keyed, Quota, TokenBucket};
use tollgate_tower::{ClientIp, Policy, RateLimitLayer};
use tower::{Layer, Service, ServiceExt, service_fn};

#[path = "../../tollgate/tests/support/counting.rs"]
mod counting;
use counting::Counting;

#[global_allocator]
static GLOBAL: Counting = Counting;

fn request(ip: u8) -> Request<Empty<Bytes>> {
    let mut req = Request::new(Empty::new());
    req.extensions_mut().insert(ConnectInfo(SocketAddr::from(([10, 0, 0, ip], 4000))));
    req
}

fn noop() -> impl Service<Request<Empty<Bytes>>, Response = Response<Body>, Error = Infallible> + Clone {
    service_fn(|_req: Request<Empty<Bytes>>| async { Ok::<_, Infallible>(Response::new(Body::empty())) })
}

/// Allocations of 100 requests (built beforehand) through `service`, responses dropped.
fn allocations_of_100<S, B>(mut service: S) -> u64
where
    S: Service<Request<Empty<Bytes>>, Response = Response<B>, Error = Infallible>,
{
    let requests: Vec<_> = (0..100).map(|i| request(i % 10)).collect();
    counting::allocations(|| {
        for req in requests {
            block_on(service.ready()).unwrap_or_else(|e| match e {});
            let res = block_on(service.call(req)).unwrap_or_else(|e| match e {});
            assert_eq!(res.status(), StatusCode::OK);
        }
    })
}

/// Allocations of 100 admitted requests through `limited` beyond the inner service's own, once
/// the first request from each client has created its key.
fn allocations_beyond_the_inner_service<S, B>(mut limited: S) -> i64
where
    S: Service<Request<Empty<Bytes>>, Response = Response<B>, Error = Infallible>,
{
    for ip in 0..10 {
        block_on(limited.ready()).unwrap_or_else(|e| match e {});
        drop(block_on(limited.call(request(ip))));
    }
    let inner = allocations_of_100(noop());
    allocations_of_100(limited) as i64 - inner as i64
}

fn quota() -> Quota {
    Quota::per_second(1).unwrap().with_burst(1_000_000).unwrap()
}

#[test]
fn the_allow_path_allocates_nothing_beyond_the_inner_service() {
    let limited = RateLimitLayer::new(Policy::new("per-ip", ClientIp::new(), Keyed::new(TokenBucket::new(quota()))))
        .layer(noop());
    let extra = allocations_beyond_the_inner_service(limited);
    assert_eq!(extra, 0, "the layer allocated {extra} times in 100 admitted requests");
    // Not vacuous: the counter counts (building a body's response allocates nothing, a Vec does).
    assert!(counting::count() > 0);
}

#[test]
fn two_policies_decided_all_or_nothing_allocate_nothing_either() {
    let policy = |name| Policy::new(name, ClientIp::new(), Keyed::new(TokenBucket::new(quota())));
    let limited = RateLimitLayer::new(policy("per-ip")).and(policy("per-ip-again")).layer(noop());
    let extra = allocations_beyond_the_inner_service(limited);
    assert_eq!(extra, 0, "two policies allocated {extra} times in 100 admitted requests");
}
