//! The expiry heap of one [`crate::Keyed`] shard: every stored key's hash, filed under a time no
//! later than the time its state goes idle, smallest first.
//!
//! Decisions on stored keys take only the shard's read lock, so they cannot re-file their key:
//! a record goes stale (too early) when its key takes permits, and is corrected only when it
//! reaches the top and is looked at again. Records are therefore lower bounds, and the top's
//! record, once checked against its state, is the shard's earliest idle time. Keys of an
//! algorithm that only a release makes idle ([`crate::Algorithm::releases_on_drop`]) are filed
//! under a rising counter instead, so the keys looked at go to the back: a clock hand.
//!
//! A record is 16 bytes (the time and the key's 64-bit hash); the heap holds one per stored key.
//! Two keys with the same 64-bit hash share their records: each record names one of them, so
//! a record may name the other key (which is then looked at sooner or later than its own time),
//! but the number of records per hash always equals the number of keys with that hash.

/// One record: a key's hash filed under `at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) at: u64,
    pub(crate) hash: u64,
}

/// A binary min-heap of [`Record`]s by `at`.
#[derive(Debug, Default)]
pub(crate) struct Expiry {
    heap: Vec<Record>,
    stamp: u64,
}

impl Expiry {
    /// The next value of the clock hand's counter.
    pub(crate) fn stamp(&mut self) -> u64 {
        self.stamp += 1;
        self.stamp
    }

    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    pub(crate) fn top(&self) -> Option<Record> {
        self.heap.first().copied()
    }

    pub(crate) fn push(&mut self, at: u64, hash: u64) {
        self.heap.push(Record { at, hash });
        self.sift_up(self.heap.len() - 1);
    }

    /// Re-files the top record under `at`.
    pub(crate) fn set_top(&mut self, at: u64) {
        if let Some(top) = self.heap.first_mut() {
            top.at = at;
            self.sift_down(0);
        }
    }

    /// Removes the top record.
    pub(crate) fn pop(&mut self) {
        if self.heap.is_empty() {
            return;
        }
        let last = self.heap.len() - 1;
        self.heap.swap(0, last);
        self.heap.pop();
        self.sift_down(0);
    }

    /// Removes one record of `hash` (its key was removed from the table), wherever it is in the
    /// heap: a search of every record, then one sift. False when no record has that hash.
    pub(crate) fn remove(&mut self, hash: u64) -> bool {
        let Some(i) = self.heap.iter().position(|r| r.hash == hash) else { return false };
        self.heap.swap_remove(i);
        if i < self.heap.len() {
            // The record moved into `i` came from a leaf: it may belong above or below `i`.
            self.sift_up(i);
            self.sift_down(i);
        }
        true
    }

    /// Replaces every record (after a pass over the whole shard).
    pub(crate) fn rebuild(&mut self, records: impl Iterator<Item = Record>) {
        self.heap.clear();
        self.heap.extend(records);
        self.heap.shrink_to_fit();
        for i in (0..self.heap.len() / 2).rev() {
            self.sift_down(i);
        }
    }

    fn sift_up(&mut self, mut i: usize) {
        let rec = self.heap[i];
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.heap[parent].at <= rec.at {
                break;
            }
            self.heap[i] = self.heap[parent];
            i = parent;
        }
        self.heap[i] = rec;
    }

    fn sift_down(&mut self, mut i: usize) {
        let len = self.heap.len();
        if i >= len {
            return;
        }
        let rec = self.heap[i];
        loop {
            let left = 2 * i + 1;
            if left >= len {
                break;
            }
            let right = left + 1;
            let child = if right < len && self.heap[right].at < self.heap[left].at { right } else { left };
            if self.heap[child].at >= rec.at {
                break;
            }
            self.heap[i] = self.heap[child];
            i = child;
        }
        self.heap[i] = rec;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_out_smallest_first_whatever_the_order_of_pushes_and_re_filings() {
        let mut e = Expiry::default();
        let times = [50u64, 10, 40, 30, 20, 60, 10, 0];
        for (h, &at) in times.iter().enumerate() {
            e.push(at, h as u64);
        }
        e.set_top(35); // 0 -> 35
        let mut out = Vec::new();
        while let Some(r) = e.top() {
            out.push(r.at);
            e.pop();
        }
        assert_eq!(out, [10, 10, 20, 30, 35, 40, 50, 60]);
        e.rebuild([5, 3, 9, 1].into_iter().map(|at| Record { at, hash: at }));
        assert_eq!((e.top().map(|r| r.at), e.len()), (Some(1), 4));
    }

    #[test]
    fn a_record_removed_from_anywhere_leaves_a_heap() {
        for removed in 0..16u64 {
            let mut e = Expiry::default();
            // Times out of order, hashes naming them: hash h is filed under (h * 7) % 16.
            for h in 0..16u64 {
                e.push((h * 7) % 16, h);
            }
            assert!(e.remove(removed));
            assert!(!e.remove(removed), "one record per hash");
            let mut out = Vec::new();
            while let Some(r) = e.top() {
                out.push(r);
                e.pop();
            }
            let expected: Vec<u64> = (0..16).filter(|&at| at != (removed * 7) % 16).collect();
            assert_eq!(out.iter().map(|r| r.at).collect::<Vec<_>>(), expected, "removed {removed}");
            assert!(out.iter().all(|r| r.hash != removed));
        }
    }
}
