//! Counting events (arrivals or admissions, sorted nanosecond times) in windows of time: the worst
//! window of a given length, per-bucket counts and trailing-window counts for the plot.

/// The most events in any window `[start, start + len)`, and where that window starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Worst {
    /// Events in the window.
    pub count: u64,
    /// Start of the (first) worst window, in nanoseconds; it starts at an event.
    pub start_ns: u64,
}

/// The most events of the sorted `times` in any half-open window of length `len` ns, sliding over
/// every event (a window holding the most events can always be slid to start at one of them).
///
/// ```
/// use tollgate_sim::{Worst, worst_window};
/// // 10 ns windows: [5, 15) holds 5, 9, 12 and 14.
/// assert_eq!(worst_window(&[0, 5, 9, 12, 14, 30], 10), Worst { count: 4, start_ns: 5 });
/// ```
pub fn worst_window(times: &[u64], len: u64) -> Worst {
    let mut worst = Worst::default();
    let mut end = 0;
    for (i, &start) in times.iter().enumerate() {
        let until = start.saturating_add(len);
        while end < times.len() && times[end] < until {
            end += 1;
        }
        let count = (end - i) as u64;
        if count > worst.count {
            worst = Worst { count, start_ns: start };
        }
    }
    worst
}

/// Events per bucket: `buckets` buckets of `width` ns from zero; later events are not counted.
pub fn bucket_counts(times: &[u64], width: u64, buckets: usize) -> Vec<u64> {
    let mut counts = vec![0; buckets];
    for &t in times {
        match counts.get_mut((t / width.max(1)) as usize) {
            Some(c) => *c += 1,
            None => break,
        }
    }
    counts
}

/// For each sample time `s` (ascending), the events in the trailing window `(s - len, s]`.
pub fn trailing_counts(times: &[u64], len: u64, samples: &[u64]) -> Vec<u64> {
    let (mut lo, mut hi) = (0, 0);
    samples
        .iter()
        .map(|&s| {
            while hi < times.len() && times[hi] <= s {
                hi += 1;
            }
            while lo < hi && times[lo].saturating_add(len) <= s {
                lo += 1;
            }
            (hi - lo) as u64
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every window start from 0 to the last event, by brute force.
    fn brute_worst(times: &[u64], len: u64) -> u64 {
        let last = times.last().copied().unwrap_or(0);
        (0..=last).map(|s| times.iter().filter(|&&t| t >= s && t < s + len).count() as u64).max().unwrap_or(0)
    }

    #[test]
    fn worst_window_matches_brute_force() {
        let mut seed = 1u64;
        for round in 0..200 {
            let mut times: Vec<u64> = (0..(round % 17))
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (seed >> 33) % 60
                })
                .collect();
            times.sort_unstable();
            for len in [1, 3, 10, 25] {
                let w = worst_window(&times, len);
                assert_eq!(w.count, brute_worst(&times, len), "{times:?} len {len}");
                let inside = times.iter().filter(|&&t| t >= w.start_ns && t < w.start_ns + len).count() as u64;
                assert_eq!(inside, w.count);
            }
        }
    }

    #[test]
    fn buckets_and_trailing_windows() {
        let times = [0, 1, 5, 10, 19, 20, 35];
        assert_eq!(bucket_counts(&times, 10, 3), [3, 2, 1]);
        assert_eq!(trailing_counts(&times, 10, &[0, 9, 10, 20, 29, 40]), [1, 3, 3, 2, 1, 1]);
        assert_eq!(worst_window(&[], 10), Worst::default());
    }
}
