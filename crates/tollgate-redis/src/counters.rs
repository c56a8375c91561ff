//! The rate-limit server's Redis API: fixed-window counters of different limits decided in one
//! round trip, reporting each counter (what Limitador's Redis storage and Envoy's per-descriptor
//! statuses need), and listing and deleting them ([`scan_windows`], [`delete_windows`]); fair
//! shares of a counter among RLQS holders on several servers ([`take_share`]).
//!
//! Unlike [`crate::RedisLimiter`], the limits are not fixed at build time: each call names its
//! counters and their limits. All keys of one call must share a hash tag (Redis Cluster): build
//! them with one [`crate::Keyspace`] and tag.

use std::time::Duration;

use tollgate::Meta;

use crate::batch::{CallWords, push_decimal};
use crate::{BackendError, Redis, RedisTime, scripts};

mod scan;
mod shares;

pub use scan::{StoredWindow, WindowKey, WindowPage, delete_windows, scan_windows};
pub use shares::{Share, ShareAsk, drop_share, held_limits, mark_held, see_window, take_share};

/// One counter of a call.
#[derive(Clone, Debug)]
pub struct WindowCounter {
    /// The Redis key (with the call's hash tag).
    pub key: String,
    /// Hits allowed per window.
    pub limit: u64,
    /// The window.
    pub window: Duration,
    /// Hits this call counts on it (0 = a probe). Counters of one call may count different hits:
    /// Envoy's per-descriptor `hits_addend`.
    pub hits: u64,
    /// False for a counter that never denies (a shadow or quota limit): it is reported as limited
    /// when it has no room, takes nothing then, and does not make the call rejected.
    pub enforce: bool,
    /// True for a counter charged whatever the call's outcome (a limit that counts every hit,
    /// past its limit: `limit` is then what it can hold): a [`CountersMode::Take`] takes its hits
    /// (or what is left if less) even when the call is denied; it never denies (`enforce` false).
    pub charge: bool,
    /// For one of a call's pooled counters (envoy/ratelimit's `quota_mode`), its limit: it is
    /// charged as with `charge` (whose `limit` is then what it can hold), and when every pooled
    /// counter of the call is over this limit with the call's hits, the call is not admitted.
    pub pooled: Option<u64>,
    /// A calendar window's start and end, in microseconds on the clock the call runs on (see
    /// [`RedisTime::window_us`]): every counter stored for another start is from an older
    /// window. `None`: the window opens at the first hit, for `window`.
    pub calendar: Option<(u64, u64)>,
    /// For a window opened by the first hit: how long ago the caller saw that hit — a cache
    /// flushing the hits it allowed in the window it opened then. A window Redis does not hold
    /// yet starts that long ago rather than now (so it is the caller's, not one flush interval
    /// later); one it holds is kept. Zero for a decision made now; at most the window.
    pub opened_ago: Duration,
}

impl WindowCounter {
    /// An enforcing counter of `hits` on `key`, `limit` per `window` opened by its first hit,
    /// decided now: set the other fields with struct update syntax.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_redis::counters::WindowCounter;
    /// let shadow = WindowCounter { enforce: false, ..WindowCounter::enforcing("k".into(), 5, Duration::from_secs(1), 2) };
    /// assert!(!shadow.enforce && !shadow.charge && shadow.calendar.is_none());
    /// ```
    pub fn enforcing(key: String, limit: u64, window: Duration, hits: u64) -> WindowCounter {
        WindowCounter {
            key,
            limit,
            window,
            hits,
            enforce: true,
            charge: false,
            pooled: None,
            calendar: None,
            opened_ago: Duration::ZERO,
        }
    }

    /// The state a fixed window of this counter reports, as `tollgate::FixedWindow` reports it:
    /// `remaining` and `reset_ns` as counted, and the retry-after that follows from them — now
    /// while there is room, at the reset when there is none (or when this call's hits did not
    /// fit), never when the hits exceed the limit (no window would hold them).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_redis::counters::WindowCounter;
    /// let c = WindowCounter::enforcing("k".into(), 5, Duration::from_secs(1), 2);
    /// assert_eq!(c.meta(3, 700, false).retry_ns, Some(0));
    /// assert_eq!(c.meta(1, 700, true).retry_ns, Some(700));
    /// let too_many = WindowCounter { hits: 6, ..c };
    /// assert_eq!(too_many.meta(5, 0, true).retry_ns, None);
    /// ```
    pub fn meta(&self, remaining: u64, reset_ns: u64, limited: bool) -> Meta {
        let retry_ns = if self.hits > self.limit {
            None
        } else if limited || remaining == 0 {
            Some(reset_ns)
        } else {
            Some(0)
        };
        Meta { limit: self.limit, remaining, reset_ns, retry_ns }
    }
}

