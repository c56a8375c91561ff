//! An accepted TCP connection whose reads go through a [`ReadHook`] and whose writes go straight
//! to the socket, failing once the socket has taken nothing for a set time: how the HTTP
//! listener hands hyper the bytes it read first (`http1::Rewind`), and closes a connection whose
//! client leaves the answers unread, and how the gRPC listener holds a new connection to its
//! preface deadline (`preface::Deadline`).
//!
//! The connection is a [`Transport`]: a `TcpStream` when serving, or a TLS stream over one
//! ([`super::tls`]), an in-memory stream when the connection code is fuzzed (`serve::fuzzing`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

/// What a connection is carried on.
pub(crate) trait Transport: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Writes may stay in the transport's buffer until it is flushed (TLS records): the
    /// connection flushes after its writes. A constant, so a plain socket's path has no flush.
    const BUFFERS: bool = false;

    /// Writes what the connection takes now, without waiting or registering for a wakeup (as
    /// `TcpStream::try_write`); `WouldBlock` when it takes nothing.
    fn try_write(&mut self, buf: &[u8]) -> io::Result<usize>;
}

impl Transport for TcpStream {
    fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        TcpStream::try_write(self, buf)
    }
}

impl Transport for DuplexStream {
    fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // A waker that does nothing: a pending write is retried by the caller's `write_all`,
        // which registers its own.
        match Pin::new(self).poll_write(&mut Context::from_waker(std::task::Waker::noop()), buf) {
            Poll::Ready(written) => written,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

/// What a read answers.
pub(crate) type Polled = Poll<io::Result<()>>;

/// What a read of a [`Socket`] does instead of reading the socket alone.
pub(crate) trait ReadHook: Unpin {
    /// Fills `buf` as [`AsyncRead::poll_read`] would, from `tcp` or from the hook's own state.
    fn poll_read<T: AsyncRead + Unpin>(&mut self, tcp: &mut T, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Polled;
}

/// `tcp`, read through `hook`.
#[derive(Debug)]
pub(crate) struct Socket<H, T = TcpStream> {
    pub(super) tcp: T,
    pub(super) hook: H,
    /// How long a write may wait for room in the socket's buffer (`None`: for ever).
    write_timeout: Option<Duration>,
    /// Set when a write found the buffer full, dropped at the next write that goes through; the
    /// only allocation, and only for a client that is not reading.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<H, T> Socket<H, T> {
    /// `tcp` read through `hook`, its writes failing with `TimedOut` once the socket has taken
    /// nothing for `write_timeout`.
    pub(super) fn new(tcp: T, hook: H, write_timeout: Option<Duration>) -> Socket<H, T> {
        Socket { tcp, hook, write_timeout, stalled: None }
    }

    /// What a write that wrote (or failed) returns; a pending one fails once stalled too long.
    fn stall<R>(&mut self, cx: &mut Context<'_>, wrote: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        let Poll::Pending = wrote else {
            self.stalled = None;
            return wrote;
        };
        let Some(timeout) = self.write_timeout else { return Poll::Pending };
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        timed_out(stalled.as_mut(), cx, || "the client read nothing of the answers within the read timeout".into())
    }
}

/// How a read or write that is still pending past its deadline ends: `Pending` (with `cx` woken
/// when `deadline` passes) until then, after it an error of kind `TimedOut` saying `why`; the
/// caller closes the connection on it.
pub(super) fn timed_out<T>(
    deadline: Pin<&mut Sleep>,
    cx: &mut Context<'_>,
    why: impl FnOnce() -> String,
) -> Poll<io::Result<T>> {
    deadline.poll(cx).map(|()| Err(io::Error::new(io::ErrorKind::TimedOut, why())))
}

impl<H: ReadHook, T: AsyncRead + Unpin> AsyncRead for Socket<H, T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Polled {
        let me = &mut *self;
        me.hook.poll_read(&mut me.tcp, cx, buf)
    }
}

impl<H: Unpin, T: AsyncWrite + Unpin> AsyncWrite for Socket<H, T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let wrote = Pin::new(&mut self.tcp).poll_write(cx, buf);
        self.stall(cx, wrote)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let wrote = Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs);
        self.stall(cx, wrote)
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
