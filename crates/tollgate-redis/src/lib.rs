//! # tollgate-redis: limits shared by every replica
//!
//! The same decisions as the in-memory [`tollgate`] limiters, with the state in Redis:
//!
//! - one round trip per decision: a Lua script per algorithm (in `scripts/*.lua`, each with its
//!   KEYS/ARGV/return contract on top): the decision scripts as Redis functions (`FCALL`, loaded
//!   once; `EVALSHA` of the same text where the server has no functions or the user may not load
//!   them), the others with `EVALSHA`, loaded only on `NOSCRIPT`;
//!   decisions that arrive while two runs of their script are under way go together in the next
//!   run, each decided alone (Redis's cost of a run is paid once per batch);
//! - time from Redis `TIME`, never from the client;
//! - several limits (per user, per tenant) decided together, all-or-nothing;
//! - keys that expire as soon as they stop mattering;
//! - hash-tagged keys, so it works on Redis Cluster;
//! - a real refund: a lease given back restores what it took, so a [`tollgate::Chain`] of a Redis
//!   limit and a local one is all-or-nothing (`RedisLimiter` is a [`tollgate::RateLimiter`]);
//! - one [`Redis`] connection for a server (`redis://`, `rediss://` with TLS), a Cluster, or the
//!   master of a Sentinel deployment (`redis+sentinel://`), followed through failovers;
//! - a deadline on every call, and a [`FailurePolicy`] (deny, allow, or a local limiter) that
//!   decides when Redis cannot — reported with its own [`tollgate::Reason`], never as "limited".
//! - for a hot key every replica hits, [`LeasedLimiter`]: slices of a fixed window's budget leased
//!   in one script call and spent in-process, never admitting more than the limit across processes;
//! - metrics through the [`metrics`](https://docs.rs/metrics) facade, labelled by the limiter's
//!   prefix (never a key): `tollgate_redis_decision_seconds` (histogram),
//!   `tollgate_redis_errors_total{kind}` and `tollgate_redis_failure_policy_total{outcome}`. A
//!   [`RedisLimiter`] registers them when it is built: install the recorder first. Code that
//!   calls Redis through [`counters::decide_windows`] records the first two with a [`RedisMetrics`];
//! - one key layout for every type, [`Keyspace`], and one choice of whose clock decides,
//!   [`RedisTime`] (Redis `TIME`, or a [`tollgate::ManualClock`] in tests);
//! - the rate-limit server's own calls (counters named per call, listed and deleted by scan) in
//!   [`counters`].
//!
//! Going from local to distributed is one line:
//!
//! ```no_run
//! use tollgate::{Keyed, Quota, TokenBucket};
//! use tollgate_redis::{Redis, AlgorithmKind, RedisLimiter};
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let quota = Quota::per_second(10)?;
//! // let per_user = Keyed::new(TokenBucket::new(quota));                     // one process
//! let redis = Redis::connect("redis://127.0.0.1/").await?;
//! let per_user = RedisLimiter::builder(&redis, "api", AlgorithmKind::TokenBucket).limit("user", quota).build()?;
//! let lease = per_user.try_acquire("alice", 1).await;
//! # let _ = (lease, Keyed::<String, _>::new(TokenBucket::new(quota))); Ok(()) }
//! ```
#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub)]
#![warn(missing_debug_implementations)]
#![forbid(unsafe_code)]

mod backend;
mod batch;
pub mod counters;
mod error;
mod failure;
mod key;
mod keyspace;
mod leased;
mod limiter;
mod metrics;
mod scripts;
mod semaphore;
mod sentinel;
mod time;
mod tls;

pub use crate::metrics::RedisMetrics;
pub use backend::{Redis, RedisOptions, redact_url};
pub use error::BackendError;
pub use failure::{FailurePolicy, LocalFallback};
pub use key::RedisKey;
pub use keyspace::Keyspace;
pub use leased::{LeasedLimiter, LeasedLimiterBuilder};
pub use limiter::{KeyCountError, RedisLimiter, RedisLimiterBuilder};
/// The Redis client underneath, re-exported so that commands for [`Redis::query`] and
/// [`Redis::pipeline`] are built with the same version (`tollgate_redis::redis::cmd("XLEN")`).
pub use redis;
pub use semaphore::{RedisSemaphore, RedisSemaphoreBuilder, SemaphoreConfigError, SemaphoreGuard, SemaphoreState};
pub use time::RedisTime;
/// The algorithms, by the core's catalogue: a [`RedisLimiter`] runs those whose
/// [`support`](tollgate::AlgorithmKind::support) says `redis`.
pub use tollgate::AlgorithmKind;

/// A misconfigured limiter, naming what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A limiter needs at least one limit.
    #[error("redis limiter {prefix:?} has no limits: add one with .limit(name, quota)")]
    NoLimits {
        /// The limiter's key prefix.
        prefix: String,
    },
    /// An algorithm with no Redis script (the catalogue's `support().redis` is false).
    #[error("redis limiter {prefix:?}: {algorithm} has no Redis script; expected {}", AlgorithmKind::names_where(|s| s.redis))]
    Algorithm {
        /// The limiter's key prefix.
        prefix: String,
        /// The algorithm asked for.
        algorithm: AlgorithmKind,
    },
    /// A limit name with a `:`: a limit's key is its name then the caller's key after a `:`, so
    /// `("a", "b:c")` and `("a:b", "c")` would count on one key.
    #[error("redis limiter {prefix:?}: limit name {name:?} has a ':' (it ends the name in the limit's Redis key)")]
    LimitName {
        /// The limiter's key prefix.
        prefix: String,
        /// The limit's name.
        name: String,
    },
    /// Two limits of one limiter with the same name: they would count on one key.
    #[error("redis limiter {prefix:?} has two limits named {name:?}: each needs its own name (its Redis key)")]
    DuplicateLimit {
        /// The limiter's key prefix.
        prefix: String,
        /// The name given twice.
        name: String,
    },
    /// [`RedisLimiterBuilder::whole_keys`] with more than one limit: they would share one key.
    #[error("redis limiter {prefix:?} uses whole keys but has {limits} limits: whole keys take exactly one")]
    WholeKeys {
        /// The limiter's key prefix.
        prefix: String,
        /// How many limits it was given.
        limits: usize,
    },
}
