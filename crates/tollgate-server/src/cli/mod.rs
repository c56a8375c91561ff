//! The command line: one clap subcommand per module. Each subcommand parses its own arguments,
//! reports its own errors on stderr and chooses its exit code (0 ok, 1 failed, 2 bad input).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Run one request-arrival sequence through each algorithm on a manual clock: a table of what
    /// each admitted, and a plot.
    Simulate(simulate::SimulateArgs),
}

pub(crate) fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Simulate(args) => simulate::main(args),
    }
}
