//! A reader-writer lock for data read on every decision and written rarely: while no writer is
//! active, a reader claims a slot of its own (one atomic read-modify-write, and a plain store to
//! leave) instead of counting itself in and out of the lock's word (two read-modify-writes). A
//! writer turns the bias off, waits for the slots to empty, and turns it back on when it is done.
//! The slots share one cache line (readers of one lock on two cores still pass it between them,
//! as they passed `std`'s lock word); what a reader saves is the second locked instruction.
//!
//! This is BRAVO (Dice and Kogan, "BRAVO: Biased Locking for Reader-Writer Locks", USENIX ATC
//! 2019) with the visible-readers table kept per lock: one cache line of [`SLOTS`] slots, so a
//! writer checks 16 bytes rather than a process-wide table, and can turn the bias back on as soon
//! as it leaves. A reader whose slot is taken (by a thread sharing its index, or by itself in a
//! nested read) or that finds the bias off uses the underlying lock, which is always correct.
//!
//! The reader's claim (a `SeqCst` read-modify-write of its slot, then a `SeqCst` load of the
//! bias) and the writer's revocation (a `SeqCst` store of the bias, then `SeqCst` loads of the
//! slots) are the two halves of Dekker's pattern: in the single order of `SeqCst` operations
//! either the writer sees the slot taken and waits, or the reader sees the bias off and falls
//! back. Loom models `SeqCst` accesses as acquire/release only, so under loom a `SeqCst` fence
//! (which it models exactly) stands between the two halves on each side.
//!
//! Holding a read guard while taking the same lock again (for reading or writing) can deadlock,
//! as with `std`'s lock.
//!
//! Miri checks the borrows (`cargo +nightly miri test -p tollgate --lib biased_lock` with
//! `MIRIFLAGS=-Zmiri-disable-weak-memory-emulation`). With its weak-memory emulation on, it
//! reports a race between a reader in a slot and a writer, a false positive: its `SeqCst` model
//! is weaker than C++20's (rust-lang/miri#2301), under which the writer's load of a slot, coming
//! after the reader's claim in the single `SeqCst` order, reads the claim or the release that
//! ends the read, and so waits for it or synchronizes with it.

use std::ops::{Deref, DerefMut};

use crate::sync::{
    AtomicBool, ConstPtr, MutPtr, Ordering, RwLock, RwLockReadGuard, RwLockWriteGuard, UnsafeCell, backoff,
    thread_index,
};

/// Slots per lock: threads with the same index modulo `SLOTS` share one (the second of two
/// readers at once takes the underlying lock). Two under loom, so that its models, with three
/// threads, have two share a slot (and a writer has fewer slots to wait for).
#[cfg(not(tollgate_loom))]
pub(crate) const SLOTS: usize = 16;
#[cfg(tollgate_loom)]
pub(crate) const SLOTS: usize = 2;

pub(crate) struct BiasedLock<T> {
    /// True while readers may claim a slot instead of taking `lock`; false while a writer holds it.
    bias: AtomicBool,
    lock: RwLock<()>,
    value: UnsafeCell<T>,
    slots: Slots,
}

/// On a cache line of their own: readers write them, and nothing else lives there to be
/// invalidated by those writes.
#[repr(align(64))]
struct Slots([AtomicBool; SLOTS]);

// SAFETY: the value is handed out as `&T` to readers on several threads at once (hence `Sync`
// for `T`) and as `&mut T` to one writer at a time, possibly on another thread (hence `Send`),
// exactly as `std::sync::RwLock` does.
unsafe impl<T: Send + Sync> Sync for BiasedLock<T> {}
// SAFETY: the lock owns its value.
unsafe impl<T: Send> Send for BiasedLock<T> {}

impl<T> BiasedLock<T> {
    pub(crate) fn new(value: T) -> Self {
        BiasedLock {
            bias: AtomicBool::new(true),
            lock: RwLock::new(()),
            value: UnsafeCell::new(value),
            slots: Slots(std::array::from_fn(|_| AtomicBool::new(false))),
        }
    }

