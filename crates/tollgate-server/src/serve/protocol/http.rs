//! The HTTP API, compatible with Limitador's:
//!
//! | route | what |
//! | --- | --- |
//! | `POST /check` | would `delta` hits be allowed? 200 or 429, counts nothing |
//! | `POST /report` | count `delta` hits, 200 |
//! | `POST /check_and_report` | decide and count if allowed: 200 or 429 |
//! | `GET /limits/{namespace}` | the namespace's limits, as JSON |
//! | `GET /counters/{namespace}?limit=N` | up to `N` of its live counters (default [`DEFAULT_LISTED`]), as JSON, with `X-Tollgate-Truncated: true` when there were more |
//! | `DELETE /counters/{namespace}` | resets its counters, or with a body `{"values": {"user_id": "alice"}}` those whose variables have these values (see [`CounterFilter`]): `{"reset": N}`, the number that held hits |
//! | `GET /status` | 200 while serving |
//! | `GET /metrics` | Prometheus text |
//!
//! Bodies are `{"namespace": "...", "values": {"key": "value"}, "delta": 1, "response_headers":
//! "DraftVersion03"}`; with `response_headers` set, the response carries the draft RateLimit
//! headers of the tightest counter (see [`super::headers`]). A call that exceeds a quota limit
//! (`mode: quota`) is allowed and carries `X-Tollgate-Quota-Exceeded`. A body that is not that JSON, a `delta` above
//! [`MAX_DELTA`], or `values` over the engine's [`RequestBounds`](crate::serve::RequestBounds) is a 400 that says why.
//!
//! Counters are listed and reset on every storage (with Redis, by a bounded scan of the
//! namespace's keys: see [`Engine::list_counters`]); a storage that cannot answer is a 503. The
//! API has no access control, as Limitador's: whoever reaches its port can reset counters.
//!
//! [`router`] serves every route. `tollgate serve` puts its own connection handling in front of
//! it: the three decision calls sent as they usually come (HTTP/1.1, a `Content-Length` body) are
//! parsed and answered on the connection by the same decision code, without the router; any
//! other request hands its connection to hyper and this router (docs/benchmarks.md, "Server CPU per decision"), where
//! a body that does not arrive whole within the HTTP read timeout of its head is answered 408
//! (the router [`router`] returns has no such timeout: the server embedding it sets its own).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use tollgate::Clock;
use tollgate_policy::{Descriptor, Limit};
use tracing::Instrument;

use super::headers::{HeaderDraft, response_headers};
use crate::serve::engine::Engine;
use crate::serve::model::{Action, CallError, CounterFilter};
use crate::serve::ops::metrics::{Metrics, Port};
use crate::serve::ops::trace::{Decision, Protocol, TraceParent};

/// A check, report or check-and-report request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallBody {
    /// The namespace.
    pub namespace: String,
    /// The request's descriptor entries (a key given twice: the last one).
    #[serde(default)]
    pub values: BTreeMap<String, String>,
    /// Hits to count.
    pub delta: u64,
    /// Set to ask for the draft RateLimit headers (`DraftVersion03`, or `draft10` for
    /// `RateLimit-Policy`/`RateLimit`).
    #[serde(default)]
    pub response_headers: Option<String>,
}

/// A limit as `GET /limits/{namespace}` shows it (Limitador's shape, plus `algorithm` and `id`).
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LimitJson {
    /// The limit's stable id.
    pub id: String,
    /// Namespace.
    pub namespace: String,
    /// Hits per window.
    pub max_value: u64,
    /// The window.
    pub seconds: u64,
    /// Optional name.
    pub name: Option<String>,
    /// Conditions as written.
    pub conditions: Vec<String>,
    /// Variables as written.
    pub variables: Vec<String>,
    /// How it counts.
    pub algorithm: String,
}

impl From<&Limit> for LimitJson {
    fn from(limit: &Limit) -> LimitJson {
        LimitJson {
            id: limit.id().to_string(),
            namespace: limit.namespace().to_string(),
            max_value: limit.max_value(),
            seconds: limit.seconds(),
            name: limit.name().map(str::to_string),
            conditions: limit.conditions().iter().map(|c| c.source().to_string()).collect(),
            variables: limit.variables().iter().map(|v| v.source().to_string()).collect(),
            algorithm: limit.algorithm().name().to_string(),
        }
    }
}

/// A live counter as `GET /counters/{namespace}` shows it.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct CounterJson {
    /// The limit it counts for.
    pub limit: LimitJson,
    /// The variables' values (variable as written → value).
    pub set_variables: BTreeMap<String, String>,
    /// Hits left in the window.
    pub remaining: u64,
    /// Seconds until the counter is back to full.
    pub expires_in_seconds: u64,
}

