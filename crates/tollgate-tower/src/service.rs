//! [`RateLimitLayer`] and the [`RateLimit`] service it wraps around an inner service.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::RateLimitBody;
use crate::headers::{insert_ratelimit, retry_after};
use crate::key::RequestInfo;
use crate::policy::{Both, Denied, Policies};

/// Builds the response for a rejected request: `(content type, body)`.
pub type RejectBody = Arc<dyn Fn(&Denied) -> (HeaderValue, Bytes) + Send + Sync>;

struct Config {
    status: StatusCode,
    headers_on_success: bool,
    body: RejectBody,
}

/// A tower [`Layer`] that limits requests by one or more [`Policies`].
///
/// `Clone` (the state is shared behind `Arc`s), so it works with axum's `Router::layer` and
/// `route_layer`. `poll_ready` only asks the inner service; permits are taken in `call`.
///
/// ```
/// use tollgate::{Keyed, Quota, TokenBucket};
/// use tollgate_tower::{ClientIp, Policy, RateLimitLayer};
/// let layer = RateLimitLayer::new(Policy::new(
///     "per-ip",
///     ClientIp::new(),
///     Keyed::new(TokenBucket::new(Quota::per_second(10)?)),
/// ))
/// .headers_on_success(true);
/// let app: axum::Router = axum::Router::new().route("/", axum::routing::get(|| async { "hi" })).layer(layer);
/// # let _ = app;
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
pub struct RateLimitLayer<P> {
    policies: P,
    config: Arc<Config>,
}

impl<P: Clone> Clone for RateLimitLayer<P> {
    fn clone(&self) -> Self {
        RateLimitLayer { policies: self.policies.clone(), config: self.config.clone() }
    }
}

fn text_body(d: &Denied) -> (HeaderValue, Bytes) {
    let msg = match d.status {
        StatusCode::TOO_MANY_REQUESTS => "Too Many Requests\n".to_owned(),
        s => format!("{}\n", s.canonical_reason().unwrap_or("Rejected")),
    };
    (HeaderValue::from_static("text/plain; charset=utf-8"), Bytes::from(msg))
}

