//! The simulator as a library: what each algorithm admits under a pattern, in simulated time.

use std::path::PathBuf;
use std::time::Duration;

use tollgate::Quota;
use tollgate_sim::{AlgorithmKind, Mode, Scenario, SimError, Traffic, simulate};

#[test]
fn boundary_attack_lets_fixed_window_admit_up_to_twice_the_limit_and_sliding_log_never_more() {
    for (quota, mode) in [
        ("100/s", Mode::Try),
        ("10/100ms", Mode::Try),
        ("600/m", Mode::Try),
        ("100/s", Mode::Acquire { max_wait: None }),
    ] {
        let q = Quota::parse(quota).unwrap();
        let mut scenario = Scenario::new(q, Traffic::parse("boundary", &q).unwrap());
        scenario.duration = q.period() * 20;
        scenario.mode = mode;
        let sim = simulate(&scenario).unwrap();
        let limit = q.limit();

        let fixed = sim.run(AlgorithmKind::FixedWindow).unwrap();
        // One request opens the window; the rest of the limit just before its end, the whole limit
        // again just after: 2 * limit - 1 inside one period.
        assert!(fixed.worst.count > limit, "{quota} {mode:?}: fixed window {:?}", fixed.worst);
        assert!(fixed.worst.count >= 2 * limit - 1, "{quota} {mode:?}: fixed window {:?}", fixed.worst);
        assert!(fixed.worst.count <= 2 * limit, "{quota} {mode:?}: fixed window {:?}", fixed.worst);

        let log = sim.run(AlgorithmKind::SlidingLog).unwrap();
        assert!(log.worst.count <= limit, "{quota} {mode:?}: sliding log {:?}", log.worst);
        assert_eq!(log.worst.count, limit, "{quota} {mode:?}: the log does admit up to its limit");
        // Everything offered is accounted for.
        for run in &sim.runs {
            assert_eq!(run.admitted.len() as u64 + run.rejected + run.queued_at_end, sim.offered.len() as u64);
        }
    }
}

#[test]
fn a_bad_pattern_file_is_an_error_naming_its_line() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("simulate");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let file = dir.join("bad-pattern.txt");
    std::fs::write(&file, "# arrivals, seconds from the start\n0.10\n0.25\n\n0.3O\n1.0\n").unwrap();
    let q = Quota::parse("10/s").unwrap();
    let e = Traffic::parse(&format!("replay:{}", file.display()), &q).unwrap_err();
    assert!(matches!(&e, SimError::ReplayLine { path, line: 5, .. } if *path == file), "{e:?}");
    assert!(e.to_string().contains("line 5: \"0.3O\""), "{e}");
    assert!(e.is_usage());
}

#[test]
fn simulated_time_is_not_wall_time() {
    // Ten minutes of 1000 requests per second through all six algorithms.
    let q = Quota::parse("500/s").unwrap().with_burst(50).unwrap();
    let mut scenario = Scenario::new(q, Traffic::parse("poisson:1000/s", &q).unwrap());
    scenario.duration = Duration::from_secs(600);
    let started = std::time::Instant::now();
    let sim = simulate(&scenario).unwrap();
    assert!(sim.offered.len() > 590_000);
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
}

/// A quota is the same rate on every algorithm: with a burst smaller than the limit, the interval
/// bucket admits the quota's rate in smaller steps (issue 15: it used to admit only the burst per
/// period, 200 instead of about 1000 here).
#[test]
fn the_interval_bucket_admits_the_quotas_rate_whatever_the_burst() {
    let q = Quota::parse("100/s").unwrap().with_burst(20).unwrap();
    let mut scenario = Scenario::new(q, Traffic::parse("poisson:150/s", &q).unwrap());
    scenario.duration = Duration::from_secs(10);
    let sim = simulate(&scenario).unwrap();
    let interval = sim.run(AlgorithmKind::IntervalBucket).unwrap().admitted.len() as f64;
    let bucket = sim.run(AlgorithmKind::TokenBucket).unwrap().admitted.len() as f64;
    // 100/s for 10 s plus the first burst, whatever the step.
    assert!((950.0..=1020.0).contains(&interval), "interval bucket admitted {interval}");
    assert!((interval - bucket).abs() <= 0.03 * bucket, "interval bucket {interval} vs token bucket {bucket}");
}
