//! Costs known only after the work, two ways: reserve an estimate and settle the actual cost
//! ([`tollgate::Reservation`]), or check that something is left and charge the actual cost after
//! the work (what Envoy does with `hits_addend: 0` on the request and the cost at stream end).
//!
//! The same [`Clients`] run against each algorithm, each way, on a [`ManualClock`] driven event
//! by event (no sleeping, no runtime). Every admission is recorded with its estimate and actual
//! cost; then, over every window the algorithm bounds ([`Allowance`]), the cost admitted is set
//! against what the algorithm allows there. Reservations keep a bound: over any window, the cost
//! admitted is at most what the algorithm allows plus, summed over the window's requests,
//! `actual − estimate` where positive. Checking first has no bound: every client in flight passed
//! the same check.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt;

use tollgate::{
    Algorithm, Clock, FixedWindow, IntervalBucket, Lease, Limiter, ManualClock, Quota, RateLimiter, Reservation,
    SlidingLog, SlidingWindow, TokenBucket, WeightedWindow,
};

use crate::algorithm::AlgorithmKind;
use crate::clients::{Clients, Request};
use crate::error::SimError;
use crate::traffic::MAX_REQUESTS;
use crate::units::{Span, nanos};

/// How a client asks for a request whose cost it knows only afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Way {
    /// `reserve(estimate)`, then `settle(actual)` after the work: what the estimate exceeded is
    /// given back, the rest past it charged as a debt later requests pay first.
    ReserveSettle,
    /// `check(1)` (admitted while anything is left), then the actual cost charged after the work,
    /// past the limit if need be (Envoy's `hits_addend: 0`, then the cost at stream end).
    CheckThenCharge,
}

impl Way {
    /// Both, in report order.
    pub const BOTH: [Way; 2] = [Way::ReserveSettle, Way::CheckThenCharge];

    /// `reserve/settle` or `check-then-charge`.
    pub fn name(self) -> &'static str {
        match self {
            Way::ReserveSettle => "reserve/settle",
            Way::CheckThenCharge => "check-then-charge",
        }
    }
}

impl fmt::Display for Way {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One admitted request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charge {
    /// When it was admitted (nanoseconds).
    pub at: u64,
    /// What the client estimated (and, reserving, reserved; checking, it reserved nothing).
    pub estimate: u64,
    /// What it cost: charged when its work was done.
    pub actual: u64,
    /// For the fixed window, when the window it was admitted in ends (0 for the others).
    pub window_end: u64,
}

impl Charge {
    /// What the actual cost exceeded the estimate by (0 when it did not): the bound's slack.
    pub fn excess(&self) -> u64 {
        self.actual.saturating_sub(self.estimate)
    }
}

/// The windows an algorithm bounds, and what it admits in each (with estimates that are exact).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allowance {
    /// Any `period` from an admission on: `limit` (the sliding log).
    Sliding {
        /// Most permits per window.
        limit: u64,
        /// The window.
        period: u64,
    },
    /// Each window the limiter opened (as its admissions' `reset_after` report it): `limit` (the
    /// fixed window).
    Opened {
        /// Most permits per window.
        limit: u64,
        /// The window.
        period: u64,
    },
    /// Windows of `period` starting at multiples of `align`: `limit` (the sliding window's
    /// segments, the weighted window's whole periods).
    Aligned {
        /// Most permits per window.
        limit: u64,
        /// The window.
        period: u64,
        /// Where windows may start.
        align: u64,
    },
    /// From any admission to any later one less than `period` after it: `burst`, plus `per_tick`
    /// for each multiple of `tick` crossed (the token bucket: one per emission interval; the
    /// interval bucket: a step per step interval).
    Refill {
        /// Permits at the start.
        burst: u64,
        /// Permits added per tick.
        per_tick: u64,
        /// Nanoseconds per tick.
        tick: u64,
        /// The longest window (the quota's period).
        period: u64,
    },
}

