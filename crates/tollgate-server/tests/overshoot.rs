//! Seed 003's overshoot, measured on the engine with real threads: rounds of POST, POST, POST,
//! GET, GET released at once. Any serial order admits exactly 2 POSTs and 2 GETs; fewer GETs
//! means a GET was denied by a counter briefly holding a rejected POST's hit (overshoot). Accuracy
//! mode must never do it; throughput mode's rate is printed (`cargo test -p tollgate-server --release
//! --test overshoot -- --nocapture`).

use std::sync::{Arc, Barrier};

use futures::executor::block_on;

use tollgate::ManualClock;
use tollgate_policy::{Descriptor, Policy};
use tollgate_server::serve::{Action, Engine, Mode};

const SEED_003: &str = r#"
- {namespace: example.org, max_value: 4, seconds: 60, variables: ["round"]}
- {namespace: example.org, max_value: 2, seconds: 1, conditions: ["req.method == 'POST'"], variables: ["round"]}
"#;

/// Rounds whose outcome no serial order gives, and the most requests admitted in one round.
fn measure(mode: Mode, rounds: usize) -> (usize, usize) {
    let engine = Arc::new(Engine::new(Policy::parse(SEED_003, "seed").unwrap(), mode, false, ManualClock::new()));
    let methods: [&'static str; 5] = ["POST", "POST", "POST", "GET", "GET"];
    let barrier = Arc::new(Barrier::new(methods.len()));
    let threads: Vec<_> = methods
        .into_iter()
        .map(|method| {
            let (engine, barrier) = (engine.clone(), barrier.clone());
            std::thread::spawn(move || {
                (0..rounds)
                    .map(|round| {
                        let d = [Descriptor::from([("req.method", method), ("round", &round.to_string())])];
                        barrier.wait();
                        block_on(engine.call("example.org", &d, 1, Action::CheckAndReport)).unwrap().allowed
                    })
                    .collect::<Vec<bool>>()
            })
        })
        .collect();
    let results: Vec<Vec<bool>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let mut wrong = 0;
    let mut most = 0;
    for round in 0..rounds {
        let admitted = |threads: std::ops::Range<usize>| results[threads].iter().filter(|r| r[round]).count();
        let (posts, gets) = (admitted(0..3), admitted(3..5));
        most = most.max(posts + gets);
        if (posts, gets) != (2, 2) {
            wrong += 1;
        }
    }
    (wrong, most)
}

#[test]
fn accuracy_mode_never_overshoots_and_throughput_never_exceeds() {
    let rounds = 3000;
    let (wrong, most) = measure(Mode::Accuracy, rounds);
    assert_eq!((wrong, most), (0, 4), "accuracy mode: every round exact");
    let (wrong, most) = measure(Mode::Throughput, rounds);
    assert!(most <= 4, "throughput mode never admits over a limit");
    println!(
        "throughput mode: {wrong} of {rounds} rounds ({:.2}%) denied a request that any serial order admits",
        100.0 * wrong as f64 / rounds as f64
    );
}
