//! Sliding window over `segments` counters: the period is cut into equal segments aligned to the
//! clock's origin, and a request is admitted when the counts of the last `segments` segments
//! (the current one included) plus the request fit in `limit`. More segments, less burst at the
//! boundary and more memory (8 bytes per segment).

use std::sync::Mutex;

use crate::algorithm::{Algorithm, quota_cell_members};
use crate::quota::{Quota, QuotaError};
use crate::seqlock::SeqCell;
use crate::snapshot::{Meta, Snapshot};

/// Segmented sliding window counter.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Limiter, ManualClock, Quota, SlidingWindow};
/// let clock = ManualClock::new();
/// let window = SlidingWindow::new(Quota::per_second(4)?, 4)?;   // four 250 ms segments
/// let limiter = Limiter::builder(window).clock(clock.clone()).build();
/// let _ = limiter.try_acquire(4).unwrap();
/// clock.advance(Duration::from_millis(500));
/// // The 4 permits count until their segment leaves the window, 1 s after it began.
/// assert_eq!(limiter.try_acquire(1).unwrap_err().retry_after(), Some(Duration::from_millis(500)));
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
///
/// Quota changes keep the counts; if the segment length changes, everything counted so far is
/// treated as counted in the current segment (it leaves the window later, never earlier).
pub struct SlidingWindow {
    quota: SeqCell<Quota>,
    segments: u64,
}

/// The state of one [`SlidingWindow`].
#[derive(Debug)]
pub struct SlidingWindowState(Mutex<Segments>);

#[derive(Debug)]
struct Segments {
    counts: Box<[u64]>,
    // Absolute index (time / segment length) of the newest segment counted.
    newest: u64,
    total: u64,
}

impl SlidingWindow {
    /// `quota.limit()` permits per `quota.period()`, tracked in `segments` segments (at least 1,
    /// at most one per nanosecond of the period).
    pub fn new(quota: Quota, segments: u64) -> Result<SlidingWindow, QuotaError> {
        if segments == 0 || segments > quota.period_ns() || segments > u32::MAX as u64 {
            return Err(QuotaError::BadSegments { segments, period: quota.period() });
        }
        Ok(SlidingWindow { quota: SeqCell::new(quota), segments })
    }

    fn seg_len(&self, q: &Quota) -> u64 {
        // Rounded up: the window may be a little longer than the period, never shorter.
        q.period_ns().div_ceil(self.segments)
    }
}

impl Segments {
    fn advance(&mut self, to: u64) {
        let n = self.counts.len() as u64;
        if to <= self.newest {
            return;
        }
        if to - self.newest >= n {
            self.counts.iter_mut().for_each(|c| *c = 0);
            self.total = 0;
        } else {
            for s in self.newest + 1..=to {
                let c = &mut self.counts[(s % n) as usize];
                self.total -= *c;
                *c = 0;
            }
        }
        self.newest = to;
    }

    /// Absolute index of the newest segment with a nonzero count, if any.
    fn newest_counted(&self) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let len = self.counts.len() as u64;
        (0..len.min(self.newest + 1)).map(|back| self.newest - back).find(|&j| self.counts[(j % len) as usize] > 0)
    }

    /// Nanoseconds until `n` more fit under `limit`, walking segments from the oldest.
    fn wait_for(&self, now: u64, seg_len: u64, limit: u64, n: u64) -> u64 {
        let len = self.counts.len() as u64;
        let mut total = self.total;
        if total.saturating_add(n) <= limit {
            return 0;
        }
        let oldest = (self.newest + 1).saturating_sub(len);
        for s in oldest..=self.newest {
            total -= self.counts[(s % len) as usize];
            if total.saturating_add(n) <= limit {
                return (s + len).saturating_mul(seg_len).saturating_sub(now);
            }
        }
        (self.newest + len).saturating_mul(seg_len).saturating_sub(now)
    }

    fn meta(&self, now: u64, seg_len: u64, limit: u64) -> Meta {
        let len = self.counts.len() as u64;
        let oldest = (self.newest + 1).saturating_sub(len);
        let newest_used = (oldest..=self.newest).rev().find(|s| self.counts[(s % len) as usize] > 0);
        let reset_ns = newest_used.map_or(0, |s| (s + len).saturating_mul(seg_len).saturating_sub(now));
        Meta {
            limit,
            remaining: limit.saturating_sub(self.total),
            reset_ns,
            retry_ns: Some(self.wait_for(now, seg_len, limit, 1)),
        }
    }
}

