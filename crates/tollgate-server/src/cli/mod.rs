//! The command line: one clap subcommand per module. Each subcommand parses its own arguments,
//! reports its own errors on stderr and chooses its exit code (0 ok, 1 failed, 2 bad input).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod check;
mod convert;
#[cfg(feature = "otlp")]
mod otlp;
mod pump;
mod serve;
mod simulate;

/// Rate limiting for Rust services and batch jobs.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the limits of a file: Envoy's rate limit service (gRPC), an HTTP API compatible with
    /// Limitador's, Prometheus metrics; reloads the file when it changes.
    Serve(serve::ServeArgs),
    /// Validate a limits file and print its limits; exits 2 with file:line:column on an error.
    CheckConfig(check::CheckArgs),
    /// Print the limits of envoy/ratelimit's configuration as a limits file in Limitador's format
    /// (what `serve --format envoy` serves); exits 2 with file:line:column on an error.
    Convert(convert::ConvertArgs),
    /// Run one request-arrival sequence through each algorithm on a manual clock: a table of what
    /// each admitted, and a plot.
    Simulate(simulate::SimulateArgs),
    /// Load a server over gRPC (Envoy RLS) or HTTP, closed loop or at a fixed rate: requests per
    /// second, latency percentiles, allowed/limited/errors.
    Bench(bench::BenchArgs),
    /// The durable work pump: enqueue JSON Lines work items, and run workers that send them to a
    /// throttled HTTP API under a paced budget shared through Redis partitions.
    Pump(pump::PumpArgs),
}

pub(crate) fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve(args) => serve::main(args),
        Command::CheckConfig(args) => check::main(args),
        Command::Convert(args) => convert::main(args),
        Command::Simulate(args) => simulate::main(args),
        Command::Bench(args) => bench::main(args),
        Command::Pump(args) => pump::main(args),
    }
}

/// The format of a limits path (`--format`, `--from`).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LimitsFormat {
    /// Limitador's limits file, with Tollgate's optional fields.
    Limitador,
    /// envoy/ratelimit's configuration: a directory of YAML files (or one file), each a `domain`
    /// and its `descriptors`.
    Envoy,
}

impl LimitsFormat {
    /// The format to read, with `--merge-domains` (envoy/ratelimit's `MERGE_DOMAIN_CONFIG`) or
    /// not; an error for `--merge-domains` with Limitador's format, which has no domains.
    fn read_as(self, merge_domains: bool) -> Result<tollgate_policy::Format, String> {
        match (self, merge_domains) {
            (LimitsFormat::Limitador, false) => Ok(tollgate_policy::Format::Limitador),
            (LimitsFormat::Limitador, true) => {
                Err("--merge-domains is for --format envoy (a Limitador file has no domains)".to_string())
            }
            (LimitsFormat::Envoy, false) => Ok(tollgate_policy::Format::Envoy),
            (LimitsFormat::Envoy, true) => Ok(tollgate_policy::Format::EnvoyMergingDomains),
        }
    }
}

/// The help of `--merge-domains`, on every command that reads envoy/ratelimit's files.
const MERGE_DOMAINS: &str = "With --format envoy: files with the same `domain` add their descriptors to it \
                             (envoy/ratelimit's MERGE_DOMAIN_CONFIG); without it, a domain in two files is an error";
