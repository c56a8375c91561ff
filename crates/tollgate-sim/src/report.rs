//! [`Report`]: the table `tollgate simulate` prints: per algorithm, what it admitted and rejected,
//! its worst window against the limit, how long requests waited, and its memory per key; for
//! [`Traffic::Clients`], per algorithm and way of asking, the cost admitted and how far over the
//! algorithm's windows it went.

use std::fmt;

use crate::clients::{Clients, Short};
use crate::run::{AlgorithmRun, Memory, Mode, Waits};
use crate::settle::Allowance;
use crate::units::Span;
use crate::{Simulation, Traffic};

/// A [`Simulation`] as a plain-text table (its `Display`); deterministic, so the same run prints
/// the same bytes.
#[derive(Debug)]
pub struct Report<'a> {
    sim: &'a Simulation,
}

impl<'a> Report<'a> {
    pub(crate) fn new(sim: &'a Simulation) -> Report<'a> {
        Report { sim }
    }
}

fn worst(run: &AlgorithmRun, limit: u64) -> String {
    format!("{}/{} ({:.2}x)", run.worst.count, limit, run.worst.count as f64 / limit as f64)
}

fn waits(w: &Waits) -> String {
    match *w {
        Waits::RetryAfter(None) => "-".to_owned(),
        Waits::RetryAfter(Some(d)) => Span(d).to_string(),
        Waits::Queued { longest, at_least } => format!("{}{}", if at_least { ">= " } else { "" }, Span(longest)),
    }
}

fn memory(m: &Memory) -> String {
    match (m.heap_bytes, m.log_entries) {
        (_, Some(entries)) => format!("{} B + {} B heap ({entries} log entries)", m.state_bytes, m.heap_bytes),
        (0, None) => format!("{} B", m.state_bytes),
        (heap, None) => format!("{} B + {heap} B heap", m.state_bytes),
    }
}

/// Columns padded to their widest cell, two spaces apart; `left(c)` columns read left to right,
/// the others line up on the right.
fn table(
    f: &mut fmt::Formatter<'_>,
    header: &[&str],
    rows: &[Vec<String>],
    left: impl Fn(usize) -> bool,
) -> fmt::Result {
    let widths: Vec<usize> = (0..header.len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).chain([header[c].chars().count()]).max().unwrap_or(0))
        .collect();
    let line = |f: &mut fmt::Formatter<'_>, cells: &[&str]| -> fmt::Result {
        let mut out = String::new();
        for (c, cell) in cells.iter().enumerate() {
            if c > 0 {
                out.push_str("  ");
            }
            let pad = " ".repeat(widths[c] - cell.chars().count());
            if left(c) {
                out.push_str(cell);
                out.push_str(&pad);
            } else {
                out.push_str(&pad);
                out.push_str(cell);
            }
        }
        writeln!(f, "{}", out.trim_end())
    };
    line(f, header)?;
    for row in rows {
        line(f, &row.iter().map(String::as_str).collect::<Vec<_>>())?;
    }
    Ok(())
}

