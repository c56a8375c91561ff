//! `tollgate simulate`: parse the arguments, validate them into a [`Scenario`], run it, print the
//! table on stdout and write the plot.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tollgate::{Quota, parse_duration};
use tollgate_sim::{Clients, DEFAULT_DURATION, Mode, Scenario, SimError, Traffic, parse_algorithms, plot, simulate};

/// Arguments of `tollgate simulate`.
#[derive(Debug, Args)]
#[command(after_long_help = AFTER_HELP)]
pub(crate) struct SimulateArgs {
    /// The quota every algorithm enforces: LIMIT/PERIOD, e.g. 100/s, 10/100ms, 600/m, 60/1m30s.
    #[arg(long, value_name = "LIMIT/PERIOD", value_parser = Quota::parse)]
    quota: Quota,

    /// Most permits a token bucket holds at once (token_bucket, interval_bucket) [default: the limit].
    #[arg(long)]
    burst: Option<u64>,

    // The help is an attribute, not a doc comment: its brackets are not links.
    #[arg(
        long,
        value_name = "PATTERN",
        required_unless_present = "costs",
        conflicts_with = "costs",
        help = "When requests arrive: steady[:RATE], bursts[:N/EVERY], boundary[:N[,SPREAD]], poisson[:RATE], \
                ramp[:FROM..TO], replay:FILE (see --help for each); or --costs"
    )]
    traffic: Option<String>,

    /// Instead of --traffic: clients whose requests cost DIST (lognormal:MEDIAN,SIGMA), known only
    /// after the work; each algorithm runs them reserving and settling, and checking then charging.
    #[arg(long, value_name = "DIST", conflicts_with = "acquire")]
    costs: Option<String>,

    /// With --costs: clients asking at once, each holding one request at a time [default: 32].
    #[arg(long, value_name = "N", requires = "costs", conflicts_with = "traffic")]
    concurrency: Option<u64>,

    /// With --costs: estimates are within this fraction of the actual cost, either way (0.5 or
    /// 50%) [default: 0.5].
    #[arg(long, value_name = "FRACTION", requires = "costs", conflicts_with = "traffic")]
    estimate_error: Option<String>,

    /// `all`, or a comma-separated list of token_bucket, interval_bucket, fixed_window,
    /// sliding_window, weighted_window, sliding_log.
    #[arg(long, default_value = "all")]
    algorithms: String,

    /// Simulated time, e.g. 60s, 10m [default: 60s; for replay, up to the last timestamp plus one
    /// period].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    duration: Option<Duration>,

    /// Segments of the sliding window.
    #[arg(long, default_value_t = tollgate_sim::DEFAULT_SEGMENTS)]
    segments: u64,

    /// Seed of the random patterns (poisson, --costs): the same seed gives the same output.
    #[arg(long, default_value_t = tollgate_sim::DEFAULT_SEED)]
    seed: u64,

    /// Requests wait in the limiter's FIFO queue (acquire) instead of being rejected (try_acquire).
    #[arg(long)]
    acquire: bool,

    /// With --acquire: reject a request at once when its wait would be longer than this.
    #[arg(long, requires = "acquire", value_name = "DURATION", value_parser = parse_duration)]
    max_wait: Option<Duration>,

    /// Width of the plot's time buckets [default: a tenth of the quota's period, at most 1000 buckets].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    bucket: Option<Duration>,

    /// Write the plot here: .svg or .png.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

const AFTER_HELP: &str = "\
Traffic patterns (L = the quota's limit, P = its period; parameters left out take the default):
  steady[:RATE]           evenly spaced arrivals, e.g. steady:150/s            [2L/P]
  bursts[:N/EVERY]        N requests at once, every EVERY, e.g. bursts:50/2s   [2L/2P]
  boundary[:N[,SPREAD]]   every 2 periods: 1 request at the start (it opens a fixed window there),
                          N over the last SPREAD of the window, N over the first SPREAD of the next,
                          e.g. boundary:100,50ms                               [L, P/20]
  poisson[:RATE]          random (exponential) gaps at RATE on average, from --seed   [2L/P]
  ramp[:FROM..TO]         rate rising linearly from FROM to TO, e.g. ramp:0/s..300/s  [0..3L/P]
  replay:FILE             one arrival per line: seconds from the start (1.25) or RFC 3339
                          (2024-05-01T12:00:00.250Z); blank lines and # comments are skipped

