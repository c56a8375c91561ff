//! Fair shares of a counter's limit among holders on several servers, and the counter's RLS
//! callers: the rate-limit server's RLQS assignments, when its replicas share one Redis
//! (`scripts/fair_share.lua`).

use std::time::Duration;

use crate::{BackendError, Redis, RedisTime, scripts};

/// What a holder asks of [`take_share`].
#[derive(Clone, Copy, Debug)]
pub struct ShareAsk<'a> {
    /// The key of the counter's holders.
    pub holders: &'a str,
    /// The key of the counter's window, as the server's RLS decisions keep it (same hash tag).
    pub counter: &'a str,
    /// The holder's name, unique among the servers.
    pub holder: &'a str,
    /// The counter's limit: hits per window.
    pub limit: u64,
    /// The counter's window.
    pub window: Duration,
    /// What the holder wants: hits per window.
    pub want: u64,
    /// The most a change of the holder's share may add to a window beyond the share: what it
    /// rebuilds (its token buckets start full in Envoy, on top of what the old ones admitted),
    /// bucket by bucket the larger of the old burst and the most a new one may start with.
    pub rebuild_most: u64,
    /// The bursts the holder's token buckets have now: a change to a share of `s` adds at most
    /// this and `s` (no new bucket starts with more than its share).
    pub rebuild_held: u64,
    /// The holder would rebuild its token buckets even if its share stays as it is (their split
    /// of it moved): the rebuild is charged all the same, and paid out of the share when what is
    /// left lacks room for it ([`Share::rebuilt`] then says so).
    pub resplit: bool,
    /// How long what it is given lasts unless asked again.
    pub ttl: Duration,
}

/// What a holder was given by [`take_share`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    /// The hits per window the holder now holds.
    pub share: u64,
    /// The counter's live holders, this one included (the RLS callers are not counted).
    pub holders: u64,
    /// What they hold in all.
    pub held: u64,
    /// What was counted into the counter's open window now, so that it holds what the holders
    /// hold.
    pub reserved: u64,
    /// The RLS callers alone used the counter's window up: nothing is left until it ends.
    pub exhausted: bool,
    /// The holder rebuilds its token buckets: its share changed, or it asked to
    /// ([`ShareAsk::resplit`]) and the rebuild was charged.
    pub rebuilt: bool,
}

/// Gives a holder its share of a counter, in one EVALSHA: its max-min fair share of the limit
/// among the live holders' wants and the counter's RLS callers' (what they used of its windows:
/// the count less what was reserved here), never more than the limit less what the other live
/// holders hold, what the RLS callers used of the window open and what the last window's changes
/// of share rebuilt; a change of the holder's share is made only when it fits with what it
/// rebuilds (`rebuild_most`, `rebuild_held`; with `resplit`, a rebuild at an unchanged share
/// too, paid out of the share if need be), charged for a window; and reserves what all holders
/// hold and those charges in that window (counted into it, up to its limit; no window is opened). What the holder
/// holds is recorded until `ttl` from now on `time`'s clock; holders past theirs are removed.
///
/// ```no_run
/// # async fn f() -> Result<(), tollgate_redis::BackendError> {
/// use std::time::Duration;
/// use tollgate_redis::counters::{ShareAsk, take_share};
/// use tollgate_redis::{Keyspace, Redis, RedisTime};
/// let redis = Redis::connect("redis://127.0.0.1:6379").await?;
/// let holders = Keyspace::new("rl:rlqs:").key("api", "all", &[] as &[&str]);
/// let counter = Keyspace::new("rl:").key("api", "all", &[] as &[&str]);
/// let ttl = Duration::from_secs(15);
/// let window = Duration::from_secs(60);
/// let (rebuild_most, rebuild_held) = (0, 0);
/// let ask = ShareAsk { holders: &holders, counter: &counter, holder: "a", limit: 100, window, want: 1_000, rebuild_most, rebuild_held, resplit: false, ttl };
/// let a = take_share(&redis, &ask, &RedisTime::redis()).await?;
/// assert_eq!(a.share, 100, "alone: all of it");
/// let b = take_share(&redis, &ShareAsk { holder: "b", ..ask }, &RedisTime::redis()).await?;
/// assert_eq!(b.share, 0, "a holds it all until it is given less");
/// # Ok(()) }
/// ```
pub async fn take_share(redis: &Redis, ask: &ShareAsk<'_>, time: &RedisTime) -> Result<Share, BackendError> {
    let script_time = time.script_now();
    let ttl_us = u64::try_from(ask.ttl.as_micros()).unwrap_or(u64::MAX).max(1);
    let window_ms = u64::try_from(ask.window.as_millis()).unwrap_or(u64::MAX).max(1);
    let args = [
        script_time.now,
        ask.holder.to_string(),
        ask.limit.to_string(),
        ask.want.to_string(),
        ttl_us.to_string(),
        window_ms.to_string(),
        script_time.shift_ms.to_string(),
        ask.rebuild_most.to_string(),
        ask.rebuild_held.to_string(),
        u8::from(ask.resplit).to_string(),
    ];
    let keys = [ask.holders.to_string(), ask.counter.to_string()];
    let reply: Vec<u64> = redis.invoke(&scripts::FAIR_SHARE, &keys, &args).await?;
    let get = |i: usize| reply.get(i).copied().unwrap_or(0);
    Ok(Share {
        share: get(0),
        holders: get(1),
        held: get(2),
        reserved: get(3),
        exhausted: get(4) == 1,
        rebuilt: get(5) == 1,
    })
}

