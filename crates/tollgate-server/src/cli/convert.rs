//! `tollgate convert --from envoy PATH`: print the limits of envoy/ratelimit's configuration as
//! one limits file in Limitador's format (with Tollgate's `descriptor_keys`, `window` and
//! `replaces` where a limit needs them), which `serve` and `check-config` read back to the same
//! limits; exit 2 with `file:line:column: message` when the input is wrong or has a feature
//! without an equivalent.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::LimitsFormat;

/// Arguments of `tollgate convert`.
#[derive(Debug, Args)]
pub(crate) struct ConvertArgs {
    /// The format read: `envoy` (envoy/ratelimit's configuration) or `limitador` (a limits file,
    /// printed back normalised).
    #[arg(long, value_enum)]
    from: LimitsFormat,

    /// A directory of envoy/ratelimit's YAML files (or one file), or a limits file.
    path: PathBuf,

    #[arg(long, help = super::MERGE_DOMAINS)]
    merge_domains: bool,
}

pub(crate) fn main(args: ConvertArgs) -> ExitCode {
    let policy = match args.from.read_as(args.merge_domains).and_then(|f| f.load(&args.path).map_err(|e| e.to_string()))
    {
        Ok(policy) => policy,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut out = std::io::stdout().lock();
    match write!(out, "{}", policy.to_yaml()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: cannot write the limits: {e}");
            ExitCode::FAILURE
        }
    }
}
