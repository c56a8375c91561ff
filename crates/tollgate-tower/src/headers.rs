//! Response headers: `Retry-After` (whole seconds, rounded up, never 0 while limited) and the IETF
//! `RateLimit-Policy` / `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers-10):
//!
//! ```text
//! RateLimit-Policy: "per-ip";q=60;w=60
//! RateLimit: "per-ip";r=12;t=37
//! ```

use std::fmt::Write;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::policy::PolicyState;

/// `RateLimit-Policy`.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Seconds for a header: rounded up, so a client that waits that long is never early.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// `Retry-After` for a rejection: `None` when retrying cannot help by waiting alone; otherwise at
/// least 1 (a limited client must never be told "0 = retry now").
pub fn retry_after(retry: Option<Duration>) -> Option<HeaderValue> {
    let secs = ceil_secs(retry?).max(1);
    Some(HeaderValue::from(secs))
}

/// Adds `RateLimit-Policy` and `RateLimit` items for each policy.
pub fn insert_ratelimit(headers: &mut HeaderMap, states: &[PolicyState]) {
    let mut policy = String::new();
    let mut current = String::new();
    for s in states {
        let sep = if policy.is_empty() { "" } else { ", " };
        let _ = write!(policy, "{sep}{}", Item(&s.name));
        let _ = write!(policy, ";q={}", s.meta.limit);
        if let Some(w) = s.window {
            let _ = write!(policy, ";w={}", ceil_secs(w).max(1));
        }
        let sep = if current.is_empty() { "" } else { ", " };
        let reset = ceil_secs(Duration::from_nanos(s.meta.reset_ns));
        let _ = write!(current, "{sep}{};r={};t={reset}", Item(&s.name), s.meta.remaining);
    }
    if let (Ok(p), Ok(c)) = (HeaderValue::from_str(&policy), HeaderValue::from_str(&current)) {
        headers.insert(RATELIMIT_POLICY, p);
        headers.insert(RATELIMIT, c);
    }
}

/// A policy name as a structured-field string: quoted, with `"` and `\` escaped and anything
/// outside printable ASCII dropped.
struct Item<'a>(&'a str);

impl std::fmt::Display for Item<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_char('"')?;
        for c in self.0.chars().filter(|c| (' '..='~').contains(c)) {
            if c == '"' || c == '\\' {
                f.write_char('\\')?;
            }
            f.write_char(c)?;
        }
        f.write_char('"')
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate::Meta;

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        assert_eq!(retry_after(Some(Duration::from_nanos(1))).unwrap(), "1");
        assert_eq!(retry_after(Some(Duration::ZERO)).unwrap(), "1");
        assert_eq!(retry_after(Some(Duration::from_millis(1001))).unwrap(), "2");
        assert_eq!(retry_after(Some(Duration::from_secs(3))).unwrap(), "3");
        assert_eq!(retry_after(None), None);
    }

    #[test]
    fn ratelimit_fields_follow_the_draft() {
        let mut h = HeaderMap::new();
        let s = |name: &str, limit, remaining, reset_ns, window| PolicyState {
            name: name.into(),
            meta: Meta { limit, remaining, reset_ns, retry_ns: None },
            window,
        };
        insert_ratelimit(
            &mut h,
            &[s("per-ip", 60, 12, 36_200_000_000, Some(Duration::from_secs(60))), s("odd\"name", 5, 0, 0, None)],
        );
        assert_eq!(h[RATELIMIT_POLICY], r#""per-ip";q=60;w=60, "odd\"name";q=5"#);
        assert_eq!(h[RATELIMIT], r#""per-ip";r=12;t=37, "odd\"name";r=0;t=0"#);
    }
}
