//! Atomics, locks and cells, swapped for loom's under `--cfg tollgate_loom` so the model checker
//! can explore every interleaving. Every atomic of the crate comes from here (the queue's locks
//! too, so that loom can model a waiter's hand-off); the algorithms' own state locks are `std`'s.

#[cfg(tollgate_loom)]
pub(crate) use loom::cell::{MutPtr, UnsafeCell};
#[cfg(tollgate_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
#[cfg(tollgate_loom)]
pub(crate) use loom::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

#[cfg(not(tollgate_loom))]
pub(crate) use cell::{MutPtr, UnsafeCell};

/// `std`'s `UnsafeCell` with the shape of loom's (pointers taken by `get`/`get_mut`, which loom
/// tracks so that it reports a read racing a write).
#[cfg(not(tollgate_loom))]
#[allow(unsafe_code)]
mod cell {
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) fn new(value: T) -> Self {
            UnsafeCell(std::cell::UnsafeCell::new(value))
        }

        #[inline]
        pub(crate) fn get(&self) -> ConstPtr<T> {
            ConstPtr(self.0.get())
        }

        #[inline]
        pub(crate) fn get_mut(&self) -> MutPtr<T> {
            MutPtr(self.0.get())
        }
    }

    pub(crate) struct ConstPtr<T>(*const T);

    impl<T> ConstPtr<T> {
        /// # Safety
        /// No `&mut T` to the cell's value may exist while the returned reference lives.
        #[inline]
        pub(crate) unsafe fn deref(&self) -> &T {
            // SAFETY: the caller's promise.
            unsafe { &*self.0 }
        }
    }

    pub(crate) struct MutPtr<T>(*mut T);

    impl<T> MutPtr<T> {
        /// # Safety
        /// No other reference to the cell's value may exist while the returned one lives.
        #[inline]
        #[allow(clippy::mut_from_ref)]
        pub(crate) unsafe fn deref(&self) -> &mut T {
            // SAFETY: the caller's promise.
            unsafe { &mut *self.0 }
        }

        /// Calls `f` with the raw pointer (as loom's `MutPtr::with`): for shared reads of a
        /// value held exclusively, without making a `&mut T` that would invalidate other `&T`s.
        #[inline]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0)
        }
    }
}

/// This thread's index among the threads that asked, from 0 up (wrapping at `usize::MAX`).
#[cfg(not(tollgate_loom))]
#[inline]
pub(crate) fn thread_index() -> usize {
    use std::cell::Cell;
    // Relaxed: any value is correct, the index only spreads threads apart.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    thread_local!(static INDEX: Cell<usize> = const { Cell::new(usize::MAX) });
    INDEX.with(|index| match index.get() {
        usize::MAX => {
            let i = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % (usize::MAX - 1);
            index.set(i);
            i
        }
        i => i,
    })
}

/// Under loom, counted afresh in every execution so that each one hands out the same indices.
#[cfg(tollgate_loom)]
pub(crate) fn thread_index() -> usize {
    use std::cell::Cell;
    loom::lazy_static! {
        static ref NEXT: loom::sync::atomic::AtomicUsize = loom::sync::atomic::AtomicUsize::new(0);
    }
    loom::thread_local!(static INDEX: Cell<usize> = Cell::new(usize::MAX));
    INDEX.with(|index| match index.get() {
        usize::MAX => {
            let i = NEXT.fetch_add(1, Ordering::Relaxed);
            index.set(i);
            i
        }
        i => i,
    })
}

/// Spins a little, then gives the processor away: for a wait that is expected to be short.
#[inline]
pub(crate) fn backoff(round: &mut u32) {
    if cfg!(tollgate_loom) {
        // Loom explores other threads only where one yields to it.
        #[cfg(tollgate_loom)]
        loom::thread::yield_now();
    } else if *round < 6 {
        (0..1u32 << *round).for_each(|_| std::hint::spin_loop());
        *round += 1;
    } else {
        std::thread::yield_now();
    }
}
