//! The wait queue behind `acquire(n).await`: its waiters in arrival order, each with the slot
//! its outcome is handed over in, and the order they are served in ([`QueueOrder`]). The queue
//! is data only: the limiter's shared state (`shared`) holds it under a lock and drives it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::task::Waker;

use crate::decision::{Lease, Rejected};
use crate::sync::Mutex;

/// Which waiter is served first when permits become available.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum QueueOrder {
    /// Oldest first, strictly: a request never overtakes an older one, even a smaller one, and
    /// `try_acquire` fails while anyone is queued.
    #[default]
    Fifo,
    /// Newest first; when the queue limit is hit, the oldest waiters are rejected
    /// ([`Reason::Evicted`](crate::Reason::Evicted)) to make room.
    Lifo,
}

#[derive(Default)]
pub(crate) struct Queue {
    pub(crate) waiters: BTreeMap<u64, Waiter>,
    pub(crate) next_id: u64,
    pub(crate) permits: u64,
}

pub(crate) struct Waiter {
    pub(crate) n: u64,
    pub(crate) deadline: Option<u64>,
    pub(crate) slot: Arc<Slot>,
}

/// Where a waiter's outcome is handed over, with the waker to call when it is.
#[derive(Default)]
pub(crate) struct Slot(pub(crate) Mutex<SlotInner>);

#[derive(Default)]
pub(crate) struct SlotInner {
    pub(crate) outcome: Option<Result<Lease, Rejected>>,
    pub(crate) waker: Option<Waker>,
}

impl Slot {
    /// Stores the outcome and returns the waker to call once every lock is released.
    pub(crate) fn complete(&self, outcome: Result<Lease, Rejected>) -> Option<Waker> {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        s.outcome = Some(outcome);
        s.waker.take()
    }

    pub(crate) fn wake_handle(&self) -> Option<Waker> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).waker.clone()
    }
}

impl Queue {
    pub(crate) fn head(&self, order: QueueOrder) -> Option<(u64, &Waiter)> {
        match order {
            QueueOrder::Fifo => self.waiters.first_key_value(),
            QueueOrder::Lifo => self.waiters.last_key_value(),
        }
        .map(|(&id, w)| (id, w))
    }

    pub(crate) fn remove(&mut self, id: u64) -> Option<Waiter> {
        let w = self.waiters.remove(&id)?;
        self.permits -= w.n;
        Some(w)
    }
}