/// [`Traffic::Clients`]: per algorithm and way, what was admitted and how far over the
/// algorithm's windows it went.
fn clients(f: &mut fmt::Formatter<'_>, sim: &Simulation, clients: &Clients) -> fmt::Result {
    let s = &sim.scenario;
    let q = &s.quota;
    let period = q.period();
    writeln!(f, "quota:    {} per {} (burst {}, token buckets only)", q.limit(), Span(period), q.burst())?;
    writeln!(
        f,
        "traffic:  {} clients for {}, seed {}: each asks, once admitted works up to {}, settles, pauses up to {}",
        clients.concurrency,
        Span(s.duration),
        s.seed,
        Span(period / 2),
        Span(period / 20)
    )?;
    writeln!(
        f,
        "costs:    {}, clamped to the capacity; estimates within ±{}% of them",
        clients.costs,
        Short(clients.estimate_error * 100.0)
    )?;
    writeln!(f, "ways:     reserve/settle: reserve(estimate), settle(actual) after the work")?;
    writeln!(
        f,
        "          check-then-charge: check(1), the actual cost charged after the work (Envoy's hits_addend: 0)"
    )?;
    writeln!(f)?;
    let header =
        ["algorithm", "way", "admitted", "cost", "utilization", "worst window", "overshoot", "its bound", "past bound"];
    let rows: Vec<Vec<String>> = sim
        .cost_runs
        .iter()
        .map(|r| {
            let overshoot = match r.worst.overshoot() {
                0 => "0".to_owned(),
                o => format!("{o} ({:.1} req)", r.overshoot_requests()),
            };
            vec![
                r.algorithm.to_string(),
                r.way.to_string(),
                r.admitted.len().to_string(),
                r.admitted_cost().to_string(),
                format!("{:.0}%", r.utilization * 100.0),
                format!("{}/{}", r.worst.cost, r.worst.allowed),
                overshoot,
                r.worst.excess.to_string(),
                r.past_bound.to_string(),
            ]
        })
        .collect();
    table(f, &header, &rows, |c| c < 2)?;
    writeln!(f)?;
    writeln!(f, "worst window: cost admitted / what the algorithm allows, in the window where it went furthest over;")?;
    writeln!(f, "  the windows are those each algorithm bounds:")?;
    let width = s.algorithms.iter().map(|k| k.name().len()).max().unwrap_or(0);
    for &kind in &s.algorithms {
        writeln!(f, "  {:width$}  {}", kind.name(), Allowance::of(kind, q, s.segments))?;
    }
    writeln!(f, "overshoot: the worst window's cost over what is allowed, also in mean requests (of those admitted).")?;
    writeln!(
        f,
        "its bound: that window's requests' actual - estimate where positive, summed: reservations go no further over"
    )?;
    writeln!(f, "  (checking first, the clients had the same estimates but reserved nothing).")?;
    writeln!(f, "past bound: the most any window went over allowed + its bound; 0: the bound held in every window.")?;
    write!(f, "utilization: cost admitted / what the quota allows over the run (limit x duration / period).")
}

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Traffic::Clients(c) = &self.sim.scenario.traffic {
            return clients(f, self.sim, c);
        }
        let s = &self.sim.scenario;
        let q = &s.quota;
        let acquire = matches!(s.mode, Mode::Acquire { .. });
        writeln!(f, "quota:    {} per {} (burst {}, token buckets only)", q.limit(), Span(q.period()), q.burst())?;
        writeln!(f, "traffic:  {} for {}, seed {}", s.traffic, Span(s.duration), s.seed)?;
        writeln!(f, "offered:  {} requests", self.sim.offered.len())?;
        match s.mode {
            Mode::Try => writeln!(f, "mode:     try_acquire(1) on arrival; rejected requests are dropped")?,
            Mode::Acquire { max_wait } => writeln!(
                f,
                "mode:     acquire(1) on arrival, waiting in the limiter's FIFO queue{}",
                max_wait.map_or(String::new(), |m| format!(" for at most {}", Span(m)))
            )?,
        }
        writeln!(f)?;

        let mut header = vec!["algorithm", "admitted", "rejected"];
        if acquire {
            header.push("queued at end");
        }
        header.extend([
            "worst window / limit",
            if acquire { "longest wait" } else { "max retry-after" },
            "memory per key",
        ]);
        let rows: Vec<Vec<String>> = self
            .sim
            .runs
            .iter()
            .map(|r| {
                let mut row = vec![r.algorithm.to_string(), r.admitted.len().to_string(), r.rejected.to_string()];
                if acquire {
                    row.push(r.queued_at_end.to_string());
                }
                row.extend([worst(r, q.limit()), waits(&r.waits), memory(&r.memory)]);
                row
            })
            .collect();
        // Names and memory read left to right; numbers line up on the right.
        let last = header.len() - 1;
        table(f, &header, &rows, |c| c == 0 || c == last)?;
        writeln!(f)?;
        writeln!(
            f,
            "worst window: the most admissions in any window of {} (the quota's period), sliding over every admission.",
            Span(q.period())
        )?;
        if acquire {
            writeln!(f, "longest wait: arrival to grant; \">=\" when that request was still queued at the end.")?;
        } else {
            writeln!(f, "max retry-after: the longest retry_after a rejected request was told (nobody waits).")?;
        }
        write!(
            f,
            "memory per key: size_of the algorithm's state, plus its heap (sliding window: 8 B per segment; \
             sliding log: 16 B per entry at this run's peak)."
        )
    }
}
