//! Sliding log: remembers when every permit was taken, so it is exact: never more than `limit`
//! permits in any window of `period`. Memory grows with the limit (one entry per admission time).

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::algorithm::{Algorithm, quota_cell_members};
use crate::quota::Quota;
use crate::seqlock::SeqCell;
use crate::snapshot::{Meta, Snapshot};

/// Exact sliding window over a log of admission times.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Limiter, ManualClock, Quota, SlidingLog};
/// let clock = ManualClock::new();
/// let limiter = Limiter::builder(SlidingLog::new(Quota::per_second(2)?)).clock(clock.clone()).build();
/// let _ = limiter.try_acquire(1).unwrap();
/// clock.advance(Duration::from_millis(600));
/// let _ = limiter.try_acquire(1).unwrap();
/// // The first permit leaves the window 1 s after it was taken, 400 ms from now.
/// assert_eq!(limiter.try_acquire(1).unwrap_err().retry_after(), Some(Duration::from_millis(400)));
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
///
/// Quota changes keep the log; the new limit and period apply to it at once.
pub struct SlidingLog {
    quota: SeqCell<Quota>,
}

/// The state of one [`SlidingLog`].
#[derive(Debug, Default)]
pub struct SlidingLogState(Mutex<Log>);

#[derive(Debug, Default)]
struct Log {
    // (admission time, permits), oldest first.
    entries: VecDeque<(u64, u64)>,
    total: u64,
}

impl Log {
    fn expire(&mut self, now: u64, period: u64) {
        while let Some(&(t, n)) = self.entries.front() {
            if t.saturating_add(period) > now {
                break;
            }
            self.entries.pop_front();
            self.total -= n;
        }
    }

    /// Nanoseconds until `n` more permits fit under `limit` (0 if they fit now).
    fn add(&mut self, now: u64, n: u64) {
        match self.entries.back_mut() {
            Some((t, k)) if *t == now => *k = k.saturating_add(n),
            _ => self.entries.push_back((now, n)),
        }
        self.total = self.total.saturating_add(n);
    }

    fn wait_for(&self, now: u64, period: u64, limit: u64, n: u64) -> u64 {
        let mut total = self.total;
        for &(t, k) in &self.entries {
            if total.saturating_add(n) <= limit {
                break;
            }
            total -= k;
            if total.saturating_add(n) <= limit {
                return t.saturating_add(period).saturating_sub(now);
            }
        }
        0
    }

    fn meta(&self, q: &Quota, now: u64) -> Meta {
        let remaining = q.limit().saturating_sub(self.total);
        let reset_ns = self.entries.back().map_or(0, |&(t, _)| t.saturating_add(q.period_ns()).saturating_sub(now));
        let retry = self.wait_for(now, q.period_ns(), q.limit(), 1);
        Meta { limit: q.limit(), remaining, reset_ns, retry_ns: Some(retry) }
    }
}

impl SlidingLog {
    /// At most `quota.limit()` permits in any window of `quota.period()`; the burst is not used.
    pub fn new(quota: Quota) -> SlidingLog {
        SlidingLog { quota: SeqCell::new(quota) }
    }
}

impl SlidingLog {
    fn decide_meta(&self, state: &SlidingLogState, now: u64, n: u64, commit: bool) -> Result<Meta, Meta> {
        let q = self.quota.load();
        let mut log = state.0.lock().unwrap_or_else(|e| e.into_inner());
        log.expire(now, q.period_ns());
        // `n > 0`: a probe answers even over the limit (a settled debt).
        if log.total.saturating_add(n) > q.limit() && n > 0 {
            let mut m = log.meta(&q, now);
            m.retry_ns = Some(log.wait_for(now, q.period_ns(), q.limit(), n));
            return Err(m);
        }
        if n > 0 && commit {
            log.add(now, n);
        }
        Ok(log.meta(&q, now))
    }
}

impl Algorithm for SlidingLog {
    type State = SlidingLogState;
    type Config = Quota;

    fn new_state(&self, _now: u64) -> SlidingLogState {
        SlidingLogState::default()
    }

    quota_cell_members!(limit);

    #[inline]
    fn decide(&self, state: &SlidingLogState, now: u64, n: u64, commit: bool) -> Result<Snapshot, Snapshot> {
        self.decide_meta(state, now, n, commit).map(Snapshot::from).map_err(Snapshot::from)
    }

    fn give_back(&self, state: &SlidingLogState, _now: u64, n: u64, acquired_at: u64) {
        let mut log = state.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut left = n;
        for entry in log.entries.iter_mut().rev() {
            if entry.0 == acquired_at {
                let k = entry.1.min(left);
                entry.1 -= k;
                left -= k;
                break;
            }
            if entry.0 < acquired_at {
                break;
            }
        }
        log.total -= n - left;
        log.entries.retain(|&(_, k)| k > 0);
    }

    /// Logged at `now`, past the limit if need be: it counts for a period, as any admission.
    fn charge(&self, state: &SlidingLogState, now: u64, n: u64) -> Result<(), &'static str> {
        if n > 0 {
            let mut log = state.0.lock().unwrap_or_else(|e| e.into_inner());
            log.expire(now, self.quota.load().period_ns());
            log.add(now, n);
        }
        Ok(())
    }

    fn is_idle(&self, state: &SlidingLogState, now: u64) -> bool {
        let period = self.quota.load().period_ns();
        let log = state.0.lock().unwrap_or_else(|e| e.into_inner());
        log.entries.back().is_none_or(|&(t, _)| t.saturating_add(period) <= now)
    }

    fn idle_at(&self, state: &SlidingLogState, now: u64) -> u64 {
        let period = self.quota.load().period_ns();
        let log = state.0.lock().unwrap_or_else(|e| e.into_inner());
        log.entries.back().map_or(now, |&(t, _)| t.saturating_add(period).max(now))
    }

    fn wait_estimate(&self, state: &SlidingLogState, now: u64, permits: u64) -> Option<u64> {
        let q = self.quota.load();
        let mut log = state.0.lock().unwrap_or_else(|e| e.into_inner());
        log.expire(now, q.period_ns());
        // Beyond one limit's worth, each further `limit` permits needs one more period.
        let extra_periods = permits.saturating_sub(1) / q.limit();
        let rest = permits - extra_periods * q.limit();
        let first = log.wait_for(now, q.period_ns(), q.limit(), rest);
        Some(first.saturating_add(extra_periods.saturating_mul(q.period_ns())))
    }

    fn carry_over(&self, _state: &SlidingLogState, _now: u64, _old: Quota) {}
}

impl std::fmt::Debug for SlidingLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlidingLog").field("quota", &self.config()).finish()
    }
}
