//! [`Turnstile`]: the local `acquire` calls of one semaphore value join the Redis queue in the
//! order they were made, not in the order their tasks happen to be polled.
//!
//! A ticket is taken when `acquire()` is called (synchronously); the call's first script run —
//! the one that grants or queues it — is sent only after every earlier ticket's was sent (into
//! the connection's FIFO request queue, so calls are pipelined, not serialized on round trips)
//! or the earlier call was dropped.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

pub(super) struct Turnstile {
    state: Mutex<State>,
    /// The ticket whose turn it is.
    serving: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    next: u64,
    serving: u64,
    /// Tickets done ahead of their turn (dropped while waiting).
    done_early: BTreeSet<u64>,
}

impl Default for Turnstile {
    fn default() -> Self {
        Turnstile { state: Mutex::default(), serving: watch::Sender::new(0) }
    }
}

impl Turnstile {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place in line, taken now; done when dropped.
    pub(super) fn ticket(self: &Arc<Self>) -> Ticket {
        let mut state = self.lock();
        state.next += 1;
        Ticket { turnstile: self.clone(), number: state.next - 1 }
    }

    /// Waits until every earlier ticket is done.
    async fn wait(&self, ticket: u64) {
        let mut rx = self.serving.subscribe();
        // Err only if the sender is gone, which cannot happen while `self` lives.
        let _ = rx.wait_for(|serving| *serving >= ticket).await;
    }

    /// `ticket` has made its first attempt, or will never make it.
    fn done(&self, ticket: u64) {
        let mut state = self.lock();
        if ticket != state.serving {
            state.done_early.insert(ticket);
            return;
        }
        state.serving += 1;
        loop {
            let next = state.serving;
            if !state.done_early.remove(&next) {
                break;
            }
            state.serving += 1;
        }
        self.serving.send_replace(state.serving);
    }
}

/// A place in line. Marks itself done when dropped, so a cancelled `acquire` never blocks the line.
pub(super) struct Ticket {
    turnstile: Arc<Turnstile>,
    number: u64,
}

impl Ticket {
    /// Waits until every earlier ticket is done.
    pub(super) async fn wait(&self) {
        self.turnstile.wait(self.number).await;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.turnstile.done(self.number);
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    #[tokio::test]
    async fn turns_follow_tickets_even_when_one_is_dropped() {
        let t = Arc::new(Turnstile::default());
        let (a, b, c) = (t.ticket(), t.ticket(), t.ticket());
        assert_eq!((a.number, b.number, c.number), (0, 1, 2));
        assert!(c.wait().now_or_never().is_none());
        a.wait().await;
        // b leaves before its turn; c must still wait for a.
        drop(b);
        assert!(c.wait().now_or_never().is_none());
        drop(a);
        c.wait().await;
        drop(c);
        assert_eq!(*t.serving.borrow(), 3);
    }
}
