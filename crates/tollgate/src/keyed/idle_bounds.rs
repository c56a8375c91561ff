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

/// Lowers `bound` to `at`; false when it was no later already.
fn lower(bound: &AtomicU64, at: u64) -> bool {
    bound.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| (at < b).then_some(at)).is_ok()
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

    /// Group `g`'s bound (`u64::MAX` past the last group).
    #[inline]
    pub(super) fn of(&self, g: usize) -> u64 {
        self.levels[0].get(g).map_or(u64::MAX, |b| b.load(Ordering::Relaxed))
    }

    /// A key in `bucket` goes idle at `at` (stored there, or given permits back).
    #[inline]
    pub(super) fn lower(&self, bucket: usize, at: u64) {
        let mut i = bucket / GROUP;
        for level in &self.levels {
            // A node is never later than its children: one not lowered keeps those above.
            if !lower(&level[i], at) {
                return;
            }
            i /= GROUP;
        }
    }

    /// Group `g`'s keys go idle no earlier than `at`, as just read from its buckets (under the
    /// write lock: a raise must not hide a give-back's lowering).
    pub(super) fn set(&mut self, g: usize, mut at: u64) {
        let mut old = self.levels[0][g].swap(at, Ordering::Relaxed);
        if old == at {
            return;
        }
        let mut i = g;
        for l in 1..self.levels.len() {
            i /= GROUP;
            let node = &self.levels[l][i];
            let was = node.load(Ordering::Relaxed);
            if old > was && at >= was {
                // The node's least child is another, and still no later than the new time.
                return;
            }
            let below = &self.levels[l - 1];
            let least = below[i * GROUP..((i + 1) * GROUP).min(below.len())]
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .min()
                .unwrap_or(u64::MAX);
            node.store(least, Ordering::Relaxed);
            if least == was {
                return;
            }
            (old, at) = (was, least);
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

    /// Every bound unset, for a table of `buckets` buckets whose keys moved.
    pub(super) fn reset(&mut self, buckets: usize) {
        if self.groups() == buckets.div_ceil(GROUP).max(1) {
            self.clear();
        } else {
            *self = IdleBounds::new(buckets);
        }
    }

    /// Every bound unset.
    fn clear(&mut self) {
        for level in &mut self.levels {
            level.iter().for_each(|b| b.store(u64::MAX, Ordering::Relaxed));
        }
    }
}

/// Keys of the group a shard last looked at that go idle first, earliest first: the next
/// evictions from that group (and the exact retry time at the cap) need no new look while the
/// first of them is current and its time is the shard's earliest bound.
#[derive(Debug, Default)]
pub(super) struct Queue {
    /// `(time, bucket)`, earliest first; `len` of them in use.
    keys: [(u64, usize); QUEUED],
    len: usize,
    /// No other key of the group goes idle before this.
    rest: u64,
    /// The group.
    pub(super) group: usize,
}

/// Keys a [`Queue`] holds.
const QUEUED: usize = 32;

impl Queue {
    /// Starts over for group `group`.
    pub(super) fn start(&mut self, group: usize) {
        *self = Queue { rest: u64::MAX, group, ..Queue::default() };
    }

    /// A key of the group, in `bucket`, goes idle at `at`.
    pub(super) fn push(&mut self, at: u64, bucket: usize) {
        if self.len == QUEUED {
            if at >= self.keys[QUEUED - 1].0 {
                self.rest = self.rest.min(at);
                return;
            }
            self.rest = self.rest.min(self.keys[QUEUED - 1].0);
            self.len -= 1;
        }
        let i = self.keys[..self.len].partition_point(|&(t, _)| t <= at);
        self.keys.copy_within(i..self.len, i + 1);
        self.keys[i] = (at, bucket);
        self.len += 1;
    }

    /// The key going idle first, with its time.
    pub(super) fn first(&self) -> Option<(u64, usize)> {
        (self.len > 0).then(|| self.keys[0])
    }

    /// Drops the first key (evicted); returns the group's bound without it.
    pub(super) fn pop(&mut self) -> u64 {
        if self.len > 0 {
            self.keys.copy_within(1..self.len, 0);
            self.len -= 1;
        }
        self.first().map_or(self.rest, |(at, _)| at)
    }

    /// Forgets every key (the table's keys moved).
    pub(super) fn clear(&mut self) {
        self.len = 0;
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

    /// Random lowerings and settings of group bounds: every node stays the least of its
    /// children, against a recomputation from scratch.
    #[test]
    fn every_node_is_the_least_of_its_children() {
        let mut next = super::super::tests::xorshift();
        for buckets in [4, 64, 65, 4096, GROUP * GROUP * 3 + 5] {
            let mut b = IdleBounds::new(buckets);
            for _ in 0..3_000 {
                let at = next(50);
                if next(2) == 0 {
                    b.lower(next(buckets as u64) as usize, at);
                } else {
                    b.set(next(b.groups() as u64) as usize, if at == 0 { u64::MAX } else { at });
                }
                for l in 1..b.levels.len() {
                    for (i, node) in b.levels[l].iter().enumerate() {
                        let below = &b.levels[l - 1];
                        let least = below[i * GROUP..((i + 1) * GROUP).min(below.len())]
                            .iter()
                            .map(|c| c.load(Ordering::Relaxed))
                            .min()
                            .unwrap();
                        assert_eq!(node.load(Ordering::Relaxed), least, "{buckets} buckets, level {l}, node {i}");
                    }
                }
                let (at, g) = b.nearest();
                assert_eq!(at, b.earliest());
                assert_eq!(b.levels[0][g].load(Ordering::Relaxed), at);
            }
        }
    }

    #[test]
    fn a_queue_keeps_the_first_keys_and_the_bound_of_the_rest() {
        let mut q = Queue::default();
        q.start(3);
        // Times 10, 20, ... in a scrambled order, more than a queue holds.
        let n = QUEUED as u64 + 5;
        for i in 0..n {
            let at = (i * 7 % n + 1) * 10;
            q.push(at, at as usize);
        }
        assert_eq!(q.first(), Some((10, 10)));
        let bounds: Vec<u64> = (0..QUEUED + 1).map(|_| q.pop()).collect();
        let queued: Vec<u64> = (2..=QUEUED as u64).map(|i| i * 10).collect();
        assert_eq!(bounds[..QUEUED - 1], queued[..], "the queued keys in order");
        let rest = (QUEUED as u64 + 1) * 10;
        assert_eq!(bounds[QUEUED - 1..], [rest, rest], "then the bound of the keys not queued");
        assert_eq!((q.first(), q.group), (None, 3));
    }
}
