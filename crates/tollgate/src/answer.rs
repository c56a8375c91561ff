//! [`Answer`]: a result that is ready now (an in-process limiter) or after I/O (a distributed one),
//! without boxing or awaiting on the ready path.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::decision::{Lease, Rejected};
use crate::snapshot::Meta;

/// A future that owns everything it needs, so it can outlive the call that made it.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// An answer now, or a future of it.
///
/// In-process limiters always answer [`Answer::Ready`], so callers that inspect the answer pay
/// neither an allocation nor a poll; `.await` works on either.
///
/// `F` is the pending answer's future: a boxed one that owns what it needs ([`BoxFuture`], what
/// every limiter answers with), unless a caller's answers borrow (a server store's future borrows
/// the call it decides), which name their own.
///
/// ```
/// use tollgate::{Answer, Limiter, Quota, RateLimiter, TokenBucket};
/// let limiter = Limiter::new(TokenBucket::new(Quota::per_second(1)?));
/// match limiter.decide(&(), 1) {
///     Answer::Ready(Ok(lease)) => assert_eq!(lease.permits(), 1),
///     Answer::Ready(Err(no)) => panic!("a full bucket admits: {no}"),
///     Answer::Pending(_) => unreachable!("in-process limiters answer at once"),
/// }
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[must_use = "an Answer does nothing until it is inspected or awaited; a dropped Decision may drop a lease"]
pub enum Answer<T, F = BoxFuture<T>> {
    /// Decided now.
    Ready(T),
    /// Decided when the future completes.
    Pending(F),
}

/// The answer to "may `n` permits go now?": a [`Lease`] or a [`Rejected`].
pub type Decision = Answer<Result<Lease, Rejected>>;

/// The answer to "would `n` permits go now?" (nothing taken).
pub type Check = Answer<Result<Meta, Rejected>>;

/// A lease given back; [`Answer::Pending`] while a distributed limiter's refund is on its way.
pub type Refund = Answer<()>;

impl<T: Send + 'static> Answer<T> {
    /// The value if it is ready, else the answer unchanged.
    pub fn now(self) -> Result<T, Answer<T>> {
        match self {
            Answer::Ready(value) => Ok(value),
            pending => Err(pending),
        }
    }

    /// Applies `f` to the value, now or when it arrives.
    pub fn map<U>(self, f: impl FnOnce(T) -> U + Send + 'static) -> Answer<U> {
        match self {
            Answer::Ready(value) => Answer::Ready(f(value)),
            Answer::Pending(fut) => Answer::Pending(Box::pin(async move { f(fut.await) })),
        }
    }
}

impl Answer<()> {
    /// Both refunds (or other unit answers): ready when both are, else one future awaiting `self`
    /// then `other`.
    pub fn and(self, other: Answer<()>) -> Answer<()> {
        match (self, other) {
            (Answer::Ready(()), Answer::Ready(())) => Answer::Ready(()),
            (first, then) => Answer::Pending(Box::pin(async move {
                first.await;
                then.await;
            })),
        }
    }
}

impl<T, F> std::fmt::Debug for Answer<T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Answer::Ready(_) => "Answer::Ready(..)",
            Answer::Pending(_) => "Answer::Pending(..)",
        })
    }
}

impl<T, F: Future<Output = T> + Unpin> IntoFuture for Answer<T, F> {
    type Output = T;
    type IntoFuture = AnswerFuture<T, F>;

    fn into_future(self) -> AnswerFuture<T, F> {
        AnswerFuture(match self {
            Answer::Ready(value) => Inner::Ready(Some(value)),
            Answer::Pending(fut) => Inner::Pending(fut),
        })
    }
}

/// The future of an [`Answer`] (`answer.await`).
#[must_use = "futures do nothing unless awaited"]
pub struct AnswerFuture<T, F = BoxFuture<T>>(Inner<T, F>);

enum Inner<T, F> {
    Ready(Option<T>),
    Pending(F),
}

// The value is moved out, never pinned; the pending future is `Unpin` (boxed).
impl<T, F: Unpin> Unpin for AnswerFuture<T, F> {}

impl<T, F: Future<Output = T> + Unpin> Future for AnswerFuture<T, F> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match &mut self.get_mut().0 {
            Inner::Ready(value) => Poll::Ready(value.take().expect("AnswerFuture polled after completion")),
            Inner::Pending(fut) => Pin::new(fut).poll(cx),
        }
    }
}

impl<T, F> std::fmt::Debug for AnswerFuture<T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AnswerFuture")
    }
}
