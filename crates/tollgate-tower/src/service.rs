//! [`RateLimitLayer`] and the [`RateLimit`] service it wraps around an inner service.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use pin_project_lite::pin_project;
use tollgate::{Answer, Reason};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::{Held, Permit, RateLimitBody, end, read_head};
use crate::headers::{insert_ratelimit, retry_after};
use crate::key::RequestInfo;
use crate::policy::{Both, Denied, Policies};

/// Builds the response for a rejected request: `(content type, body)`.
pub type RejectBody = Arc<dyn Fn(&Denied) -> (HeaderValue, Bytes) + Send + Sync>;

struct Config {
    status: StatusCode,
    unavailable_status: StatusCode,
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
    let detail = match &d.rejected {
        Some(r) => format!("{} (policy {})", r.reason(), d.policy.name),
        None => format!("no rate-limit key in request (policy {})", d.policy.name),
    };
    let mut problem = serde_json::json!({
        "type": "about:blank",
        "title": d.status.canonical_reason().unwrap_or("Rejected"),
        "status": d.status.as_u16(),
        "detail": detail,
    });
    if let Some(retry) = d.rejected.and_then(|r| r.retry_after()) {
        problem["retry_after_ms"] = u64::try_from(retry.as_millis()).unwrap_or(u64::MAX).into();
    }
    (HeaderValue::from_static("application/problem+json"), Bytes::from(problem.to_string()))
}

