//! Running the server: Prometheus metrics ([`Metrics`](crate::serve::Metrics)), hot reload of the
//! limits file ([`Reloader`](crate::serve::Reloader)) and of the TLS certificates ([`watch`]), and the decision spans of [`trace`].

pub(crate) mod metrics;
pub(crate) mod reload;
pub mod trace;
pub(crate) mod watch;
