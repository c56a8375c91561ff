//! A fixed number of requests through one layer over a no-op service, for instruction counts that
//! do not depend on the machine's load (see `.ci/instructions`, which subtracts the no-op's own
//! count to get the layer's overhead).
//!
//! Paths: `layer/{noop,tollgate,tower_governor}` (one client IP), `layer_1k/...` (1,000 IPs), and
//! `layer_two/...` (one client IP, two limits: two policies all-or-nothing in one Tollgate layer,
//! two `GovernorLayer`s stacked).

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
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
    req.extensions_mut().insert(ConnectInfo(SocketAddr::from((std::net::Ipv4Addr::from(ip), 4000))));
    req
}

fn noop() -> impl Service<Request<Empty<Bytes>>, Response = Response<Body>, Error = Infallible> + Clone {
    service_fn(|_req: Request<Empty<Bytes>>| async { Ok::<_, Infallible>(Response::new(Body::empty())) })
}

/// Sends `count` requests from `ips` client addresses through `service`; `.ci/instructions` counts
/// only inside this function.
#[inline(never)]
fn measured<S>(service: S, ips: u32, count: u64)
where
    S: Service<Request<Empty<Bytes>>, Error = Infallible> + Clone,
{
    for i in 0..count {
        let ip = (i % u64::from(ips)) as u32;
        std::hint::black_box(block_on(service.clone().oneshot(request(ip))).unwrap_or_else(|e| match e {}));
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: layer_decisions <layer|layer_1k|layer_two>/<noop|tollgate|tower_governor> <count>";
    let path = args.next().ok_or(usage)?;
    let count: u64 = args.next().ok_or(usage)?.parse()?;
    let (walk, side) = path.split_once('/').ok_or(usage)?;
    let (ips, limits) = match walk {
        "layer" => (1, 1),
        "layer_1k" => (1000, 1),
        "layer_two" => (1, 2),
        _ => return Err(usage.into()),
    };
    // Every request admitted, and every client stays active (1 per second, burst 1e9: a key hit at
    // least once a second never goes idle, so neither map sweeps and re-inserts keys): the path a busy client's requests take.
    let quota = Quota::per_second(1)?.with_burst(1_000_000_000)?;
    match side {
        "noop" => measured(noop(), ips, count),
        "tollgate" => {
            let policy = |name| Policy::new(name, ClientIp::new(), Keyed::new(TokenBucket::new(quota)));
            let layer = RateLimitLayer::new(policy("per-ip"));
            if limits == 1 {
                measured(layer.layer(noop()), ips, count)
            } else {
                measured(layer.and(policy("per-ip-2")).layer(noop()), ips, count)
            }
        }
        "tower_governor" => {
            // Each layer its own limiter, as each Tollgate policy has its own.
            let governor = || {
                let config = GovernorConfigBuilder::default()
                    .per_second(1)
                    .burst_size(1_000_000_000)
                    .key_extractor(PeerIpKeyExtractor)
                    .finish()
                    .ok_or("tower_governor config");
                config.map(tower_governor::GovernorLayer::new)
            };
            if limits == 1 {
                measured(governor()?.layer(noop()), ips, count)
            } else {
                measured(governor()?.layer(governor()?.layer(noop())), ips, count)
            }
        }
        _ => return Err(usage.into()),
    }
    Ok(())
}
