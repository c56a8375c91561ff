//! `tollgate check-config PATH`: validate a limits file (or envoy/ratelimit's configuration) and
//! print its limits; exit 2 with `file:line:column: message` when it is wrong.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use tollgate_policy::Enforcement;

use super::LimitsFormat;

/// Arguments of `tollgate check-config`.
#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// The limits file, or with `--format envoy` a directory of envoy/ratelimit's YAML files.
    file: PathBuf,

    /// The format: `limitador` (a limits file) or `envoy` (envoy/ratelimit's configuration).
    #[arg(long, value_enum, default_value = "limitador")]
    format: LimitsFormat,

    #[arg(long, help = super::MERGE_DOMAINS)]
    merge_domains: bool,
}

pub(crate) fn main(args: CheckArgs) -> ExitCode {
    let policy =
        match args.format.read_as(args.merge_domains).and_then(|f| f.load(&args.file).map_err(|e| e.to_string())) {
            Ok(policy) => policy,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        };
    println!("{}: {} limits, valid", args.file.display(), policy.len());
    let one_file = policy.rules().windows(2).all(|w| w[0].source_name() == w[1].source_name());
    for limit in policy.rules() {
        let name = limit.name().map(|n| format!(" \"{n}\"")).unwrap_or_default();
        let place = match one_file {
            true => format!("line {}", limit.position().line),
            false => format!("{}:{}", limit.source_name(), limit.position().line),
        };
        let window = match limit.calendar() {
            Some(calendar) => format!("calendar {} in {}", calendar.unit().name(), calendar.zone()),
            None => format!("{}s", limit.seconds()),
        };
        let rate = match limit.unlimited() {
            true => "unlimited (counts nothing)".to_string(),
            false => format!("{} per {window} ({})", limit.max_value(), limit.algorithm().name()),
        };
        println!("  {place}: {}{name}: {rate}, id {}", limit.namespace(), limit.id());
        if let Some(keys) = limit.descriptor_keys() {
            println!("      each descriptor with keys [{}]", keys.join(", "));
        }
        for condition in limit.conditions() {
            println!("      when {}", condition.source());
        }
        for variable in limit.variables() {
            println!("      per {}", variable.source());
        }
        if !limit.replaces().is_empty() {
            println!("      replaces {}", limit.replaces().join(", "));
        }
        match limit.enforcement() {
            Enforcement::Enforce => {}
            Enforcement::Shadow if limit.counts_past() => {
                println!("      shadow: counts every hit, allowed or not (memory, redis), and reports; never denies")
            }
            Enforcement::Shadow => println!("      shadow: counts and reports, never denies"),
            Enforcement::Quota => println!("      mode quota: allows, and marks the answer when over"),
            Enforcement::Pooled => println!("      mode pooled: denies when every pooled limit of the request is over"),
        }
        if let Some(metadata) = limit.metadata() {
            println!("      metadata {}", serde_json::to_string(metadata).expect("a JSON map serialises"));
        }
        if limit.has_stats_key() {
            println!("      statistics per value (detailed_metric, value_to_metric)");
        }
    }
    ExitCode::SUCCESS
}
