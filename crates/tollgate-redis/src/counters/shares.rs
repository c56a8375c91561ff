//! Fair shares of a counter's limit among holders on several servers: the rate-limit server's
//! RLQS assignments, when its replicas share one Redis (`scripts/fair_share.lua`).

use std::time::Duration;

use crate::{BackendError, Redis, RedisTime, scripts};

/// What a holder was given by [`take_share`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    /// The hits per window the holder now holds.
    pub share: u64,
    /// The counter's live holders, this one included.
    pub holders: u64,
    /// What they hold in all.
    pub held: u64,
}

/// Gives `holder` its share of the counter whose holders are at `key`, in one EVALSHA: its
/// max-min fair share of `limit` (hits per window) among the live holders' wants, given it wants
/// `want`, and never more than `limit` less what the other live holders hold. What it holds is
/// recorded until `ttl` from now on `time`'s clock; holders past theirs are removed.
///
/// ```no_run
/// # async fn f() -> Result<(), tollgate_redis::BackendError> {
/// use std::time::Duration;
/// use tollgate_redis::counters::take_share;
/// use tollgate_redis::{Keyspace, Redis, RedisTime};
/// let redis = Redis::connect("redis://127.0.0.1:6379").await?;
/// let key = Keyspace::new("rl:rlqs:").key("api", "all", &[] as &[&str]);
/// let ttl = Duration::from_secs(15);
/// let a = take_share(&redis, &key, "a", 100, 1_000, ttl, &RedisTime::redis()).await?;
/// assert_eq!(a.share, 100, "alone: all of it");
/// let b = take_share(&redis, &key, "b", 100, 1_000, ttl, &RedisTime::redis()).await?;
/// assert_eq!(b.share, 0, "a holds it all until it is given less");
/// # Ok(()) }
/// ```
pub async fn take_share(
    redis: &Redis,
    key: &str,
    holder: &str,
    limit: u64,
    want: u64,
    ttl: Duration,
    time: &RedisTime,
) -> Result<Share, BackendError> {
    let now = time.now_us().map_or_else(String::new, |n| n.to_string());
    let ttl_us = u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX).max(1);
    let args = [now, holder.to_string(), limit.to_string(), want.to_string(), ttl_us.to_string()];
    let reply: Vec<u64> = redis.invoke(&scripts::FAIR_SHARE, &[key.to_string()], &args).await?;
    let get = |i: usize| reply.get(i).copied().unwrap_or(0);
    Ok(Share { share: get(0), holders: get(1), held: get(2) })
}

/// Removes `holder` from the counter whose holders are at `key`: what it held goes back to the
/// others at once.
pub async fn drop_share(redis: &Redis, key: &str, holder: &str) -> Result<(), BackendError> {
    redis.query::<u64>(redis::cmd("HDEL").arg(key).arg(holder)).await.map(drop)
}
