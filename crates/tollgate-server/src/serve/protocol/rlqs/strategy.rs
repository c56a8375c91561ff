//! An assignment as Envoy's `rate_limit_quota` filter enforces it.
//!
//! Built to Envoy's client (`source/extensions/filters/http/rate_limit_quota/global_client_impl.cc`),
//! not only to the proto: it enforces blanket rules and token buckets and skips
//! `requests_per_time_unit`; it reads only the whole seconds of a token bucket's `fill_interval`
//! (under one second the bucket admits everything) and of `assignment_time_to_live` (0 expires at
//! once); it keeps the bucket it has when `max_tokens`, `tokens_per_fill` and the *nanos* of
//! `fill_interval` are unchanged (so a new `fill_interval` in whole seconds alone is not applied),
//! and a new bucket starts full; it refills continuously (`AtomicTokenBucketImpl`: available =
//! min(max, elapsed × tokens_per_fill / fill_interval)), admitting a request per whole token.

use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt32Value};

/// What one bucket of one Envoy instance is told to enforce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Assignment {
    /// Every request passes: the bucket matches no limit that denies.
    AllowAll,
    /// No request passes: a limit's window is exhausted, or the share is 0.
    DenyAll,
    /// Requests pass while the bucket has a token.
    Bucket(Bucket),
}

impl Assignment {
    /// The strategy Envoy enforces.
    pub(crate) fn strategy(self) -> RateLimitStrategy {
        let strategy = match self {
            Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
            Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
            Assignment::Bucket(b) => Strategy::TokenBucket(TokenBucket {
                max_tokens: b.max_tokens,
                tokens_per_fill: Some(UInt32Value { value: b.tokens_per_fill }),
                fill_interval: Some(ProtoDuration { seconds: i64::from(b.fill_secs), nanos: 0 }),
            }),
        };
        RateLimitStrategy { strategy: Some(strategy) }
    }
}

/// A token bucket as Envoy builds it: `max_tokens` at most, refilled continuously by
/// `tokens_per_fill` every `fill_secs` seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bucket {
    pub(crate) max_tokens: u32,
    pub(crate) tokens_per_fill: u32,
    pub(crate) fill_secs: u32,
}

/// The burst a share gets: a two-hundredth of it, and up to 8 tokens for a small share (a
/// quarter of it at most), at least one. Small, because a rebuilt bucket starts full again, on
/// top of what the old one admitted in the window (measured: a fiftieth let a fleet admit 1.03x
/// a limit of 6,000 a minute while demand shifted); not one token, because a bucket that holds
/// one wastes the refill that comes between two requests (a third of a share at 2x demand in
/// 10 ms steps). The one formula: what a rebuilt bucket adds to a window is the `max_tokens` it
/// gave (`ledger::Rebuild`).
fn burst(share: u64) -> u64 {
    (share / 200).max((share / 4).min(8)).max(1)
}

impl Bucket {
    /// The largest bucket whose admissions in any stretch of each part's window stay within that
    /// part's share: its burst plus its refill over the window. `parts` are (hits per window,
    /// window); `None` when a share is 0 (nothing may pass) or there are no parts.
    ///
    /// The refill is expressed over the tightest part's window in whole seconds (Envoy reads
    /// no more), so a share of 300 per minute is 292 tokens per 60 s, not a rounded rate per
    /// second.
    pub(crate) fn within(parts: &[(u64, Duration)]) -> Option<Bucket> {
        if parts.is_empty() || parts.iter().any(|&(share, _)| share == 0) {
            return None;
        }
        let max_tokens = parts.iter().map(|&(share, _)| burst(share)).min().expect("not empty");
        // Tokens per second each part allows after the burst; the tightest decides.
        let (rate, window) = parts
            .iter()
            .map(|&(share, window)| ((share - max_tokens) as f64 / window.as_secs_f64().max(1e-9), window))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .expect("not empty");
        let longest = parts.iter().map(|&(_, w)| w).max().expect("not empty");
        let max = f64::from(u32::MAX);
        let (tokens_per_fill, fill_secs) = if rate <= 0.0 {
            // The burst is the whole share: refill too slowly to add a token within two of the
            // longest windows (Envoy needs some refill; unset would be one token a year anyway).
            (1.0, 2.0 * longest.as_secs_f64().ceil() + 1.0)
        } else {
            let fill = window.as_secs_f64().floor().clamp(1.0, (max / rate).floor().max(1.0));
            let per_fill = (rate * fill).floor();
            if per_fill >= 1.0 {
                (per_fill.min(max), fill)
            } else {
                // Under a token per window: one token every so many whole seconds, rounded up
                // so never faster than the share.
                (1.0, (1.0 / rate).ceil())
            }
        };
        Some(Bucket {
            max_tokens: u32::try_from(max_tokens).unwrap_or(u32::MAX),
            tokens_per_fill: tokens_per_fill as u32,
            fill_secs: fill_secs.min(f64::from(u32::MAX)) as u32,
        })
    }

