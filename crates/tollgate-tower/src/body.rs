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
    // The common case, a body that holds nothing, is the inner body alone: a response is then no
    // bigger than the inner one, and moving it through `oneshot` and the server costs no more
    // (a bigger one is copied out of line at every hop, and those copies stall). The rest is
    // boxed behind one pointer, which fits beside the inner body's own niche.
    #[project = Proj]
    enum Kind<B> {
        Plain {
            #[pin]
            body: B,
        },
        Boxed {
            other: Pin<Box<Other<B>>>,
        },
    }
}

pin_project! {
    #[project = OtherProj]
    enum Other<B> {
        Holding {
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
        let kind = match permit {
            None => Kind::Plain { body },
            Some(permit) => Kind::Boxed { other: Box::pin(Other::Holding { body, permit: Some(permit) }) },
        };
        RateLimitBody { kind }
    }

    /// The inner body, holding nothing.
    #[inline]
    pub(crate) fn plain(body: B) -> Self {
        RateLimitBody { kind: Kind::Plain { body } }
    }

    pub(crate) fn rejected(bytes: Bytes) -> Self {
        RateLimitBody { kind: Kind::Boxed { other: Box::pin(Other::Rejected { bytes: Some(bytes) }) } }
    }
}

impl<B> std::fmt::Debug for RateLimitBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("RateLimitBody");
        match &self.kind {
            Kind::Plain { .. } => d.field("kind", &"inner").field("holds_permit", &false),
            Kind::Boxed { other } => match &**other {
                Other::Holding { permit, .. } => d.field("kind", &"inner").field("holds_permit", &permit.is_some()),
                Other::Rejected { bytes } => d.field("kind", &"rejected").field("bytes", bytes),
            },
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
            Proj::Plain { body } => body.poll_frame(cx),
            Proj::Boxed { other } => match other.as_mut().project() {
                OtherProj::Holding { body, permit } => {
                    let polled = body.poll_frame(cx);
                    if let Poll::Ready(None | Some(Err(_))) = &polled {
                        // The body is done: release now, not whenever the connection drops it.
                        permit.take();
                    }
                    polled
                }
                OtherProj::Rejected { bytes } => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Plain { body } => body.is_end_stream(),
            Kind::Boxed { other } => match &**other {
                Other::Holding { body, .. } => body.is_end_stream(),
                Other::Rejected { bytes } => bytes.is_none(),
            },
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Plain { body } => body.size_hint(),
            Kind::Boxed { other } => match &**other {
                Other::Holding { body, .. } => body.size_hint(),
                Other::Rejected { bytes } => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            },
        }
    }
}

#[cfg(all(test, feature = "axum"))]
mod tests {
    use super::*;

    #[test]
    fn a_body_that_holds_nothing_is_no_bigger_than_the_inner_one() {
        // What keeps the layer's responses as cheap to move through `oneshot` and the server as
        // the inner service's: a bigger response is copied out of line at every hop.
        assert_eq!(size_of::<RateLimitBody<axum::body::Body>>(), size_of::<axum::body::Body>());
        assert_eq!(
            size_of::<http::Response<RateLimitBody<axum::body::Body>>>(),
            size_of::<http::Response<axum::body::Body>>()
        );
    }
}
