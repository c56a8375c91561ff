//! Every subcommand reads quotas and durations with the core's one parser: a bad value is refused
//! before anything starts, with exit code 2, naming the flag, the value and the syntax expected.

use std::process::{Command, Output};

fn tollgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate")).args(args).output().expect("the tollgate binary runs")
}

#[test]
fn a_bad_quota_or_duration_names_the_flag_on_every_subcommand() {
    let simulate = ["simulate", "--traffic", "steady"];
    let pump_run = ["pump", "run", "--url", "http://127.0.0.1:1"];
    let cases: [(&[&str], &[&str], &str, &str); 10] = [
        (
            &["serve", "--limits", "l.yaml"],
            &["--flush-every", "0s"],
            "'--flush-every <DURATION>'",
            "invalid duration \"0s\": \"0s\" is zero",
        ),
        (&["bench"], &["--duration", "soon"], "'--duration <DURATION>'", "invalid duration \"soon\""),
        (&["bench"], &["--warmup", "1 parsec"], "'--warmup <DURATION>'", "invalid duration \"1 parsec\""),
        (&pump_run, &["--rate", "5/"], "'--rate <UNITS/PERIOD>'", "invalid rate \"5/\": no period after '/'"),
        (&pump_run, &["--rate", "0/s"], "'--rate <UNITS/PERIOD>'", "budget units must be at least 1, got 0"),
        (
            &pump_run,
            &["--rate", "10/s", "--granularity", "abc"],
            "'--granularity <DURATION>'",
            "invalid duration \"abc\"",
        ),
        (&pump_run, &["--rate", "10/s", "--idle", "0"], "'--idle <DURATION>'", "invalid duration \"0\""),
        (&simulate, &["--quota", "10/0s"], "'--quota <LIMIT/PERIOD>'", "invalid quota \"10/0s\": \"0s\" is zero"),
        (&simulate, &["--quota", "abc"], "'--quota <LIMIT/PERIOD>'", "(expected COUNT/PERIOD such as 100/s"),
        (
            &simulate,
            &["--quota", "100/s", "--duration=-1s"],
            "'--duration <DURATION>'",
            "(expected a duration such as 250ms",
        ),
    ];
    for (base, extra, flag, message) in cases {
        let mut args = base.to_vec();
        args.extend(extra);
        let out = tollgate(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(&format!("for {flag}: ")), "{args:?} names {flag}: {err}");
        assert!(err.contains(message), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn the_same_spellings_are_accepted_everywhere() {
    // Bare units, compound periods and whitespace, as `tollgate::Quota::parse` takes them.
    for quota in ["100/s", "6000/m", "60/1m30s", "100/1s", " 100 / s "] {
        let out = tollgate(&["simulate", "--quota", quota, "--traffic", "steady", "--duration", "1m30s"]);
        assert!(out.status.success(), "{quota}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn counter_caps_are_checked_before_serving() {
    for (extra, flag) in [
        (["--max-counters", "0"], "'--max-counters <N>'"),
        (["--max-counters", "many"], "'--max-counters <N>'"),
        (["--at-max-counters", "drop"], "'--at-max-counters <AT_MAX_COUNTERS>'"),
        (["--max-counter-bytes", "0"], "'--max-counter-bytes <BYTES>'"),
        (["--max-counter-bytes", "lots"], "'--max-counter-bytes <BYTES>'"),
        (["--max-value-bytes", "0KiB"], "'--max-value-bytes <BYTES>'"),
        (["--max-request-bytes", "1.5.5"], "'--max-request-bytes <BYTES>'"),
        (["--max-entries", "0"], "'--max-entries <N>'"),
        (["--max-descriptors", "x"], "'--max-descriptors <N>'"),
        (["--rlqs-assignment-ttl", "1500ms"], "'--rlqs-assignment-ttl <DURATION>'"),
        (["--rlqs-assignment-ttl", "0s"], "'--rlqs-assignment-ttl <DURATION>'"),
        (["--rlqs-max-buckets", "0"], "'--rlqs-max-buckets <N>'"),
        (["--redis-deadline", "soon"], "'--redis-deadline <DURATION>'"),
    ] {
        let mut args = vec!["serve", "--limits", "l.yaml"];
        args.extend(extra);
        let out = tollgate(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(&format!("for {flag}")), "{args:?} names {flag}: {err}");
    }
    let out = tollgate(&["serve", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--max-counters <N>") && help.contains("[default: reject]"), "{help}");
    for default in ["[default: 1GiB]", "[default: 4KiB]", "[default: 64KiB]", "[default: 64]"] {
        assert!(help.contains(default), "{default} in {help}");
    }
}
