//! `tollgate simulate` end to end through the binary (the library's own tests are in tollgate-sim).

use std::path::PathBuf;
use std::process::{Command, Output};

use tollgate_sim::AlgorithmKind;

fn tollgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate")).args(args).output().expect("the tollgate binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh path under Cargo's scratch directory for integration tests.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("simulate");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

#[test]
fn the_table_shows_the_boundary_attack_numbers() {
    let out = tollgate(&["simulate", "--quota", "100/s", "--traffic", "boundary", "--duration", "10s"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    let row = |name: &str| {
        table.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} row in\n{table}")).to_owned()
    };
    assert!(row("fixed_window").contains("199/100 (1.99x)"), "{table}");
    assert!(row("sliding_log").contains("100/100 (1.00x)"), "{table}");
    assert!(table.contains("offered:  1005 requests"), "{table}");
    for kind in AlgorithmKind::ALL {
        assert!(row(kind.name()).len() > kind.name().len());
    }
}

#[test]
fn same_seed_gives_identical_table_and_plot_bytes() {
    let run = |seed: &str, out: &PathBuf| {
        let o = tollgate(&[
            "simulate",
            "--quota",
            "50/s",
            "--burst",
            "10",
            "--traffic",
            "poisson:80/s",
            "--duration",
            "20s",
            "--seed",
            seed,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        (stdout(&o), std::fs::read(out).unwrap())
    };
    for ext in ["svg", "png"] {
        let a = run("7", &scratch(&format!("seed-a.{ext}")));
        let b = run("7", &scratch(&format!("seed-b.{ext}")));
        assert_eq!(a.0, b.0, "same seed, same table");
        assert!(a.1 == b.1, "same seed, same {ext} bytes");
        let c = run("8", &scratch(&format!("seed-c.{ext}")));
        assert_ne!(a.0, c.0, "another seed, other arrivals");
        assert!(a.1 != c.1, "another seed, another {ext}");
    }
}

#[test]
fn a_bad_pattern_file_is_an_error_naming_its_line() {
    let file = scratch("bad-pattern.txt");
    std::fs::write(&file, "# arrivals, seconds from the start\n0.10\n0.25\n\n0.3O\n1.0\n").unwrap();
    let spec = format!("replay:{}", file.display());

    let out = tollgate(&["simulate", "--quota", "10/s", "--traffic", &spec]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains(&format!("pattern file {}, line 5: \"0.3O\"", file.display())), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(stdout(&out).is_empty());
}

#[test]
fn a_replay_file_runs_to_its_last_timestamp() {
    let file = scratch("replay.txt");
    std::fs::write(&file, "2024-05-01T12:00:00Z\n2024-05-01T14:00:00.5+02:00\n2024-05-01T12:00:01Z\n").unwrap();
    let spec = format!("replay:{}", file.display());
    let out = tollgate(&["simulate", "--quota", "1/s", "--traffic", &spec, "--algorithms", "sliding_log"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    assert!(table.contains("for 2s,"), "{table}");
    assert!(table.contains("offered:  3 requests"), "{table}");
    // 0 s and 1 s are admitted; 0.5 s is not (the log holds the one at 0 s).
    assert!(table.lines().any(|l| l.starts_with("sliding_log") && l.contains(" 2 ") && l.contains(" 1 ")), "{table}");
}

#[test]
fn plot_files_are_valid_svg_and_png() {
    let svg = scratch("plot.svg");
    let out = tollgate(&[
        "simulate",
        "--quota",
        "100/s",
        "--traffic",
        "boundary",
        "--duration",
        "6s",
        "--out",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("well-formed SVG");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(root.attribute("width"), Some("1200"));
    assert_eq!(root.attribute("height"), Some("800"));
    let lines = doc.descendants().filter(|n| n.has_tag_name("polyline")).count();
    assert!(lines >= 2 * AlgorithmKind::ALL.len(), "{lines} polylines");
    let texts: Vec<&str> = doc.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text()).collect();
    assert!(texts.iter().any(|t| t.contains("fixed_window 199/100")), "{texts:?}");
    assert!(texts.iter().any(|t| t.contains("limit 100")), "{texts:?}");

    let png_path = scratch("plot.png");
    let out = tollgate(&[
        "simulate",
        "--quota",
        "100/s",
        "--traffic",
        "steady:150/s",
        "--duration",
        "5s",
        "--acquire",
        "--out",
        png_path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png_path).unwrap()));
    let mut reader = decoder.read_info().expect("a PNG header");
    let (width, height) = (reader.info().width, reader.info().height);
    assert_eq!((width, height), (1200, 800));
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    reader.next_frame(&mut pixels).expect("PNG pixels decode");
    assert!(pixels.iter().any(|&b| b != 255), "the plot is not blank");
}

#[test]
fn acquire_mode_reports_waits_in_the_fifo_queue() {
    let out = tollgate(&[
        "simulate",
        "--quota",
        "10/s",
        "--traffic",
        "bursts:20/4s",
        "--duration",
        "8s",
        "--algorithms",
        "token_bucket,sliding_log",
        "--acquire",
        "--max-wait",
        "500ms",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    assert!(table.contains("longest wait") && table.contains("queued at end"), "{table}");
    // Token bucket 10/s, burst 10: a burst of 20 gets 10 at once and 5 more within 500 ms.
    let row = table.lines().find(|l| l.starts_with("token_bucket")).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cells[1..4], ["30", "10", "0"], "{table}");
    assert!(row.contains("500ms"), "{table}");
}

#[test]
fn bad_input_is_a_clear_error_naming_the_value_never_a_panic() {
    let base = [("--quota", "100/s"), ("--traffic", "steady")];
    for (args, needle) in [
        (vec!["--quota", "100/x"], "for '--quota <LIMIT/PERIOD>': invalid quota \"100/x\""),
        (vec!["--quota", "0/s"], "for '--quota <LIMIT/PERIOD>': invalid quota \"0/s\": quota limit must be at least 1"),
        (vec!["--quota", "100"], "no '/'"),
        (vec!["--quota", "5/"], "for '--quota <LIMIT/PERIOD>': invalid quota \"5/\": no period after '/'"),
        (vec!["--burst", "0"], "invalid --burst \"0\""),
        (vec!["--traffic", "tsunami"], "unknown pattern \"tsunami\""),
        (vec!["--traffic", "steady:fast"], "\"fast\""),
        (vec!["--algorithms", "token_bucket,leaky_bucket"], "unknown algorithm \"leaky_bucket\""),
        (vec!["--duration", "0s"], "for '--duration <DURATION>': invalid duration \"0s\""),
        (vec!["--duration", "forever"], "for '--duration <DURATION>': invalid duration \"forever\""),
        (vec!["--traffic", "boundary:10,fast"], "--traffic boundary spread: invalid duration \"fast\""),
        (vec!["--segments", "0"], "invalid --segments \"0\""),
        (vec!["--segments", "1000000000"], "invalid --segments \"1000000000\""),
        (vec!["--bucket", "1ns"], "invalid --bucket \"1ns\""),
        (vec!["--max-wait", "1s"], "--acquire"),
        (vec!["--out", "plot.gif"], "invalid --out \"plot.gif\""),
        (vec!["--traffic", "steady:100000000/s", "--duration", "1h"], "more than 2000000 requests"),
        (vec!["--traffic", "replay:/no/such/file.txt"], "cannot read pattern file /no/such/file.txt"),
    ] {
        let mut all = vec!["simulate"];
        for (flag, value) in base {
            if !args.contains(&flag) {
                all.extend([flag, value]);
            }
        }
        all.extend(&args);
        let out = tollgate(&all);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // A file that cannot be written is the machine's fault, not the input's.
    let out = tollgate(&["simulate", "--quota", "1/s", "--traffic", "steady", "--out", "/no/such/dir/plot.svg"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot write plot file /no/such/dir/plot.svg"));
}

#[test]
fn help_lists_the_patterns() {
    let out = tollgate(&["simulate", "--help"]);
    assert!(out.status.success());
    let help = stdout(&out);
    for pattern in ["steady", "bursts", "boundary", "poisson", "ramp", "replay", "--costs", "lognormal:MEDIAN,SIGMA"] {
        assert!(help.contains(pattern), "{help}");
    }
}

#[test]
fn costs_compare_reserve_settle_with_check_then_charge() {
    let svg = scratch("costs.svg");
    let out = tollgate(&[
        "simulate",
        "--quota",
        "1000/s",
        "--costs",
        "lognormal:20,1",
        "--concurrency",
        "32",
        "--estimate-error",
        "50%",
        "--duration",
        "10s",
        "--out",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    assert!(table.contains("traffic:  32 clients for 10s, seed 1"), "{table}");
    assert!(table.contains("estimates within ±50% of them"), "{table}");
    for kind in AlgorithmKind::ALL {
        let rows: Vec<Vec<&str>> =
            table.lines().filter(|l| l.starts_with(kind.name())).map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(rows.len(), 2, "{kind}: {table}");
        assert_eq!(rows[0][1], "reserve/settle", "{table}");
        assert_eq!(rows[1][1], "check-then-charge", "{table}");
        // The last column, past bound: 0 reserving, above 0 checking first.
        assert_eq!(rows[0].last(), Some(&"0"), "{kind}: {table}");
        assert_ne!(rows[1].last(), Some(&"0"), "{kind}: {table}");
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("well-formed SVG");
    let texts: Vec<&str> = doc.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text()).collect();
    assert!(texts.iter().any(|t| t.contains("check-then-charge")), "{texts:?}");
    assert!(texts.iter().any(|t| t.trim().starts_with("fixed_window: over by reserving")), "{texts:?}");
}

#[test]
fn bad_costs_options_are_clear_errors_naming_the_option() {
    for (args, needle) in [
        (vec!["--costs", "pareto:2"], "invalid --costs \"pareto:2\": unknown cost distribution \"pareto\""),
        (vec!["--costs", "lognormal:20"], "invalid --costs \"lognormal:20\": expected lognormal:MEDIAN,SIGMA"),
        (vec!["--costs", "lognormal:5000,1"], "the median cost 5000 is more than the capacity 1000"),
        (vec!["--costs", "lognormal:20,1", "--concurrency", "0"], "invalid --concurrency \"0\""),
        (vec!["--costs", "lognormal:20,1", "--concurrency", "many"], "'--concurrency <N>'"),
        (vec!["--costs", "lognormal:20,1", "--estimate-error", "1.5"], "invalid --estimate-error \"1.5\""),
        (
            vec!["--costs", "lognormal:20,1", "--traffic", "steady"],
            "'--costs <DIST>' cannot be used with '--traffic <PATTERN>'",
        ),
        (vec!["--costs", "lognormal:20,1", "--acquire"], "'--costs <DIST>' cannot be used with '--acquire'"),
        (vec!["--traffic", "steady", "--concurrency", "8"], "'--traffic <PATTERN>' cannot be used with '--concurrency"),
        (vec!["--estimate-error", "0.2"], "--costs <DIST>"),
    ] {
        let mut all = vec!["simulate", "--quota", "1000/s"];
        all.extend(&args);
        let out = tollgate(&all);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
