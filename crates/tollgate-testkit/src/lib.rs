//! Test support for Tollgate's crates: the parts a fault test is made of.
//!
//! - [`RedisServer`]: a real `redis-server` per test on a free port, that the test can kill,
//!   restart, pause (SIGSTOP, a hung server) and resume; [`RedisCluster`]: several of them as
//!   a Redis Cluster.
//! - [`Certificates`]: a throwaway CA and certificates for TLS tests (the `openssl` command).
//! - [`FaultProxy`]: a TCP proxy between clients and a server that adds latency, blackholes,
//!   resets connections and heals, switched while the test runs.
//! - [`History`] and [`Bound`]: every decision recorded on the authority's clock and checked
//!   against the algorithm's own bound; a violation names the shortest window that breaks it.
//! - [`Part`] and [`part`]: random parts of an all-or-nothing call, for the two-phase property
//!   tests.
//!
//! ```
//! use tollgate_testkit::{Bound, Decision, History};
//! let history = History::default();
//! // Two permits a second, burst 2: three admissions within one millisecond break the bound.
//! for at in [0, 500_000, 1_000_000] {
//!     history.record(Decision { at_ns: at, key: "k".into(), n: 1, allowed: true });
//! }
//! let bound = Bound::TokenBucket { burst: 2, emission_ns: 500_000_000 };
//! let violation = history.check(&bound).unwrap_err();
//! assert_eq!((violation.admitted, violation.allowed), (3, 2));
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![warn(missing_debug_implementations)]

mod certificates;
mod doc_pages;
mod history;
mod parts;
mod process;
mod proxy;
mod redis_cluster;
mod redis_server;

pub use certificates::Certificates;
pub use history::{Bound, Decision, History, Hold, Violation, max_holders};
pub use parts::{Part, part};
pub use process::{Signal, free_port, signal};
pub use proxy::{Fault, FaultProxy};
pub use redis_cluster::RedisCluster;
pub use redis_server::RedisServer;
