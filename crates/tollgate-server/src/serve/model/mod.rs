//! What the server decides about, with no I/O: a call and its answer, the loaded limits, the
//! counters as reported, which counters a reset chooses, where counters may live, and how large a
//! request may be. Every other layer reads these types; they read none of the others.

pub(crate) mod bounds;
pub(crate) mod call;
pub(crate) mod counters;
pub(crate) mod listing;
pub(crate) mod loaded;
pub(crate) mod share;
pub(crate) mod storage;

pub use bounds::{Bound, Oversize, RequestBounds};
pub use call::{Action, CallError, Mode, Outcome, Status};
pub(crate) use counters::Counters;
pub use counters::{CounterCap, CounterTable};
pub use listing::{CounterFilter, CounterList, CounterView};
pub(crate) use listing::{Pick, limits_by_id};
pub use loaded::Loaded;
pub(crate) use share::fair_level;
pub use share::fair_shares;
pub use storage::{REDIS_MAX_VALUE, Refused, StorageError, StorageKind};
