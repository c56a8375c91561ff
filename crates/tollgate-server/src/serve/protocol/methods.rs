//! The gRPC methods the server answers, and the action each asks for: the one table that both
//! ways of serving a call read (the fast path of `serve::net::grpc`, and tonic's, which takes
//! compressed calls), for Envoy's service and Kuadrant's alike.

use crate::serve::model::Action;

/// Envoy's rate limit service, v3.
pub(crate) const ENVOY: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// Kuadrant's: `CheckRateLimit` checks without counting, `Report` counts without checking; both
/// take and return Envoy's messages.
pub(crate) const KUADRANT: &str = "kuadrant.service.ratelimit.v1.RateLimitService";

/// Envoy's rate limit quota service (RLQS): one streaming method, served by tonic
/// (`serve::net::rlqs`), not by the unary path.
pub(crate) const RLQS: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";

/// Every rate-limit method, by its path: `/{service}/{method}`.
const METHODS: [(&str, &str, Action); 3] = [
    (ENVOY, "ShouldRateLimit", Action::CheckAndReport),
    (KUADRANT, "CheckRateLimit", Action::Check),
    (KUADRANT, "Report", Action::Report),
];

/// The action a request's path asks for, if it names one of the rate-limit methods.
pub(crate) fn action(path: &str) -> Option<Action> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    METHODS.iter().find(|(s, m, _)| *s == service && *m == method).map(|&(_, _, action)| action)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_has_its_action_and_nothing_else_has_one() {
        let path = |service: &str, method: &str| format!("/{service}/{method}");
        assert_eq!(action(&path(ENVOY, "ShouldRateLimit")), Some(Action::CheckAndReport));
        assert_eq!(action(&path(KUADRANT, "CheckRateLimit")), Some(Action::Check));
        assert_eq!(action(&path(KUADRANT, "Report")), Some(Action::Report));
        for other in [
            path(ENVOY, "Report"),
            path(KUADRANT, "ShouldRateLimit"),
            "/grpc.health.v1.Health/Check".to_string(),
            format!("{ENVOY}/ShouldRateLimit"),
            format!("/{ENVOY}/ShouldRateLimit/"),
            String::new(),
        ] {
            assert_eq!(action(&other), None, "{other}");
        }
    }
}
