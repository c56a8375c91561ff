//! What both targets decide with: the limits, and engines built once per process.

use std::sync::Arc;

use tollgate::ManualClock;
use tollgate_policy::Policy;
use tollgate_server::serve::{Engine, Metrics, Mode};

/// Every algorithm; conditions (simple and CEL) and variables; windows of one unit and not
/// (RLS gives those per second); a `max_value` past `u32::MAX` (RLS carries u32); names with a
/// quote (headers quote names).
pub const LIMITS: &str = r#"
- namespace: api
  name: "posts \"per\" user"
  max_value: 3
  seconds: 1
  conditions: ["req.method == 'POST'"]
  variables: ["user"]
- namespace: api
  max_value: 10
  seconds: 60
  variables: ["descriptors[0].user"]
  algorithm: token_bucket
- namespace: api
  max_value: 7
  seconds: 7
  conditions: ["descriptors[0]['req.method'] == 'GET'"]
  algorithm: sliding_window
- namespace: api
  name: big
  max_value: 5000000000
  seconds: 3600
  variables: ["descriptors[1].tenant"]
  algorithm: weighted_window
- namespace: other
  max_value: 1
  seconds: 86400
"#;

/// The engines inputs are decided by: accuracy mode, and throughput mode in shadow.
pub struct Engines {
    pub clock: ManualClock,
    pub engines: [(Arc<Engine<ManualClock>>, Arc<Metrics>); 2],
}

impl Engines {
    pub fn new() -> Engines {
        let policy = Policy::parse(LIMITS, "fuzz.yaml").expect("the fuzz limits parse");
        let clock = ManualClock::new();
        let engine = |mode, shadow| {
            (Arc::new(Engine::new(policy.clone(), mode, shadow, clock.clone())), Arc::new(Metrics::new()))
        };
        let engines = [engine(Mode::Accuracy, false), engine(Mode::Throughput, true)];
        Engines { clock, engines }
    }
}

/// A single-threaded runtime, as the server's tasks would poll the handlers on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().build().expect("a current-thread runtime")
}
