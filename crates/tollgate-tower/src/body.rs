//! [`RateLimitBody`]: the response body, holding the request's permits until it has been sent
//! in full or dropped (a client that disconnects mid-stream frees its concurrency slot), and
//! settling the reservations among them when it ends.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Extensions, HeaderMap};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tollgate::BoxFuture;

use crate::policy::Policies;
use crate::settle::Reserved;

/// What an admitted response holds until its body ends: the policies' permit. Dropped, it
/// releases what it holds (a concurrency permit) and leaves its reservations' estimates;
/// [`end`] settles them first.
pub(crate) trait Held: Send {
    /// Calls `f` on each reservation held.
    fn each_reserved(&mut self, f: &mut dyn FnMut(&mut Reserved));
}

/// The permit of policies `P`, held.
pub(crate) struct Permit<P: Policies>(pub(crate) P::Permit);

impl<P: Policies> Held for Permit<P> {
    fn each_reserved(&mut self, f: &mut dyn FnMut(&mut Reserved)) {
        P::each_reserved(&mut self.0, f);
    }
}

/// The response's head arrived: reservations read their costs from its headers or extensions.
/// False when there are none.
pub(crate) fn read_head(held: &mut dyn Held, headers: &HeaderMap, extensions: &Extensions) -> bool {
    let mut any = false;
    held.each_reserved(&mut |r| {
        any = true;
        r.read_head(headers, extensions);
    });
    any
}

/// The body ended: releases what is held and settles the reservations; a settle answered later
/// (a distributed limiter's) is returned, to be driven before the end is passed on.
pub(crate) fn end(mut held: Box<dyn Held>) -> Option<BoxFuture<()>> {
    let mut pending = Vec::new();
    held.each_reserved(&mut |r| pending.extend(r.finish()));
    drop(held);
    match pending.len() {
        0 => None,
        1 => pending.pop(),
        _ => Some(Box::pin(async move {
            for settle in pending {
                settle.await;
            }
        })),
    }
}

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
            held: Option<Box<dyn Held>>,
            // The body's last frame (`None`: its end), passed on once the settle is answered.
            ending: Option<(BoxFuture<()>, Option<Frame<Bytes>>)>,
        },
        Rejected {
            bytes: Option<Bytes>,
        },
    }
}

impl<B> RateLimitBody<B> {
    pub(crate) fn inner(body: B, held: Option<Box<dyn Held>>) -> Self {
        let kind = match held {
            None => Kind::Plain { body },
            Some(held) => Kind::Boxed { other: Box::pin(Other::Holding { body, held: Some(held), ending: None }) },
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
                Other::Holding { held, ending, .. } => d
                    .field("kind", &"inner")
                    .field("holds_permit", &held.is_some())
                    .field("settling", &ending.is_some()),
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
                OtherProj::Holding { mut body, held, ending } => loop {
                    if let Some((settle, _)) = ending {
                        std::task::ready!(settle.as_mut().poll(cx));
                        let last = ending.take().and_then(|(_, last)| last);
                        return Poll::Ready(last.map(Ok));
                    }
                    let polled = std::task::ready!(body.as_mut().poll_frame(cx));
                    // The end is the last frame (a server drops the body after it without asking
                    // for more), trailers, or the end of the stream.
                    let ended = match &polled {
                        None => true,
                        Some(Ok(frame)) => match frame.trailers_ref() {
                            Some(trailers) => {
                                if let Some(held) = held.as_deref_mut() {
                                    held.each_reserved(&mut |r| r.read_trailers(trailers));
                                }
                                true
                            }
                            None => body.is_end_stream(),
                        },
                        Some(Err(_)) => {
                            // Not sent to its end: released, the estimates stand.
                            held.take();
                            return Poll::Ready(polled);
                        }
                    };
                    // The body is done: release and settle now, not whenever the connection drops it.
                    let Some(settle) = (if ended { held.take().and_then(end) } else { None }) else {
                        return Poll::Ready(polled);
                    };
                    let last = match polled {
                        Some(Ok(frame)) => Some(frame),
                        _ => None,
                    };
                    *ending = Some((settle, last));
                },
                OtherProj::Rejected { bytes } => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Plain { body } => body.is_end_stream(),
            Kind::Boxed { other } => match &**other {
                Other::Holding { body, ending, .. } => ending.is_none() && body.is_end_stream(),
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