impl Allowance {
    /// What `kind` admits under `quota` (with `segments` for the sliding window).
    pub fn of(kind: AlgorithmKind, quota: &Quota, segments: u64) -> Allowance {
        let (limit, period, burst) = (quota.limit(), nanos(quota.period()), quota.burst());
        match kind {
            AlgorithmKind::TokenBucket => {
                Allowance::Refill { burst, per_tick: 1, tick: nanos(quota.emission_interval()), period }
            }
            // The interval bucket's step: the limit every period, or (a burst below the limit)
            // the burst every period·burst/limit, rounded up.
            AlgorithmKind::IntervalBucket if burst < limit => {
                let tick = (u128::from(period) * u128::from(burst)).div_ceil(u128::from(limit));
                Allowance::Refill { burst, per_tick: burst, tick: u64::try_from(tick).unwrap_or(u64::MAX), period }
            }
            AlgorithmKind::IntervalBucket => Allowance::Refill { burst, per_tick: limit, tick: period, period },
            AlgorithmKind::FixedWindow => Allowance::Opened { limit, period },
            AlgorithmKind::SlidingWindow => {
                let align = period.div_ceil(segments.max(1));
                Allowance::Aligned { limit, period: align.saturating_mul(segments.max(1)), align }
            }
            AlgorithmKind::WeightedWindow => Allowance::Aligned { limit, period, align: period },
            AlgorithmKind::SlidingLog => Allowance::Sliding { limit, period },
        }
    }
}

impl fmt::Display for Allowance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = |ns: u64| Span(std::time::Duration::from_nanos(ns));
        match *self {
            Allowance::Sliding { limit, period } => write!(f, "{limit} in any {}", d(period)),
            Allowance::Opened { limit, period } => write!(f, "{limit} in each {} window it opened", d(period)),
            Allowance::Aligned { limit, period, align } if align == period => {
                write!(f, "{limit} in each {} window", d(period))
            }
            Allowance::Aligned { limit, period, align } => {
                write!(f, "{limit} in any {} starting on a {} segment", d(period), d(align))
            }
            Allowance::Refill { burst, per_tick, tick, period } => {
                write!(f, "{burst} + {per_tick} per {} crossed, in any {}", d(tick), d(period))
            }
        }
    }
}

/// One window's admissions against what the algorithm allows there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CostWindow {
    /// Its first admission (nanoseconds).
    pub start_ns: u64,
    /// Where it ends (nanoseconds; for [`Allowance::Refill`], at its last admission).
    pub end_ns: u64,
    /// Requests admitted in it.
    pub requests: u64,
    /// Their actual cost.
    pub cost: u64,
    /// What the algorithm allows in it.
    pub allowed: u64,
    /// Their [`Charge::excess`], summed: what the bound adds to `allowed`.
    pub excess: u64,
}

impl CostWindow {
    /// The cost over what the algorithm allows (0 when within).
    pub fn overshoot(&self) -> u64 {
        self.cost.saturating_sub(self.allowed)
    }

    /// `allowed + excess`: what reservations are held to in this window.
    pub fn bound(&self) -> u64 {
        self.allowed.saturating_add(self.excess)
    }
}

/// What one algorithm admitted of the [`Clients`]' requests, one way.
#[derive(Clone, Debug, PartialEq)]
pub struct CostRun {
    /// The algorithm.
    pub algorithm: AlgorithmKind,
    /// How the clients asked.
    pub way: Way,
    /// Admissions, in time order.
    pub admitted: Vec<Charge>,
    /// Asks refused (each retried later).
    pub refused: u64,
    /// The windows the algorithm bounds.
    pub allowance: Allowance,
    /// The window whose cost went furthest over what the algorithm allows there (or came
    /// closest to it).
    pub worst: CostWindow,
    /// The most any window's cost went over its [`CostWindow::bound`]: 0 when the bound held in
    /// every window.
    pub past_bound: u64,
    /// The cost admitted over what the quota allows over the run (`limit × duration / period`).
    pub utilization: f64,
}

impl CostRun {
    /// The actual cost of every admitted request.
    pub fn admitted_cost(&self) -> u64 {
        self.admitted.iter().map(|c| c.actual).sum()
    }

    /// The mean actual cost of an admitted request (0 when none was).
    pub fn mean_cost(&self) -> f64 {
        if self.admitted.is_empty() { 0.0 } else { self.admitted_cost() as f64 / self.admitted.len() as f64 }
    }

