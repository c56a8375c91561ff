//! How the bytes travel: the gRPC listener's connections ([`preface`]: a deadline to open the
//! HTTP/2 session) and its rate-limit calls ([`grpc`]), the HTTP listener's connections
//! ([`http1`]), RLQS's streams ([`rlqs`]), the socket both read through ([`socket`]), and TLS on
//! both ([`tls`]). The protocols' answers are framed
//! here; nothing here decides.

pub(crate) mod grpc;
pub(crate) mod http1;
pub(crate) mod preface;
pub(crate) mod rlqs;
pub(crate) mod socket;
pub(crate) mod tls;

/// Resolves when `stop` says so, or its sender is gone (every task of the server stops on it).
pub(crate) async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    // The borrow `wait_for` returns is dropped here, not held across the caller's awaits.
    let _ = stop.wait_for(|s| *s).await;
}
