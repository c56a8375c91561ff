//! An axum app with Tollgate in front, ready to copy:
//! per-IP token bucket on every route, a per-API-key hourly quota weighted by method,
//! at most 2 streaming downloads at once per client, and JSON problem responses.
//!
//! ```sh
//! cargo run --example axum_app
//! curl -i localhost:3000/              # RateLimit-Policy / RateLimit headers on every answer
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code} ' localhost:3000/; done; echo
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use bytes::Bytes;
use tollgate::{Concurrency, Keyed, Quota, TokenBucket};
use tollgate_tower::{ClientIp, Header, MissingKey, Policy, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 10 requests per second per client IP, bursts of 10. Behind a reverse proxy, list it with
    // `ClientIp::new().trust_proxies(["10.0.0.0/8"])?` so X-Forwarded-For is honoured from it only.
    let per_ip = Policy::new("per-ip", ClientIp::new(), Keyed::new(TokenBucket::new(Quota::per_second(10)?)));

    // 1000 cost units per hour per API key; writes cost 10. Anonymous callers share one bucket.
    let per_key =
        Policy::new("per-key", Header::new("x-api-key".parse()?), Keyed::new(TokenBucket::new(Quota::per_hour(1000)?)))
            .cost(|req| if req.method == http::Method::GET { 1 } else { 10 })
            .on_missing_key(MissingKey::Shared(Bytes::from_static(b"anonymous")));

    // Downloads: at most 2 in flight per client, held until the body has been sent.
    let downloads = Policy::new("downloads", ClientIp::new(), Keyed::new(Concurrency::new(2)?));

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/items", post(|| async { "created\n" }))
        .route("/download", get(download).route_layer(RateLimitLayer::new(downloads).problem_json()))
        .layer(RateLimitLayer::new(per_ip).and(per_key).headers_on_success(true).problem_json());

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
    Ok(())
}

/// A slow body: 5 chunks, 200 ms apart.
async fn download() -> Body {
    let chunks = futures::stream::unfold(0u32, |i| async move {
        if i == 5 {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(format!("chunk {i}\n"))), i + 1))
    });
    Body::from_stream(chunks)
}
