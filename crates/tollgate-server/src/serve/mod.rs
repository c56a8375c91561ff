//! `tollgate serve`: the rate-limit server.
//!
//! - [`Engine`]: decisions on the loaded limits and their in-memory counters, in accuracy or
//!   throughput mode, optionally in shadow mode;
//! - [`rls`]: Envoy's rate limit service (gRPC), answered without tonic's per-call machinery by
//!   `unary`; [`http`]: the HTTP API (Limitador's);
//! - [`Metrics`]: Prometheus metrics; [`Reloader`]: watching the limits file;
//! - [`start`]: all of it on the current tokio runtime.

mod admin;
mod cache;
mod counters;
mod engine;
pub mod headers;
pub mod http;
mod kuadrant;
mod metrics;
mod reload;
pub mod rls;
mod server;
mod unary;

pub use admin::{CounterFilter, CounterList, SCAN_COUNT};
pub use counters::CounterCap;
pub use engine::{
    Action, CounterTable, CounterView, Engine, Loaded, Mode, Outcome, RedisStore, Status, StorageError, StorageKind,
};
pub use headers::HeaderDraft;
pub use metrics::Metrics;
pub use reload::{Reloaded, Reloader};
pub use server::{Running, ServeConfig, ServeError, Storage, TimeSource, start};
