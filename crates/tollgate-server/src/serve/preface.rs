//! The gRPC listener's connections, each given a deadline to open its HTTP/2 session.
//!
//! hyper waits for a new HTTP/2 connection's preface without a timer, and its keep-alive pings
//! (which close a connection whose peer stops answering, see [`super::start`]) begin only after
//! it: a client that connects and sends nothing, or a few bytes, would hold the connection, and
//! a graceful shutdown waiting for it, for ever. [`Preface`] makes a read fail once the deadline
//! passes before the client's 24-byte preface has arrived; after it, the timer is dropped and
//! reads cost what the socket's do.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};

/// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`: what every HTTP/2 client sends first (RFC 9113, 3.4).
const PREFACE_LEN: usize = 24;

/// `incoming`'s connections, each with `timeout` to send its preface (`None`: no deadline).
pub(super) fn deadlines(
    incoming: TcpIncoming,
    timeout: Option<Duration>,
) -> impl Stream<Item = io::Result<Preface>> + Send + 'static {
    incoming.map(move |accepted| accepted.map(|tcp| Preface::new(tcp, timeout)))
}

/// An accepted connection whose reads fail with `TimedOut` if the preface has not arrived whole
/// by its deadline.
#[derive(Debug)]
pub(super) struct Preface {
    tcp: TcpStream,
    /// Until the preface is read; boxed because `Sleep` is `!Unpin`, once per connection.
    deadline: Option<Pin<Box<Sleep>>>,
    read: usize,
}

impl Preface {
    fn new(tcp: TcpStream, timeout: Option<Duration>) -> Preface {
        Preface { tcp, deadline: timeout.map(|t| Box::pin(tokio::time::sleep(t))), read: 0 }
    }
}

impl AsyncRead for Preface {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = &mut *self;
        let Some(deadline) = &mut me.deadline else { return Pin::new(&mut me.tcp).poll_read(cx, buf) };
        let before = buf.filled().len();
        match Pin::new(&mut me.tcp).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                me.read += n;
                // At the end of the stream too: hyper sees it and closes.
                if me.read >= PREFACE_LEN || n == 0 {
                    me.deadline = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if deadline.as_mut().poll(cx).is_ready() => {
                me.deadline = None;
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "no HTTP/2 preface within the read timeout")))
            }
            other => other,
        }
    }
}

impl AsyncWrite for Preface {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

impl Connected for Preface {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.tcp.connect_info()
    }
}
