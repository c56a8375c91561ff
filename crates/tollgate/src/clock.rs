//! Where time comes from.
//!
//! Every limiter reads time through a [`Clock`]: monotonic nanoseconds since the clock's own origin.
//! [`SystemClock`] reads the CPU's time-stamp counter through `quanta` (a few nanoseconds per read);
//! [`ManualClock`] only moves when a test calls [`ManualClock::advance`], so a simulated hour takes
//! microseconds and no test sleeps.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::sync::{AtomicU64, Mutex, Ordering};

/// A boxed future that completes at a deadline of a [`Clock`].
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A source of monotonic time, in nanoseconds since the clock's origin.
///
/// Clones of a clock must share one time line (a cloned [`ManualClock`] moves with the original).
pub trait Clock: Clone + Send + Sync + 'static {
    /// Nanoseconds since this clock's origin; monotonic (the system clock relies on the CPU's
    /// invariant TSC, and every limiter tolerates a reading a few nanoseconds behind another).
    fn now(&self) -> u64;

    /// A future that completes once [`Clock::now`] is at or past `deadline`.
    ///
    /// Waiting limiters (`acquire(n).await`) use it; [`SystemClock`] needs a tokio runtime with
    /// its time driver enabled for it.
    fn sleep_until(&self, deadline: u64) -> Sleep;

    /// Nanoseconds since the UNIX epoch at this clock's origin (where [`Clock::now`] is 0): what
    /// places calendar windows (a UTC day, a month in a time zone) on the clock. The default, 0,
    /// puts the origin at 1970-01-01T00:00Z, as [`ManualClock`] does, so tests set dates by
    /// advancing it.
    fn unix_origin_ns(&self) -> u64 {
        0
    }
}

/// The real clock: the time-stamp counter read through `quanta`, calibrated to nanoseconds.
///
/// ```
/// use tollgate::{Clock, SystemClock};
/// let clock = SystemClock::new();
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// ```
#[derive(Clone, Debug)]
pub struct SystemClock {
    clock: quanta::Clock,
    origin: u64,
    /// Nanoseconds per 2^[`SCALE_SHIFT`] counter ticks: ticks become nanoseconds by one multiply
    /// and a constant shift (quanta's own scaling shifts by a calibrated amount, which costs a
    /// variable 128-bit shift and a select on every read).
    scale: u64,
    unix_origin: u64,
}

/// 2^40 ticks is minutes of a GHz counter: `scale` keeps 11 or more significant digits.
const SCALE_SHIFT: u32 = 40;

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        // quanta's calibration, read off once (the counter's own nanoseconds when it has no TSC).
        let scale = clock.delta_as_nanos(0, 1 << SCALE_SHIFT);
        // Read once: calendar boundaries then follow the monotonic clock, unmoved by later
        // wall-clock steps (a drift of seconds a day at most, against windows of days).
        let unix_origin = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        SystemClock { clock, origin, scale, unix_origin }
    }
}

