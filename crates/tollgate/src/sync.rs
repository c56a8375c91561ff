//! Atomics used by the lock-free parts, swapped for loom's under `--cfg tollgate_loom` so the
//! model checker can explore every interleaving.

#[cfg(tollgate_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering, fence};
#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering, fence};