    /// The worst window's overshoot in mean requests of this run.
    pub fn overshoot_requests(&self) -> f64 {
        let mean = self.mean_cost();
        if mean > 0.0 { self.worst.overshoot() as f64 / mean } else { 0.0 }
    }
}

/// What every run of one scenario shares.
pub(crate) struct Ctx<'a> {
    pub(crate) quota: Quota,
    pub(crate) segments: u64,
    pub(crate) clients: &'a Clients,
    pub(crate) seed: u64,
    pub(crate) end: u64,
}

/// Runs the clients through `kind`, each way.
pub(crate) fn run(kind: AlgorithmKind, ctx: &Ctx<'_>) -> Result<Vec<CostRun>, SimError> {
    Way::BOTH.iter().map(|&way| run_one(kind, way, ctx)).collect()
}

fn run_one(kind: AlgorithmKind, way: Way, ctx: &Ctx<'_>) -> Result<CostRun, SimError> {
    let q = ctx.quota;
    match kind {
        AlgorithmKind::TokenBucket => drive(TokenBucket::new(q), kind, way, ctx),
        AlgorithmKind::IntervalBucket => drive(IntervalBucket::new(q), kind, way, ctx),
        AlgorithmKind::FixedWindow => drive(FixedWindow::new(q), kind, way, ctx),
        AlgorithmKind::SlidingWindow => {
            let window = SlidingWindow::new(q, ctx.segments)
                .map_err(|e| SimError::invalid("--segments", &ctx.segments.to_string(), e.to_string()))?;
            drive(window, kind, way, ctx)
        }
        AlgorithmKind::WeightedWindow => drive(WeightedWindow::new(q), kind, way, ctx),
        AlgorithmKind::SlidingLog => drive(SlidingLog::new(q), kind, way, ctx),
    }
}

/// What a client is doing.
enum Client {
    /// Between requests: the next event draws a new one.
    Idle,
    /// Refused: the next event asks for this one again.
    Refused(Request),
    /// Admitted: the next event settles it.
    Working(Reservation, Request),
}

/// The event loop: each client's next event, earliest first (ties: the lower client first).
fn drive<A: Algorithm>(algo: A, kind: AlgorithmKind, way: Way, ctx: &Ctx<'_>) -> Result<CostRun, SimError> {
    let clock = ManualClock::new();
    let limiter = Limiter::builder(algo).clock(clock.clone()).build();
    let period = nanos(ctx.quota.period());
    let cannot = |e: &dyn fmt::Display| {
        SimError::invalid("--algorithms", kind.name(), format!("cannot reserve and settle: {e}"))
    };
    let mut streams = ctx.clients.streams(ctx.seed, limiter.capacity(), ctx.quota.period());
    let mut clients: Vec<Client> = streams.iter().map(|_| Client::Idle).collect();
    let mut events: BinaryHeap<Reverse<(u64, usize)>> =
        streams.iter_mut().enumerate().map(|(c, requests)| Reverse((requests.pause(), c))).collect();
    let mut admitted = Vec::new();
    let (mut asks, mut refused) = (0usize, 0u64);
    // The fixed window a check admitted into when no window was open yet (see `window_end`).
    let mut pending_window = 0;
    while let Some(Reverse((at, c))) = events.pop() {
        if at >= ctx.end {
            break;
        }
        if at > clock.now() {
            clock.set(at);
        }
        let request = match std::mem::replace(&mut clients[c], Client::Idle) {
            Client::Working(reservation, request) => {
                match reservation.settle(&limiter, &(), request.actual).now() {
                    Ok(Ok(())) => {}
                    Ok(Err(failed)) => return Err(cannot(&failed)),
                    Err(_) => return Err(cannot(&"the settle did not answer at once")),
                }
                events.push(Reverse((at.saturating_add(request.pause), c)));
                continue;
            }
            Client::Refused(request) => request,
            Client::Idle => streams[c].next(),
        };
        asks += 1;
        if asks > MAX_REQUESTS {
            return Err(SimError::TooManyRequests {
                traffic: ctx.clients.label(),
                duration: Span(std::time::Duration::from_nanos(ctx.end)).to_string(),
                max: MAX_REQUESTS,
            });
        }
        let asked = match way {
            Way::ReserveSettle => match limiter.reserve(&(), request.estimate).now() {
                Ok(asked) => asked,
                Err(_) => return Err(cannot(&"the reserve did not answer at once")),
            },
            Way::CheckThenCharge => limiter.check(1).map(|meta| Reservation::new(Lease::new(meta, 0, at))),
        };
        match asked {
            Ok(reservation) => {
                let window_end = if kind == AlgorithmKind::FixedWindow {
                    let reset = nanos(reservation.lease().reset_after());
                    // No window open (a check takes nothing, so it opens none): this request
                    // counts in the window that opens now, or in the one the last such check
                    // counted in.
                    if reset > 0 {
                        at.saturating_add(reset)
                    } else {
                        if pending_window <= at {
                            pending_window = at.saturating_add(period);
                        }
                        pending_window
                    }
                } else {
                    0
                };
                admitted.push(Charge { at, estimate: request.estimate, actual: request.actual, window_end });
                clients[c] = Client::Working(reservation, request);
                events.push(Reverse((at.saturating_add(request.work), c)));
            }
            Err(no) => {
                refused += 1;
                let retry = no.retry_after().map_or(period, nanos).max(1);
                clients[c] = Client::Refused(request);
                events.push(Reverse((at.saturating_add(retry), c)));
            }
        }
    }
    let allowance = Allowance::of(kind, &ctx.quota, ctx.segments);
    let (worst, past_bound) = cost_windows(&admitted, &allowance);
    let cost: u64 = admitted.iter().map(|c| c.actual).sum();
    let allowed_over_run = ctx.quota.limit() as f64 * ctx.end as f64 / period as f64;
    Ok(CostRun {
        algorithm: kind,
        way,
        admitted,
        refused,
        allowance,
        worst,
        past_bound,
        utilization: cost as f64 / allowed_over_run,
    })
}