/// Sees a counter's window as an RLS decision left it (it opened the window, found it full or came
/// near its end), as [`take_share`] sees it for a holder, with no holder to assign: what the RLS
/// callers used of it is taken in, and what the live holders hold is reserved in it (counted
/// into it, up to its limit), with the claims of holders that were given less than their fair
/// share for lack of room (out of what the RLS callers' fair part leaves). `holders`, `counter`,
/// `limit` and `window` as in [`ShareAsk`]. Returns what was counted into the window; nothing
/// is written for a counter no one holds.
///
/// ```no_run
/// # async fn f() -> Result<(), tollgate_redis::BackendError> {
/// use std::time::Duration;
/// use tollgate_redis::counters::see_window;
/// use tollgate_redis::{Keyspace, Redis, RedisTime};
/// let redis = Redis::connect("redis://127.0.0.1:6379").await?;
/// let holders = Keyspace::new("rl:rlqs:").key("api", "all", &[] as &[&str]);
/// let counter = Keyspace::new("rl:").key("api", "all", &[] as &[&str]);
/// let window = Duration::from_secs(1);
/// let reserved = see_window(&redis, &holders, &counter, 100, window, &RedisTime::redis()).await?;
/// assert_eq!(reserved, 0, "no one holds it");
/// # Ok(()) }
/// ```
pub async fn see_window(
    redis: &Redis,
    holders: &str,
    counter: &str,
    limit: u64,
    window: Duration,
    time: &RedisTime,
) -> Result<u64, BackendError> {
    // The script's holder '' sees the window only (fair_share.lua's header).
    let ask = ShareAsk {
        holders,
        counter,
        holder: "",
        limit,
        window,
        want: 0,
        rebuild_most: 0,
        rebuild_held: 0,
        resplit: false,
        ttl: Duration::from_micros(1),
    };
    take_share(redis, &ask, time).await.map(|share| share.reserved)
}

/// Removes `holder` from the counter whose holders are at `key`: what it held goes back to the
/// others at once.
pub async fn drop_share(redis: &Redis, key: &str, holder: &str) -> Result<(), BackendError> {
    redis.query::<u64>(redis::cmd("HDEL").arg(key).arg(holder)).await.map(drop)
}

/// Marks the limit `limit` (its id) as held by a holder of this server, in the set at `key`,
/// which lives for `keep` after its last mark: every server on this Redis reads the set
/// ([`held_limits`]) to see the windows of the limits held on other servers too (an RLS
/// decision there opens a window that the holders' assignments may admit in).
///
/// ```no_run
/// # async fn f() -> Result<(), tollgate_redis::BackendError> {
/// use std::time::Duration;
/// use tollgate_redis::{Redis, counters::{held_limits, mark_held}};
/// let redis = Redis::connect("redis://127.0.0.1:6379/").await?;
/// mark_held(&redis, "{held}:limits", 42, Duration::from_secs(60)).await?;
/// assert!(held_limits(&redis, "{held}:limits").await?.contains(&42));
/// # Ok(()) }
/// ```
pub async fn mark_held(redis: &Redis, key: &str, limit: u64, keep: Duration) -> Result<(), BackendError> {
    let keep_ms = u64::try_from(keep.as_millis()).unwrap_or(u64::MAX).max(1);
    let mut pipe = redis::pipe();
    pipe.cmd("SADD").arg(key).arg(limit).ignore().cmd("PEXPIRE").arg(key).arg(keep_ms).ignore();
    redis.pipeline::<()>(&pipe).await
}

/// The limits marked held by [`mark_held`] in the set at `key` (by their ids; none once it
/// expired).
pub async fn held_limits(redis: &Redis, key: &str) -> Result<Vec<u64>, BackendError> {
    redis.query(redis::cmd("SMEMBERS").arg(key)).await
}