impl<P: Policies> RateLimitLayer<P> {
    /// Limits by `policies` ([`crate::Policy`] or several via [`RateLimitLayer::and`]); rejects
    /// with 429 and a plain-text body.
    pub fn new(policies: P) -> Self {
        RateLimitLayer {
            policies,
            config: Arc::new(Config {
                status: StatusCode::TOO_MANY_REQUESTS,
                unavailable_status: StatusCode::SERVICE_UNAVAILABLE,
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
            unavailable_status: self.config.unavailable_status,
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

    /// The status when a distributed limiter could not decide and its failure policy denied
    /// (default 503 Service Unavailable).
    pub fn unavailable_status(self, status: StatusCode) -> Self {
        self.config(|c| c.unavailable_status = status)
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
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    P: Policies,
    ResB: http_body::Body,
{
    type Response = Response<RateLimitBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, P>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let shared = &*self.shared;
        let verdict = match shared.policies.prepare(&RequestInfo::of(&req)) {
            Ok(prepared) => shared.policies.run(&prepared, shared.config.status),
            Err(denied) => Answer::Ready(Err(denied)),
        };
        let state = match verdict {
            Answer::Ready(Ok(permit)) => {
                let kept = keep(shared, permit);
                admitted(&mut self.inner, req, kept)
            }
            Answer::Ready(Err(denied)) => {
                State::Rejected { response: Some(Box::new(rejection(&shared.config, &denied, is_grpc(&req)))) }
            }
            Answer::Pending(decision) => {
                // The ready service goes with the request; a clone stays for the next poll_ready.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                State::Deciding { decision, pending: Some(Box::new((inner, req, self.shared.clone()))) }
            }
        };
        ResponseFuture { state }
    }
}

/// What an admitted request keeps: success headers (when asked for) and the permit, boxed only
/// when it holds something (a concurrency limit, a reservation to settle; the body keeps it
/// until the end). Everything else of the permit is dropped here, before the request moves on.
#[inline]
fn keep<P: Policies>(shared: &Shared<P>, permit: P::Permit) -> Kept {
    shared.policies.count_admitted();
    let headers = if shared.config.headers_on_success { Some(success_headers(shared, &permit)) } else { None };
    let permit = if P::holds(&permit) { Some(Box::new(Permit::<P>(permit)) as Box<dyn Held>) } else { None };
    Kept { permit, headers }
}

/// The `RateLimit` headers of an admitted request; out of line, so that the common path (no
/// headers on success) stays small enough to inline.
#[inline(never)]
fn success_headers<P: Policies>(shared: &Shared<P>, permit: &P::Permit) -> Box<http::HeaderMap> {
    let mut states = Vec::new();
    shared.policies.describe(permit, &mut states);
    let mut h = http::HeaderMap::new();
    insert_ratelimit(&mut h, &states);
    Box::new(h)
}

struct Kept {
    permit: Option<Box<dyn Held>>,
    headers: Option<Box<http::HeaderMap>>,
}

fn admitted<S, P, ReqB, ResB>(inner: &mut S, req: Request<ReqB>, kept: Kept) -> State<S, ReqB, P>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    P: Policies,
{
    State::Admitted { fut: inner.call(req), permit: kept.permit, headers: kept.headers }
}

/// True for a gRPC call (`content-type: application/grpc`, `application/grpc+proto`, ...): its
/// client reads the status from `grpc-status`, and takes an HTTP error status for a broken
/// transport.
fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers().get(header::CONTENT_TYPE).is_some_and(|v| {
        v.as_bytes().strip_prefix(b"application/grpc").is_some_and(|r| r.is_empty() || r[0] == b'+' || r[0] == b';')
    })
}

/// The gRPC status code for a rejection answered with `status`: a limited call is
/// RESOURCE_EXHAUSTED, a backend that could not decide UNAVAILABLE, a missing key by the status
/// it was given (gRPC's own mapping of HTTP statuses).
fn grpc_code(status: StatusCode, reason: Option<Reason>) -> u8 {
    match (reason, status) {
        (Some(Reason::Unavailable), _) | (_, StatusCode::SERVICE_UNAVAILABLE) => 14,
        (Some(_), _) | (_, StatusCode::TOO_MANY_REQUESTS) => 8,
        (None, StatusCode::UNAUTHORIZED) => 16,
        (None, StatusCode::FORBIDDEN) => 7,
        (None, _) => 3,
    }
}

fn rejection(config: &Config, denied: &Denied, grpc: bool) -> Response<Bytes> {
    let reason = denied.rejected.map(|r| r.reason());
    // A backend that could not decide is not the client's fault: by default 503, not 429.
    let status = if reason == Some(Reason::Unavailable) { config.unavailable_status } else { denied.status };
    tracing::debug!(
        policy = %denied.policy.name,
        status = status.as_u16(),
        reason = ?reason,
        retry_after = ?denied.rejected.and_then(|r| r.retry_after()),
        grpc,
        "request rate limited"
    );
    let mut res = if grpc {
        grpc_rejection(denied, grpc_code(status, reason))
    } else {
        let (content_type, body) = (config.body)(denied);
        let mut res = Response::new(body);
        *res.status_mut() = status;
        res.headers_mut().insert(header::CONTENT_TYPE, content_type);
        res
    };
    let h = res.headers_mut();
    if let Some(r) = &denied.rejected {
        if let Some(v) = retry_after(r.retry_after()) {
            h.insert(header::RETRY_AFTER, v);
        }
        insert_ratelimit(h, std::slice::from_ref(&denied.policy));
    }
    res
}

/// A gRPC "trailers-only" answer: HTTP 200, no message, the status in `grpc-status` and
/// `grpc-message`, and when waiting helps, `grpc-retry-pushback-ms` (what gRPC's retry policy
/// reads) beside `retry-after`.
fn grpc_rejection(denied: &Denied, code: u8) -> Response<Bytes> {
    let mut res = Response::new(Bytes::new());
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from(u16::from(code)));
    let message = match code {
        14 => format!("rate limit {} could not decide", denied.policy.name),
        8 => format!("rate limited by {}", denied.policy.name),
        _ => format!("request has no key for rate limit {}", denied.policy.name),
    };
    // grpc-message is percent-encoded: every byte but printable ASCII other than '%' (gRPC over
    // HTTP/2, "Status-Message").
    const GRPC_MESSAGE: &AsciiSet = &CONTROLS.add(b'%');
    let encoded = utf8_percent_encode(&message, GRPC_MESSAGE).to_string();
    if let Ok(v) = HeaderValue::from_str(&encoded) {
        h.insert("grpc-message", v);
    }
    if let Some(retry) = denied.rejected.and_then(|r| r.retry_after()) {
        let ms = retry.as_millis().max(1).min(u128::from(u32::MAX));
        h.insert("grpc-retry-pushback-ms", HeaderValue::from(ms as u64));
    }
    res
}

type Decision<T> = tollgate::BoxFuture<Result<T, Box<Denied>>>;

pin_project! {
    /// The response future of [`RateLimit`].
    pub struct ResponseFuture<S, B, P>
    where
        S: Service<Request<B>>,
        P: Policies,
    {
        #[pin]
        state: State<S, B, P>,
    }
}

pin_project! {
    // Everything but the inner future is boxed, and boxed only on the path that needs it, so the
    // future a request moves through `oneshot` and friends is little more than the inner one.
    #[project = StateProj]
    enum State<S, B, P>
    where
        S: Service<Request<B>>,
        P: Policies,
    {
        Deciding {
            decision: Decision<P::Permit>,
            pending: Option<Box<(S, Request<B>, Arc<Shared<P>>)>>,
        },
        Admitted {
            #[pin]
            fut: S::Future,
            permit: Option<Box<dyn Held>>,
            headers: Option<Box<http::HeaderMap>>,
        },
        // A response whose body had ended before it was sent, its cost being settled.
        // Boxed: the future of every other response stays as small as it was.
        Settling {
            settle: tollgate::BoxFuture<()>,
            response: Option<Box<S::Response>>,
        },
        Rejected {
            response: Option<Box<Response<Bytes>>>,
        },
    }
}

impl<S, B, P, ResB> Future for ResponseFuture<S, B, P>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    P: Policies,
    ResB: http_body::Body,
{
    type Output = Result<Response<RateLimitBody<ResB>>, S::Error>;

    // Always inlined into the poll that drives it (`oneshot`'s, the server's), with the rest out
    // of line: the common case, an admitted response that holds nothing, then moves as it is (its
    // body is the wrapper's whole content) without a call and a copy more (measured: the layer's
    // 691 instructions a request -> 643).
    #[inline(always)]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let StateProj::Admitted { fut, permit: None, headers: None } = self.as_mut().project().state.project() {
            let res = std::task::ready!(fut.poll(cx))?;
            return Poll::Ready(Ok(res.map(RateLimitBody::plain)));
        }
        self.poll_other(cx)
    }
}

impl<S, B, P, ResB> ResponseFuture<S, B, P>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    P: Policies,
    ResB: http_body::Body,
{
    /// Every state but an admitted response that holds nothing.
    #[inline(never)]
    fn poll_other(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<RateLimitBody<ResB>>, S::Error>> {
        loop {
            let next = match self.as_mut().project().state.project() {
                StateProj::Deciding { decision, pending } => {
                    let verdict = std::task::ready!(decision.as_mut().poll(cx));
                    let (mut inner, req, shared) = *pending.take().expect("polled after completion");
                    match verdict {
                        Ok(permit) => admitted(&mut inner, req, keep(&shared, permit)),
                        Err(denied) => {
                            let response = rejection(&shared.config, &denied, is_grpc(&req));
                            State::Rejected { response: Some(Box::new(response)) }
                        }
                    }
                }
                StateProj::Admitted { fut, permit, headers } => {
                    let mut res = std::task::ready!(fut.poll(cx))?;
                    if permit.is_none() && headers.is_none() {
                        // Admitted after a decision that came later (a distributed limiter's).
                        return Poll::Ready(Ok(res.map(RateLimitBody::plain)));
                    }
                    match holding(&mut res, permit.take(), headers.take()) {
                        Then::Hold(held) => return Poll::Ready(Ok(res.map(|body| RateLimitBody::inner(body, held)))),
                        Then::Settle(settle) => State::Settling { settle, response: Some(Box::new(res)) },
                    }
                }
                StateProj::Settling { settle, response } => {
                    std::task::ready!(settle.as_mut().poll(cx));
                    let res = *response.take().expect("polled after completion");
                    return Poll::Ready(Ok(res.map(RateLimitBody::plain)));
                }
                StateProj::Rejected { response } => {
                    let res = *response.take().expect("polled after completion");
                    return Poll::Ready(Ok(res.map(RateLimitBody::rejected)));
                }
            };
            self.as_mut().project().state.set(next);
        }
    }
}

/// What an admitted response's body does with the permit.
enum Then {
    /// Holds it (if anything is left to hold) until it ends.
    Hold(Option<Box<dyn Held>>),
    /// Nothing: the body had ended; the response waits for this settle.
    Settle(tollgate::BoxFuture<()>),
}

/// An admitted response that holds a permit or gets success headers. Its reservations read their
/// costs from its head; a body that has already ended (an empty one, which a server drops unread)
/// settles them now, and when a distributed limiter answers later, the response waits for it.
#[inline(never)]
fn holding<B: http_body::Body>(
    res: &mut Response<B>,
    mut permit: Option<Box<dyn Held>>,
    headers: Option<Box<http::HeaderMap>>,
) -> Then {
    if let Some(h) = headers {
        res.headers_mut().extend(*h);
    }
    let reserves = permit.as_deref_mut().is_some_and(|held| read_head(held, res.headers(), res.extensions()));
    if reserves && res.body().is_end_stream() {
        if let Some(settle) = permit.take().and_then(end) {
            return Then::Settle(settle);
        }
    }
    Then::Hold(permit)
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("status", &self.status)
            .field("unavailable_status", &self.unavailable_status)
            .field("headers_on_success", &self.headers_on_success)
            .finish_non_exhaustive()
    }
}

impl<P: std::fmt::Debug> std::fmt::Debug for RateLimitLayer<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer").field("policies", &self.policies).field("config", &self.config).finish()
    }
}

