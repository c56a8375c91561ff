//! # Tollgate: rate limiting that is correct to the permit
//!
//! In-process limiters behind one trait, with decisions as data:
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Limiter, ManualClock, Quota, Reason, TokenBucket};
//!
//! let clock = ManualClock::new(); // or leave it out for the system clock
//! let limiter = Limiter::builder(TokenBucket::new(Quota::per_second(5)?)).clock(clock.clone()).build();
//!
//! let lease = limiter.try_acquire(5).expect("a full bucket admits its burst");
//! assert_eq!(lease.remaining(), 0);
//!
//! let no = limiter.try_acquire(1).unwrap_err();            // being limited is data, not an error
//! assert_eq!(no.reason(), Reason::Exhausted);
//! assert_eq!(no.retry_after(), Some(Duration::from_millis(200)));
//!
//! clock.advance(Duration::from_millis(200));
//! assert!(limiter.try_acquire(1).is_ok());
//! # Ok::<(), tollgate::QuotaError>(())
//! ```
//!
//! ## Algorithms
//!
//! | algorithm | bursts | exact? | state per key |
//! | --- | --- | --- | --- |
//! | [`TokenBucket`] (GCRA, lock-free) | up to `burst`, then smooth | exact for its model | 8 bytes |
//! | [`IntervalBucket`] | up to `burst`, refilled in steps | exact for its model | 24 bytes |
//! | [`FixedWindow`] | up to 2× limit across a boundary | no | 24 bytes |
//! | [`SlidingWindow`] (N segments) | about limit/N over (queued waiters: up to 2×) | approximately | 40 + 8·N bytes |
//! | [`WeightedWindow`] | small | approximation | 32 bytes |
//! | [`SlidingLog`] | never over `limit` in any window | exact | 48 + 16 bytes per admission time |
//! | [`Concurrency`] | — (permits held, not spent) | exact | 8 bytes |
//!
//! ## Waiting
//!
//! `acquire(n).await` waits in a queue, FIFO (strict) or LIFO, bounded in permits, with an
//! optional `max_wait`:
//!
//! ```
//! use tollgate::{Concurrency, Limiter, QueueOrder};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::builder(Concurrency::new(2)?).queue_order(QueueOrder::Fifo).queue_limit(100).build();
//! let lease = limiter.acquire(2).await?;   // released when dropped
//! assert_eq!(limiter.held(), 2);
//! drop(lease);
//! assert_eq!(limiter.held(), 0);
//! # Ok(()) }
//! ```
//!
//! [`Keyed`] keeps one state per key with bounded memory; [`Chain`] combines limits
//! all-or-nothing.
//!
//! ## Quotas and durations as text
//!
//! One parser reads what people write, for the `tollgate` command line, the Python bindings and
//! your own configuration: [`Quota::parse`] (also `str::parse::<Quota>()`) takes `LIMIT/PERIOD`
//! (`"100/s"`, `"5/10m"`, `"60/1m30s"`, `"1000/day"`), [`parse_duration`] takes `"250ms"`,
//! `"1m30s"` (humantime's syntax), and every failure is a [`ParseError`] naming the text at fault:
//!
//! ```
//! use std::time::Duration;
//! use tollgate::Quota;
//!
//! let quota: Quota = "5/10m".parse()?;
//! assert_eq!((quota.limit(), quota.period()), (5, Duration::from_secs(600)));
//! assert_eq!(tollgate::parse_duration("250ms")?, Duration::from_millis(250));
//!
//! let err = "10/0s".parse::<Quota>().unwrap_err();
//! assert_eq!(err.input(), "10/0s");
//! assert!(err.to_string().starts_with("invalid quota \"10/0s\": \"0s\" is zero"));
//! # Ok::<(), tollgate::ParseError>(())
//! ```
#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub, missing_debug_implementations)]
// Denied, not forbidden: `biased_lock` (and the cell it reads through, in `sync`) is the one
// place that hands out a reference without a `std` lock guard, checked by loom. Kept because it
// makes keyed decisions about 1.2x faster than `std`'s `RwLock`, on 1 and 2 threads
// (docs/keyed-lock.md, benches/keyed_lock.rs).
#![deny(unsafe_code)]

mod algorithm;
mod all_or_nothing;
mod answer;
#[allow(unsafe_code)]
mod biased_lock;
#[cfg(feature = "calendar")]
mod calendar;
mod catalogue;
mod chain;
mod clock;
mod concurrency;
mod decision;
mod fixed_window;
mod interval_bucket;
mod keyed;
mod limiter;
mod parse;
mod permit;
mod queue;
mod quota;
mod rate_limiter;
mod reservation;
mod seqlock;
mod shared;
mod sliding_log;
mod sliding_window;
mod snapshot;
mod stats;
mod sync;
mod token_bucket;
mod weighted_window;

pub use algorithm::Algorithm;
pub use all_or_nothing::{AllOrNothing, Outcome, PartAnswer, PartState, Reply, Step};
pub use answer::{Answer, AnswerFuture, BoxFuture, Check, Decision, Refund};
#[cfg(feature = "calendar")]
pub use calendar::{Calendar, CalendarError, CalendarUnit};
pub use catalogue::{AlgorithmKind, Support, UnknownAlgorithm};
pub use chain::Chain;
pub use clock::{Clock, ManualClock, Sleep, SystemClock};
pub use concurrency::{Concurrency, ConcurrencyState};
pub use decision::{Lease, Reason, Rejected};
pub use fixed_window::{FixedWindow, FixedWindowState, WindowCount};
pub use interval_bucket::{IntervalBucket, IntervalBucketState};
#[cfg(feature = "bench-locks")]
#[doc(hidden)]
pub use keyed::KeyedOnRwLock;
pub use keyed::{AtKeyLimit, Keyed, KeyedBuilder, KeyedStatistics, SWEEP};
pub use limiter::{Builder, Limiter};
pub use parse::{ParseError, ParseErrorKind, ParseTarget, parse_duration, parse_duration_or_zero, parse_rate};
pub use permit::Permit;
pub use queue::QueueOrder;
pub use quota::{Quota, QuotaError};
pub use rate_limiter::{Acquire, RateLimiter};
pub use reservation::{Reservation, Settle, SettleError, SettleFailed, Settled};
pub use sliding_log::{SlidingLog, SlidingLogState};
pub use sliding_window::{SlidingWindow, SlidingWindowState};
pub use snapshot::{Meta, Snapshot};
pub use stats::Statistics;
pub use token_bucket::{TokenBucket, TokenBucketState};
pub use weighted_window::{WeightedWindow, WeightedWindowState};
