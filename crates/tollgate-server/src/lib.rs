//! # tollgate-server: the rate-limit server behind `tollgate serve`
//!
//! [`serve`] is the whole library: Envoy's rate limit service over gRPC, an HTTP API compatible
//! with Limitador's, Prometheus metrics and hot reload of the limits file, started on the current
//! tokio runtime.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate::SystemClock;
//! use tollgate_server::serve::{ServeConfig, start};
//!
//! let limits = std::env::temp_dir().join(format!("tollgate-doc-{}.yaml", std::process::id()));
//! std::fs::write(&limits, "- namespace: example.org\n  max_value: 10\n  seconds: 60\n")?;
//! let config = ServeConfig {
//!     grpc: "127.0.0.1:0".parse()?, // port 0: the OS chooses
//!     http: "127.0.0.1:0".parse()?,
//!     watch: false,
//!     ..ServeConfig::new(&limits)
//! };
//! let running = start(&config, SystemClock::new()).await?;
//! println!("RLS on {}, HTTP API on {}", running.grpc, running.http);
//! running.shutdown().await;
//! # std::fs::remove_file(&limits)?;
//! # Ok(()) }
//! ```
//!
//! The binary's other subcommands are thin command lines over their own crates: `simulate` over
//! `tollgate-sim`, `bench` over `tollgate-load`, `pump` over `tollgate-pace` (and its `http`
//! worker), `check-config` and `convert` over `tollgate-policy`.
#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub, missing_debug_implementations)]
#![forbid(unsafe_code)]

pub mod serve;