impl<S: std::fmt::Debug, P: std::fmt::Debug> std::fmt::Debug for RateLimit<S, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("policies", &self.shared.policies)
            .field("config", &self.shared.config)
            .finish()
    }
}

impl<S, B, P> std::fmt::Debug for ResponseFuture<S, B, P>
where
    S: Service<Request<B>>,
    P: Policies,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Deciding { .. } => "deciding",
            State::Admitted { .. } => "admitted",
            State::Settling { .. } => "settling",
            State::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture").field("state", &state).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_calls_are_told_by_their_content_type() {
        let with = |ct: &str| Request::builder().header(header::CONTENT_TYPE, ct).body(()).unwrap();
        for grpc in ["application/grpc", "application/grpc+proto", "application/grpc;charset=utf-8"] {
            assert!(is_grpc(&with(grpc)), "{grpc}");
        }
        for other in ["application/json", "application/grpc-web", "application/grpcx", "text/plain"] {
            assert!(!is_grpc(&with(other)), "{other}");
        }
        assert!(!is_grpc(&Request::new(())));
    }

    fn denied(name: &str) -> Denied {
        let meta = tollgate::Meta { limit: 10, remaining: 0, reset_ns: 1_500_000_000, retry_ns: Some(1_500_000_000) };
        let policy = crate::policy::PolicyState { name: name.into(), meta, window: None };
        let rejected = tollgate::Rejected::new(meta, 1, Reason::Exhausted);
        Denied { status: StatusCode::TOO_MANY_REQUESTS, policy, rejected: Some(rejected) }
    }

    #[test]
    fn a_problem_detail_is_json_whatever_the_policy_is_called() {
        let name = "per \"user\"\\\n\u{1} ü";
        let (content_type, body) = problem_json(&denied(name));
        assert_eq!(content_type, "application/problem+json");
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(problem["status"], 429);
        assert_eq!(problem["title"], "Too Many Requests");
        assert_eq!(problem["retry_after_ms"], 1500);
        assert!(problem["detail"].as_str().unwrap().ends_with(&format!("(policy {name})")), "{problem}");
        let no_key = Denied { rejected: None, ..denied("p") };
        let problem: serde_json::Value = serde_json::from_slice(&problem_json(&no_key).1).unwrap();
        assert_eq!(problem["detail"], "no rate-limit key in request (policy p)");
        assert!(problem.get("retry_after_ms").is_none(), "{problem}");
    }

    #[test]
    fn a_grpc_message_is_percent_encoded() {
        let res = grpc_rejection(&denied("per user 100% ü\n"), 8);
        let message = res.headers()["grpc-message"].to_str().unwrap();
        assert_eq!(message, "rate limited by per user 100%25 %C3%BC%0A");
        assert_eq!(res.headers()["grpc-status"], "8");
        assert_eq!(res.headers()["grpc-retry-pushback-ms"], "1500");
    }

    #[test]
    fn a_rejection_maps_to_the_grpc_code_a_client_expects() {
        use StatusCode as S;
        assert_eq!(grpc_code(S::TOO_MANY_REQUESTS, Some(Reason::Exhausted)), 8);
        assert_eq!(grpc_code(S::TOO_MANY_REQUESTS, Some(Reason::ExceedsCapacity)), 8);
        assert_eq!(grpc_code(S::SERVICE_UNAVAILABLE, Some(Reason::Unavailable)), 14);
        assert_eq!(grpc_code(S::TOO_MANY_REQUESTS, Some(Reason::Unavailable)), 14);
        assert_eq!(grpc_code(S::UNAUTHORIZED, None), 16);
        assert_eq!(grpc_code(S::FORBIDDEN, None), 7);
        assert_eq!(grpc_code(S::BAD_REQUEST, None), 3);
        assert_eq!(grpc_code(S::TOO_MANY_REQUESTS, None), 8);
    }
}