/// A `DELETE /counters/{namespace}` body (optional: no body resets every counter).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResetBody {
    /// Only counters whose variables have these values (variable as written, or the descriptor
    /// entry's key it reads → value); none: every counter.
    #[serde(default)]
    pub values: std::collections::HashMap<String, String>,
}

/// The answer to `DELETE /counters/{namespace}`.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ResetJson {
    /// Counters reset that held hits (the ones a listing showed).
    pub reset: u64,
}

/// `GET /counters/{namespace}`'s query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    limit: Option<usize>,
}

/// Counters `GET /counters/{namespace}` lists without `?limit=`.
pub const DEFAULT_LISTED: usize = 1000;

/// Most counters one listing may ask for.
pub const MAX_LISTED: usize = 100_000;

/// Set to `true` on a listing that left counters out (`false` otherwise).
pub const TRUNCATED_HEADER: &str = "x-tollgate-truncated";

/// The most hits one call may count. Envoy's `hits_addend` is 32-bit; a larger delta is no real
/// call, and at u64 scale it would wrap the `authorized_hits` counter in one request.
pub const MAX_DELTA: u64 = u32::MAX as u64;

/// What the API's routes decide with.
pub(crate) struct Api<C: Clock> {
    engine: Arc<Engine<C>>,
    metrics: Arc<Metrics>,
    pub(crate) trace_parent: Option<Arc<dyn TraceParent>>,
    /// How long a body hyper reads may take once its head is in (`None`: no limit).
    body_timeout: Option<Duration>,
}

impl<C: Clock> Api<C> {
    /// Deciding with `engine`, each decision span's parent set by `trace_parent` from the
    /// request's headers; a body that takes longer than `body_timeout` after its head is
    /// answered 408.
    pub(crate) fn new(
        engine: Arc<Engine<C>>,
        metrics: Arc<Metrics>,
        trace_parent: Option<Arc<dyn TraceParent>>,
        body_timeout: Option<Duration>,
    ) -> Arc<Api<C>> {
        Arc::new(Api { engine, metrics, trace_parent, body_timeout })
    }

    /// The request's body, as the `Bytes` extractor reads it (the same limit, the same
    /// rejections), or 408 Request Timeout past the body timeout (hyper then closes the
    /// connection: the rest of the body is never read).
    async fn body(&self, request: Request) -> Result<Bytes, Response> {
        let read = Bytes::from_request(request, &());
        let read = match self.body_timeout {
            None => read.await,
            Some(timeout) => match tokio::time::timeout(timeout, read).await {
                Ok(read) => read,
                Err(_) => return Err(body_timed_out(timeout)),
            },
        };
        read.map_err(IntoResponse::into_response)
    }
}

/// The 408 of a body that did not arrive within `timeout` of its head.
pub(crate) fn body_timed_out(timeout: Duration) -> Response {
    let reason = format!("the request's body did not arrive within {}\n", humantime::format_duration(timeout));
    (StatusCode::REQUEST_TIMEOUT, reason).into_response()
}

/// The API's routes, deciding with `engine`.
pub fn router<C: Clock + Clone>(engine: Arc<Engine<C>>, metrics: Arc<Metrics>) -> Router {
    router_with_trace_parent(engine, metrics, None)
}

/// The API's routes, deciding with `engine`, each decision span's parent set by `trace_parent`
/// from the request's headers (see [`crate::serve::trace`]).
pub fn router_with_trace_parent<C: Clock + Clone>(
    engine: Arc<Engine<C>>,
    metrics: Arc<Metrics>,
    trace_parent: Option<Arc<dyn TraceParent>>,
) -> Router {
    routes(Api::new(engine, metrics, trace_parent, None))
}

/// The API's routes over `api`.
pub(crate) fn routes<C: Clock + Clone>(api: Arc<Api<C>>) -> Router {
    operations(decisions(Router::new())).route("/status", get(status::<C>)).with_state(api)
}

/// The decision listener's routes when the operators' are served apart (`--admin`): the
/// decision calls and `/status`.
pub(crate) fn decision_routes<C: Clock + Clone>(api: Arc<Api<C>>) -> Router {
    decisions(Router::new()).route("/status", get(status::<C>)).with_state(api)
}

/// The operators' routes on a listener of their own (`--admin`): the limits, the counters
/// (listed, reset), `/metrics`, and `/status` for the admin port's probes.
pub(crate) fn admin_routes<C: Clock + Clone>(api: Arc<Api<C>>) -> Router {
    operations(Router::new()).route("/status", get(status::<C>)).with_state(api)
}

