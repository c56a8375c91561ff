//! An accepted TCP connection whose reads go through a [`ReadHook`] and whose writes go straight
//! to the socket: how the HTTP listener hands hyper the bytes it read first (`http1::Rewind`)
//! and how the gRPC listener holds a new connection to its preface deadline
//! (`preface::Deadline`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// What a read of a [`Socket`] does instead of reading the socket alone.
pub(super) trait ReadHook: Unpin {
    /// Fills `buf` as [`AsyncRead::poll_read`] would, from `tcp` or from the hook's own state.
    fn poll_read(&mut self, tcp: &mut TcpStream, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>>;
}

/// `tcp`, read through `hook`.
#[derive(Debug)]
pub(super) struct Socket<H> {
    pub(super) tcp: TcpStream,
    pub(super) hook: H,
}

impl<H: ReadHook> AsyncRead for Socket<H> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = &mut *self;
        me.hook.poll_read(&mut me.tcp, cx, buf)
    }
}

impl<H: Unpin> AsyncWrite for Socket<H> {
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
