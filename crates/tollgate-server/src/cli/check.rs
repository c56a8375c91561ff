//! `tollgate check-config FILE`: validate a limits file and print its limits; exit 2 with
//! `file:line:column: message` when it is wrong.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use tollgate_policy::Policy;

/// Arguments of `tollgate check-config`.
#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// The limits file.
    file: PathBuf,
}

pub(crate) fn main(args: CheckArgs) -> ExitCode {
    let policy = match Policy::load(&args.file) {
        Ok(policy) => policy,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    println!("{}: {} limits, valid", args.file.display(), policy.len());
    for limit in policy.limits() {
        let name = limit.name().map(|n| format!(" \"{n}\"")).unwrap_or_default();
        println!(
            "  line {}: {}{name}: {} per {}s ({}), id {}",
            limit.position().line,
            limit.namespace(),
            limit.max_value(),
            limit.seconds(),
            limit.algorithm().name(),
            limit.id()
        );
        for condition in limit.conditions() {
            println!("      when {}", condition.source());
        }
        for variable in limit.variables() {
            println!("      per {}", variable.source());
        }
    }
    ExitCode::SUCCESS
}
