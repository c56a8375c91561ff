//! Costs known only after the work: the same clients reserving and settling, and checking then
//! charging, through every algorithm (issue 40: reserve/settle against the peers' way).

use std::time::Duration;

use tollgate::Quota;
use tollgate_sim::{AlgorithmKind, Clients, Mode, Scenario, SimError, Simulation, Traffic, Way, plot, simulate};

/// 32 clients, log-normal costs (median 20, sigma 1: mean 33) estimated within ±50%, against
/// 1000 per second for 20 simulated seconds.
fn thirty_two_clients(seed: u64) -> Simulation {
    let quota = Quota::parse("1000/s").unwrap();
    let clients = Clients::parse("lognormal:20,1", 32, "0.5").unwrap();
    let mut scenario = Scenario::new(quota, Traffic::Clients(clients));
    scenario.duration = Duration::from_secs(20);
    scenario.seed = seed;
    simulate(&scenario).unwrap()
}

/// The target of issue 40: with 32 concurrent requests and costs estimated within ±50%,
/// reservations keep every window within the bound (what the algorithm allows plus the window's
/// `actual − estimate` where positive), while checking first then charging goes over by many
/// requests' cost.
///
/// Why 8 mean requests: checking admits a client while anything at all is left, so each time the
/// limit frees up every client whose retry is due passes the same `check(1)` together and each
/// then charges its whole cost, up to 32 requests past what was left. Over seeds 0 to 39 the
/// check-then-charge overshoot was 12 to 60 mean requests for every algorithm (the least: the
/// fixed window, seed 31, which forgets the debt at each window's end); 8, a quarter of the
/// clients, is "several" with a margin. Reservations went over by 0.3 to 16.5 mean requests, each
/// time within the bound: the bound grows with the estimates' error, not with the clients.
#[test]
fn reserve_settle_keeps_the_bound_and_check_then_charge_overshoots_by_several_requests() {
    for seed in 1..=8 {
        let sim = thirty_two_clients(seed);
        assert_eq!(sim.cost_runs.len(), 2 * AlgorithmKind::ALL.len());
        for kind in AlgorithmKind::ALL {
            let ours = sim.cost_run(kind, Way::ReserveSettle).unwrap();
            let peers = sim.cost_run(kind, Way::CheckThenCharge).unwrap();
            let what =
                format!("{kind}, seed {seed}: reserve/settle {:?}, check-then-charge {:?}", ours.worst, peers.worst);
            assert_eq!(ours.past_bound, 0, "{what}: past the bound");
            assert!(ours.worst.overshoot() <= ours.worst.excess, "{what}");
            assert!(ours.worst.cost <= ours.worst.bound(), "{what}");
            // The reservations' bound is a check that can fail: checking first fails it.
            assert!(peers.past_bound > 0, "{what}");
            let mean = peers.mean_cost();
            assert!((25.0..40.0).contains(&mean), "{what}: mean cost {mean}");
            assert!(
                peers.worst.overshoot() as f64 >= 8.0 * mean,
                "{what}: only {:.1} requests over",
                peers.overshoot_requests()
            );
            // Reservations do not buy the bound with an idle quota (the token bucket's first
            // burst comes on top of the rate).
            assert!((0.9..1.1).contains(&ours.utilization), "{what}: utilization {}", ours.utilization);
            assert_eq!(ours.admitted_cost(), ours.admitted.iter().map(|c| c.actual).sum::<u64>());
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_runs_table_and_plot() {
    let a = thirty_two_clients(7);
    let b = thirty_two_clients(7);
    assert_eq!(a, b);
    assert_eq!(a.report().to_string(), b.report().to_string());
    let svg = |sim: &Simulation| plot::render(sim, plot::Format::Svg, None).unwrap();
    assert!(svg(&a) == svg(&b), "same seed, same SVG bytes");
    let c = thirty_two_clients(8);
    assert_ne!(a.cost_runs, c.cost_runs, "another seed, other requests");
    assert_ne!(a.report().to_string(), c.report().to_string());

    let text = String::from_utf8(svg(&a)).unwrap();
    for needle in ["reserve/settle", "check-then-charge", "limit 1000", "sliding_log: over by"] {
        assert!(text.contains(needle), "{needle} missing from the plot");
    }
    let table = a.report().to_string();
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("sliding_log")).collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(rows[0].contains("reserve/settle") && rows[1].contains("check-then-charge"), "{table}");
    assert!(table.contains("costs:    log-normal (median 20, sigma 1, mean 33)"), "{table}");
}

/// Every algorithm and both ways see the same requests from each client: with a limit that
/// never binds, they admit the very same requests at the very same times.
#[test]
fn each_client_asks_for_the_same_requests_whatever_the_algorithm_and_the_way() {
    let quota = Quota::parse("1000000/s").unwrap();
    let mut scenario = Scenario::new(quota, Traffic::Clients(Clients::parse("lognormal:20,1", 32, "0.5").unwrap()));
    scenario.duration = Duration::from_secs(5);
    let sim = simulate(&scenario).unwrap();
    let admitted = |i: usize| -> Vec<(u64, u64, u64)> {
        sim.cost_runs[i].admitted.iter().map(|c| (c.at, c.estimate, c.actual)).collect()
    };
    // 32 clients, each a request every 275 ms on average (work 250 ms, pause 25 ms).
    assert!((500..650).contains(&admitted(0).len()), "{}", admitted(0).len());
    for (i, run) in sim.cost_runs.iter().enumerate() {
        assert_eq!(admitted(i), admitted(0), "{} {}", run.algorithm, run.way);
        assert_eq!((run.refused, run.worst.overshoot(), run.past_bound), (0, 0, 0), "{} {}", run.algorithm, run.way);
    }
}

#[test]
fn bad_combinations_name_the_option_at_fault() {
    let quota = Quota::parse("100/s").unwrap().with_burst(10).unwrap();
    let clients = |costs: &str| Traffic::Clients(Clients::parse(costs, 4, "0.5").unwrap());
    let error = |scenario: &Scenario| -> SimError { simulate(scenario).unwrap_err() };

    let mut s = Scenario::new(quota, clients("lognormal:20,1"));
    let e = error(&s);
    assert!(e.is_usage());
    assert_eq!(
        e.to_string(),
        "invalid --costs \"lognormal:20,1\": the median cost 20 is more than the capacity 10 (the quota's limit, or --burst)"
    );
    s.algorithms = vec![AlgorithmKind::SlidingLog];
    assert!(
        simulate(&Scenario { duration: Duration::from_secs(2), ..s.clone() }).is_ok(),
        "a window's capacity is the limit"
    );

    let acquire = Scenario { mode: Mode::Acquire { max_wait: None }, ..Scenario::new(quota, clients("lognormal:5,1")) };
    assert!(error(&acquire).to_string().starts_with("invalid --acquire"), "{}", error(&acquire));

    let segments = Scenario { segments: 0, algorithms: vec![AlgorithmKind::SlidingWindow], ..s.clone() };
    assert!(error(&segments).to_string().contains("--segments \"0\""), "{}", error(&segments));

    let many = Traffic::Clients(Clients::parse("lognormal:5,1", 10_000, "0.5").unwrap());
    let long = Scenario { duration: Duration::from_secs(7200), ..Scenario::new(quota, many) };
    assert!(matches!(error(&long), SimError::TooManyRequests { .. }), "{}", error(&long));

    for (costs, concurrency, estimate_error, what) in [
        ("lognormal:20", 32, "0.5", "--costs"),
        ("uniform:1,10", 32, "0.5", "--costs"),
        ("lognormal:20,1", 0, "0.5", "--concurrency"),
        ("lognormal:20,1", 32, "100%", "--estimate-error"),
    ] {
        let e = Clients::parse(costs, concurrency, estimate_error).unwrap_err();
        assert!(matches!(&e, SimError::Invalid { what: w, .. } if *w == what), "{e}");
    }
}
