//! [`Clients`]: requests whose cost is known only after the work (LLM tokens, bytes sent, a
//! query's cost), from clients that each hold one request at a time. The cost of each request is
//! drawn from a heavy-tailed distribution, and the client's estimate of it is off by up to a given
//! fraction. Each client's requests come from its own seeded stream, so every algorithm and both
//! ways of asking ([`crate::Way`]) see the same requests in the same order.

use std::fmt;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::SimError;
use crate::units::nanos;

/// Most clients one simulation runs.
pub const MAX_CLIENTS: u64 = 10_000;
/// Clients unless told otherwise (`--concurrency`).
pub const DEFAULT_CONCURRENCY: u64 = 32;
/// How far off estimates are unless told otherwise (`--estimate-error`): ±50%.
pub const DEFAULT_ESTIMATE_ERROR: f64 = 0.5;
/// Largest log-normal sigma accepted: e^(5²/2) makes the mean 268,000 times the median already.
pub const MAX_SIGMA: f64 = 5.0;

const DISTRIBUTIONS: &str = "lognormal:MEDIAN,SIGMA";

/// How the cost of a request is distributed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CostDistribution {
    /// `e^(ln(median) + sigma·Z)`, `Z` standard normal: mostly near the median, now and then many
    /// times it (sigma 1: one request in 20 costs more than 5 times the median).
    LogNormal {
        /// The median cost (in permits).
        median: f64,
        /// The standard deviation of the cost's logarithm.
        sigma: f64,
    },
}

impl CostDistribution {
    /// Parses `lognormal:MEDIAN,SIGMA` (`log-normal` and `MEDIAN:SIGMA` are read too), e.g.
    /// `lognormal:20,1`. Errors name `--costs`.
    ///
    /// ```
    /// use tollgate_sim::CostDistribution;
    /// assert_eq!(CostDistribution::parse("lognormal:20,1")?, CostDistribution::LogNormal { median: 20.0, sigma: 1.0 });
    /// assert!(CostDistribution::parse("pareto:2").unwrap_err().to_string().starts_with("invalid --costs \"pareto:2\""));
    /// # Ok::<(), tollgate_sim::SimError>(())
    /// ```
    pub fn parse(spec: &str) -> Result<CostDistribution, SimError> {
        let bad = |reason: String| SimError::invalid("--costs", spec, reason);
        let (name, args) = spec.split_once(':').unwrap_or((spec, ""));
        match name.trim().to_ascii_lowercase().as_str() {
            "lognormal" | "log-normal" | "log_normal" => {
                let parts: Vec<&str> = args.split([',', ':']).map(str::trim).collect();
                let [median, sigma] = parts[..] else {
                    return Err(bad(format!("expected {DISTRIBUTIONS}, e.g. lognormal:20,1")));
                };
                let number = |s: &str| s.parse::<f64>().ok().filter(|v| v.is_finite());
                let median = number(median).filter(|&m| m >= 1.0).ok_or_else(|| {
                    bad(format!("the median {median:?} is not a number of permits of at least 1 ({DISTRIBUTIONS})"))
                })?;
                let sigma = number(sigma).filter(|s| (0.0..=MAX_SIGMA).contains(s)).ok_or_else(|| {
                    bad(format!("sigma {sigma:?} is not a number from 0 to {MAX_SIGMA} ({DISTRIBUTIONS})"))
                })?;
                Ok(CostDistribution::LogNormal { median, sigma })
            }
            _ => Err(bad(format!("unknown cost distribution {:?}; expected {DISTRIBUTIONS}", name.trim()))),
        }
    }

    /// As `--costs` writes it: `lognormal:20,1`.
    pub fn spec(&self) -> String {
        match *self {
            CostDistribution::LogNormal { median, sigma } => format!("lognormal:{},{}", Short(median), Short(sigma)),
        }
    }

    /// The median cost.
    pub fn median(&self) -> f64 {
        match *self {
            CostDistribution::LogNormal { median, .. } => median,
        }
    }

    /// The mean cost before clamping to a capacity (`median·e^(sigma²/2)` for a log-normal).
    pub fn mean(&self) -> f64 {
        match *self {
            CostDistribution::LogNormal { median, sigma } => median * (sigma * sigma / 2.0).exp(),
        }
    }

    fn sample(&self, rng: &mut ChaCha8Rng) -> f64 {
        match *self {
            CostDistribution::LogNormal { median, sigma } => {
                // Box-Muller: 1 - u lies in (0, 1], so the logarithm is finite.
                let (u, v): (f64, f64) = (rng.random(), rng.random());
                let z = (-2.0 * (1.0 - u).ln()).sqrt() * (std::f64::consts::TAU * v).cos();
                median * (sigma * z).exp()
            }
        }
    }
}

