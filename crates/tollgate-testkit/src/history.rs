//! [`History`]: decisions recorded on the authority's clock, checked against an algorithm's bound.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

/// One decision as the authority (Redis `TIME`, the server's clock) timed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// When it was decided, in nanoseconds on the authority's clock.
    pub at_ns: u64,
    /// The key it was about.
    pub key: String,
    /// Permits asked for.
    pub n: u64,
    /// Whether they were granted.
    pub allowed: bool,
}

/// The most an algorithm may admit, per key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// GCRA token bucket: in any interval `[t1, t2]`, at most `burst + (t2 - t1) / emission`.
    TokenBucket {
        /// Permits that may go at once.
        burst: u64,
        /// Nanoseconds per permit.
        emission_ns: u64,
    },
    /// Fixed window: at most `limit` per window. Windows open at the first admission after the
    /// previous one ended (as Tollgate's fixed windows do), or on multiples of `period_ns` when
    /// `aligned`.
    FixedWindow {
        /// Permits per window.
        limit: u64,
        /// The window's length.
        period_ns: u64,
        /// Windows start on multiples of the period instead of at a first request.
        aligned: bool,
    },
    /// Sliding log: at most `limit` in any window `(t - period, t]`.
    SlidingLog {
        /// Permits per window.
        limit: u64,
        /// The window's length.
        period_ns: u64,
    },
}

/// A window in which a key got more than its bound allows — the shortest one found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The key.
    pub key: String,
    /// The window's first admission, on the authority's clock.
    pub from_ns: u64,
    /// The window's last admission.
    pub to_ns: u64,
    /// Permits admitted within it.
    pub admitted: u64,
    /// Permits the bound allows within it.
    pub allowed: u64,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "key {:?}: {} permits admitted in {} ns (from {} to {} ns), the bound allows {}",
            self.key,
            self.admitted,
            self.to_ns - self.from_ns,
            self.from_ns,
            self.to_ns,
            self.allowed
        )
    }
}

/// Decisions recorded by many tasks, checked offline.
#[derive(Debug, Default)]
pub struct History {
    decisions: Mutex<Vec<Decision>>,
}

impl History {
    /// Records one decision.
    pub fn record(&self, decision: Decision) {
        self.decisions.lock().unwrap_or_else(|e| e.into_inner()).push(decision);
    }

    /// Every decision so far, in the order recorded.
    pub fn decisions(&self) -> Vec<Decision> {
        self.decisions.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Admitted permits so far.
    pub fn admitted(&self) -> u64 {
        self.decisions.lock().unwrap_or_else(|e| e.into_inner()).iter().filter(|d| d.allowed).map(|d| d.n).sum()
    }

    /// Checks every key's admissions against `bound`; the first key that breaks it is reported
    /// with the shortest window that does.
    pub fn check(&self, bound: &Bound) -> Result<(), Violation> {
        for (key, admitted) in self.admissions() {
            let excess = excess_per_end(&admitted, bound);
            let Some(j) = excess.iter().position(|&e| e > 0) else { continue };
            let allowed = |i: usize| bound.allows(admitted[j].0 - admitted[i].0);
            let (mut i, mut sum) = (j, admitted[j].1);
            while sum <= allowed(i) {
                i -= 1;
                sum += admitted[i].1;
            }
            return Err(Violation {
                key,
                from_ns: admitted[i].0,
                to_ns: admitted[j].0,
                admitted: sum,
                allowed: allowed(i),
            });
        }
        Ok(())
    }

    /// Over-admission against `bound`, summed over keys: for each key, the most permits any
    /// window held beyond what the bound allows (0 when it holds) — the figure to report when a
    /// policy (fail open) is allowed to break the bound.
    pub fn excess(&self, bound: &Bound) -> u64 {
        self.admissions().map(|(_, admitted)| excess_per_end(&admitted, bound).into_iter().max().unwrap_or(0)).sum()
    }

    /// Each key's admissions as `(at, n)`, in time order.
    fn admissions(&self) -> impl Iterator<Item = (String, Vec<(u64, u64)>)> {
        let mut per_key: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
        for d in self.decisions().into_iter().filter(|d| d.allowed && d.n > 0) {
            per_key.entry(d.key).or_default().push((d.at_ns, d.n));
        }
        per_key.into_iter().map(|(key, mut admitted)| {
            admitted.sort_unstable();
            (key, admitted)
        })
    }
}

impl Bound {
    /// Permits the bound allows in a window spanning `span_ns` between its first and last
    /// admission (within one window, for the window algorithms).
    fn allows(&self, span_ns: u64) -> u64 {
        match *self {
            Bound::TokenBucket { burst, emission_ns } => burst + span_ns / emission_ns.max(1),
            Bound::FixedWindow { limit, .. } | Bound::SlidingLog { limit, .. } => limit,
        }
    }
}

/// For each admission `j`, how far the worst window ending at `j` goes over the bound (0 when
/// within it). One pass per bound.
fn excess_per_end(admitted: &[(u64, u64)], bound: &Bound) -> Vec<u64> {
    match *bound {
        // `admitted[i..=j]` holds `sum <= burst + floor(span / T)` iff `(sum - burst) * T <= span`:
        // with prefix sums S, the worst `i` for `j` is the one with the least `S_(i-1) * T - t_i`.
        Bound::TokenBucket { burst, emission_ns } => {
            let t = i128::from(emission_ns.max(1));
            let (mut before, mut least) = (0i128, i128::MAX);
            let mut out = Vec::with_capacity(admitted.len());
            for &(at, n) in admitted {
                least = least.min(before * t - i128::from(at));
                before += i128::from(n);
                // Positive: the window of `j` alone holds `n * T`. Rounded up: permits are whole.
                let most = (before * t - i128::from(at) - least + t - 1) / t;
                out.push((most - i128::from(burst)).max(0) as u64);
            }
            out
        }
        Bound::FixedWindow { limit, period_ns, aligned } => {
            let (mut start, mut count) = (None::<u64>, 0u64);
            let mut out = Vec::with_capacity(admitted.len());
            for &(at, n) in admitted {
                let window = match start {
                    _ if aligned => at - at % period_ns,
                    Some(s) if at < s + period_ns => s,
                    _ => at,
                };
                if start != Some(window) {
                    (start, count) = (Some(window), 0);
                }
                count += n;
                out.push(count.saturating_sub(limit));
            }
            out
        }
        Bound::SlidingLog { limit, period_ns } => {
            let (mut i, mut count) = (0, 0u64);
            let mut out = Vec::with_capacity(admitted.len());
            for &(at, n) in admitted {
                count += n;
                while admitted[i].0 + period_ns <= at {
                    count -= admitted[i].1;
                    i += 1;
                }
                out.push(count.saturating_sub(limit));
            }
            out
        }
    }
}

/// A holder of a semaphore permit, from its own log: from when it was granted until it released
/// or its lease expired, on the authority's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold {
    /// Granted at.
    pub from_ns: u64,
    /// Released, or expired, at (exclusive).
    pub until_ns: u64,
    /// The fencing token it was given.
    pub token: u64,
}

/// The most holders at any instant (a semaphore of capacity `c` must never exceed `c`).
pub fn max_holders(holds: &[Hold]) -> usize {
    let mut edges: Vec<(u64, i8)> = holds.iter().flat_map(|h| [(h.from_ns, 1), (h.until_ns, -1)]).collect();
    // At one instant a release comes before a grant: the permit passed from one to the other.
    edges.sort_unstable();
    let (mut now, mut most) = (0i64, 0i64);
    for (_, step) in edges {
        now += i64::from(step);
        most = most.max(now);
    }
    most as usize
}
