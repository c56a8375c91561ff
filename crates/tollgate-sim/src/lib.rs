//! # tollgate-sim: how each rate-limiting algorithm treats a traffic pattern
//!
//! Run one request-arrival sequence through each of the core crate's algorithms on a manual clock
//! (a simulated minute takes milliseconds) and compare what they admit, as a table and as a plot.
//! This is the library behind `tollgate simulate`.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_sim::{AlgorithmKind, Scenario, Traffic, simulate};
//!
//! let quota: tollgate::Quota = "100/s".parse()?;
//! let mut scenario = Scenario::new(quota, Traffic::parse("boundary", &quota)?);
//! scenario.duration = Duration::from_secs(10);
//! let sim = simulate(&scenario)?;
//!
//! let fixed = sim.run(AlgorithmKind::FixedWindow).unwrap();
//! assert!(fixed.worst.count > 190);                 // nearly 2x the limit across a boundary
//! let log = sim.run(AlgorithmKind::SlidingLog).unwrap();
//! assert!(log.worst.count <= 100);                  // never more than the limit
//! println!("{}", sim.report());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Data flows one way: user input is parsed ([`tollgate::Quota::parse`], [`Traffic::parse`],
//! [`parse_algorithms`]) into a [`Scenario`]; [`simulate`] turns its traffic into
//! arrival times (seeded, so the same seed gives the same run) and runs them through a
//! [`tollgate::Limiter`] per algorithm, each on its own [`tollgate::ManualClock`]; the resulting
//! [`Simulation`] prints as a table ([`Simulation::report`]) and draws as a plot ([`plot`]).
//!
//! Costs known only after the work (LLM tokens, bytes sent) are [`Traffic::Clients`]: clients
//! that each hold one request at a time, with heavy-tailed costs and estimates off by up to a
//! given fraction. Each algorithm runs them twice, reserving an estimate and settling the actual
//! cost ([`tollgate::Reservation`]), and checking first then charging the cost after the work
//! (Envoy's way); each [`CostRun`] holds what was admitted, the worst window's cost against what
//! the algorithm allows there, and whether the reservations' bound held:
//!
//! ```
//! use std::time::Duration;
//! use tollgate_sim::{AlgorithmKind, Clients, Scenario, Traffic, Way, simulate};
//!
//! let quota: tollgate::Quota = "1000/s".parse()?;
//! let clients = Clients::parse("lognormal:20,1", 32, "0.5")?;
//! let mut scenario = Scenario::new(quota, Traffic::Clients(clients));
//! scenario.algorithms = vec![AlgorithmKind::SlidingLog];
//! scenario.duration = Duration::from_secs(10);
//! let sim = simulate(&scenario)?;
//!
//! let ours = sim.cost_run(AlgorithmKind::SlidingLog, Way::ReserveSettle).unwrap();
//! assert_eq!(ours.past_bound, 0);                          // within the bound in every window
//! let peers = sim.cost_run(AlgorithmKind::SlidingLog, Way::CheckThenCharge).unwrap();
//! assert!(peers.worst.overshoot() > ours.worst.overshoot());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Errors ([`SimError`]) name the value at fault by the `tollgate simulate` option it comes from
//! (e.g. `--segments`), since that is where a user typed it.
#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub, missing_debug_implementations)]
#![forbid(unsafe_code)]

mod algorithm;
mod clients;
mod error;
pub mod plot;
mod report;
mod run;
mod settle;
mod traffic;
mod units;
mod window;

use std::time::Duration;

use tollgate::Quota;

pub use algorithm::{AlgorithmKind, parse_algorithms};
pub use clients::{Clients, CostDistribution, DEFAULT_CONCURRENCY, DEFAULT_ESTIMATE_ERROR, MAX_CLIENTS, MAX_SIGMA};
pub use error::SimError;
pub use report::Report;
pub use run::{AlgorithmRun, Memory, Mode, Waits};
pub use settle::{Allowance, Charge, CostRun, CostWindow, Way, cost_windows, trailing_cost};
pub use traffic::{MAX_REQUESTS, Traffic, parse_replay, read_replay};
pub use units::{Rate, Span};
pub use window::{Worst, bucket_counts, trailing_counts, worst_window};

/// Segments of a sliding window unless told otherwise.
pub const DEFAULT_SEGMENTS: u64 = 10;
/// Simulated time unless told otherwise.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(60);
/// Seed of the random patterns unless told otherwise.
pub const DEFAULT_SEED: u64 = 1;
/// Most segments a simulated sliding window may have (800 KB of counters per key).
pub const MAX_SEGMENTS: u64 = 100_000;

/// What to simulate.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// The quota every algorithm enforces (the burst only matters to the token buckets).
    pub quota: Quota,
    /// When requests arrive.
    pub traffic: Traffic,
    /// Simulated time; arrivals at or after it are not offered.
    pub duration: Duration,
    /// The algorithms to compare, in report order.
    pub algorithms: Vec<AlgorithmKind>,
    /// Segments of [`AlgorithmKind::SlidingWindow`].
    pub segments: u64,
    /// Seed of the random patterns.
    pub seed: u64,
    /// `try_acquire` or queued `acquire`.
    pub mode: Mode,
}

