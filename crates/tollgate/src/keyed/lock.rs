//! The lock over each shard's table: a type parameter of the engine, so that one build can run
//! the same decisions behind the biased lock ([`Keyed`](crate::Keyed)'s) and behind `std`'s
//! `RwLock` (`benches/keyed_lock.rs`, with the `bench-locks` feature).

use std::ops::DerefMut;

use crate::biased_lock::{self, BiasedLock};
use crate::sync::{RwLock, RwLockWriteGuard};

/// A reader-writer lock as the engine uses it: short reads in a closure (a decision), long
/// reads in a closure (a pass over the shard), and a write guard.
pub(super) trait TableLock<T> {
    /// Exclusive access; the lock is left when it is dropped.
    type Write<'a>: DerefMut<Target = T>
    where
        Self: 'a;

    fn new(value: T) -> Self;

    /// Calls `f` with shared access, for a short read.
    fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R;

    /// Calls `f` with shared access, for a read that may take long.
    fn read_shared<R>(&self, f: impl FnOnce(&T) -> R) -> R;

    fn write(&self) -> Self::Write<'_>;
}

impl<T> TableLock<T> for BiasedLock<T> {
    type Write<'a>
        = biased_lock::WriteGuard<'a, T>
    where
        T: 'a;

    fn new(value: T) -> Self {
        BiasedLock::new(value)
    }

    #[inline(always)]
    fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        BiasedLock::read(self, f)
    }

    fn read_shared<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        BiasedLock::read_shared(self, f)
    }

    fn write(&self) -> Self::Write<'_> {
        BiasedLock::write(self)
    }
}

/// `std`'s `RwLock`, every read through it: what the biased lock is measured against.
#[cfg_attr(not(feature = "bench-locks"), allow(dead_code))]
pub(super) struct PlainLock<T>(RwLock<T>);

impl<T> TableLock<T> for PlainLock<T> {
    type Write<'a>
        = RwLockWriteGuard<'a, T>
    where
        T: 'a;

    fn new(value: T) -> Self {
        PlainLock(RwLock::new(value))
    }

    #[inline(always)]
    fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.0.read().unwrap_or_else(|e| e.into_inner()))
    }

    fn read_shared<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.0.read().unwrap_or_else(|e| e.into_inner()))
    }

    fn write(&self) -> Self::Write<'_> {
        self.0.write().unwrap_or_else(|e| e.into_inner())
    }
}