impl SlidingWindow {
    fn decide_meta(&self, state: &SlidingWindowState, now: u64, n: u64, commit: bool) -> Result<Meta, Meta> {
        let q = self.quota.load();
        let seg_len = self.seg_len(&q);
        let mut segs = state.0.lock().unwrap_or_else(|e| e.into_inner());
        segs.advance(now / seg_len);
        // `n > 0`: a probe answers even over the limit (a settled debt).
        if segs.total.saturating_add(n) > q.limit() && n > 0 {
            let mut m = segs.meta(now, seg_len, q.limit());
            m.retry_ns = Some(segs.wait_for(now, seg_len, q.limit(), n));
            return Err(m);
        }
        if n > 0 && commit {
            let i = (segs.newest % self.segments) as usize;
            segs.counts[i] += n;
            segs.total += n;
        }
        Ok(segs.meta(now, seg_len, q.limit()))
    }
}

impl Algorithm for SlidingWindow {
    type State = SlidingWindowState;
    type Config = Quota;

    fn new_state(&self, now: u64) -> SlidingWindowState {
        let seg_len = self.seg_len(&self.quota.load());
        SlidingWindowState(Mutex::new(Segments {
            counts: vec![0; self.segments as usize].into_boxed_slice(),
            newest: now / seg_len,
            total: 0,
        }))
    }

    quota_cell_members!(limit);

    #[inline]
    fn decide(&self, state: &SlidingWindowState, now: u64, n: u64, commit: bool) -> Result<Snapshot, Snapshot> {
        self.decide_meta(state, now, n, commit).map(Snapshot::from).map_err(Snapshot::from)
    }

    fn give_back(&self, state: &SlidingWindowState, now: u64, n: u64, acquired_at: u64) {
        let seg_len = self.seg_len(&self.quota.load());
        let mut segs = state.0.lock().unwrap_or_else(|e| e.into_inner());
        segs.advance(now / seg_len);
        let s = acquired_at / seg_len;
        if s + self.segments > segs.newest && s <= segs.newest {
            let c = &mut segs.counts[(s % self.segments) as usize];
            let k = (*c).min(n);
            *c -= k;
            segs.total -= k;
        }
    }

    /// Counted in the segment of `now`, past the limit if need be: it weighs on every request
    /// until that segment leaves the window.
    fn charge(&self, state: &SlidingWindowState, now: u64, n: u64) -> Result<(), &'static str> {
        let seg_len = self.seg_len(&self.quota.load());
        let mut segs = state.0.lock().unwrap_or_else(|e| e.into_inner());
        segs.advance(now / seg_len);
        let i = (segs.newest % self.segments) as usize;
        segs.counts[i] = segs.counts[i].saturating_add(n);
        segs.total = segs.total.saturating_add(n);
        Ok(())
    }

    fn is_idle(&self, state: &SlidingWindowState, now: u64) -> bool {
        let seg_len = self.seg_len(&self.quota.load());
        let mut segs = state.0.lock().unwrap_or_else(|e| e.into_inner());
        segs.advance(now / seg_len);
        segs.total == 0
    }

    fn idle_at(&self, state: &SlidingWindowState, now: u64) -> u64 {
        let seg_len = self.seg_len(&self.quota.load());
        let mut segs = state.0.lock().unwrap_or_else(|e| e.into_inner());
        segs.advance(now / seg_len);
        match segs.newest_counted() {
            // Segment `j` is forgotten when the newest segment is `j + len`.
            Some(j) => {
                let at = (u128::from(j) + segs.counts.len() as u128) * u128::from(seg_len);
                u64::try_from(at).unwrap_or(u64::MAX)
            }
            None => now,
        }
    }

    fn wait_estimate(&self, state: &SlidingWindowState, now: u64, permits: u64) -> Option<u64> {
        let q = self.quota.load();
        let seg_len = self.seg_len(&q);
        let mut segs = state.0.lock().unwrap_or_else(|e| e.into_inner());
        segs.advance(now / seg_len);
        let extra_periods = permits.saturating_sub(1) / q.limit();
        let rest = permits - extra_periods * q.limit();
        let first = segs.wait_for(now, seg_len, q.limit(), rest);
        Some(first.saturating_add(extra_periods.saturating_mul(seg_len * self.segments)))
    }

    fn carry_over(&self, state: &SlidingWindowState, now: u64, old: Quota) {
        let new_len = self.seg_len(&self.quota.load());
        if old.period_ns().div_ceil(self.segments) == new_len {
            return;
        }
        let mut segs = state.0.lock().unwrap_or_else(|e| e.into_inner());
        let total = segs.total;
        segs.counts.iter_mut().for_each(|c| *c = 0);
        segs.newest = now / new_len;
        let i = (segs.newest % self.segments) as usize;
        segs.counts[i] = total;
    }
}

impl std::fmt::Debug for SlidingWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlidingWindow").field("quota", &self.config()).finish()
    }
}
