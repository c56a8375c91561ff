//! Response headers computed from an [`Outcome`], the same for the HTTP API and Envoy's RLS
//! (`response_headers_to_add`): the draft RateLimit headers of the tightest counter, and the mark
//! of exceeded quota limits.

use std::fmt::Write as _;

use crate::serve::model::{Outcome, Status};

/// Which draft of the RateLimit header fields to send (`--rate-limit-headers` for RLS replies,
/// `response_headers` in an HTTP body).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderDraft {
    /// draft-polli-ratelimit-headers-03: `X-RateLimit-Limit`, `-Remaining`, `-Reset`, as
    /// Limitador sends them.
    Draft03,
    /// draft-ietf-httpapi-ratelimit-headers-10: `RateLimit-Policy` and `RateLimit`.
    Draft10,
}

impl HeaderDraft {
    /// Reads the HTTP API's `response_headers` value: `DraftVersion03` / `draft03`,
    /// `DraftVersion10` / `draft10`; `Ok(None)` for none (`""`, `none`, `None`).
    ///
    /// ```
    /// use tollgate_server::serve::HeaderDraft;
    /// assert_eq!(HeaderDraft::from_body("DraftVersion03"), Ok(Some(HeaderDraft::Draft03)));
    /// assert_eq!(HeaderDraft::from_body("none"), Ok(None));
    /// assert_eq!(
    ///     HeaderDraft::from_body("v99").unwrap_err().to_string(),
    ///     "invalid response_headers `v99`: expected DraftVersion03, DraftVersion10 or none"
    /// );
    /// ```
    pub fn from_body(value: &str) -> Result<Option<HeaderDraft>, UnknownHeaderDraft> {
        match value {
            "" | "none" | "None" => Ok(None),
            "DraftVersion03" | "draft03" => Ok(Some(HeaderDraft::Draft03)),
            "DraftVersion10" | "draft10" => Ok(Some(HeaderDraft::Draft10)),
            other => Err(UnknownHeaderDraft { value: other.to_owned() }),
        }
    }
}

/// A `response_headers` value that names no draft [`HeaderDraft::from_body`] knows.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid response_headers `{value}`: expected DraftVersion03, DraftVersion10 or none")]
pub struct UnknownHeaderDraft {
    /// The value as sent.
    pub value: String,
}

/// Lists the names of the quota limits (`mode: quota`) a call exceeded, comma-separated; absent
/// when none was.
pub const QUOTA_EXCEEDED: &str = "x-tollgate-quota-exceeded";

/// The headers to send with `outcome`: the draft's RateLimit fields of the tightest counter (a
/// limited one first, then the one with the fewest hits left) when `draft` is set, and
/// [`QUOTA_EXCEEDED`] when a quota was exceeded. Names are lower case.
pub fn response_headers(outcome: &Outcome, draft: Option<HeaderDraft>) -> Vec<(&'static str, String)> {
    let mut headers = Vec::new();
    if let Some(draft) = draft {
        rate_limit(outcome, draft, &mut headers);
    }
    let quotas = outcome.quotas_exceeded();
    if !quotas.is_empty() {
        headers.push((QUOTA_EXCEEDED, quotas.join(", ")));
    }
    headers
}

fn rate_limit(outcome: &Outcome, draft: HeaderDraft, headers: &mut Vec<(&'static str, String)>) {
    // An unlimited rule has no limit to report (envoy/ratelimit sends headers for limits only).
    let mut order: Vec<&Status> = outcome.statuses.iter().filter(|s| !outcome.limit(s).unlimited()).collect();
    order.sort_by_key(|s| (!s.limited, s.meta.remaining));
    let Some(tightest) = order.first() else { return };
    let limit = outcome.limit(tightest);
    let reset = tightest.meta.reset_ns.div_ceil(1_000_000_000);
    match draft {
        HeaderDraft::Draft10 => {
            let policy = format!("\"{}\";q={};w={}", limit.id(), outcome.max_value(tightest), limit.seconds());
            headers.push(("ratelimit-policy", policy));
            headers.push(("ratelimit", format!("\"{}\";r={};t={reset}", limit.id(), tightest.meta.remaining)));
        }
        HeaderDraft::Draft03 => {
            let mut value = outcome.max_value(tightest).to_string();
            for status in &order {
                let l = outcome.limit(status);
                let _ = write!(value, ", {};w={}", outcome.max_value(status), l.seconds());
                if let Some(name) = l.name() {
                    let _ = write!(value, ";name=\"{}\"", name.replace('"', "'"));
                }
            }
            headers.push(("x-ratelimit-limit", value));
            headers.push(("x-ratelimit-remaining", tightest.meta.remaining.to_string()));
            headers.push(("x-ratelimit-reset", reset.to_string()));
        }
    }
}
