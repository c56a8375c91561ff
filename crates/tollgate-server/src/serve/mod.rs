//! `tollgate serve`: the rate-limit server.
//!
//! - [`Engine`]: decisions on the loaded limits, optionally in shadow mode, with one store of
//!   counters picked at start (in memory in accuracy or throughput mode, in Redis, or cached from
//!   Redis);
//! - [`rls`]: Envoy's rate limit service (gRPC), answered without tonic's per-call machinery by
//!   `unary`; [`http`]: the HTTP API (Limitador's);
//! - [`Metrics`]: Prometheus metrics; [`Reloader`]: watching the limits file;
//! - [`trace`]: a `tracing` span per decision, off unless a subscriber enables it, and the
//!   [`TraceParent`] hook that links it to the caller's trace;
//! - [`start`]: all of it on the current tokio runtime.

mod admin;
mod bounds;
mod counters;
mod engine;
#[doc(hidden)]
pub mod fuzzing;
pub mod headers;
pub mod http;
mod http1;
mod kuadrant;
mod metrics;
mod preface;
mod reload;
pub mod rls;
mod server;
mod socket;
mod store;
pub mod trace;
mod unary;

pub use admin::{CounterFilter, CounterList};
pub use bounds::{Bound, Oversize, RequestBounds};
pub use counters::CounterCap;
pub use engine::{
    Action, CallError, CounterTable, CounterView, Engine, Loaded, Mode, Outcome, Status, StorageError, StorageKind,
};
pub use headers::{HeaderDraft, UnknownHeaderDraft};
pub use metrics::{Metrics, UNCONFIGURED_NAMESPACE};
pub use reload::{Reloaded, Reloader};
pub use server::{
    DEFAULT_GRPC_READ_TIMEOUT, DEFAULT_HTTP_READ_TIMEOUT, Running, ServeConfig, ServeError, Storage, start,
};
pub use store::{RedisStore, SCAN_COUNT, TimeSource};
pub use trace::TraceParent;
