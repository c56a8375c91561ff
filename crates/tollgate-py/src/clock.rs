//! `ManualClock` for tests of the in-process limiters, and the clock they run on.

use std::time::Duration;

use pyo3::prelude::*;
use tollgate::{Clock, Sleep, SystemClock};

use crate::args;

/// A clock that moves only when told: pass it as `clock=` to an in-process limiter to test
/// time-dependent behaviour without sleeping.
#[pyclass(module = "tollgate._tollgate", name = "ManualClock")]
pub struct ManualClock(pub(crate) tollgate::ManualClock);

#[pymethods]
impl ManualClock {
    #[new]
    fn new() -> ManualClock {
        ManualClock(tollgate::ManualClock::new())
    }

    /// Moves the clock forward by `seconds` (>= 0, or a duration string such as `"250ms"`).
    fn advance(&self, seconds: args::Seconds) -> PyResult<()> {
        self.0.advance(args::seconds("seconds", &seconds, true)?);
        Ok(())
    }

    /// Seconds since the clock was made.
    #[getter]
    fn now(&self) -> f64 {
        Duration::from_nanos(self.0.now()).as_secs_f64()
    }
}

/// The system clock, or a test's manual one.
#[derive(Clone)]
pub(crate) enum AnyClock {
    System(SystemClock),
    Manual(tollgate::ManualClock),
}

impl AnyClock {
    pub(crate) fn from_arg(clock: Option<PyRef<'_, ManualClock>>) -> AnyClock {
        match clock {
            Some(manual) => AnyClock::Manual(manual.0.clone()),
            None => AnyClock::System(SystemClock::new()),
        }
    }
}

impl Clock for AnyClock {
    fn now(&self) -> u64 {
        match self {
            AnyClock::System(c) => c.now(),
            AnyClock::Manual(c) => c.now(),
        }
    }

    fn sleep_until(&self, deadline: u64) -> Sleep {
        match self {
            AnyClock::System(c) => c.sleep_until(deadline),
            AnyClock::Manual(c) => c.sleep_until(deadline),
        }
    }
}
