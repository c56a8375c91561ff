//! [`RedisTime`]: whose clock a script decides with — Redis `TIME`, or a [`tollgate::Clock`] whose
//! time is passed in (tests on a [`tollgate::ManualClock`]).

use std::sync::Arc;

use tollgate::{Clock, Sleep, SystemClock};

/// Whose clock times the windows and buckets kept in Redis.
///
/// - [`RedisTime::redis`] (the default): each script reads Redis `TIME`, so every process agrees
///   whatever its own clock says; waiting between retries runs on this process's clock.
/// - [`RedisTime::clock`]: scripts get `clock`'s time as an argument, and waits run on it, so a
///   test steps a [`tollgate::ManualClock`] through windows without sleeping. Processes with
///   different clocks would disagree: for tests, or for one process alone.
///
/// ```
/// use std::time::Duration;
/// use tollgate::ManualClock;
/// use tollgate_redis::RedisTime;
/// let clock = ManualClock::new();
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(RedisTime::clock(clock).now_us(), Some(2_000_000));
/// assert_eq!(RedisTime::redis().now_us(), None, "Redis reads its own TIME");
/// ```
#[derive(Clone)]
pub struct RedisTime {
    /// The clock waits run on; scripts read it too unless `redis` is true.
    clock: Arc<dyn AnyClock>,
    redis: bool,
}

/// [`Clock`] without `Clone`, so it can be a trait object.
trait AnyClock: Send + Sync {
    fn now(&self) -> u64;
    fn sleep_until(&self, deadline: u64) -> Sleep;
    fn unix_origin_ns(&self) -> u64;
}

impl<C: Clock> AnyClock for C {
    fn now(&self) -> u64 {
        Clock::now(self)
    }

    fn sleep_until(&self, deadline: u64) -> Sleep {
        Clock::sleep_until(self, deadline)
    }

    fn unix_origin_ns(&self) -> u64 {
        Clock::unix_origin_ns(self)
    }
}

/// A clock read once ([`RedisTime::at`]); sleeps and the origin are the clock's.
struct At {
    now_ns: u64,
    clock: Arc<dyn AnyClock>,
}

impl AnyClock for At {
    fn now(&self) -> u64 {
        self.now_ns
    }

    fn sleep_until(&self, deadline: u64) -> Sleep {
        self.clock.sleep_until(deadline)
    }

    fn unix_origin_ns(&self) -> u64 {
        self.clock.unix_origin_ns()
    }
}

/// How long a key decided on a passed-in clock lives at least (ms of real time): such a clock
/// may run at any pace, and a key must not expire between two steps of a test.
const CLOCK_MIN_TTL_MS: u64 = 60_000;

/// Where a key decided on a clock at 1970 (a [`tollgate::ManualClock`]) expires, past its end on
/// that clock (ms): 2^44, about 557 years, past any Redis `TIME`, and still written whole by Lua.
const FAR_SHIFT_MS: u64 = 1 << 44;

/// What the scripts are told of the time (`clock.lua`, `run.lua`, `fixed_lib.lua`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ScriptTime {
    /// Now in µs, or empty: Redis `TIME`.
    pub(crate) now: String,
    /// The least TTL of a key (ms of real time): 0 on Redis `TIME`.
    pub(crate) min_ttl_ms: u64,
    /// How far past its end on the clock a fixed window's key expires (ms), so that Redis's
    /// clock never drops a window the passed-in clock still counts: 0 on Redis `TIME`.
    pub(crate) shift_ms: u64,
}

impl RedisTime {
    /// Redis `TIME`: what production runs on.
    pub fn redis() -> RedisTime {
        RedisTime { clock: Arc::new(SystemClock::new()), redis: true }
    }

    /// `clock`'s time, passed to each script.
    pub fn clock<C: Clock>(clock: C) -> RedisTime {
        RedisTime { clock: Arc::new(clock), redis: false }
    }

