//! Shared by the HTTP tests: an axum app served on a free port with peer addresses; a streamed
//! response body the test feeds.

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt;
use http_body::Frame;
use http_body_util::StreamBody;
use tokio::sync::{mpsc, oneshot};

pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await.unwrap();
    });
    addr
}

/// A body whose frames the test sends, and which reports when the server drops it (a client that
/// went away, or the end of the stream).
#[allow(dead_code)] // not every test binary streams
pub fn streamed() -> (mpsc::Sender<Frame<Bytes>>, oneshot::Receiver<()>, Body) {
    let (tx, mut rx) = mpsc::channel::<Frame<Bytes>>(4);
    let (dropped_tx, dropped_rx) = oneshot::channel();
    struct OnDrop(Option<oneshot::Sender<()>>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            let _ = self.0.take().map(|t| t.send(()));
        }
    }
    let guard = OnDrop(Some(dropped_tx));
    let frames = futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).map(move |frame| {
        let _ = &guard;
        Ok::<_, Infallible>(frame)
    });
    (tx, dropped_rx, Body::new(StreamBody::new(frames)))
}