/// A counter's role as `counters.lua` takes it, in one word: what it does with the call's
/// outcome, then its hits unless 1, its calendar window and how long ago its first hit was seen,
/// when it has them (each argument costs Redis a conversion: the common counter is one character).
fn push_role(role: &mut Vec<u8>, c: &WindowCounter) {
    use std::io::Write;
    match (c.pooled, c.charge, c.enforce) {
        (Some(limit), _, _) => {
            role.push(b'p');
            push_decimal(role, limit);
        }
        (None, true, _) => role.push(b'2'),
        (None, false, enforce) => role.push(b'0' + u8::from(enforce)),
    }
    if c.hits != 1 {
        role.push(b'*');
        push_decimal(role, c.hits);
    }
    if let Some((start, end)) = c.calendar {
        let _ = write!(role, "@{start}-{end}");
    }
    let ago = c.opened_ago.as_micros().min(c.window.as_micros());
    if ago > 0 {
        let _ = write!(role, "~{ago}");
    }
}

/// What a call does with its counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountersMode {
    /// Would each counter's hits fit in every enforcing counter? Takes nothing.
    Check = 0,
    /// Takes each counter's hits if they fit in every enforcing counter, else from none; a
    /// counter that does not enforce takes its hits only if they fit.
    Take = 1,
    /// Each counter takes its hits if they fit, on its own (counting what already happened).
    Report = 2,
    /// Each counter takes its hits, or what is left of its limit if less (a local cache's allowed
    /// hits, flushed).
    Flush = 3,
}

/// The answer of a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountersAnswer {
    /// True when the hits fitted in every enforcing counter.
    pub admitted: bool,
    /// Each counter after the call (see [`WindowCounter::meta`]), and whether it alone had no
    /// room.
    pub counters: Vec<(Meta, bool)>,
}

/// Decides the hits of `counters` in one EVALSHA, on `time` (a passed-in clock's keys live for
/// at least a minute of real time). Calls that arrive together share the EVALSHA: each is decided
/// alone, as if it ran alone, one after the other (see `Redis::batched`).
///
/// ```no_run
/// # async fn f() -> Result<(), tollgate_redis::BackendError> {
/// use std::time::Duration;
/// use tollgate_redis::counters::{CountersMode, WindowCounter, decide_windows};
/// use tollgate_redis::{Keyspace, Redis, RedisTime};
/// let redis = Redis::connect("redis://127.0.0.1:6379").await?;
/// let key = Keyspace::new("rl:").key("api", "all", &[] as &[&str]);
/// let all = WindowCounter::enforcing(key, 100, Duration::from_secs(60), 1);
/// let answer = decide_windows(&redis, &[all], CountersMode::Take, &RedisTime::redis()).await?;
/// assert!(answer.admitted);
/// # Ok(()) }
/// ```
pub async fn decide_windows(
    redis: &Redis,
    counters: &[WindowCounter],
    mode: CountersMode,
    time: &RedisTime,
) -> Result<CountersAnswer, BackendError> {
    if counters.is_empty() {
        return Ok(CountersAnswer { admitted: true, counters: Vec::new() });
    }
    // KEYS: the counters'; ARGV: the mode, then each counter's limit, window (µs) and role.
    let mut call = CallWords::with_capacity(counters.iter().map(|c| c.key.len() + 4 + 3 * 24).sum::<usize>() + 5);
    for c in counters {
        call.key(&c.key);
    }
    call.arg_u64(mode as u64);
    for c in counters {
        call.arg_u64(c.limit);
        let window = c.window.as_micros().max(1);
        match u64::try_from(window) {
            Ok(window) => call.arg_u64(window),
            Err(_) => call.arg(window.to_string().as_bytes()),
        }
        call.arg_with(|out| push_role(out, c));
    }
    // Batched with the calls that arrive meanwhile (`Redis::batched`).
    let reply = redis.batched(&scripts::COUNTERS, time, call).await?;
    let get = |k: usize| reply.get(k).unwrap_or(0);
    let answer = CountersAnswer {
        admitted: get(0) == 1,
        counters: counters
            .iter()
            .enumerate()
            .map(|(i, c)| {
                // A counter without room for its hits says so by a negative remaining: -(remaining + 1).
                let (remaining, reset_us) = (get(1 + 2 * i), get(2 + 2 * i).max(0) as u64);
                let limited = remaining < 0;
                let remaining = if limited { -(remaining + 1) } else { remaining } as u64;
                (c.meta(remaining, reset_us * 1000, limited), limited)
            })
            .collect(),
    };
    Ok(answer)
}