    /// Shared access: through this thread's slot when it is free and no writer is active, else
    /// through the underlying lock. For short reads: a writer waits for slot holders by spinning.
    #[inline]
    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        let slot = &self.slots.0[thread_index() % SLOTS];
        if slot.compare_exchange(false, true, Ordering::SeqCst, Ordering::Relaxed).is_ok() {
            #[cfg(tollgate_loom)]
            crate::sync::fence(Ordering::SeqCst);
            if self.bias.load(Ordering::SeqCst) {
                return ReadGuard { value: self.value.get(), held: Held::Slot(slot) };
            }
            slot.store(false, Ordering::Release);
        }
        self.read_shared()
    }

    /// Shared access through the underlying lock only: for reads that may take long (a pass
    /// over every value, a caller's closure), which writers then wait for without spinning.
    pub(crate) fn read_shared(&self) -> ReadGuard<'_, T> {
        let guard = self.lock.read().unwrap_or_else(|e| e.into_inner());
        ReadGuard { value: self.value.get(), held: Held::Shared(guard) }
    }

    /// Exclusive access: waits for the underlying lock's other holders, turns the bias off and
    /// waits for readers in slots to leave.
    pub(crate) fn write(&self) -> WriteGuard<'_, T> {
        let guard = self.lock.write().unwrap_or_else(|e| e.into_inner());
        self.bias.store(false, Ordering::SeqCst);
        #[cfg(tollgate_loom)]
        crate::sync::fence(Ordering::SeqCst);
        for slot in &self.slots.0 {
            let mut round = 0;
            while slot.load(Ordering::SeqCst) {
                backoff(&mut round);
            }
        }
        WriteGuard { value: self.value.get_mut(), _rebias: Rebias(&self.bias), _guard: guard }
    }
}

/// Shared access to a [`BiasedLock`]'s value; leaves the slot or the lock when dropped.
pub(crate) struct ReadGuard<'a, T> {
    value: ConstPtr<T>,
    held: Held<'a>,
}

enum Held<'a> {
    Slot(&'a AtomicBool),
    Shared(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: a writer takes `&mut T` only after it holds the underlying write lock (so no
        // `Shared` guard exists) and has seen every slot empty with the bias off (so no `Slot`
        // guard exists or can be made until it turns the bias back on, when it is done).
        unsafe { self.value.deref() }
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        if let Held::Slot(slot) = self.held {
            // Release: what this reader read happens before what a writer waiting for it writes.
            slot.store(false, Ordering::Release);
        }
    }
}

/// Exclusive access to a [`BiasedLock`]'s value; turns the bias back on and leaves the lock when
/// dropped. Fields drop in this order: the access to the value ends (loom tracks it), then the
/// bias goes back on, then the underlying lock is left.
pub(crate) struct WriteGuard<'a, T> {
    value: MutPtr<T>,
    _rebias: Rebias<'a>,
    _guard: RwLockWriteGuard<'a, ()>,
}

/// Turns a lock's bias back on when its writer is done.
struct Rebias<'a>(&'a AtomicBool);

impl Drop for Rebias<'_> {
    fn drop(&mut self) {
        // Release: a reader that sees the bias on sees this writer's writes. The underlying lock
        // is still held here (the guard's last field), so no other writer is active.
        self.0.store(true, Ordering::Release);
    }
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: this guard is the only access (see `ReadGuard::deref`), and no `&mut T` made
        // through it lives while `&self` is borrowed. Through the raw pointer: a `&mut T` made
        // here would invalidate the `&T`s of earlier derefs that still live.
        self.value.with(|value| unsafe { &*value })
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard is the only access, and `&mut self` makes this reference the only one.
        unsafe { self.value.deref() }
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_nested_read_takes_the_underlying_lock_and_both_leave() {
        let lock = BiasedLock::new(7);
        {
            let outer = lock.read();
            assert!(matches!(outer.held, Held::Slot(_)));
            let inner = lock.read();
            assert!(matches!(inner.held, Held::Shared(_)), "the slot is taken by the outer read");
            assert_eq!(*outer + *inner, 14);
        }
        let mut write = lock.write();
        // Two shared borrows of a write guard at once (sound only if `deref` makes no `&mut`:
        // Miri's borrow checks tell).
        let (a, b) = (&*write, &*write);
        assert_eq!(*a + *b, 14);
        *write += 1;
        drop(write);
        assert!(matches!(lock.read().held, Held::Slot(_)), "the writer turned the bias back on");
        assert_eq!(*lock.read(), 8);
    }

    /// More threads than slots, reading a pair that writers keep equal: no reader ever sees a
    /// half-done write, and every write lands.
    #[test]
    fn readers_never_see_a_write_half_done() {
        let lock = BiasedLock::new((0u64, 0u64));
        let threads = 2 * SLOTS;
        std::thread::scope(|s| {
            for t in 0..threads {
                let lock = &lock;
                s.spawn(move || {
                    for i in 0..2_000 {
                        if (i + t) % 50 == 0 {
                            let mut w = lock.write();
                            w.0 += 1;
                            // Long enough for a reader let in by mistake to see the pair apart.
                            std::hint::black_box(&mut *w);
                            std::thread::yield_now();
                            w.1 += 1;
                        } else {
                            let r = lock.read();
                            let first = r.0;
                            std::thread::yield_now();
                            assert_eq!(first, r.1, "a read overlapped a write");
                        }
                    }
                });
            }
        });
        assert_eq!(*lock.read(), (40 * threads as u64, 40 * threads as u64));
    }
}
