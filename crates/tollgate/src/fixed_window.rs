//! Fixed window: at most `limit` permits per window of `period`; a window opens at the first
//! request after the previous one ended (seed 001's design, also Limitador's). Cheap and simple,
//! but up to 2× `limit` can pass within one `period` across a window boundary.

use std::sync::Mutex;

use crate::algorithm::{Algorithm, quota_cell_members};
use crate::quota::Quota;
use crate::seqlock::SeqCell;
use crate::snapshot::{Meta, Snapshot};

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
    /// Calendar windows instead of windows opened by the first request.
    #[cfg(feature = "calendar")]
    calendar: Option<Box<crate::calendar::ClockCalendar>>,
}

/// The state of one [`FixedWindow`].
#[derive(Debug)]
pub struct FixedWindowState(Mutex<WindowCount>);

/// A fixed window's count as a value, decided without a clock or a lock: the one place the
/// window rule is written. [`FixedWindow`] keeps one per key; a cache of shared counters (the
/// server's `redis-cached` storage) keeps one per counter.
///
/// A window opens at the first permit it counts and lasts a period; an empty window is no window
/// (the next permit opens a new one, whenever it comes).
///
/// ```
/// use tollgate::WindowCount;
/// let minute = 60_000_000_000;
/// let w = WindowCount::default().at(1_000, minute).counted(3); // opened at 1,000 ns by 3 permits
/// assert_eq!((w.start, w.count, w.remaining(10)), (1_000, 3, 7));
/// assert_eq!(w.reset_ns(31_000, minute), minute - 30_000);
/// assert_eq!(w.at(minute, minute), w, "still open");
/// assert_eq!(w.at(minute + 1_000, minute), WindowCount { start: minute + 1_000, count: 0 }, "over");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowCount {
    /// When the window opened (clock nanoseconds); for an empty window, when it was last looked at.
    pub start: u64,
    /// Permits counted in it.
    pub count: u64,
}

impl WindowCount {
    /// The window at `now`: this one, or a new, empty one at `now` if this one is over after
    /// `period` ns or has counted nothing.
    #[inline]
    #[must_use]
    pub fn at(self, now: u64, period: u64) -> WindowCount {
        if self.count == 0 || now >= self.end(period) { WindowCount { start: now, count: 0 } } else { self }
    }

    /// When the window ends.
    #[inline]
    pub fn end(self, period: u64) -> u64 {
        self.start.saturating_add(period)
    }

    /// Nanoseconds from `now` until the window ends; 0 for an empty one (no permit has opened it).
    #[inline]
    pub fn reset_ns(self, now: u64, period: u64) -> u64 {
        if self.count == 0 { 0 } else { self.end(period).saturating_sub(now) }
    }

    /// Permits of `limit` not yet counted.
    #[inline]
    pub fn remaining(self, limit: u64) -> u64 {
        limit.saturating_sub(self.count)
    }

    /// The window with `n` more permits counted.
    #[inline]
    #[must_use]
    pub fn counted(self, n: u64) -> WindowCount {
        WindowCount { count: self.count.saturating_add(n), ..self }
    }
}

impl FixedWindow {
    /// `quota.limit()` permits per `quota.period()`; the burst is not used.
    pub fn new(quota: Quota) -> FixedWindow {
        FixedWindow {
            quota: SeqCell::new(quota),
            #[cfg(feature = "calendar")]
            calendar: None,
        }
    }

    /// At most `limit` permits per calendar window (a second, minute, hour, day, week or month of a time zone) as
    /// `clock` places it: every key's window opens and closes on the calendar's boundaries, and
    /// `reset` and `retry` count down to the next one. The quota's period is the calendar's
    /// nominal length (what `window()` reports). Feature `calendar`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Calendar, CalendarUnit, FixedWindow, Limiter, ManualClock};
    ///
    /// let clock = ManualClock::new(); // its origin is 1970-01-01T00:00Z
    /// clock.advance(Duration::from_secs(1_769_903_999)); // 2026-01-31T23:59:59Z
    /// let month = Calendar::new(CalendarUnit::Month, "UTC")?;
    /// let limiter = Limiter::builder(FixedWindow::calendar(3, month, &clock)?).clock(clock.clone()).build();
    /// assert!(limiter.try_acquire(3).is_ok());
    /// let no = limiter.try_acquire(1).unwrap_err();
    /// assert_eq!(no.retry_after(), Some(Duration::from_secs(1)), "February starts in a second");
    /// clock.advance(Duration::from_secs(1));
    /// assert!(limiter.try_acquire(3).is_ok(), "a new month, a new window");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "calendar")]
    pub fn calendar(
        limit: u64,
        calendar: crate::Calendar,
        clock: &impl crate::Clock,
    ) -> Result<FixedWindow, crate::QuotaError> {
        let quota = Quota::window(calendar.nominal(), limit)?;
        let calendar = crate::calendar::ClockCalendar::new(calendar, clock.unix_origin_ns());
        Ok(FixedWindow { quota: SeqCell::new(quota), calendar: Some(Box::new(calendar)) })
    }

