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
//! Reads are closures (`lock.read(|value| ...)`), not guards: a forgotten guard would leave its
//! slot taken and wedge every later writer, which spins until the slot is left. A read cannot be
//! forgotten, and an unwinding one leaves its slot. Writes are guards, as `std`'s: a forgotten
//! write guard keeps the lock, as `std`'s does.
//!
//! Taking the same lock inside a read (for writing, or for reading while a writer waits) can
//! deadlock, as with `std`'s lock.
//!
//! Miri checks the borrows (`cargo +nightly miri test -p tollgate --lib biased_lock` with
//! `MIRIFLAGS=-Zmiri-disable-weak-memory-emulation`). With its weak-memory emulation on, it
//! reports a race between a reader in a slot and a writer, a false positive: its `SeqCst` model
//! is weaker than C++20's (rust-lang/miri#2301), under which the writer's load of a slot, coming
//! after the reader's claim in the single `SeqCst` order, reads the claim or the release that
//! ends the read, and so waits for it or synchronizes with it.

use std::ops::{Deref, DerefMut};

use crate::sync::{
    AtomicBool, MutPtr, Ordering, RwLock, RwLockReadGuard, RwLockWriteGuard, UnsafeCell, backoff, thread_index,
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

    /// Calls `f` with shared access: through this thread's slot when it is free and no writer is
    /// active, else through the underlying lock. For short reads: a writer waits for slot
    /// holders by spinning.
    ///
    /// A closure rather than a guard: a guard could be forgotten (`mem::forget`, a leaked `Box`)
    /// and leave its slot taken, and every later writer would spin for ever waiting for it. Here
    /// the slot is left when this call ends, by returning or by unwinding, and nothing that holds
    /// it reaches the caller. `f` is called from one place whichever way the read is held, so it
    /// is inlined once (two copies, one per way, cost a keyed decision ~20 instructions).
    #[inline(always)]
    pub(crate) fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        // Declared first, so dropped last: the access to the value ends (loom tracks it), then
        // the slot or the lock is left.
        let _held = self.enter();
        let value = self.value.get();
        // SAFETY: a writer takes `&mut T` only after it holds the underlying write lock (so no
        // reader holds it shared) and has seen every slot empty with the bias off (so no reader
        // is in a slot, or can enter one until it turns the bias back on, when it is done);
        // `_held` keeps this read's slot or shared lock until after the last use of this
        // reference, which cannot outlive `f`.
        f(unsafe { value.deref() })
    }

    /// Takes this thread's slot if it is free and the bias is on, else the underlying lock
    /// shared. Private: only [`BiasedLock::read`] holds what it returns, so it cannot be forgotten.
    #[inline(always)]
    fn enter(&self) -> Held<'_> {
        let slot = &self.slots.0[thread_index() % SLOTS];
        if slot.compare_exchange(false, true, Ordering::SeqCst, Ordering::Relaxed).is_ok() {
            #[cfg(tollgate_loom)]
            crate::sync::fence(Ordering::SeqCst);
            if self.bias.load(Ordering::SeqCst) {
                return Held::Slot(slot);
            }
            slot.store(false, Ordering::Release);
        }
        Held::Shared(self.lock.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Calls `f` with shared access through the underlying lock only: for reads that may take
    /// long (a pass over every value, a caller's closure), which writers then wait for without
    /// spinning. A closure for the same reason as [`BiasedLock::read`].
    pub(crate) fn read_shared<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        let _guard = self.lock.read().unwrap_or_else(|e| e.into_inner());
        let value = self.value.get();
        // SAFETY: a writer takes `&mut T` only under the underlying write lock, which `_guard`
        // keeps out until after the last use of this reference.
        f(unsafe { value.deref() })
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

/// What a read holds: its slot, or the underlying lock shared. Leaves the slot when the read
/// ends, also by unwinding. Private to this module and held only inside [`BiasedLock::read`].
enum Held<'a> {
    Slot(&'a AtomicBool),
    Shared(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
}

impl Drop for Held<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Held::Slot(slot) = self {
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
        // SAFETY: this guard is the only access (see `BiasedLock::write`), and no `&mut T` made
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
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// This thread's slot in `lock`.
    fn my_slot<T>(lock: &BiasedLock<T>) -> &AtomicBool {
        &lock.slots.0[thread_index() % SLOTS]
    }

    /// Runs a writer of `lock` on another thread; true when it got the lock within 5 s (a wedged
    /// writer fails the test instead of hanging it: its thread is left spinning).
    fn a_writer_completes(lock: &std::sync::Arc<BiasedLock<u64>>) -> bool {
        let (done, finished) = mpsc::channel();
        let lock = lock.clone();
        std::thread::spawn(move || {
            *lock.write() += 1;
            let _ = done.send(());
        });
        finished.recv_timeout(Duration::from_secs(5)).is_ok()
    }

    #[test]
    fn a_nested_read_takes_the_underlying_lock_and_both_leave() {
        let lock = BiasedLock::new(7);
        let sum = lock.read(|outer| {
            assert!(my_slot(&lock).load(Ordering::Relaxed), "the outer read is in the slot");
            lock.read(|inner| {
                assert!(lock.lock.try_write().is_err(), "the slot is taken by the outer read: the lock is");
                outer + inner
            })
        });
        assert_eq!(sum, 14);
        assert!(!my_slot(&lock).load(Ordering::Relaxed), "the slot was left");
        assert!(lock.lock.try_write().is_ok(), "the lock was left");
        let mut write = lock.write();
        // Two shared borrows of a write guard at once (sound only if `deref` makes no `&mut`:
        // Miri's borrow checks tell).
        let (a, b) = (&*write, &*write);
        assert_eq!(*a + *b, 14);
        *write += 1;
        drop(write);
        let in_slot = lock.read(|_| my_slot(&lock).load(Ordering::Relaxed));
        assert!(in_slot, "the writer turned the bias back on");
        assert_eq!(lock.read(|v| *v), 8);
    }

    /// What a reader can hold beyond its read, it can forget, and no writer waits for it: the
    /// slot is the read's, left when the closure returns. (With the guard this API replaced,
    /// `mem::forget(lock.read())` left the slot taken and this writer spun for ever.)
    #[test]
    fn forgetting_what_a_read_returned_leaves_no_slot_taken() {
        let lock = std::sync::Arc::new(BiasedLock::new(0u64));
        let (value, was_in_slot) = lock.read(|v| (Box::new(*v), my_slot(&lock).load(Ordering::Relaxed)));
        assert!(was_in_slot);
        std::mem::forget(value);
        assert!(!my_slot(&lock).load(Ordering::Relaxed));
        assert!(a_writer_completes(&lock), "a writer waited for ever for the forgotten read's slot");
        assert_eq!(lock.read(|v| *v), 1);
    }

    /// A read that unwinds leaves its slot (and a shared read its lock): writers still complete.
    #[test]
    fn a_read_that_panics_leaves_its_slot() {
        let lock = std::sync::Arc::new(BiasedLock::new(0u64));
        let in_slot = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            lock.read(|_| -> () {
                assert!(my_slot(&lock).load(Ordering::Relaxed));
                panic!("a reader's bug")
            })
        }));
        assert!(in_slot.is_err());
        assert!(!my_slot(&lock).load(Ordering::Relaxed), "the slot was left on unwinding");
        assert!(a_writer_completes(&lock), "a writer waited for ever for the panicked read's slot");
        let shared = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lock.read_shared(|_| panic!("again"))));
        assert!(shared.is_err());
        assert!(a_writer_completes(&lock), "a writer waited for ever for the panicked shared read");
        assert_eq!(lock.read(|v| *v), 2);
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
                            lock.read(|r| {
                                let first = r.0;
                                std::thread::yield_now();
                                assert_eq!(first, r.1, "a read overlapped a write");
                            });
                        }
                    }
                });
            }
        });
        assert_eq!(lock.read(|v| *v), (40 * threads as u64, 40 * threads as u64));
    }
}