type ApiRouter<C> = Router<Arc<Api<C>>>;

/// `router` with the decision calls.
fn decisions<C: Clock + Clone>(router: ApiRouter<C>) -> ApiRouter<C> {
    router
        .route("/check", post(|s, r| call(s, r, Action::Check)))
        .route("/report", post(|s, r| call(s, r, Action::Report)))
        .route("/check_and_report", post(|s, r| call(s, r, Action::CheckAndReport)))
}

/// `router` with the operators' calls.
fn operations<C: Clock + Clone>(router: ApiRouter<C>) -> ApiRouter<C> {
    router
        .route("/limits/{namespace}", get(limits))
        .route("/counters/{namespace}", get(counters).delete(reset))
        .route("/metrics", get(render_metrics::<C>))
}

/// A check, report or check-and-report, in its decision span (its parent named in the request's
/// headers, which are read before the body).
async fn call<C: Clock + Clone>(State(api): State<Arc<Api<C>>>, request: Request, action: Action) -> Response {
    let decision = Decision::start(Protocol::Http, action, api.trace_parent.as_deref(), request.headers());
    let span = decision.span().clone();
    async {
        match api.body(request).await {
            Ok(body) => answer(&api, &body, action, &decision).await.into_response(),
            Err(refused) => {
                decision.invalid();
                refused
            }
        }
    }
    .instrument(span)
    .await
}

/// What a check, report or check-and-report answers, before it is framed: by axum here, or
/// written by hand on `serve::net::http1`'s connections. One answer, two framings.
#[derive(Debug)]
pub(crate) struct Answer {
    /// 200, 429, or the status of a refusal.
    pub(crate) status: StatusCode,
    /// The RateLimit and quota headers of a decided call (lower-case names).
    pub(crate) headers: Vec<(&'static str, HeaderValue)>,
    /// `None`: the JSON `null` of a decided call; `Some`: why it was refused, as plain text.
    pub(crate) reason: Option<String>,
}

impl Answer {
    fn refused(status: StatusCode, reason: String) -> Answer {
        Answer { status, headers: Vec::new(), reason: Some(reason) }
    }

    /// The `Content-Type` and the body.
    pub(crate) fn content(&self) -> (&'static str, &str) {
        match &self.reason {
            None => ("application/json", "null"),
            // As axum's `String` response.
            Some(reason) => ("text/plain; charset=utf-8", reason),
        }
    }
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let content_type = self.content().0;
        let mut response = match self.reason {
            None => "null".into_response(),
            Some(reason) => reason.into_response(),
        };
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        for (name, value) in self.headers {
            headers.insert(HeaderName::from_static(name), value);
        }
        response
    }
}

