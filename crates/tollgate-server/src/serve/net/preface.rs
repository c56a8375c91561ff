//! The gRPC listener's connections: each given a deadline to open its HTTP/2 session, and TCP
//! keep-alive to find peers that are gone.
//!
//! hyper waits for a new HTTP/2 connection's preface without a timer: a client that connects and
//! sends nothing, or a few bytes, would hold the connection, and a graceful shutdown waiting for
//! it, for ever. [`Deadline`] makes a read fail once the deadline passes before the client's
//! 24-byte preface has arrived; after it, the timer is dropped and reads cost what the socket's
//! do. A peer whose host dies or drops off the network later is found by the kernel's TCP
//! keep-alive probes, at no cost per request; hyper's HTTP/2 PINGs would find it too, but they
//! lock a mutex and read the clock on every frame received: 2–4 % more CPU per RLS decision,
//! measured side by side (three rounds, server and load pinned to a core each).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};

use super::socket::{Polled, ReadHook, Socket, timed_out};
use super::tls::Tls;

/// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`: what every HTTP/2 client sends first (RFC 9113, 3.4).
const PREFACE_LEN: usize = 24;

/// The connections `listener` accepts (`TCP_NODELAY` set), each with `timeout` to send its
/// preface and kernel keep-alive probes after `timeout` of silence (three, a third of it apart:
/// a dead peer's connection is reset about twice `timeout` after its last packet). `None`:
/// neither.
pub(crate) fn incoming(
    listener: TcpListener,
    timeout: Option<Duration>,
) -> impl Stream<Item = io::Result<Preface>> + Send + 'static {
    // The kernel counts keep-alive in whole seconds.
    let whole = |t: Duration| Duration::from_secs(t.as_secs_f64().ceil().max(1.0) as u64);
    let incoming = TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(timeout.map(whole))
        .with_keepalive_interval(timeout.map(|t| whole(t / 3)))
        .with_keepalive_retries(timeout.map(|_| 3));
    // No write timeout: HTTP/2's flow control stops writing to a client that reads nothing
    // long before the socket's buffer fills.
    incoming.map(move |accepted| accepted.map(|tcp| Socket::new(tcp, Deadline::new(timeout), None)))
}

/// The same over TLS: each connection's handshake on a task of its own, within `timeout`, then
/// `timeout` again for the preface (read from the TLS stream: the HTTP/2 bytes, not the
/// handshake's). Connections whose handshake fails are dropped (and counted by `tls`). The
/// accepting task ends when the stream is dropped.
pub(crate) fn incoming_tls(
    listener: TcpListener,
    timeout: Option<Duration>,
    tls: Arc<Tls>,
) -> impl Stream<Item = io::Result<Preface<TlsStream<TcpStream>>>> + Send + 'static {
    let mut accepted = Box::pin(incoming(listener, timeout));
    // Handshakes done and not yet taken by the server: a few, so a burst waits for it to take
    // them rather than holding memory.
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let preface = tokio::select! {
                next = accepted.next() => match next {
                    Some(Ok(preface)) => preface,
                    // As tonic does with its own incoming stream: a failed accept is logged and
                    // accepting goes on.
                    Some(Err(e)) => {
                        tracing::debug!("gRPC accept error: {e}");
                        continue;
                    }
                    None => return,
                },
                () = tx.closed() => return,
            };
            let (tls, tx) = (tls.clone(), tx.clone());
            tokio::spawn(async move {
                if let Ok(stream) = tls.accept(preface.tcp, timeout).await {
                    let _ = tx.send(Ok(Socket::new(stream, Deadline::new(timeout), None))).await;
                }
            });
        }
    });
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// An accepted connection whose reads fail with `TimedOut` if the preface has not arrived whole
/// by its deadline.
pub(crate) type Preface<T = TcpStream> = Socket<Deadline, T>;

/// Until the preface is read: its deadline (boxed because `Sleep` is `!Unpin`, once per
/// connection) and the bytes read so far.
#[derive(Debug)]
pub(crate) struct Deadline {
    sleep: Option<Pin<Box<Sleep>>>,
    read: usize,
}

impl Deadline {
    fn new(timeout: Option<Duration>) -> Deadline {
        Deadline { sleep: timeout.map(|t| Box::pin(tokio::time::sleep(t))), read: 0 }
    }
}

impl ReadHook for Deadline {
    fn poll_read<T: AsyncRead + Unpin>(&mut self, tcp: &mut T, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Polled {
        let Some(sleep) = &mut self.sleep else { return Pin::new(tcp).poll_read(cx, buf) };
        let before = buf.filled().len();
        match Pin::new(tcp).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                self.read += n;
                // At the end of the stream too: hyper sees it and closes.
                if self.read >= PREFACE_LEN || n == 0 {
                    self.sleep = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => timed_out(sleep.as_mut(), cx, || "no HTTP/2 preface within the read timeout".into()),
            failed => failed,
        }
    }
}

impl Connected for Preface {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.tcp.connect_info()
    }
}

impl Connected for Preface<TlsStream<TcpStream>> {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.tcp.get_ref().0.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use socket2::SockRef;
    use tokio::net::TcpStream;

    use super::*;

    /// The server's side of a connection accepted with `timeout`.
    async fn accepted(timeout: Option<Duration>) -> Preface {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = Box::pin(incoming(listener, timeout));
        let _client = TcpStream::connect(addr).await.unwrap();
        let preface = incoming.next().await.unwrap().unwrap();
        assert!(preface.tcp.nodelay().unwrap());
        preface
    }

    #[tokio::test]
    async fn accepted_connections_probe_a_silent_peer_after_the_timeout() {
        let preface = accepted(Some(Duration::from_secs(30))).await;
        let socket = SockRef::from(&preface.tcp);
        assert!(socket.keepalive().unwrap());
        assert_eq!(socket.tcp_keepalive_time().unwrap(), Duration::from_secs(30));
        assert_eq!(socket.tcp_keepalive_interval().unwrap(), Duration::from_secs(10));
        assert_eq!(socket.tcp_keepalive_retries().unwrap(), 3);
        // Under a second: rounded up, never 0 (which the kernel refuses).
        let preface = accepted(Some(Duration::from_millis(500))).await;
        let socket = SockRef::from(&preface.tcp);
        assert_eq!(socket.tcp_keepalive_time().unwrap(), Duration::from_secs(1));
        assert_eq!(socket.tcp_keepalive_interval().unwrap(), Duration::from_secs(1));
    }

    #[tokio::test]
    async fn without_a_timeout_nothing_probes() {
        assert!(!SockRef::from(&accepted(None).await.tcp).keepalive().unwrap());
    }
}