impl fmt::Display for CostDistribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            CostDistribution::LogNormal { median, sigma } => write!(
                f,
                "log-normal (median {}, sigma {}, mean {})",
                Short(median),
                Short(sigma),
                Short(self.mean().round())
            ),
        }
    }
}

/// Clients that each hold one request at a time: draw a request, ask for it until admitted, work
/// for a while, settle its actual cost, pause, and start again (a closed loop: the more the
/// limiter holds them back, the less they ask).
///
/// Times are relative to the quota's period `P`: work lasts up to `P/2` (uniform), the pause up to
/// `P/20`; each client starts after a first pause. A refused client asks again for the same
/// request when the limiter's `retry_after` says it would fit.
///
/// Costs are clamped to the limiter's capacity (the burst of a token bucket, the limit of a
/// window): a heavy tail must not draw a request no limiter could ever admit. Estimates are the
/// clamped cost times a factor uniform in `1 ± estimate_error`, rounded and clamped to
/// `1..=capacity` as well.
#[derive(Clone, Debug, PartialEq)]
pub struct Clients {
    /// How many clients ask at once (`--concurrency`).
    pub concurrency: u64,
    /// The actual cost of a request (`--costs`).
    pub costs: CostDistribution,
    /// Estimates are within this fraction of the actual cost, either way (`--estimate-error`,
    /// from 0 to below 1).
    pub estimate_error: f64,
}

impl Clients {
    /// Parses the three options of `tollgate simulate` that describe them: `--costs`
    /// ([`CostDistribution::parse`]), `--concurrency` (1 to [`MAX_CLIENTS`]) and
    /// `--estimate-error` (a fraction `0.5` or a percentage `50%`, below 1). Each error names its
    /// option.
    ///
    /// ```
    /// use tollgate_sim::Clients;
    /// let c = Clients::parse("lognormal:20,1", 32, "50%")?;
    /// assert_eq!((c.concurrency, c.estimate_error), (32, 0.5));
    /// assert!(Clients::parse("lognormal:20,1", 32, "1.5").unwrap_err().to_string().contains("--estimate-error"));
    /// assert!(Clients::parse("lognormal:20,1", 0, "0.5").unwrap_err().to_string().contains("--concurrency"));
    /// # Ok::<(), tollgate_sim::SimError>(())
    /// ```
    pub fn parse(costs: &str, concurrency: u64, estimate_error: &str) -> Result<Clients, SimError> {
        let costs = CostDistribution::parse(costs)?;
        if !(1..=MAX_CLIENTS).contains(&concurrency) {
            return Err(SimError::invalid(
                "--concurrency",
                &concurrency.to_string(),
                format!("from 1 to {MAX_CLIENTS} clients"),
            ));
        }
        let s = estimate_error.trim();
        let error = match s.strip_suffix('%') {
            Some(percent) => percent.trim().parse::<f64>().map(|p| p / 100.0),
            None => s.parse::<f64>(),
        };
        let estimate_error = error.ok().filter(|e| (0.0..1.0).contains(e)).ok_or_else(|| {
            SimError::invalid(
                "--estimate-error",
                estimate_error,
                "a fraction from 0 to below 1 (0.5 or 50%: estimates within ±50% of the actual cost)",
            )
        })?;
        Ok(Clients { concurrency, costs, estimate_error })
    }

    /// A short name for titles: `32 clients, log-normal costs (median 20, sigma 1), estimates ±50%`.
    pub fn label(&self) -> String {
        let CostDistribution::LogNormal { median, sigma } = self.costs;
        format!(
            "{} clients, log-normal costs (median {}, sigma {}), estimates ±{}%",
            self.concurrency,
            Short(median),
            Short(sigma),
            Short(self.estimate_error * 100.0)
        )
    }

    /// Each client's stream of requests for a limiter of `capacity` under a quota of `period`.
    pub(crate) fn streams(&self, seed: u64, capacity: u64, period: Duration) -> Vec<Requests> {
        (0..self.concurrency)
            .map(|client| {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(client);
                Requests { rng, clients: self.clone(), capacity: capacity.max(1), period: nanos(period).max(1) }
            })
            .collect()
    }
}

impl fmt::Display for Clients {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} clients, one request each at a time; costs {} clamped to the capacity, estimated within ±{}%",
            self.concurrency,
            self.costs,
            Short(self.estimate_error * 100.0)
        )
    }
}

/// One request: what the client estimates, what it costs, how long its work takes, and the pause
/// after it (nanoseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) estimate: u64,
    pub(crate) actual: u64,
    pub(crate) work: u64,
    pub(crate) pause: u64,
}

/// One client's requests, drawn in order from its own stream.
pub(crate) struct Requests {
    rng: ChaCha8Rng,
    clients: Clients,
    capacity: u64,
    period: u64,
}

impl Requests {
    /// A pause: uniform in 1 ns ..= `P/20`.
    pub(crate) fn pause(&mut self) -> u64 {
        self.rng.random_range(1..=(self.period / 20).max(1))
    }

