//! `tollgate serve`: the rate-limit server, in layers that point one way (each uses only those
//! above it in this list):
//!
//! - `model`: what is decided about, no I/O: [`Action`], [`Outcome`], [`Loaded`], the counters'
//!   [`CounterCap`] and views, [`CounterFilter`], [`StorageKind`], [`RequestBounds`];
//! - `store`: where counters live (in memory, or in Redis three ways), one store picked at start;
//! - [`Engine`]: decisions on the loaded limits, optionally in shadow mode, with that store;
//! - `ops`: [`Metrics`] (Prometheus), [`Reloader`] (watching the limits file), [`trace`] (a
//!   `tracing` span per decision, and the [`TraceParent`] hook that links it to the caller's
//!   trace);
//! - `protocol`: Envoy's and Kuadrant's rate limit services ([`rls`]), Envoy's rate limit quota
//!   service ([`rlqs`]: fair shares of each limit for Envoys that enforce locally), the HTTP API
//!   ([`http`], Limitador's) and the RateLimit [`headers`], each answering in its own messages,
//!   unframed;
//! - `net`: the listeners' connections, framing those answers (the rate-limit gRPC calls without
//!   tonic's per-call machinery, the HTTP decision calls without hyper's);
//! - [`start`]: all of it on the current tokio runtime.

mod engine;
#[doc(hidden)]
pub mod fuzzing;
mod model;
mod net;
mod ops;
mod protocol;
mod server;
mod store;

pub use engine::Engine;
pub use model::{
    Action, Bound, CallError, CounterCap, CounterFilter, CounterList, CounterTable, CounterView, Loaded, Mode, Outcome,
    Oversize, REDIS_MAX_VALUE, Refused, RequestBounds, Status, StorageError, StorageKind, fair_shares,
};
pub use net::tls::{TlsError, TlsFiles};
pub use ops::metrics::{Metrics, STATS_KEYS_PER_LIMIT, UNCONFIGURED_NAMESPACE};
pub use ops::reload::{Reloaded, Reloader};
pub use ops::trace;
pub use protocol::headers::{HeaderDraft, UnknownHeaderDraft};
pub use protocol::rlqs::RlqsConfig;
pub use protocol::{headers, http, rlqs, rls};
pub use server::{
    DEFAULT_GRPC_READ_TIMEOUT, DEFAULT_HTTP_READ_TIMEOUT, Running, ServeConfig, ServeError, Storage, start,
};
pub use store::{RedisStore, SCAN_COUNT, TimeSource};
pub use trace::TraceParent;