/// Decides the call whose body is `body`.
pub(crate) async fn answer<C: Clock + Clone>(api: &Api<C>, body: &[u8], action: Action, decision: &Decision) -> Answer {
    let started = Instant::now();
    // The body checked as UTF-8 once: read from bytes, serde_json checks each string on its own,
    // which cost more than the whole body (about 700 instructions a call, docs/benchmarks.md).
    let parsed = std::str::from_utf8(body)
        .map_err(|e| e.to_string())
        .and_then(|text| serde_json::from_str::<CallBody>(text).map_err(|e| e.to_string()));
    let body = match parsed {
        Ok(body) => body,
        Err(e) => {
            decision.invalid();
            return Answer::refused(StatusCode::BAD_REQUEST, format!("invalid request body: {e}\n"));
        }
    };
    decision.request(&body.namespace, body.delta);
    if body.delta > MAX_DELTA {
        decision.invalid();
        let why = format!(
            "invalid delta {}: at most {MAX_DELTA} hits per call (as Envoy's 32-bit hits_addend)\n",
            body.delta
        );
        return Answer::refused(StatusCode::BAD_REQUEST, why);
    }
    let draft = match HeaderDraft::from_body(body.response_headers.as_deref().unwrap_or("")) {
        Ok(draft) => draft,
        Err(why) => {
            decision.invalid();
            return Answer::refused(StatusCode::BAD_REQUEST, format!("{why}\n"));
        }
    };
    let descriptors = [Descriptor::from(body.values)];
    let outcome = match api.engine.call(&body.namespace, &descriptors, body.delta, action).await {
        Ok(outcome) => outcome,
        Err(CallError::Oversize(e)) => {
            decision.invalid();
            api.metrics.refused(e.bound);
            return Answer::refused(StatusCode::BAD_REQUEST, format!("{e}\n"));
        }
        Err(e @ CallError::Storage(_)) => {
            decision.unavailable();
            api.metrics.unavailable(Port::Http);
            return Answer::refused(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n"));
        }
    };
    decision.decided(&outcome);
    // As Limitador: calls are counted in metrics by check_and_report only (check and report are
    // halves of one call).
    if action == Action::CheckAndReport {
        api.metrics.record(&body.namespace, &outcome, body.delta, started.elapsed());
    }
    let status =
        if outcome.allowed || action == Action::Report { StatusCode::OK } else { StatusCode::TOO_MANY_REQUESTS };
    // A value that is no header value (a limit's name with a control character) is left out.
    let headers = response_headers(&outcome, draft)
        .into_iter()
        .filter_map(|(name, value)| Some((name, HeaderValue::from_str(&value).ok()?)))
        .collect();
    Answer { status, headers, reason: None }
}

async fn limits<C: Clock + Clone>(State(api): State<Arc<Api<C>>>, Path(namespace): Path<String>) -> Response {
    let loaded = api.engine.loaded();
    let limits: Vec<LimitJson> = loaded.policy.namespace(&namespace).map(LimitJson::from).collect();
    axum::Json(limits).into_response()
}

async fn counters<C: Clock + Clone>(
    State(api): State<Arc<Api<C>>>,
    Path(namespace): Path<String>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let max = match query {
        Ok(Query(ListQuery { limit: None })) => DEFAULT_LISTED,
        Ok(Query(ListQuery { limit: Some(n) })) if (1..=MAX_LISTED).contains(&n) => n,
        Ok(Query(ListQuery { limit: Some(n) })) => {
            let why = format!("invalid limit {n}: from 1 to {MAX_LISTED} counters per listing\n");
            return (StatusCode::BAD_REQUEST, why).into_response();
        }
        Err(e) => return (StatusCode::BAD_REQUEST, format!("invalid query: {}\n", e.body_text())).into_response(),
    };
    let list = match api.engine.list_counters(&namespace, max).await {
        Ok(list) => list,
        Err(e) => {
            return (StatusCode::SERVICE_UNAVAILABLE, format!("counter storage unavailable: {e}\n")).into_response();
        }
    };
    let (loaded, truncated) = (list.loaded, list.truncated);
    let counters: Vec<CounterJson> = list
        .counters
        .into_iter()
        .map(|view| {
            let limit = &loaded.policy.limits()[view.limit];
            CounterJson {
                limit: LimitJson::from(limit),
                set_variables: limit.variables().iter().map(|v| v.source().to_string()).zip(view.values).collect(),
                remaining: view.meta.remaining,
                expires_in_seconds: view.meta.reset_ns.div_ceil(1_000_000_000),
            }
        })
        .collect();
    let truncated = HeaderValue::from_static(if truncated { "true" } else { "false" });
    ([(HeaderName::from_static(TRUNCATED_HEADER), truncated)], axum::Json(counters)).into_response()
}

async fn reset<C: Clock + Clone>(
    State(api): State<Arc<Api<C>>>,
    Path(namespace): Path<String>,
    request: Request,
) -> Response {
    let body = match api.body(request).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    let filter = if body.iter().all(u8::is_ascii_whitespace) {
        CounterFilter::everything()
    } else {
        match serde_json::from_slice::<ResetBody>(&body) {
            Ok(body) => CounterFilter::new(body.values),
            Err(e) => return (StatusCode::BAD_REQUEST, format!("invalid request body: {e}\n")).into_response(),
        }
    };
    match api.engine.reset_counters(&namespace, &filter).await {
        Ok(reset) => axum::Json(ResetJson { reset }).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("counter storage unavailable: {e}\n")).into_response(),
    }
}

async fn render_metrics<C: Clock + Clone>(State(api): State<Arc<Api<C>>>) -> Response {
    let text = api.metrics.render(&api.engine);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// `GET /status`: Limitador's fields (`config_version`, `config_err_since`: failed reloads since
/// the last good one) plus ours.
async fn status<C: Clock + Clone>(State(api): State<Arc<Api<C>>>) -> Response {
    let loaded = api.engine.loaded();
    let (failed, last_error) = api.metrics.reload_state();
    axum::Json(serde_json::json!({
        "status": "ok",
        "config_version": loaded.generation,
        "config_err_since": failed,
        "last_reload_error": last_error,
        "limits": loaded.policy.len(),
        "mode": format!("{:?}", api.engine.mode()).to_lowercase(),
        "shadow": api.engine.shadow(),
    }))
    .into_response()
}