    /// The same time source, with a passed-in clock read once: scripts are given `now_ns` (ns on
    /// that clock) however long the call takes to reach them, so a caller that worked other
    /// figures out from that instant (how long ago a window opened) gives scripts the same one.
    /// Redis `TIME` is unchanged.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Clock, ManualClock};
    /// use tollgate_redis::RedisTime;
    /// let clock = ManualClock::new();
    /// let time = RedisTime::clock(clock.clone());
    /// let then = time.at(clock.now());
    /// clock.advance(Duration::from_millis(5));
    /// assert_eq!((then.now_us(), time.now_us()), (Some(0), Some(5_000)));
    /// ```
    pub fn at(&self, now_ns: u64) -> RedisTime {
        if self.redis {
            return self.clone();
        }
        RedisTime { clock: Arc::new(At { now_ns, clock: self.clock.clone() }), redis: false }
    }

    /// True for Redis `TIME`.
    pub fn is_redis(&self) -> bool {
        self.redis
    }

    /// The time scripts are given, in µs; `None` when they read Redis `TIME`.
    pub fn now_us(&self) -> Option<u64> {
        (!self.redis).then(|| self.clock.now() / 1000)
    }

    /// A calendar window on the scripts' clock, in µs: `window_at` gives the (start, end) of the
    /// window holding an instant, all in ns since the UNIX epoch (e.g.
    /// `|unix| calendar.window_at(unix)` for a `tollgate::Calendar`). On a passed-in clock the
    /// instant is its now, placed by its UNIX origin; on Redis `TIME`, this host's wall clock
    /// (Redis `TIME` is a wall clock too, so the two agree but for the skew between hosts).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::ManualClock;
    /// use tollgate_redis::RedisTime;
    /// let clock = ManualClock::new();
    /// clock.advance(Duration::from_secs(90));
    /// let minute = |unix: u64| (unix / 60_000_000_000 * 60_000_000_000, (unix / 60_000_000_000 + 1) * 60_000_000_000);
    /// assert_eq!(RedisTime::clock(clock).window_us(minute), (60_000_000, 120_000_000));
    /// ```
    pub fn window_us(&self, window_at: impl FnOnce(u64) -> (u64, u64)) -> (u64, u64) {
        if self.redis {
            let unix = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
            let (start, end) = window_at(unix);
            (start / 1000, end / 1000)
        } else {
            let origin = self.clock.unix_origin_ns();
            let (start, end) = window_at(origin.saturating_add(self.clock.now()));
            (start.saturating_sub(origin) / 1000, end.saturating_sub(origin) / 1000)
        }
    }

    /// The scripts' `now` argument (µs, or empty for Redis `TIME`: `clock.lua`) and the least
    /// TTL their keys get, in ms.
    pub(crate) fn script_now(&self) -> ScriptTime {
        match self.now_us() {
            Some(now) => {
                // A clock placed on the calendar (a system clock) has its keys expire a minute
                // after their ends in real time; one at 1970 (a manual clock) far in the future.
                let origin_ms = self.clock.unix_origin_ns() / 1_000_000;
                let shift_ms = if origin_ms > 0 { origin_ms + CLOCK_MIN_TTL_MS } else { FAR_SHIFT_MS };
                ScriptTime { now: now.to_string(), min_ttl_ms: CLOCK_MIN_TTL_MS, shift_ms }
            }
            None => ScriptTime { now: String::new(), min_ttl_ms: 0, shift_ms: 0 },
        }
    }

    /// Now on the clock waits run on (ns).
    pub(crate) fn local_now(&self) -> u64 {
        self.clock.now()
    }

    /// Sleeps until `deadline` of [`RedisTime::local_now`]'s clock.
    pub(crate) fn sleep_until(&self, deadline: u64) -> Sleep {
        self.clock.sleep_until(deadline)
    }
}

impl Default for RedisTime {
    fn default() -> RedisTime {
        RedisTime::redis()
    }
}

impl std::fmt::Debug for RedisTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.redis { f.write_str("RedisTime::Redis") } else { f.write_str("RedisTime::Clock") }
    }
}
