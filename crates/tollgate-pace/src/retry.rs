//! Riding out a queue that cannot be reached: bounded exponential back-off on the pacer's clock,
//! spread by [`Jitter`], giving up when the error will not pass by itself or the outage lasts
//! longer than [`PumpOptions::outage`].

use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate::Clock;

use crate::{PaceError, PumpOptions};

/// The longest pause between two tries of a queue call (unless `empty_poll` is longer).
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(5);

/// The randomness that spreads the pump's retry pauses: each pause is drawn between half the
/// back-off's pause and the whole of it ("equal jitter"), so that workers that lost Redis at the
/// same moment do not all ask again at the same moment, while the back-off still doubles.
///
/// Cheap to clone (clones share the source).
///
/// ```
/// use tollgate_pace::{Jitter, PumpOptions};
/// let mut options = PumpOptions::new("worker-1");
/// options.jitter = Jitter::seeded(7);          // the same pauses on every run
/// options.jitter = Jitter::none();             // every pause whole
/// options.jitter = Jitter::from_fn(|| 0.25);   // any source of fractions in [0, 1]
/// # let _ = options;
/// ```
#[derive(Clone)]
pub struct Jitter(Arc<dyn Fn() -> f64 + Send + Sync>);

impl Jitter {
    /// Fractions from a small generator seeded at random (the default).
    pub fn random() -> Jitter {
        // std's hasher keys are drawn from the operating system's randomness: a seed without
        // a dependency for what only has to differ between workers.
        Jitter::seeded(std::collections::hash_map::RandomState::new().hash_one(0u8))
    }

    /// Fractions from a small generator (SplitMix64) seeded with `seed`: the same on every run.
    pub fn seeded(seed: u64) -> Jitter {
        let state = AtomicU64::new(seed);
        Jitter::from_fn(move || {
            let mut z = state.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed).wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            // The top 53 bits: every value an f64 in [0, 1) can hold at that spacing.
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        })
    }

    /// No randomness: every pause is the back-off's whole pause.
    pub fn none() -> Jitter {
        Jitter::from_fn(|| 1.0)
    }

    /// Fractions from `source`, one per pause: 0 makes it half the back-off's pause, 1 the whole
    /// (values outside [0, 1] are taken as the nearer end, and NaN as 1).
    pub fn from_fn(source: impl Fn() -> f64 + Send + Sync + 'static) -> Jitter {
        Jitter(Arc::new(source))
    }

    /// `pause` spread by one draw of the source.
    fn spread(&self, pause: Duration) -> Duration {
        let drawn = (self.0)();
        let fraction = if drawn.is_nan() { 1.0 } else { drawn.clamp(0.0, 1.0) };
        pause.mul_f64(0.5 + 0.5 * fraction)
    }
}

impl Default for Jitter {
    fn default() -> Jitter {
        Jitter::random()
    }
}

impl fmt::Debug for Jitter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Jitter").finish_non_exhaustive()
    }
}

/// One queue call's failures in a row: since when (on the pacer's clock) and the last pause.
pub(crate) struct Backoff<'a, C: Clock> {
    clock: &'a C,
    options: &'a PumpOptions,
    since: Option<u64>,
    pause: Duration,
}

impl<'a, C: Clock> Backoff<'a, C> {
    pub(crate) fn new(clock: &'a C, options: &'a PumpOptions) -> Self {
        Backoff { clock, options, since: None, pause: Duration::ZERO }
    }

    /// The call answered: any outage is over.
    pub(crate) fn over(&mut self) {
        if let Some(since) = self.since.take() {
            let lasted = Duration::from_nanos(self.clock.now().saturating_sub(since));
            tracing::info!("the queue answers again after {:.1} s", lasted.as_secs_f64());
        }
        self.pause = Duration::ZERO;
    }

    /// The call failed with `error` while doing `what`: after a pause, `Ok` to try again; the
    /// error itself when it will not pass by itself or the outage has lasted `options.outage`.
    pub(crate) async fn wait(&mut self, error: PaceError, what: &str) -> Result<(), PaceError> {
        if !error.is_transient() {
            return Err(error);
        }
        let now = self.clock.now();
        let lasted = Duration::from_nanos(now.saturating_sub(*self.since.get_or_insert(now)));
        let Some(left) = self.options.outage.checked_sub(lasted).filter(|left| !left.is_zero()) else {
            return Err(error);
        };
        let first = self.options.empty_poll.max(Duration::from_millis(10));
        self.pause = (self.pause * 2).clamp(first, MAX_RETRY_PAUSE.max(first));
        // The outage limit holds whatever the draw: the last try comes at the limit, not after.
        let pause = self.options.jitter.spread(self.pause).min(left);
        tracing::warn!(
            "queue unavailable for {:.1} s ({what}), trying again in {pause:?}: {error}",
            lasted.as_secs_f64()
        );
        self.clock.sleep_until(now.saturating_add(u64::try_from(pause.as_nanos()).unwrap_or(u64::MAX))).await;
        Ok(())
    }
}
