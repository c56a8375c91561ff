//! The gRPC listener's connections over real sockets, in paused time (it moves only when every
//! task waits, straight to the next timer): silent ones and idle clients against
//! `grpc_read_timeout` (its TCP keep-alive, the kernel's, is checked in `serve::preface`).
//! And the `grpc_unary` fuzz target's properties, in a short form.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use hyper_util::rt::TokioIo;
use support::{descriptor, should_rate_limit};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tonic::transport::Endpoint;

const LIMITS: &str = r#"
- namespace: ns
  max_value: 100
  seconds: 60
  variables: ["descriptors[0].app_id"]
"#;

const TIMEOUT: Duration = Duration::from_secs(5);

/// What an HTTP/2 client sends first.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

async fn server(timeout: Option<Duration>) -> support::Server {
    support::server_with(LIMITS, |config| config.grpc_read_timeout = timeout).await
}

/// Reads (and drops: the server's SETTINGS frame) until the server closes the
/// connection, and says how long after `since` it did.
async fn closed_after(tcp: &mut TcpStream, since: Instant) -> Duration {
    let mut sink = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(600), tcp.read_to_end(&mut sink)).await;
    assert!(matches!(read, Ok(Ok(_)) | Ok(Err(_))), "never closed: {read:?}");
    since.elapsed()
}

fn within_a_tick(took: Duration, expected: Duration) -> bool {
    took >= expected && took < expected + Duration::from_millis(50)
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_sends_no_preface_in_time_is_closed() {
    let server = server(Some(TIMEOUT)).await;
    let opened = Instant::now();
    let mut silent = TcpStream::connect(server.running.grpc).await.unwrap();
    let took = closed_after(&mut silent, opened).await;
    assert!(within_a_tick(took, TIMEOUT), "{took:?}");
    // Part of the preface, 2 s in: the deadline counts from the opening.
    let opened = Instant::now();
    let mut slow = TcpStream::connect(server.running.grpc).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    slow.write_all(&PREFACE[..10]).await.unwrap();
    let took = closed_after(&mut slow, opened).await;
    assert!(within_a_tick(took, TIMEOUT), "{took:?}");
}

#[tokio::test(start_paused = true)]
async fn a_client_idle_long_past_the_read_timeout_keeps_its_connection() {
    let server = server(Some(TIMEOUT)).await;
    // A tonic client whose connections are counted: it would open a second one, silently, if
    // the server closed the first.
    let connections = Arc::new(AtomicUsize::new(0));
    let (addr, counted) = (server.running.grpc, connections.clone());
    let channel = Endpoint::from_static("http://tollgate")
        .connect_with_connector(tower::service_fn(move |_| {
            counted.fetch_add(1, Ordering::Relaxed);
            async move { TcpStream::connect(addr).await.map(TokioIo::new) }
        }))
        .await
        .unwrap();
    let mut client = RateLimitServiceClient::new(channel);
    for _ in 0..3 {
        let answer = should_rate_limit(&mut client, "ns", vec![descriptor(&[("app_id", "a")])], 1).await;
        assert_eq!(answer.overall_code, 1, "{answer:?}");
        // Twenty read timeouts without a call: the timeout is for opening, not for idling.
        tokio::time::sleep(20 * TIMEOUT).await;
    }
    assert_eq!(connections.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_a_silent_connection_at_most_the_read_timeout() {
    let server = server(Some(TIMEOUT)).await;
    let _silent = TcpStream::connect(server.running.grpc).await.unwrap();
    // Accepted before the shutdown starts.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(600), server.running.shutdown()).await.expect("shutdown hung");
    let took = started.elapsed();
    assert!(took <= TIMEOUT, "{took:?}");
}

#[tokio::test(start_paused = true)]
async fn without_a_read_timeout_a_silent_connection_stays_open() {
    let server = server(None).await;
    let mut silent = TcpStream::connect(server.running.grpc).await.unwrap();
    let mut settings = [0; 64];
    // The server's own SETTINGS frame, then nothing for an hour, and no close.
    assert!(silent.read(&mut settings).await.unwrap() > 0);
    let read = tokio::time::timeout(Duration::from_secs(3600), silent.read(&mut settings)).await;
    assert!(read.is_err(), "{read:?}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 300, ..Default::default() })]

    /// The `grpc_unary` fuzz target's properties (`serve::fuzzing`), on random inputs: answers
    /// framed as gRPC says, hits counted only for calls answered OK, once.
    #[test]
    fn any_framing_keeps_the_unary_properties(
        input in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        runtime.block_on(tollgate_server::serve::fuzzing::grpc_unary(&input));
    }
}
