//! [`RateLimitBody`]: the response body, holding the request's permits until it has been sent
//! in full or dropped (a client that disconnects mid-stream frees its concurrency slot).

use std::any::Any;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The inner service's body (holding permits while it streams), or a rejection's body.
    pub struct RateLimitBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = Proj]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
            permit: Option<Box<dyn Any + Send>>,
        },
        Rejected {
            bytes: Option<Bytes>,
        },
    }
}

impl<B> RateLimitBody<B> {
    pub(crate) fn inner(body: B, permit: Option<Box<dyn Any + Send>>) -> Self {
        RateLimitBody { kind: Kind::Inner { body, permit } }
    }

    pub(crate) fn rejected(bytes: Bytes) -> Self {
        RateLimitBody { kind: Kind::Rejected { bytes: Some(bytes) } }
    }

    /// Turns a rejection body into one typed for any inner body.
    pub(crate) fn cast<C>(self) -> RateLimitBody<C> {
        match self.kind {
            Kind::Rejected { bytes } => RateLimitBody { kind: Kind::Rejected { bytes } },
            Kind::Inner { .. } => unreachable!("only rejection bodies are cast"),
        }
    }
}

impl<B> std::fmt::Debug for RateLimitBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("RateLimitBody");
        match &self.kind {
            Kind::Inner { permit, .. } => d.field("kind", &"inner").field("holds_permit", &permit.is_some()),
            Kind::Rejected { bytes } => d.field("kind", &"rejected").field("bytes", bytes),
        };
        d.finish_non_exhaustive()
    }
}

impl<B> Body for RateLimitBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            Proj::Inner { body, permit } => {
                let polled = body.poll_frame(cx);
                if let Poll::Ready(None | Some(Err(_))) = &polled {
                    // The body is done: release now, not whenever the connection drops it.
                    permit.take();
                }
                polled
            }
            Proj::Rejected { bytes } => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Rejected { bytes } => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Rejected { bytes } => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}
