//! The library behind the `tollgate` binary.
//!
//! - [`serve`]: the rate-limit server (`tollgate serve`): Envoy RLS over gRPC, an HTTP API
//!   compatible with Limitador's, Prometheus metrics, hot reload.
#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub, missing_debug_implementations)]

pub mod serve;
