//! # tollgate-pace: pacing batch work against a throttled service
//!
//! The other side of rate limiting (seed 004, the Azure "Rate Limiting pattern"): a job that must
//! push a lot of work into a service that throttles it, without being throttled, and with several
//! uncoordinated workers sharing the service's capacity.
//!
//! - [`Pacer`]: a [`Budget`] in any unit, released in short slices, cut on throttling and probed
//!   back up (AIMD), honouring Retry-After;
//! - [`Partitions`]: the global capacity split into partitions leased through Redis (TTL, renewal,
//!   fencing token); a worker paces itself to what it holds, a dead worker's partitions come back
//!   when their lease lapses;
//! - [`RedisStreams`] (a [`Queue`]) and [`pump`]: a durable queue in front of the workers, drained
//!   under the pacer, acknowledged only after success, reclaimed from dead workers, dead-lettered
//!   after repeated failures;
//! - the `http` module (feature `http`): work items as JSON Lines and the worker that sends each to an HTTP
//!   API, classifying the answer as done, throttled or failed (what `tollgate pump` runs);
//! - metrics through the [`metrics`](https://docs.rs/metrics) facade, labelled by the pacer's
//!   name ([`PacerBuilder::name`]): `tollgate_pacer_rate`, `tollgate_pacer_ceiling`,
//!   `tollgate_pacer_throttled_total`, `tollgate_pacer_units_total`,
//!   `tollgate_pump_items_total{outcome}`, `tollgate_pump_in_flight` and
//!   `tollgate_pump_queue_retries_total`. A pacer registers them
//!   when it is built: install the recorder first.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tollgate_pace::PaceError> {
//! use tollgate_pace::{Budget, Pacer};
//! let pacer = Pacer::builder(Budget::per_second(100)?).build()?;
//! for item_cost in [1, 1, 5] {
//!     pacer.acquire(item_cost).await?;      // waits for the budget
//!     // ... call the service; on a 429: pacer.throttled(retry_after), else pacer.succeeded()
//!     pacer.succeeded();
//! }
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]
#![forbid(unsafe_code)]

mod budget;
mod error;
#[cfg(feature = "http")]
pub mod http;
mod metrics;
mod pacer;
mod partitions;
mod pump;
mod queue;
mod retry;

pub use budget::Budget;
pub use error::{PaceError, QueueError};
pub use pacer::{Pacer, PacerBuilder};
pub use partitions::{Partitions, PartitionsBuilder};
pub use pump::{Handled, HandlerError, Progress, PumpOptions, pump};
pub use queue::{Item, Queue, RedisStreams};
pub use retry::Jitter;