/// Over every window `allowance` bounds: the window with the largest `cost − allowed`, and the
/// largest `cost − allowed − excess` (0 when none is above 0: the bound held). `charges` are in
/// time order. Linear in the number of charges (the sliding windows slide two ends forward; the
/// refill windows keep the best start so far).
pub fn cost_windows(charges: &[Charge], allowance: &Allowance) -> (CostWindow, u64) {
    // Prefix sums of the cost and of the excess: a window's are differences of two.
    let mut cost = Vec::with_capacity(charges.len() + 1);
    let mut excess = Vec::with_capacity(charges.len() + 1);
    let (mut c, mut e) = (0i128, 0i128);
    cost.push(0);
    excess.push(0);
    for charge in charges {
        c += i128::from(charge.actual);
        e += i128::from(charge.excess());
        cost.push(c);
        excess.push(e);
    }
    let window = |from: usize, to: usize, allowed: u64, end_ns: u64| CostWindow {
        start_ns: charges[from].at,
        end_ns,
        requests: (to - from) as u64,
        cost: (cost[to] - cost[from]) as u64,
        allowed,
        excess: (excess[to] - excess[from]) as u64,
    };
    let mut worst: Option<(i128, CostWindow)> = None;
    let mut past = 0i128;
    let mut past_refill = 0i128;
    let mut consider = |from: usize, to: usize, allowed: u64, end_ns: u64| {
        if from >= to {
            return;
        }
        let over = (cost[to] - cost[from]) - i128::from(allowed);
        past = past.max(over - (excess[to] - excess[from]));
        if worst.as_ref().is_none_or(|(w, _)| over > *w) {
            worst = Some((over, window(from, to, allowed, end_ns)));
        }
    };
    match *allowance {
        Allowance::Sliding { limit, period } => {
            let mut to = 0;
            for (from, a) in charges.iter().enumerate() {
                let end = a.at.saturating_add(period);
                while to < charges.len() && charges[to].at < end {
                    to += 1;
                }
                consider(from, to, limit, end);
            }
        }
        Allowance::Opened { limit, .. } => {
            let mut from = 0;
            while from < charges.len() {
                let end = charges[from].window_end;
                let to = from + charges[from..].iter().take_while(|b| b.window_end == end).count();
                consider(from, to, limit, end);
                from = to;
            }
        }
        Allowance::Aligned { limit, period, align } => {
            let align = align.max(1);
            let (mut from, mut to) = (0, 0);
            while from < charges.len() {
                let start = charges[from].at / align * align;
                let end = start.saturating_add(period);
                while to < charges.len() && charges[to].at < end {
                    to += 1;
                }
                consider(from, to, limit, end);
                // The next window starts at the next segment holding an admission.
                let next = start.saturating_add(align);
                while from < charges.len() && charges[from].at < next {
                    from += 1;
                }
            }
        }
        Allowance::Refill { burst, per_tick, tick, period } => {
            // A window from admission i to admission j (less than a period later): cost[j+1] −
            // cost[i] − burst − per_tick·(tick_j − tick_i). For each j, the best i minimises
            // cost[i] − per_tick·tick_i (for the bound, less excess[i]) among the admissions of
            // the last period: two queues of candidates, increasing (a later, smaller key
            // makes the earlier ones useless).
            let tick = tick.max(1);
            let refill = |k: usize| i128::from(per_tick) * i128::from(charges[k].at / tick);
            let key = |k: usize| cost[k] - refill(k);
            let key_bound = |k: usize| cost[k] - excess[k] - refill(k);
            let (mut best, mut best_bound) = (VecDeque::new(), VecDeque::new());
            for j in 0..charges.len() {
                while best.back().is_some_and(|&i| key(i) >= key(j)) {
                    best.pop_back();
                }
                best.push_back(j);
                while best_bound.back().is_some_and(|&i| key_bound(i) >= key_bound(j)) {
                    best_bound.pop_back();
                }
                best_bound.push_back(j);
                let first = charges[j].at.saturating_sub(period.saturating_sub(1));
                for queue in [&mut best, &mut best_bound] {
                    while queue.front().is_some_and(|&i| charges[i].at < first) {
                        queue.pop_front();
                    }
                }
                let (i, b) = (best[0], best_bound[0]);
                let allowed = i128::from(burst) + refill(j) - refill(i);
                consider(i, j + 1, u64::try_from(allowed).unwrap_or(u64::MAX), charges[j].at);
                let reach = cost[j + 1] - excess[j + 1] - refill(j);
                past_refill = past_refill.max(reach - key_bound(b) - i128::from(burst));
            }
        }
    }
    let past = past.max(past_refill);
    let worst = worst.map(|(_, w)| w).unwrap_or_default();
    (worst, u64::try_from(past.max(0)).unwrap_or(u64::MAX))
}

