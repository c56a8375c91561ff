//! Max-min fair division of a quota among those who want it: whoever wants less than an equal
//! share gets what they want, and what they leave is split the same way among the others.

/// Divides `capacity` among `demands` max-min fairly: each gets at most what it wants, the
/// total is at most `capacity`, and no one's share can grow without shrinking a smaller one's.
/// Whole units: when the capacity left does not split evenly, the first wanting more get one
/// more. Returns the shares in the order of `demands`.
///
/// ```
/// use tollgate_server::serve::fair_shares;
/// // 90 among three who want plenty: 30 each.
/// assert_eq!(fair_shares(90, &[200, 200, 200]), [30, 30, 30]);
/// // One wants 10: it gets 10, the other two split the 80 left.
/// assert_eq!(fair_shares(90, &[10, 200, 200]), [10, 40, 40]);
/// // Everyone gets what they want when it fits; nothing is handed out unasked.
/// assert_eq!(fair_shares(90, &[5, 0, 20]), [5, 0, 20]);
/// // Ten among three: one unit left over goes to the first still wanting more.
/// assert_eq!(fair_shares(10, &[9, 9, 9]), [4, 3, 3]);
/// ```
pub fn fair_shares(capacity: u64, demands: &[u64]) -> Vec<u64> {
    let Some(level) = fair_level(capacity, demands) else { return demands.to_vec() };
    let mut shares: Vec<u64> = demands.iter().map(|&d| d.min(level)).collect();
    // What the split leaves over, one unit each to those wanting more than the level, in the
    // callers' order.
    let mut over = capacity - shares.iter().sum::<u64>();
    for (share, _) in shares.iter_mut().zip(demands).filter(|(_, d)| **d > level) {
        if over == 0 {
            break;
        }
        *share += 1;
        over -= 1;
    }
    shares
}

/// The level of [`fair_shares`]' division: those wanting more than it get it (and some one unit
/// more), the others what they want; `None` when every demand is met in full.
pub(crate) fn fair_level(capacity: u64, demands: &[u64]) -> Option<u64> {
    // The smallest demands are settled first: each is met in full until one is above the level
    // an equal split of what is left gives; from there on everyone wants more than the level.
    let mut sorted = demands.to_vec();
    sorted.sort_unstable();
    let mut left = capacity;
    for (k, &demand) in sorted.iter().enumerate() {
        let level = left / (sorted.len() - k) as u64;
        if demand > level {
            return Some(level);
        }
        left -= demand;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference: raise a common level one unit at a time.
    fn by_units(capacity: u64, demands: &[u64]) -> u64 {
        let mut shares = vec![0u64; demands.len()];
        let mut left = capacity;
        loop {
            let mut moved = false;
            for (s, &d) in shares.iter_mut().zip(demands) {
                if left > 0 && *s < d {
                    *s += 1;
                    left -= 1;
                    moved = true;
                }
            }
            if !moved {
                return shares.iter().sum();
            }
        }
    }

    proptest! {
        #[test]
        fn shares_are_max_min_fair(capacity in 0u64..400, demands in proptest::collection::vec(0u64..200, 0..6)) {
            let shares = fair_shares(capacity, &demands);
            let total: u64 = shares.iter().sum();
            prop_assert!(total <= capacity);
            prop_assert_eq!(total, by_units(capacity, &demands), "as much handed out as fits");
            for (i, (&s, &d)) in shares.iter().zip(&demands).enumerate() {
                prop_assert!(s <= d, "{i} got {s}, wanted {d}");
                // Fair: one who got less than it wanted got at least everyone else's share but one unit.
                if s < d {
                    prop_assert!(shares.iter().all(|&o| o <= s + 1), "{shares:?} for {demands:?}");
                }
            }
        }
    }
}
