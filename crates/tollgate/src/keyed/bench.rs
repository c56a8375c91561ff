//! [`KeyedOnRwLock`]: keyed decisions on a table whose shards sit behind `std`'s `RwLock`
//! instead of the biased lock, so that `benches/keyed_lock.rs` can run both in one build. Only
//! with the `bench-locks` feature; not API.

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::Arc;

use super::builder::KeyedBuilder;
use super::lock::PlainLock;
use super::shards::{Inner, Table};
use crate::algorithm::Algorithm;
use crate::clock::{Clock, SystemClock};
use crate::decision::{Lease, Rejected};

/// A [`Keyed`](crate::Keyed) limiter's engine with each shard behind `std`'s `RwLock`: for
/// `benches/keyed_lock.rs` only (the `bench-locks` feature), not API.
#[doc(hidden)]
pub struct KeyedOnRwLock<K, A: Algorithm, C: Clock = SystemClock> {
    inner: Arc<OnRwLock<K, A, C>>,
}

/// The engine with each shard behind `std`'s `RwLock`.
type OnRwLock<K, A, C> = Inner<K, A, C, PlainLock<Table<K, <A as Algorithm>::State>>>;

impl<K, A: Algorithm, C: Clock> KeyedBuilder<K, A, C> {
    /// The limiter [`KeyedBuilder::build`] makes, each shard behind `std`'s `RwLock`.
    #[doc(hidden)]
    pub fn build_on_rwlock(self) -> KeyedOnRwLock<K, A, C> {
        KeyedOnRwLock { inner: Arc::new(self.engine()) }
    }
}

impl<K, A: Algorithm, C: Clock> KeyedOnRwLock<K, A, C>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// [`Keyed::try_acquire`](crate::Keyed::try_acquire).
    #[inline]
    pub fn try_acquire<Q>(&self, key: &Q, n: u64) -> Result<Lease, Rejected>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.inner.decide(key, n, true).map(|(meta, now, stored)| self.inner.lease(key, meta, n, now, stored))
    }

    /// [`Keyed::len`](crate::Keyed::len).
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// [`Keyed::is_empty`](crate::Keyed::is_empty).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<K, A: Algorithm, C: Clock> std::fmt::Debug for KeyedOnRwLock<K, A, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedOnRwLock").field("shards", &self.inner.shards.len()).finish_non_exhaustive()
    }
}
