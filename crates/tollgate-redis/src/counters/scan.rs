//! Listing and deleting the rate-limit server's counters ([`super::decide_windows`]' windows):
//! what `GET` and `DELETE /counters/{namespace}` need with counters in Redis.
//!
//! Listing is a SCAN, one step per call, so no call blocks Redis for long however many keys it
//! holds; each step also reads the state of the keys it found, in the same script, at the same
//! instant as the time it reports.

use std::time::Duration;

use crate::{BackendError, Keyspace, Redis, RedisTime, scripts};

/// One counter a [`scan_windows`] step found: its key and stored state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredWindow {
    /// The Redis key.
    pub key: String,
    /// When its window ends (µs, on the clock that decided it).
    pub end_us: u64,
    /// Hits counted in that window.
    pub count: u64,
}

impl StoredWindow {
    /// The hits left and the time until the window ends (µs) at `now_us`, for a limit of
    /// `limit`; for a calendar limit, `calendar` is the current window's (start, end) in µs (as
    /// [`super::WindowCounter::calendar`]: a counter that ended before it started is from an
    /// older window). `None` when the window is over or empty: the counter starts full again, as
    /// `decide_windows` would see it.
    ///
    /// ```
    /// use tollgate_redis::counters::StoredWindow;
    /// let w = StoredWindow { key: "rl:{api}:x".into(), end_us: 61_000_000, count: 3 };
    /// assert_eq!(w.state(5, None, 31_000_000), Some((2, 30_000_000)));
    /// assert_eq!(w.state(5, None, 61_000_000), None, "over");
    /// assert_eq!(w.state(5, Some((1_000_000, 61_000_000)), 31_000_000), Some((2, 30_000_000)));
    /// assert_eq!(w.state(5, Some((61_000_000, 121_000_000)), 61_000_000), None, "an older window");
    /// ```
    pub fn state(&self, limit: u64, calendar: Option<(u64, u64)>, now_us: u64) -> Option<(u64, u64)> {
        if calendar.is_some_and(|(start, _)| self.end_us <= start) {
            return None;
        }
        (self.count > 0 && now_us < self.end_us).then(|| (limit.saturating_sub(self.count), self.end_us - now_us))
    }
}

/// A counter to delete, and how its windows run (as in [`super::WindowCounter`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowKey {
    /// The Redis key (with the call's hash tag).
    pub key: String,
    /// The window, for a window opened by its first hit.
    pub window: Duration,
    /// The current calendar window's (start, end) in µs, for a calendar limit.
    pub calendar: Option<(u64, u64)>,
}

/// One step of a scan: where to go on from, the time of the step, what it found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowPage {
    /// The cursor of the next step; 0 when the scan is over.
    pub cursor: u64,
    /// The step's time in µs, on the [`RedisTime`] the step ran on.
    pub now_us: u64,
    /// Counters found (a key may be found again by a later step of the same scan).
    pub windows: Vec<StoredWindow>,
}

/// One SCAN step from `cursor` (0 to start) over the keys of `keyspace` under `tag`
/// ([`Keyspace::pattern`]), looking at about `count` keys of Redis's keyspace, with the stored
/// state of each key it found: one EVALSHA, routed to the tag's node on Redis Cluster. Its time
/// is `time`'s.
///
/// ```no_run
/// # async fn f() -> Result<(), tollgate_redis::BackendError> {
/// use tollgate_redis::counters::scan_windows;
/// use tollgate_redis::{Keyspace, Redis, RedisTime};
/// let redis = Redis::connect("redis://127.0.0.1:6379").await?;
/// let (counters, time) = (Keyspace::new("rl:"), RedisTime::redis());
/// let mut cursor = 0;
/// loop {
///     let page = scan_windows(&redis, &counters, "api", cursor, 1000, &time).await?;
///     println!("{} counters at {} µs", page.windows.len(), page.now_us);
///     cursor = page.cursor;
///     if cursor == 0 { break; }
/// }
/// # Ok(()) }
/// ```
pub async fn scan_windows(
    redis: &Redis,
    keyspace: &Keyspace,
    tag: &str,
    cursor: u64,
    count: usize,
    time: &RedisTime,
) -> Result<WindowPage, BackendError> {
    let time = time.script_now();
    let args =
        [time.now, cursor.to_string(), keyspace.pattern(tag), count.max(1).to_string(), time.shift_ms.to_string()];
    // Any key with the tag routes the step to the node its keys are on.
    let reply: Vec<Vec<u8>> = redis.invoke(&scripts::COUNTERS_SCAN, &[keyspace.head(tag)], &args).await?;
    let number = |i: usize| reply.get(i).and_then(|b| std::str::from_utf8(b).ok()?.parse::<u64>().ok());
    let windows = reply
        .get(2..)
        .unwrap_or_default()
        .chunks_exact(3)
        .filter_map(|found| {
            let number = |b: &[u8]| std::str::from_utf8(b).ok()?.parse::<u64>().ok();
            Some(StoredWindow {
                key: String::from_utf8(found[0].clone()).ok()?,
                end_us: number(&found[1])?,
                count: number(&found[2])?,
            })
        })
        .collect();
    Ok(WindowPage { cursor: number(0).unwrap_or(0), now_us: number(1).unwrap_or(0), windows })
}

/// Deletes `counters` (all with one hash tag) in one EVALSHA, so each starts its next window
/// full; returns how many held hits in a window still open as of `time`: the counters a listing
/// would have shown.
///
/// ```no_run
/// # async fn f() -> Result<(), tollgate_redis::BackendError> {
/// use std::time::Duration;
/// use tollgate_redis::counters::{WindowKey, delete_windows};
/// use tollgate_redis::{Keyspace, Redis, RedisTime};
/// let redis = Redis::connect("redis://127.0.0.1:6379").await?;
/// let key = Keyspace::new("rl:").key("api", "per-user", &["alice"]);
/// let alice = WindowKey { key, window: Duration::from_secs(60), calendar: None };
/// let live = delete_windows(&redis, &[alice], &RedisTime::redis()).await?;
/// # let _ = live; Ok(()) }
/// ```
pub async fn delete_windows(redis: &Redis, counters: &[WindowKey], time: &RedisTime) -> Result<u64, BackendError> {
    if counters.is_empty() {
        return Ok(0);
    }
    let keys: Vec<String> = counters.iter().map(|c| c.key.clone()).collect();
    let time = time.script_now();
    let mut args = Vec::with_capacity(2 + 2 * counters.len());
    args.extend([time.now, time.shift_ms.to_string()]);
    for c in counters {
        let (period, start) = match c.calendar {
            Some((start, end)) => (end.saturating_sub(start), start),
            None => (window_us(c.window), 0),
        };
        args.extend([period.to_string(), start.to_string()]);
    }
    redis.invoke(&scripts::COUNTERS_RESET, &keys, &args).await
}

/// A window in whole µs, as `decide_windows` sends it.
fn window_us(window: Duration) -> u64 {
    u64::try_from(window.as_micros()).unwrap_or(u64::MAX).max(1)
}