    /// The token bucket to send for `parts` to a bucket that has `before`: [`Bucket::within`]
    /// them, changed if need be so that Envoy tells it apart ([`Bucket::replacing`]); `None`
    /// when nothing may pass.
    pub(crate) fn next(parts: &[(u64, Duration)], before: Option<Bucket>) -> Option<Bucket> {
        Bucket::within(parts).map(|b| b.replacing(before))
    }

    /// The most this bucket admits in any stretch of `window`: a full bucket, then whole tokens
    /// of its refill.
    #[cfg(test)]
    pub(crate) fn admits_within(self, window: Duration) -> u64 {
        let refill = window.as_secs_f64() * f64::from(self.tokens_per_fill) / f64::from(self.fill_secs.max(1));
        u64::from(self.max_tokens).saturating_add(refill.floor() as u64)
    }

    /// This bucket, changed if need be so that Envoy replaces `before` with it: Envoy keeps its
    /// bucket when `max_tokens` and `tokens_per_fill` are unchanged, whatever `fill_interval`'s
    /// whole seconds say. The change is downward (one token less per fill), never more than was
    /// planned; a bucket of one token per fill gets two per twice the fill instead (the same
    /// rate, and a `tokens_per_fill` Envoy tells apart).
    pub(crate) fn replacing(self, before: Option<Bucket>) -> Bucket {
        match before {
            Some(b)
                if b.fill_secs != self.fill_secs
                    && (b.max_tokens, b.tokens_per_fill) == (self.max_tokens, self.tokens_per_fill) =>
            {
                if self.tokens_per_fill > 1 {
                    Bucket { tokens_per_fill: self.tokens_per_fill - 1, ..self }
                } else {
                    Bucket { tokens_per_fill: 2, fill_secs: self.fill_secs.saturating_mul(2), ..self }
                }
            }
            _ => self,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn a_share_per_minute_is_a_burst_and_the_rest_refilled_over_the_minute() {
        let b = Bucket::within(&[(300, MINUTE)]).unwrap();
        assert_eq!(b, Bucket { max_tokens: 8, tokens_per_fill: 292, fill_secs: 60 });
        assert_eq!(b.admits_within(MINUTE), 300);
    }

    #[test]
    fn every_part_is_kept_within_its_share() {
        let second = Duration::from_secs(1);
        let parts = [(300, MINUTE), (10, second), (1_000, Duration::from_secs(3600))];
        let b = Bucket::within(&parts).unwrap();
        for (share, window) in parts {
            assert!(b.admits_within(window) <= share, "{b:?} admits {} in {window:?}", b.admits_within(window));
        }
        assert_eq!(b.max_tokens, 2, "the smallest burst: a quarter of 10");
        for (share, window) in
            [(1, MINUTE), (2, MINUTE), (7, Duration::from_millis(500)), (5, Duration::from_secs(86_400))]
        {
            let b = Bucket::within(&[(share, window)]).unwrap();
            assert!(
                b.admits_within(window) <= share,
                "{b:?} admits {} of {share} in {window:?}",
                b.admits_within(window)
            );
            assert!(b.tokens_per_fill >= 1 && b.fill_secs >= 1, "{b:?}: Envoy needs both");
        }
        assert_eq!(Bucket::within(&[(0, MINUTE)]), None);
        assert_eq!(Bucket::within(&[]), None);
    }

    #[test]
    fn a_change_of_fill_alone_is_made_visible_to_envoy() {
        let before = Bucket { max_tokens: 6, tokens_per_fill: 294, fill_secs: 60 };
        let after = Bucket { fill_secs: 30, ..before }.replacing(Some(before));
        assert_eq!(after, Bucket { max_tokens: 6, tokens_per_fill: 293, fill_secs: 30 });
        assert_eq!(before.replacing(Some(before)), before, "the same bucket is kept as it is");
        let slow = Bucket { max_tokens: 1, tokens_per_fill: 1, fill_secs: 7 };
        let slower = Bucket { fill_secs: 9, ..slow }.replacing(Some(slow));
        assert_eq!(slower, Bucket { max_tokens: 1, tokens_per_fill: 2, fill_secs: 18 }, "1 per 9 s, told apart");
    }
}
