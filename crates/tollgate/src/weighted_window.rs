//! Sliding window, weighted two-window approximation (seed 001's "moving window", Cloudflare's
//! design): windows of `period` aligned to the clock's origin; the estimate is the previous
//! window's count weighted by how much of it still overlaps the sliding window, plus the current
//! window's count. Two counters per key; smooth, but an approximation.

use std::sync::Mutex;

use crate::algorithm::{Algorithm, quota_cell_members};
use crate::quota::Quota;
use crate::seqlock::SeqCell;
use crate::snapshot::{Meta, Snapshot};

/// Weighted two-window sliding counter.
///
/// Admits `n` when `prev · (period − elapsed) / period + curr + n <= limit`, computed exactly in
/// integers (no rounding).
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Limiter, ManualClock, Quota, WeightedWindow};
/// let clock = ManualClock::new();
/// let limiter = Limiter::builder(WeightedWindow::new(Quota::per_second(10)?)).clock(clock.clone()).build();
/// let _ = limiter.try_acquire(10).unwrap();
/// clock.advance(Duration::from_millis(1500));
/// // Half of the previous window still overlaps: 5 of its 10 count.
/// assert_eq!(limiter.try_acquire(0).unwrap().remaining(), 5);
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
///
/// Quota changes keep both counts; the windows are re-aligned to the new period.
pub struct WeightedWindow {
    quota: SeqCell<Quota>,
}

/// The state of one [`WeightedWindow`].
#[derive(Debug)]
pub struct WeightedWindowState(Mutex<TwoWindows>);

#[derive(Debug, Clone, Copy)]
struct TwoWindows {
    index: u64,
    prev: u64,
    curr: u64,
}

impl WeightedWindow {
    /// `quota.limit()` permits per sliding `quota.period()`; the burst is not used.
    pub fn new(quota: Quota) -> WeightedWindow {
        WeightedWindow { quota: SeqCell::new(quota) }
    }
}

impl TwoWindows {
    fn roll(self, index: u64) -> TwoWindows {
        match index.saturating_sub(self.index) {
            0 => self,
            1 => TwoWindows { index, prev: self.curr, curr: 0 },
            _ => TwoWindows { index, prev: 0, curr: 0 },
        }
    }

    /// Nanoseconds from `now` until `n` more fit (`n <= limit`).
    fn wait_for(&self, now: u64, p: u64, limit: u64, n: u64) -> u64 {
        let start = self.index * p;
        // Earliest elapsed time e in a window with counts (prev, curr) such that
        // prev * (p - e) <= (limit - curr - n) * p.
        let earliest = |prev: u64, curr: u64| -> Option<u64> {
            let room = limit.checked_sub(curr.checked_add(n)?)? as u128 * p as u128;
            if prev == 0 {
                return Some(0);
            }
            let keep = (room / prev as u128).min(p as u128) as u64;
            Some(p - keep)
        };
        match earliest(self.prev, self.curr) {
            Some(e) => start.saturating_add(e).saturating_sub(now),
            None => {
                let e = earliest(self.curr, 0).unwrap_or(p);
                start.saturating_add(p).saturating_add(e).saturating_sub(now)
            }
        }
    }

    fn weighted(&self, now: u64, p: u64) -> u128 {
        let elapsed = now - self.index * p;
        self.prev as u128 * (p - elapsed) as u128 + self.curr as u128 * p as u128
    }

    fn meta(&self, now: u64, q: &Quota) -> Meta {
        let p = q.period_ns();
        let cap = q.limit() as u128 * p as u128;
        let remaining = (cap.saturating_sub(self.weighted(now, p)) / p as u128) as u64;
        // Window ends may lie past the end of the clock's range: saturate rather than overflow.
        let end_of = |windows: u64| (self.index as u128 + windows as u128) * p as u128 - now as u128;
        let reset_ns = if self.curr > 0 {
            end_of(2)
        } else if self.prev > 0 {
            end_of(1)
        } else {
            0
        };
        let reset_ns = u64::try_from(reset_ns).unwrap_or(u64::MAX);
        Meta { limit: q.limit(), remaining, reset_ns, retry_ns: Some(self.wait_for(now, p, q.limit(), 1)) }
    }
}

