//! [`Report`]: the table `tollgate simulate` prints: per algorithm, what it admitted and rejected,
//! its worst window against the limit, how long requests waited, and its memory per key.

use std::fmt;

use crate::Simulation;
use crate::run::{AlgorithmRun, Memory, Mode, Waits};
use crate::units::Span;

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

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
        let widths: Vec<usize> = (0..header.len())
            .map(|c| rows.iter().map(|r| r[c].chars().count()).chain([header[c].len()]).max().unwrap_or(0))
            .collect();
        // Names and memory read left to right; numbers line up on the right.
        let left = |c: usize| c == 0 || c == header.len() - 1;
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
        line(f, &header)?;
        for row in &rows {
            line(f, &row.iter().map(String::as_str).collect::<Vec<_>>())?;
        }
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
