//! Overhead of the layer per request over a no-op service, side by side with `tower_governor`
//! on the same quota and key (peer IP), in-process `oneshot` calls; and two limits in one layer
//! (`RateLimitLayer::new(a).and(b)`) beside two stacked `GovernorLayer`s.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use futures::executor::block_on;
use http::{Request, Response};
use http_body_util::Empty;
use tollgate::{Keyed, Quota, TokenBucket};
use tollgate_tower::{ClientIp, Policy, RateLimitLayer};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::PeerIpKeyExtractor;

fn request(ip: u32) -> Request<Empty<Bytes>> {
    let mut req = Request::new(Empty::new());
    let addr = SocketAddr::from((std::net::Ipv4Addr::from(ip), 4000));
    req.extensions_mut().insert(ConnectInfo(addr));
    req
}

fn noop() -> impl Service<Request<Empty<Bytes>>, Response = Response<Body>, Error = Infallible> + Clone {
    service_fn(|_req: Request<Empty<Bytes>>| async { Ok::<_, Infallible>(Response::new(Body::empty())) })
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("layer_overhead");
    g.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(30);

    // Every request admitted, and every client stays active (1 per second, burst 1e9: a key hit at
    // least once a second never goes idle, so neither map sweeps and re-inserts keys): the path a busy client's requests take.
    let quota = Quota::per_second(1).unwrap().with_burst(1_000_000_000).unwrap();
    let policy = |name| Policy::new(name, ClientIp::new(), Keyed::new(TokenBucket::new(quota)));
    let ours = RateLimitLayer::new(policy("per-ip")).layer(noop());
    let ours_two = RateLimitLayer::new(policy("per-ip")).and(policy("per-ip-again")).layer(noop());
    // Each layer its own limiter, as each Tollgate policy has its own.
    let governor = || {
        let config = GovernorConfigBuilder::default()
            .per_second(1)
            .burst_size(1_000_000_000)
            .key_extractor(PeerIpKeyExtractor)
            .finish()
            .unwrap();
        tower_governor::GovernorLayer::new(config)
    };
    let theirs = governor().layer(noop());
    let theirs_two = governor().layer(governor().layer(noop()));
    let base = noop();

    for (name, keys) in [("one_ip", 1u32), ("1000_ips", 1000)] {
        let mut i = 0u32;
        g.bench_function(format!("noop/{name}"), |b| {
            b.iter(|| {
                i = (i + 1) % keys;
                block_on(base.clone().oneshot(request(i))).unwrap()
            })
        });
        g.bench_function(format!("tollgate/{name}"), |b| {
            b.iter(|| {
                i = (i + 1) % keys;
                block_on(ours.clone().oneshot(request(i))).unwrap()
            })
        });
        g.bench_function(format!("tower_governor/{name}"), |b| {
            b.iter(|| {
                i = (i + 1) % keys;
                block_on(theirs.clone().oneshot(request(i))).unwrap()
            })
        });
    }
    g.bench_function("tollgate/two_limits_one_ip", |b| {
        b.iter(|| block_on(ours_two.clone().oneshot(request(0))).unwrap())
    });
    g.bench_function("tower_governor/two_limits_one_ip", |b| {
        b.iter(|| block_on(theirs_two.clone().oneshot(request(0))).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