impl WeightedWindow {
    fn decide_meta(&self, state: &WeightedWindowState, now: u64, n: u64, commit: bool) -> Result<Meta, Meta> {
        let q = self.quota.load();
        let p = q.period_ns();
        let mut guard = state.0.lock().unwrap_or_else(|e| e.into_inner());
        let w = guard.roll(now / p);
        let needed = w.weighted(now, p) + n as u128 * p as u128;
        // `n > 0`: a probe answers even over the limit (a settled debt).
        if needed > q.limit() as u128 * p as u128 && n > 0 {
            *guard = w;
            let mut m = w.meta(now, &q);
            m.retry_ns = Some(w.wait_for(now, p, q.limit(), n));
            return Err(m);
        }
        let w = if n > 0 && commit { TwoWindows { curr: w.curr + n, ..w } } else { w };
        *guard = w;
        Ok(w.meta(now, &q))
    }
}

impl Algorithm for WeightedWindow {
    type State = WeightedWindowState;
    type Config = Quota;

    fn new_state(&self, now: u64) -> WeightedWindowState {
        let p = self.quota.load().period_ns();
        WeightedWindowState(Mutex::new(TwoWindows { index: now / p, prev: 0, curr: 0 }))
    }

    quota_cell_members!(limit);

    #[inline]
    fn decide(&self, state: &WeightedWindowState, now: u64, n: u64, commit: bool) -> Result<Snapshot, Snapshot> {
        self.decide_meta(state, now, n, commit).map(Snapshot::from).map_err(Snapshot::from)
    }

    fn give_back(&self, state: &WeightedWindowState, now: u64, n: u64, acquired_at: u64) {
        let p = self.quota.load().period_ns();
        let mut guard = state.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut w = guard.roll(now / p);
        let at = acquired_at / p;
        if at == w.index {
            w.curr = w.curr.saturating_sub(n);
        } else if at + 1 == w.index {
            w.prev = w.prev.saturating_sub(n);
        }
        *guard = w;
    }

    /// Counted in the current window, past the limit if need be: it weighs on requests in this
    /// window and, by its overlap, the next.
    fn charge(&self, state: &WeightedWindowState, now: u64, n: u64) -> Result<(), &'static str> {
        let p = self.quota.load().period_ns();
        let mut guard = state.0.lock().unwrap_or_else(|e| e.into_inner());
        let w = guard.roll(now / p);
        *guard = TwoWindows { curr: w.curr.saturating_add(n), ..w };
        Ok(())
    }

    fn is_idle(&self, state: &WeightedWindowState, now: u64) -> bool {
        let p = self.quota.load().period_ns();
        let w = state.0.lock().unwrap_or_else(|e| e.into_inner()).roll(now / p);
        w.prev == 0 && w.curr == 0
    }

    fn idle_at(&self, state: &WeightedWindowState, now: u64) -> u64 {
        let p = self.quota.load().period_ns();
        let w = state.0.lock().unwrap_or_else(|e| e.into_inner()).roll(now / p);
        // A current count still weighs as the previous window's during the next window.
        let windows = if w.curr > 0 {
            2
        } else if w.prev > 0 {
            1
        } else {
            return now;
        };
        let at = (u128::from(w.index) + windows) * u128::from(p);
        u64::try_from(at).unwrap_or(u64::MAX)
    }

    fn wait_estimate(&self, state: &WeightedWindowState, now: u64, permits: u64) -> Option<u64> {
        let q = self.quota.load();
        let p = q.period_ns();
        let w = state.0.lock().unwrap_or_else(|e| e.into_inner()).roll(now / p);
        let extra_periods = permits.saturating_sub(1) / q.limit();
        let rest = permits - extra_periods * q.limit();
        Some(w.wait_for(now, p, q.limit(), rest).saturating_add(extra_periods.saturating_mul(p)))
    }

    fn carry_over(&self, state: &WeightedWindowState, now: u64, old: Quota) {
        let p = self.quota.load().period_ns();
        if p == old.period_ns() {
            return;
        }
        let mut guard = state.0.lock().unwrap_or_else(|e| e.into_inner());
        let w = guard.roll(now / old.period_ns());
        *guard = TwoWindows { index: now / p, ..w };
    }
}

impl std::fmt::Debug for WeightedWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightedWindow").field("quota", &self.config()).finish()
    }
}
