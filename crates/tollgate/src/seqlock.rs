//! A sequence lock over a few 64-bit words: readers never write shared memory (so they scale
//! across cores), the rare writer (a quota change) bumps a counter around its stores.
//!
//! This is how limiters read their configuration on every decision without a lock and without
//! seeing half of an old quota and half of a new one.

use std::sync::Mutex;

use crate::sync::{AtomicU64, Ordering, fence};

/// A value that can be stored as four 64-bit words.
pub(crate) trait Words: Copy {
    fn to_words(self) -> [u64; 4];
    fn from_words(w: [u64; 4]) -> Self;
}

pub(crate) struct SeqCell<T: Words> {
    seq: AtomicU64,
    words: [AtomicU64; 4],
    writer: Mutex<()>,
    _t: std::marker::PhantomData<T>,
}

impl<T: Words> SeqCell<T> {
    pub(crate) fn new(value: T) -> Self {
        let w = value.to_words();
        SeqCell {
            seq: AtomicU64::new(0),
            words: [AtomicU64::new(w[0]), AtomicU64::new(w[1]), AtomicU64::new(w[2]), AtomicU64::new(w[3])],
            writer: Mutex::new(()),
            _t: std::marker::PhantomData,
        }
    }

    #[inline]
    pub(crate) fn load(&self) -> T {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 0 {
                let w = [
                    self.words[0].load(Ordering::Relaxed),
                    self.words[1].load(Ordering::Relaxed),
                    self.words[2].load(Ordering::Relaxed),
                    self.words[3].load(Ordering::Relaxed),
                ];
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    return T::from_words(w);
                }
            }
            std::hint::spin_loop();
            #[cfg(tollgate_loom)]
            loom::thread::yield_now();
        }
    }

    /// Stores `value` and returns the previous one.
    pub(crate) fn store(&self, value: T) -> T {
        let _guard = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.load();
        let w = value.to_words();
        self.seq.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::Release);
        for (slot, v) in self.words.iter().zip(w) {
            slot.store(v, Ordering::Relaxed);
        }
        self.seq.fetch_add(1, Ordering::Release);
        old
    }
}

impl Words for crate::Quota {
    fn to_words(self) -> [u64; 4] {
        [self.limit(), self.period_ns(), self.burst(), self.emission_ns()]
    }
    fn from_words(w: [u64; 4]) -> Self {
        crate::Quota::from_parts(w[0], w[1], w[2], w[3])
    }
}

impl Words for u64 {
    fn to_words(self) -> [u64; 4] {
        [self, 0, 0, 0]
    }
    fn from_words(w: [u64; 4]) -> Self {
        w[0]
    }
}