Costs known only after the work (--costs DIST instead of --traffic):
  lognormal:MEDIAN,SIGMA  heavy-tailed costs, e.g. lognormal:20,1 (mean 33); clamped to the
                          capacity (the limit, or the token buckets' burst)
  --concurrency clients each hold one request at a time: ask, once admitted work up to P/2,
  settle, pause up to P/20; a refused client asks again at its retry-after. Estimates are within
  --estimate-error of the cost. Each algorithm runs them twice: reserve(estimate) then
  settle(actual), and check(1) then the actual cost charged after the work (Envoy's
  hits_addend: 0). The table gives each way's cost admitted, utilization, the worst window's cost
  against what the algorithm allows there, its overshoot, the reservations' bound for it, and how
  far any window went past that bound.

The table: admitted, rejected, worst window / limit (the most admissions in any window of one
period, sliding over every admission), max retry-after (or, with --acquire, the longest wait from
arrival to grant), and memory per key (size of the algorithm's state plus its heap).

Examples:
  tollgate simulate --quota 100/s --burst 20 --traffic boundary --duration 10s --out sim.svg
  tollgate simulate --quota 1000/s --costs lognormal:20,1 --concurrency 32 --estimate-error 0.5";

pub(crate) fn main(args: SimulateArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(if e.is_usage() { 2 } else { 1 })
        }
    }
}

/// The arguments, checked: what to simulate and where to draw it.
struct Validated {
    scenario: Scenario,
    out: Option<PathBuf>,
    bucket: Option<Duration>,
}

fn run(args: SimulateArgs) -> Result<(), SimError> {
    let Validated { scenario, out, bucket } = validate(args)?;
    let sim = simulate(&scenario)?;
    println!("{}", sim.report());
    if let Some(path) = out {
        plot::write(&sim, &path, bucket)?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(())
}

/// Everything the user typed, checked and turned into a scenario before anything runs.
fn validate(args: SimulateArgs) -> Result<Validated, SimError> {
    let quota = match args.burst {
        None => args.quota,
        Some(b) => args.quota.with_burst(b).map_err(|e| SimError::Invalid {
            what: "--burst",
            value: b.to_string(),
            reason: e.to_string(),
        })?,
    };
    if let Some(out) = &args.out {
        plot::Format::from_path(out)?;
    }
    let traffic = match (&args.costs, &args.traffic) {
        (Some(costs), _) => Traffic::Clients(Clients::parse(
            costs,
            args.concurrency.unwrap_or(tollgate_sim::DEFAULT_CONCURRENCY),
            &args.estimate_error.unwrap_or_else(|| tollgate_sim::DEFAULT_ESTIMATE_ERROR.to_string()),
        )?),
        (None, Some(traffic)) => Traffic::parse(traffic, &quota)?,
        // clap requires one of them.
        (None, None) => {
            return Err(SimError::Invalid {
                what: "--traffic",
                value: String::new(),
                reason: "name a pattern, or --costs".into(),
            });
        }
    };
    let duration = match (args.duration, &traffic) {
        (Some(d), _) => d,
        // A replay runs to its last timestamp plus one period, so its last window is complete.
        (None, Traffic::Replay { times, .. }) => {
            Duration::from_nanos(times.last().copied().unwrap_or(0)).saturating_add(quota.period())
        }
        (None, _) => DEFAULT_DURATION,
    };
    let mode = if args.acquire { Mode::Acquire { max_wait: args.max_wait } } else { Mode::Try };
    let bucket = args.bucket;
    if let Some(b) = bucket {
        plot::check_bucket(duration, b)?;
    }
    let scenario = Scenario {
        algorithms: parse_algorithms(&args.algorithms)?,
        duration,
        segments: args.segments,
        seed: args.seed,
        mode,
        ..Scenario::new(quota, traffic)
    };
    Ok(Validated { scenario, out: args.out, bucket })
}
