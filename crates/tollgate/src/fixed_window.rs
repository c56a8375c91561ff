//! Fixed window: at most `limit` permits per window of `period`; a window opens at the first
//! request after the previous one ended (seed 001's design, also Limitador's). Cheap and simple,
//! but up to 2× `limit` can pass within one `period` across a window boundary.

use std::sync::Mutex;

use crate::algorithm::Algorithm;
use crate::decision::Meta;
use crate::quota::Quota;
use crate::seqlock::SeqCell;
use crate::snapshot::Snapshot;

/// Fixed window counter.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{FixedWindow, Limiter, ManualClock, Quota};
/// let clock = ManualClock::new();
/// let limiter = Limiter::builder(FixedWindow::new(Quota::per_second(3)?)).clock(clock.clone()).build();
/// assert!(limiter.try_acquire(3).is_ok());
/// assert_eq!(limiter.try_acquire(1).unwrap_err().retry_after(), Some(Duration::from_secs(1)));
/// clock.advance(Duration::from_secs(1));
/// assert!(limiter.try_acquire(3).is_ok());   // a new window, the full limit again
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
///
/// Quota changes keep the current window's start and count; the new limit and period apply to it.
pub struct FixedWindow {
    quota: SeqCell<Quota>,
}

/// The state of one [`FixedWindow`].
#[derive(Debug)]
pub struct FixedWindowState(Mutex<Window>);

#[derive(Debug, Clone, Copy)]
struct Window {
    start: u64,
    count: u64,
}

impl FixedWindow {
    /// `quota.limit()` permits per `quota.period()`; the burst is not used.
    pub fn new(quota: Quota) -> FixedWindow {
        FixedWindow { quota: SeqCell::new(quota) }
    }
}

fn current(w: Window, now: u64, period: u64) -> Window {
    // An empty window is no window: the next admitted request opens one (also the first window,
    // which must not start when the state was created).
    if w.count == 0 || now >= w.start.saturating_add(period) { Window { start: now, count: 0 } } else { w }
}

fn meta(q: &Quota, w: Window, now: u64) -> Meta {
    let remaining = q.limit().saturating_sub(w.count);
    let end = w.start.saturating_add(q.period_ns());
    let reset_ns = if w.count == 0 { 0 } else { end.saturating_sub(now) };
    Meta { limit: q.limit(), remaining, reset_ns, retry_ns: Some(if remaining > 0 { 0 } else { reset_ns }) }
}

impl FixedWindow {
    fn decide_meta(&self, state: &FixedWindowState, now: u64, n: u64, commit: bool) -> Result<Meta, Meta> {
        let q = self.quota.load();
        let mut guard = state.0.lock().unwrap_or_else(|e| e.into_inner());
        let w = current(*guard, now, q.period_ns());
        if w.count.saturating_add(n) > q.limit() {
            let mut m = meta(&q, w, now);
            m.retry_ns = Some(w.start.saturating_add(q.period_ns()).saturating_sub(now));
            return Err(m);
        }
        if n == 0 || !commit {
            return Ok(meta(&q, w, now));
        }
        let w = Window { start: w.start, count: w.count + n };
        *guard = w;
        Ok(meta(&q, w, now))
    }
}

impl Algorithm for FixedWindow {
    type State = FixedWindowState;
    type Config = Quota;

    fn new_state(&self, now: u64) -> FixedWindowState {
        FixedWindowState(Mutex::new(Window { start: now, count: 0 }))
    }

    fn capacity(&self) -> u64 {
        self.quota.load().limit()
    }

    #[inline]
    fn decide(&self, state: &FixedWindowState, now: u64, n: u64, commit: bool) -> Result<Snapshot, Snapshot> {
        self.decide_meta(state, now, n, commit).map(Snapshot::from).map_err(Snapshot::from)
    }

    fn give_back(&self, state: &FixedWindowState, _now: u64, n: u64, acquired_at: u64) {
        let mut w = state.0.lock().unwrap_or_else(|e| e.into_inner());
        if acquired_at >= w.start {
            w.count = w.count.saturating_sub(n);
        }
    }

    fn is_idle(&self, state: &FixedWindowState, now: u64) -> bool {
        let w = *state.0.lock().unwrap_or_else(|e| e.into_inner());
        current(w, now, self.quota.load().period_ns()).count == 0
    }

    fn idle_at(&self, state: &FixedWindowState, now: u64) -> u64 {
        let period = self.quota.load().period_ns();
        let w = current(*state.0.lock().unwrap_or_else(|e| e.into_inner()), now, period);
        if w.count == 0 { now } else { w.start.saturating_add(period) }
    }

    fn wait_estimate(&self, state: &FixedWindowState, now: u64, permits: u64) -> Option<u64> {
        let q = self.quota.load();
        let w = current(*state.0.lock().unwrap_or_else(|e| e.into_inner()), now, q.period_ns());
        let remaining = q.limit().saturating_sub(w.count);
        if permits <= remaining {
            return Some(0);
        }
        let windows = (permits - remaining).div_ceil(q.limit());
        let first = w.start.saturating_add(q.period_ns()).saturating_sub(now);
        Some(first.saturating_add((windows - 1).saturating_mul(q.period_ns())))
    }

    fn config(&self) -> Quota {
        self.quota.load()
    }

    fn window(&self) -> Option<std::time::Duration> {
        Some(self.quota.load().period())
    }

    fn set_config(&self, quota: Quota) -> Quota {
        self.quota.store(quota)
    }

    fn carry_over(&self, _state: &FixedWindowState, _now: u64, _old: Quota) {}
}

impl std::fmt::Debug for FixedWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixedWindow").field("quota", &self.config()).finish()
    }
}