impl SystemClock {
    /// Nanoseconds from the origin to the counter reading `raw` (0 before the origin).
    #[inline]
    fn nanos(&self, raw: u64) -> u64 {
        let ticks = raw.saturating_sub(self.origin);
        // At most ticks * 2^40-ish: the product fits 128 bits, the result 64 for 584 years.
        ((u128::from(ticks) * u128::from(self.scale)) >> SCALE_SHIFT) as u64
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> u64 {
        // Raw counter ticks scaled once: no `Instant`/`Duration` round trip on the hot path.
        self.nanos(self.clock.raw())
    }

    fn unix_origin_ns(&self) -> u64 {
        self.unix_origin
    }

    fn sleep_until(&self, deadline: u64) -> Sleep {
        let remaining = Duration::from_nanos(deadline.saturating_sub(self.now()));
        // Relative to now rather than mapping one origin onto the other, so the two clocks'
        // drift cannot add up; a waiter that wakes early simply re-checks and sleeps again.
        Box::pin(tokio::time::sleep(remaining))
    }
}

/// A clock that moves only when told to; clones share the same time line.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Clock, ManualClock};
/// let clock = ManualClock::new();
/// let other = clock.clone();
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(other.now(), 5_000_000);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

#[derive(Debug, Default)]
struct ManualInner {
    now: AtomicU64,
    next_id: AtomicU64,
    // (deadline, id) -> waker of a pending sleep.
    timers: Mutex<BTreeMap<(u64, u64), Waker>>,
}

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward by `by` and wakes every sleep whose deadline has passed.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let now = self.inner.now.fetch_add(by, Ordering::SeqCst).saturating_add(by);
        self.wake_due(now);
    }

    /// Sets the time to `nanos` since the origin; panics if that is earlier than now, since a
    /// monotonic clock going backwards is a bug in the test that does it.
    pub fn set(&self, nanos: u64) {
        let prev = self.inner.now.swap(nanos, Ordering::SeqCst);
        assert!(prev <= nanos, "ManualClock::set({nanos}) would move time backwards from {prev}");
        self.wake_due(nanos);
    }

    /// Number of sleeps currently registered with this clock (a test's way to know a waiter has
    /// gone to sleep before it advances time).
    pub fn pending_sleeps(&self) -> usize {
        self.inner.timers.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn wake_due(&self, now: u64) {
        let due: Vec<Waker> = {
            let mut timers = self.inner.timers.lock().unwrap_or_else(|e| e.into_inner());
            let later = timers.split_off(&(now.saturating_add(1), 0));
            std::mem::replace(&mut *timers, later).into_values().collect()
        };
        // Wake outside the lock: a woken task may poll straight away and re-register.
        due.into_iter().for_each(Waker::wake);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        self.inner.now.load(Ordering::SeqCst)
    }

    fn sleep_until(&self, deadline: u64) -> Sleep {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        Box::pin(ManualSleep { clock: self.clone(), deadline, id, registered: false })
    }
}

struct ManualSleep {
    clock: ManualClock,
    deadline: u64,
    id: u64,
    registered: bool,
}

impl Future for ManualSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let key = (self.deadline, self.id);
        let mut timers = self.clock.inner.timers.lock().unwrap_or_else(|e| e.into_inner());
        // Checked under the lock so an `advance` cannot slip between the check and the insert.
        if self.clock.now() >= self.deadline {
            timers.remove(&key);
            drop(timers);
            self.registered = false;
            return Poll::Ready(());
        }
        timers.insert(key, cx.waker().clone());
        drop(timers);
        self.registered = true;
        Poll::Pending
    }
}

impl Drop for ManualSleep {
    fn drop(&mut self) {
        if self.registered {
            let mut timers = self.clock.inner.timers.lock().unwrap_or_else(|e| e.into_inner());
            timers.remove(&(self.deadline, self.id));
        }
    }
}

/// Converts a duration to whole nanoseconds, saturating at `u64::MAX` (584 years).
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The system clock's one-multiply scaling agrees with quanta's calibrated one to within a
    /// nanosecond per second, from a tick to an hour's worth of ticks.
    #[test]
    fn system_clock_scales_ticks_as_quanta_does() {
        let clock = SystemClock::new();
        let per_second = clock.clock.delta_as_nanos(0, 1 << 30).max(1);
        for ticks in [0u64, 1, 1_000, 1 << 20, 1 << 30, 1 << 35, 1 << 42, 10_000_000_000_000] {
            let ours = clock.nanos(clock.origin + ticks);
            let theirs = clock.clock.delta_as_nanos(clock.origin, clock.origin + ticks);
            let allowed = 1 + theirs / 1_000_000_000;
            assert!(
                ours.abs_diff(theirs) <= allowed,
                "{ticks} ticks: {ours} ns against quanta's {theirs} ({per_second} ns per 2^30 ticks)"
            );
        }
        if let Some(before) = clock.origin.checked_sub(1) {
            assert_eq!(clock.nanos(before), 0, "before the origin");
        }
    }
}