    /// The calendar, for a limiter built with [`FixedWindow::calendar`].
    #[cfg(feature = "calendar")]
    pub fn calendar_of(&self) -> Option<&crate::Calendar> {
        self.calendar.as_deref().map(|c| &c.calendar)
    }

    /// The window `w` is in at `now` (a new, empty one if its own is over), and when it ends.
    #[inline]
    fn at(&self, w: WindowCount, now: u64, period: u64) -> (WindowCount, u64) {
        #[cfg(feature = "calendar")]
        if let Some(calendar) = &self.calendar {
            let (start, end) = calendar.window(now);
            let w = if w.start == start { w } else { WindowCount { start, count: 0 } };
            return (w, end);
        }
        let w = w.at(now, period);
        (w, w.end(period))
    }

    /// True for calendar windows, whose end is known before anyone opens them.
    fn fixed_bounds(&self) -> bool {
        #[cfg(feature = "calendar")]
        return self.calendar.is_some();
        #[cfg(not(feature = "calendar"))]
        false
    }
}

fn meta(q: &Quota, w: WindowCount, end: u64, fixed_bounds: bool, now: u64) -> Meta {
    let remaining = w.remaining(q.limit());
    // An empty first-hit window has no end yet; a calendar window always has one.
    let reset_ns = if w.count == 0 && !fixed_bounds { 0 } else { end.saturating_sub(now) };
    Meta { limit: q.limit(), remaining, reset_ns, retry_ns: Some(if remaining > 0 { 0 } else { reset_ns }) }
}

impl FixedWindow {
    fn decide_meta(&self, state: &FixedWindowState, now: u64, n: u64, commit: bool) -> Result<Meta, Meta> {
        let q = self.quota.load();
        let mut guard = state.0.lock().unwrap_or_else(|e| e.into_inner());
        let (w, end) = self.at(*guard, now, q.period_ns());
        let fixed = self.fixed_bounds();
        // `n > 0`: a probe answers even over the limit (a settled debt).
        if w.count.saturating_add(n) > q.limit() && n > 0 {
            let mut m = meta(&q, w, end, fixed, now);
            m.retry_ns = Some(end.saturating_sub(now));
            return Err(m);
        }
        if n == 0 || !commit {
            return Ok(meta(&q, w, end, fixed, now));
        }
        let w = w.counted(n);
        *guard = w;
        Ok(meta(&q, w, end, fixed, now))
    }
}

impl Algorithm for FixedWindow {
    type State = FixedWindowState;
    type Config = Quota;

    fn new_state(&self, now: u64) -> FixedWindowState {
        FixedWindowState(Mutex::new(WindowCount { start: now, count: 0 }))
    }

    quota_cell_members!(limit);

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

    /// Counted in the window open at `now` (opening one if none is), past its limit if need be:
    /// nothing more is admitted in that window. A window's count starts again at 0, so a debt
    /// never outlives the window it was charged in.
    fn charge(&self, state: &FixedWindowState, now: u64, n: u64) -> Result<(), &'static str> {
        if n > 0 {
            let mut guard = state.0.lock().unwrap_or_else(|e| e.into_inner());
            let (w, _) = self.at(*guard, now, self.quota.load().period_ns());
            *guard = w.counted(n);
        }
        Ok(())
    }

    fn is_idle(&self, state: &FixedWindowState, now: u64) -> bool {
        let w = *state.0.lock().unwrap_or_else(|e| e.into_inner());
        self.at(w, now, self.quota.load().period_ns()).0.count == 0
    }

    fn idle_at(&self, state: &FixedWindowState, now: u64) -> u64 {
        let period = self.quota.load().period_ns();
        let (w, end) = self.at(*state.0.lock().unwrap_or_else(|e| e.into_inner()), now, period);
        if w.count == 0 { now } else { end }
    }

    fn wait_estimate(&self, state: &FixedWindowState, now: u64, permits: u64) -> Option<u64> {
        let q = self.quota.load();
        let (w, end) = self.at(*state.0.lock().unwrap_or_else(|e| e.into_inner()), now, q.period_ns());
        let remaining = w.remaining(q.limit());
        if permits <= remaining {
            return Some(0);
        }
        // Windows after the next are taken at their nominal length (a month as 30 days).
        let windows = (permits - remaining).div_ceil(q.limit());
        let first = end.saturating_sub(now);
        Some(first.saturating_add((windows - 1).saturating_mul(q.period_ns())))
    }

    fn carry_over(&self, _state: &FixedWindowState, _now: u64, _old: Quota) {}
}

impl std::fmt::Debug for FixedWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("FixedWindow");
        d.field("quota", &self.config());
        #[cfg(feature = "calendar")]
        d.field("calendar", &self.calendar_of());
        d.finish()
    }
}
