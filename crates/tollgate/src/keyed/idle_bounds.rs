//! When the keys of one [`Keyed`](crate::Keyed) shard go idle, as far as the shard knows: a
//! bound per group of [`GROUP`] buckets of its hash table, instead of a record per key.
//!
//! Each group's bound is no later than the idle time of every key stored in its buckets, and the
//! bounds form a tree (each node the least of its [`GROUP`] children), so the group that may hold
//! the key nearest to idle is found from the root in a few steps, and a group is looked at by
//! reading its buckets. A key's idle time only moves later as it takes permits
//! ([`crate::Algorithm::idle_at`]), and decisions on stored keys take only the shard's read lock,
//! so bounds go stale (too early), never wrong; they are raised to their group's true earliest
//! time when the group is looked at under the write lock. Give-backs, the one change that moves
//! a key's idle time earlier, lower the bounds under the read lock (they are atomics).
//!
//! At 64 buckets a group, the bounds cost 8 bytes per 64 buckets: under half a byte per key at
//! the table's lowest load (7/16), against 16 bytes per key for a heap of per-key records.

use crate::sync::{AtomicU64, Ordering};

/// Buckets in a group, and children of a node of the tree.
pub(super) const GROUP: usize = 64;

/// The bounds of one shard: `levels[0]` per group of buckets, each next level per [`GROUP`] nodes
/// of the one below, up to a root of one.
#[derive(Debug)]
pub(super) struct IdleBounds {
    levels: Vec<Box<[AtomicU64]>>,
}

fn level(len: usize) -> Box<[AtomicU64]> {
    (0..len).map(|_| AtomicU64::new(u64::MAX)).collect()
}

fn lower(bound: &AtomicU64, at: u64) {
    let _ = bound.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| (at < b).then_some(at));
}

impl IdleBounds {
    /// Bounds for a table of `buckets` buckets, none set (`u64::MAX`: no key).
    pub(super) fn new(buckets: usize) -> Self {
        let mut levels = vec![level(buckets.div_ceil(GROUP).max(1))];
        while levels[levels.len() - 1].len() > 1 {
            let len = levels[levels.len() - 1].len().div_ceil(GROUP);
            levels.push(level(len));
        }
        IdleBounds { levels }
    }

    /// The groups of buckets.
    pub(super) fn groups(&self) -> usize {
        self.levels[0].len()
    }

    /// The buckets of group `g`, in a table of `buckets` buckets.
    pub(super) fn buckets(g: usize, buckets: usize) -> std::ops::Range<usize> {
        g * GROUP..((g + 1) * GROUP).min(buckets)
    }

    /// No stored key goes idle before this (`u64::MAX`: none goes idle by time).
    #[inline]
    pub(super) fn earliest(&self) -> u64 {
        self.levels[self.levels.len() - 1][0].load(Ordering::Relaxed)
    }

    /// A key in `bucket` goes idle at `at` (stored there, or given permits back).
    #[inline]
    pub(super) fn lower(&self, bucket: usize, at: u64) {
        let mut i = bucket / GROUP;
        for level in &self.levels {
            lower(&level[i], at);
            i /= GROUP;
        }
    }

    /// Group `g`'s keys go idle no earlier than `at`, as just read from its buckets (under the
    /// write lock: a raise must not hide a give-back's lowering).
    pub(super) fn set(&mut self, g: usize, at: u64) {
        self.levels[0][g].store(at, Ordering::Relaxed);
        let mut i = g;
        for l in 1..self.levels.len() {
            i /= GROUP;
            let below = &self.levels[l - 1];
            let least = below[i * GROUP..((i + 1) * GROUP).min(below.len())]
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .min()
                .unwrap_or(u64::MAX);
            self.levels[l][i].store(least, Ordering::Relaxed);
        }
    }

    /// The group with the earliest bound, and that bound.
    pub(super) fn nearest(&self) -> (u64, usize) {
        let mut i = 0;
        for level in self.levels.iter().rev().skip(1) {
            let children = &level[i * GROUP..((i + 1) * GROUP).min(level.len())];
            let (j, _) = children
                .iter()
                .enumerate()
                .min_by_key(|(_, b)| b.load(Ordering::Relaxed))
                .expect("a node has at least one child");
            i = i * GROUP + j;
        }
        (self.levels[0][i].load(Ordering::Relaxed), i)
    }

    /// Every bound unset, for a table whose keys moved.
    pub(super) fn clear(&mut self) {
        for level in &mut self.levels {
            level.iter_mut().for_each(|b| *b.get_mut() = u64::MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_and_the_nearest_group_follow_every_change() {
        // 64 * 64 * 2 buckets: three levels.
        let buckets = GROUP * GROUP * 2;
        let mut b = IdleBounds::new(buckets);
        assert_eq!(b.levels.len(), 3);
        assert_eq!((b.earliest(), b.groups()), (u64::MAX, GROUP * 2));
        b.lower(5000, 70);
        b.lower(100, 90);
        b.lower(8000, 80);
        assert_eq!(b.earliest(), 70);
        assert_eq!(b.nearest(), (70, 5000 / GROUP));
        // Group 78 (bucket 5000) read again: its keys go idle at 95 now.
        b.set(5000 / GROUP, 95);
        assert_eq!(b.nearest(), (80, 8000 / GROUP));
        b.set(8000 / GROUP, u64::MAX);
        assert_eq!(b.nearest(), (90, 100 / GROUP));
        b.lower(8191, 10);
        assert_eq!((b.earliest(), b.nearest()), (10, (10, 8191 / GROUP)));
        b.clear();
        assert_eq!(b.earliest(), u64::MAX);
        assert_eq!(IdleBounds::buckets(1, 100), 64..100);
        assert_eq!(IdleBounds::new(4).levels.len(), 1);
    }
}