/// For each sample time `s` (ascending), the cost admitted in the trailing window `(s − len, s]`.
pub fn trailing_cost(charges: &[Charge], len: u64, samples: &[u64]) -> Vec<u64> {
    let (mut lo, mut hi, mut sum) = (0, 0, 0u64);
    samples
        .iter()
        .map(|&s| {
            while hi < charges.len() && charges[hi].at <= s {
                sum += charges[hi].actual;
                hi += 1;
            }
            while lo < hi && charges[lo].at.saturating_add(len) <= s {
                sum -= charges[lo].actual;
                lo += 1;
            }
            sum
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(at: u64, estimate: u64, actual: u64) -> Charge {
        Charge { at, estimate, actual, window_end: 0 }
    }

    /// Every window of every kind, by brute force.
    fn brute(charges: &[Charge], allowance: &Allowance) -> (i128, i128) {
        let mut worst = (i128::MIN, i128::MIN);
        let mut within = |set: &[&Charge], allowed: u64| {
            if set.is_empty() {
                return;
            }
            let cost: i128 = set.iter().map(|c| i128::from(c.actual)).sum();
            let excess: i128 = set.iter().map(|c| i128::from(c.excess())).sum();
            worst.0 = worst.0.max(cost - i128::from(allowed));
            worst.1 = worst.1.max(cost - i128::from(allowed) - excess);
        };
        let last = charges.last().map_or(0, |c| c.at);
        match *allowance {
            Allowance::Sliding { limit, period } => {
                for s in 0..=last {
                    within(&charges.iter().filter(|c| c.at >= s && c.at < s + period).collect::<Vec<_>>(), limit);
                }
            }
            Allowance::Aligned { limit, period, align } => {
                for s in (0..=last).step_by(align as usize) {
                    within(&charges.iter().filter(|c| c.at >= s && c.at < s + period).collect::<Vec<_>>(), limit);
                }
            }
            Allowance::Refill { burst, per_tick, tick, period } => {
                for i in 0..charges.len() {
                    for j in (i..charges.len()).filter(|&j| charges[j].at - charges[i].at < period) {
                        let allowed = burst + per_tick * (charges[j].at / tick - charges[i].at / tick);
                        within(&charges[i..=j].iter().collect::<Vec<_>>(), allowed);
                    }
                }
            }
            Allowance::Opened { .. } => unreachable!(),
        }
        worst
    }

    #[test]
    fn windows_match_brute_force() {
        let mut seed = 3u64;
        let mut next = |m: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        for round in 0..300 {
            let mut at = 0;
            let charges: Vec<Charge> = (0..round % 23)
                .map(|_| {
                    at += next(4);
                    charge(at, 1 + next(9), 1 + next(12))
                })
                .collect();
            for allowance in [
                Allowance::Sliding { limit: 15, period: 10 },
                Allowance::Aligned { limit: 15, period: 10, align: 5 },
                Allowance::Aligned { limit: 12, period: 7, align: 7 },
                Allowance::Refill { burst: 10, per_tick: 1, tick: 1, period: 8 },
                Allowance::Refill { burst: 20, per_tick: 6, tick: 5, period: 10 },
                Allowance::Refill { burst: 20, per_tick: 6, tick: 5, period: 1000 },
            ] {
                let (worst, past) = cost_windows(&charges, &allowance);
                let (over, beyond) = brute(&charges, &allowance);
                if charges.is_empty() {
                    assert_eq!((worst, past), (CostWindow::default(), 0));
                    continue;
                }
                let got = i128::from(worst.cost) - i128::from(worst.allowed);
                assert_eq!(got, over, "{allowance:?} {charges:?}");
                assert_eq!(i128::from(past), beyond.max(0), "{allowance:?} {charges:?}");
                let inside: Vec<&Charge> =
                    charges.iter().filter(|c| c.at >= worst.start_ns && c.at <= worst.end_ns).collect();
                assert!(inside.len() as u64 >= worst.requests);
            }
        }
    }

    #[test]
    fn opened_windows_group_by_their_end() {
        let c = |at, actual, window_end| Charge { at, estimate: 5, actual, window_end };
        let charges = [c(0, 6, 10), c(3, 6, 10), c(10, 4, 20), c(12, 9, 22), c(15, 4, 22)];
        let (worst, past) = cost_windows(&charges, &Allowance::Opened { limit: 10, period: 10 });
        assert_eq!(worst, CostWindow { start_ns: 12, end_ns: 22, requests: 2, cost: 13, allowed: 10, excess: 4 });
        assert_eq!(past, 0);
    }

    #[test]
    fn trailing_cost_sums_the_window() {
        let charges = [charge(0, 1, 2), charge(5, 1, 3), charge(10, 1, 4)];
        assert_eq!(trailing_cost(&charges, 10, &[0, 5, 9, 10, 19, 20]), [2, 5, 5, 7, 4, 0]);
    }

    #[test]
    fn allowances_follow_the_quota() {
        let q = Quota::per_second(100).unwrap().with_burst(20).unwrap();
        let s = 1_000_000_000;
        assert_eq!(
            Allowance::of(AlgorithmKind::TokenBucket, &q, 10),
            Allowance::Refill { burst: 20, per_tick: 1, tick: s / 100, period: s }
        );
        assert_eq!(
            Allowance::of(AlgorithmKind::IntervalBucket, &q, 10),
            Allowance::Refill { burst: 20, per_tick: 20, tick: s / 5, period: s }
        );
        assert_eq!(
            Allowance::of(AlgorithmKind::SlidingWindow, &Quota::per_second(100).unwrap(), 3),
            Allowance::Aligned { limit: 100, period: 1_000_000_002, align: 333_333_334 }
        );
        assert_eq!(Allowance::of(AlgorithmKind::FixedWindow, &q, 10).to_string(), "100 in each 1s window it opened");
        assert_eq!(Allowance::of(AlgorithmKind::TokenBucket, &q, 10).to_string(), "20 + 1 per 10ms crossed, in any 1s");
    }
}