impl Scenario {
    /// Every algorithm, [`DEFAULT_DURATION`], [`DEFAULT_SEGMENTS`], [`DEFAULT_SEED`],
    /// [`Mode::Try`].
    pub fn new(quota: Quota, traffic: Traffic) -> Scenario {
        Scenario {
            quota,
            traffic,
            duration: DEFAULT_DURATION,
            algorithms: AlgorithmKind::ALL.to_vec(),
            segments: DEFAULT_SEGMENTS,
            seed: DEFAULT_SEED,
            mode: Mode::Try,
        }
    }
}

/// The outcome: what was offered, and what each algorithm admitted.
#[derive(Clone, Debug, PartialEq)]
pub struct Simulation {
    /// What was simulated.
    pub scenario: Scenario,
    /// Arrival times in nanoseconds, ascending (none for [`Traffic::Clients`]).
    pub offered: Vec<u64>,
    /// One run per algorithm, in the scenario's order (none for [`Traffic::Clients`]).
    pub runs: Vec<AlgorithmRun>,
    /// For [`Traffic::Clients`]: two runs per algorithm, in the scenario's order, each in
    /// [`Way::BOTH`]'s order (none for the other patterns).
    pub cost_runs: Vec<CostRun>,
}

impl Simulation {
    /// The run of `kind`, if it was simulated.
    pub fn run(&self, kind: AlgorithmKind) -> Option<&AlgorithmRun> {
        self.runs.iter().find(|r| r.algorithm == kind)
    }

    /// The run of `kind` asked `way`, if it was simulated ([`Traffic::Clients`]).
    pub fn cost_run(&self, kind: AlgorithmKind, way: Way) -> Option<&CostRun> {
        self.cost_runs.iter().find(|r| r.algorithm == kind && r.way == way)
    }

    /// The table printed by `tollgate simulate` (see [`Report`]).
    pub fn report(&self) -> Report<'_> {
        Report::new(self)
    }
}

/// Runs `scenario`: builds its arrivals, then runs them through each algorithm.
pub fn simulate(scenario: &Scenario) -> Result<Simulation, SimError> {
    let end = units::nanos(scenario.duration);
    if end == 0 {
        return Err(SimError::invalid("--duration", &Span(scenario.duration).to_string(), "must be longer than zero"));
    }
    if scenario.algorithms.is_empty() {
        return Err(SimError::invalid("--algorithms", "", "name at least one algorithm, or `all`"));
    }
    if scenario.algorithms.contains(&AlgorithmKind::SlidingWindow) && scenario.segments > MAX_SEGMENTS {
        return Err(SimError::invalid(
            "--segments",
            &scenario.segments.to_string(),
            format!("at most {MAX_SEGMENTS} segments (8 bytes each, per key)"),
        ));
    }
    if let Traffic::Clients(clients) = &scenario.traffic {
        return simulate_clients(scenario, clients, end);
    }
    let offered = scenario.traffic.arrivals(scenario.duration, scenario.seed)?;
    let runs = scenario
        .algorithms
        .iter()
        .map(|&kind| run::run(kind, scenario.quota, scenario.segments, scenario.mode, &offered, end))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Simulation { scenario: scenario.clone(), offered, runs, cost_runs: Vec::new() })
}

/// [`Traffic::Clients`]: each algorithm, each [`Way`].
fn simulate_clients(scenario: &Scenario, clients: &Clients, end: u64) -> Result<Simulation, SimError> {
    if let Mode::Acquire { .. } = scenario.mode {
        return Err(SimError::invalid("--acquire", "", "the clients of --costs reserve or check; they do not queue"));
    }
    // The burst is the token buckets' capacity, the limit the windows'.
    let q = &scenario.quota;
    let capacity = |kind| match kind {
        AlgorithmKind::TokenBucket | AlgorithmKind::IntervalBucket => q.burst(),
        _ => q.limit(),
    };
    let capacity = scenario.algorithms.iter().map(|&k| capacity(k)).min().unwrap_or(q.limit());
    let median = clients.costs.median();
    if median > capacity as f64 {
        return Err(SimError::invalid(
            "--costs",
            &clients.costs.spec(),
            format!("the median cost {median} is more than the capacity {capacity} (the quota's limit, or --burst)"),
        ));
    }
    let ctx = settle::Ctx { quota: scenario.quota, segments: scenario.segments, clients, seed: scenario.seed, end };
    let mut cost_runs = Vec::with_capacity(2 * scenario.algorithms.len());
    for &kind in &scenario.algorithms {
        cost_runs.extend(settle::run(kind, &ctx)?);
    }
    Ok(Simulation { scenario: scenario.clone(), offered: Vec::new(), runs: Vec::new(), cost_runs })
}