    pub(crate) fn next(&mut self) -> Request {
        let cap = self.capacity as f64;
        let actual = self.clients.costs.sample(&mut self.rng).round().clamp(1.0, cap);
        let off: f64 = self.rng.random_range(-1.0..=1.0);
        let estimate = (actual * (1.0 + self.clients.estimate_error * off)).round().clamp(1.0, cap);
        let work = self.rng.random_range(1..=(self.period / 2).max(1));
        let pause = self.pause();
        Request { estimate: estimate as u64, actual: actual as u64, work, pause }
    }
}

/// A number printed with at most three decimals, trailing zeros dropped: `20`, `0.75`.
pub(crate) struct Short(pub(crate) f64);

impl fmt::Display for Short {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = format!("{:.3}", self.0);
        f.write_str(s.trim_end_matches('0').trim_end_matches('.'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_option_at_fault() {
        for (costs, concurrency, error, needle) in [
            ("lognormal", 32, "0.5", "invalid --costs \"lognormal\": expected lognormal:MEDIAN,SIGMA"),
            ("lognormal:20", 32, "0.5", "invalid --costs \"lognormal:20\""),
            ("lognormal:0.5,1", 32, "0.5", "the median \"0.5\""),
            ("lognormal:abc,1", 32, "0.5", "the median \"abc\""),
            ("lognormal:20,-1", 32, "0.5", "sigma \"-1\""),
            ("lognormal:20,9", 32, "0.5", "sigma \"9\" is not a number from 0 to 5"),
            ("lognormal:20,NaN", 32, "0.5", "sigma \"NaN\""),
            ("pareto:1.5", 32, "0.5", "unknown cost distribution \"pareto\""),
            ("lognormal:20,1", 0, "0.5", "invalid --concurrency \"0\": from 1 to 10000 clients"),
            ("lognormal:20,1", 10_001, "0.5", "invalid --concurrency \"10001\""),
            ("lognormal:20,1", 32, "1", "invalid --estimate-error \"1\""),
            ("lognormal:20,1", 32, "-0.1", "invalid --estimate-error \"-0.1\""),
            ("lognormal:20,1", 32, "150%", "invalid --estimate-error \"150%\""),
            ("lognormal:20,1", 32, "half", "invalid --estimate-error \"half\""),
        ] {
            let e = Clients::parse(costs, concurrency, error).unwrap_err();
            assert!(e.is_usage());
            assert!(e.to_string().contains(needle), "{costs} {concurrency} {error}: {e}");
        }
        let c = Clients::parse(" Log-Normal : 20 : 0.5 ", 1, " 25 % ").unwrap();
        assert_eq!(c.costs, CostDistribution::LogNormal { median: 20.0, sigma: 0.5 });
        assert_eq!(c.estimate_error, 0.25);
        assert_eq!(Clients::parse("lognormal:20,0", 1, "0").unwrap().estimate_error, 0.0);
    }

    #[test]
    fn requests_are_seeded_clamped_and_estimated_within_the_error() {
        let clients = Clients::parse("lognormal:50,2", 3, "0.5").unwrap();
        let period = Duration::from_secs(1);
        let draw = |seed| -> Vec<Request> {
            clients
                .streams(seed, 400, period)
                .iter_mut()
                .flat_map(|r| (0..2000).map(|_| r.next()).collect::<Vec<_>>())
                .collect()
        };
        let requests = draw(7);
        assert_eq!(requests, draw(7), "same seed, same requests");
        assert_ne!(requests, draw(8));
        for r in &requests {
            assert!((1..=400).contains(&r.actual) && (1..=400).contains(&r.estimate), "{r:?}");
            let (a, e) = (r.actual as f64, r.estimate as f64);
            // Within ±50% but for rounding, unless clamped.
            assert!(e >= (a * 0.5).round().max(1.0) && (e <= (a * 1.5).round() || e == 400.0), "{r:?}");
            assert!((1..=500_000_000).contains(&r.work) && (1..=50_000_000).contains(&r.pause), "{r:?}");
        }
        // Sigma 2 over a capacity of 8 medians: the tail is clamped now and then.
        assert!(requests.iter().any(|r| r.actual == 400));
        let median = {
            let mut a: Vec<u64> = requests.iter().map(|r| r.actual).collect();
            a.sort_unstable();
            a[a.len() / 2]
        };
        assert!((45..=55).contains(&median), "median {median}");
    }

    #[test]
    fn descriptions() {
        let c = Clients::parse("lognormal:20,1", 32, "0.5").unwrap();
        assert_eq!(c.label(), "32 clients, log-normal costs (median 20, sigma 1), estimates ±50%");
        assert_eq!(
            c.to_string(),
            "32 clients, one request each at a time; costs log-normal (median 20, sigma 1, mean 33) clamped to \
             the capacity, estimated within ±50%"
        );
    }
}