/// An RFC 9457 problem detail: `{"type","title","status","detail","retry_after_ms"?}`.
pub fn problem_json(d: &Denied) -> (HeaderValue, Bytes) {
    let title = d.status.canonical_reason().unwrap_or("Rejected");
    let detail = match &d.rejected {
        Some(r) => format!("{} (policy {})", r.reason(), d.policy.name),
        None => format!("no rate-limit key in request (policy {})", d.policy.name),
    };
    let retry = d
        .rejected
        .and_then(|r| r.retry_after())
        .map(|r| format!(",\"retry_after_ms\":{}", r.as_millis()))
        .unwrap_or_default();
    let json = format!(
        "{{\"type\":\"about:blank\",\"title\":{},\"status\":{},\"detail\":{}{retry}}}",
        json_string(title),
        d.status.as_u16(),
        json_string(&detail)
    );
    (HeaderValue::from_static("application/problem+json"), Bytes::from(json))
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl<P: Policies> RateLimitLayer<P> {
    /// Limits by `policies` ([`crate::Policy`] or several via [`RateLimitLayer::and`]); rejects
    /// with 429 and a plain-text body.
    pub fn new(policies: P) -> Self {
        RateLimitLayer {
            policies,
            config: Arc::new(Config {
                status: StatusCode::TOO_MANY_REQUESTS,
                headers_on_success: false,
                body: Arc::new(text_body),
            }),
        }
    }

    /// Adds another policy; a request must pass both, and a rejection by the second gives back
    /// what the first took.
    pub fn and<Q: Policies>(self, other: Q) -> RateLimitLayer<Both<P, Q>> {
        RateLimitLayer { policies: Both(self.policies, other), config: self.config }
    }

    fn config(mut self, f: impl FnOnce(&mut Config)) -> Self {
        let mut config = Config {
            status: self.config.status,
            headers_on_success: self.config.headers_on_success,
            body: self.config.body.clone(),
        };
        f(&mut config);
        self.config = Arc::new(config);
        self
    }

    /// The status of a rate-limited response (default 429).
    pub fn status(self, status: StatusCode) -> Self {
        self.config(|c| c.status = status)
    }

    /// Also sends `RateLimit-Policy` / `RateLimit` on admitted responses (default: only on
    /// rejections).
    pub fn headers_on_success(self, on: bool) -> Self {
        self.config(|c| c.headers_on_success = on)
    }

    /// Answers rejections with an RFC 9457 `application/problem+json` body.
    pub fn problem_json(self) -> Self {
        self.config(|c| c.body = Arc::new(problem_json))
    }

    /// Builds the rejection body (content type and bytes) yourself.
    pub fn reject_body(self, body: impl Fn(&Denied) -> (HeaderValue, Bytes) + Send + Sync + 'static) -> Self {
        self.config(|c| c.body = Arc::new(body))
    }
}

impl<S, P: Clone> Layer<S> for RateLimitLayer<P> {
    type Service = RateLimit<S, P>;
    fn layer(&self, inner: S) -> RateLimit<S, P> {
        // One allocation per wrapped service, so that cloning the service per request (as
        // `oneshot` and axum do) costs one reference count, not one per policy field.
        let shared = Arc::new(Shared { policies: self.policies.clone(), config: self.config.clone() });
        RateLimit { inner, shared }
    }
}

struct Shared<P> {
    policies: P,
    config: Arc<Config>,
}

/// The rate-limiting service (see [`RateLimitLayer`]).
pub struct RateLimit<S, P> {
    inner: S,
    shared: Arc<Shared<P>>,
}

impl<S: Clone, P> Clone for RateLimit<S, P> {
    fn clone(&self) -> Self {
        RateLimit { inner: self.inner.clone(), shared: self.shared.clone() }
    }
}

impl<S, P, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, P>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    P: Policies,
{
    type Response = Response<RateLimitBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, P::Permit>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let shared = &*self.shared;
        match shared.policies.decide(&RequestInfo::of(&req), shared.config.status) {
            Ok(permit) => {
                let headers = shared.config.headers_on_success.then(|| {
                    let mut states = Vec::new();
                    shared.policies.describe(&permit, &mut states);
                    let mut h = http::HeaderMap::new();
                    insert_ratelimit(&mut h, &states);
                    h
                });
                let permit = P::holds(&permit).then_some(permit);
                ResponseFuture { state: State::Admitted { fut: self.inner.call(req), permit, headers } }
            }
            Err(denied) => {
                tracing::debug!(
                    policy = %denied.policy.name,
                    status = denied.status.as_u16(),
                    reason = ?denied.rejected.map(|r| r.reason()),
                    retry_after = ?denied.rejected.and_then(|r| r.retry_after()),
                    "request rate limited"
                );
                ResponseFuture { state: State::Rejected { response: Some(self.rejection(&denied)) } }
            }
        }
    }
}

impl<S, P> RateLimit<S, P> {
    fn rejection<B>(&self, denied: &Denied) -> Response<RateLimitBody<B>> {
        let (content_type, body) = (self.shared.config.body)(denied);
        let mut res = Response::new(RateLimitBody::rejected(body));
        *res.status_mut() = denied.status;
        let h = res.headers_mut();
        h.insert(header::CONTENT_TYPE, content_type);
        if let Some(r) = &denied.rejected {
            if let Some(v) = retry_after(r.retry_after()) {
                h.insert(header::RETRY_AFTER, v);
            }
            insert_ratelimit(h, std::slice::from_ref(&denied.policy));
        }
        res
    }
}

pin_project! {
    /// The response future of [`RateLimit`].
    pub struct ResponseFuture<F, T> {
        #[pin]
        state: State<F, T>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, T> {
        Admitted {
            #[pin]
            fut: F,
            permit: Option<T>,
            headers: Option<http::HeaderMap>,
        },
        Rejected {
            response: Option<Response<RateLimitBody<()>>>,
        },
    }
}

impl<F, T, B, E> Future for ResponseFuture<F, T>
where
    F: Future<Output = Result<Response<B>, E>>,
    T: Send + 'static,
{
    type Output = Result<Response<RateLimitBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Admitted { fut, permit, headers } => {
                let res = std::task::ready!(fut.poll(cx))?;
                let (mut parts, body) = res.into_parts();
                if let Some(h) = headers.take() {
                    parts.headers.extend(h);
                }
                let permit = permit.take().map(|p| Box::new(p) as Box<dyn std::any::Any + Send>);
                Poll::Ready(Ok(Response::from_parts(parts, RateLimitBody::inner(body, permit))))
            }
            StateProj::Rejected { response } => {
                let res = response.take().expect("polled after completion");
                Poll::Ready(Ok(res.map(RateLimitBody::cast)))
            }
        }
    }
}
