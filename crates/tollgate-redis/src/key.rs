//! [`RedisKey`]: how a limiter key becomes part of a Redis key.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

/// A key a distributed limiter can store: its text form, which becomes the decision's hash tag.
///
/// ```
/// use tollgate_redis::RedisKey;
/// assert_eq!("alice".redis_key(), "alice");
/// assert_eq!(().redis_key(), "global");
/// assert_eq!("10.0.0.1".parse::<std::net::IpAddr>().unwrap().redis_key(), "10.0.0.1");
/// ```
pub trait RedisKey: Sync {
    /// The key as text.
    fn redis_key(&self) -> Cow<'_, str>;
}

impl RedisKey for str {
    fn redis_key(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl RedisKey for String {
    fn redis_key(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl RedisKey for Arc<str> {
    fn redis_key(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

/// Bytes that are not UTF-8 are replaced (`U+FFFD`), as HTTP header values seldom are.
impl RedisKey for bytes::Bytes {
    fn redis_key(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(self)
    }
}

impl RedisKey for IpAddr {
    fn redis_key(&self) -> Cow<'_, str> {
        Cow::Owned(self.to_string())
    }
}

impl RedisKey for u64 {
    fn redis_key(&self) -> Cow<'_, str> {
        Cow::Owned(self.to_string())
    }
}

/// One state for everything (a global limit).
impl RedisKey for () {
    fn redis_key(&self) -> Cow<'_, str> {
        Cow::Borrowed("global")
    }
}
