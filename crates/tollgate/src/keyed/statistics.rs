//! [`KeyedStatistics`]: what a [`Keyed`](crate::Keyed) limiter counts, gathered from its shards.

use std::hash::Hash;

use super::lock::TableLock;
use super::shards::{Inner, Table};
use crate::algorithm::Algorithm;
use crate::clock::Clock;
use crate::sync::Ordering;

/// Counters of a [`Keyed`](crate::Keyed) limiter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyedStatistics {
    /// Keys currently stored.
    pub keys: usize,
    /// What the stored keys weigh, by the function given to
    /// [`KeyedBuilder::max_key_bytes`](crate::KeyedBuilder::max_key_bytes) (0 without one).
    pub key_bytes: usize,
    /// Requests admitted so far (probes excluded); `None` unless built with
    /// [`KeyedBuilder::statistics`](crate::KeyedBuilder::statistics).
    pub admitted: Option<u64>,
    /// Requests rejected so far; `None` unless built with
    /// [`KeyedBuilder::statistics`](crate::KeyedBuilder::statistics).
    pub rejected: Option<u64>,
    /// Idle keys removed to make room or keep memory down (always counted; not those removed by
    /// [`Keyed::evict_idle`](crate::Keyed::evict_idle)).
    pub swept_idle: u64,
    /// Keys that were not idle, evicted at the cap for a new key
    /// ([`AtKeyLimit::EvictNearestIdle`](crate::AtKeyLimit::EvictNearestIdle)).
    pub evicted_at_limit: u64,
    /// New keys rejected at the cap ([`AtKeyLimit::Reject`](crate::AtKeyLimit::Reject)).
    pub rejected_at_limit: u64,
    /// New keys decided without being stored at the cap
    /// ([`AtKeyLimit::AdmitUnstored`](crate::AtKeyLimit::AdmitUnstored)).
    pub unstored_at_limit: u64,
}

impl<K, A: Algorithm, C: Clock, L: TableLock<Table<K, A::State>>> Inner<K, A, C, L>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// [`Keyed::statistics`](crate::Keyed::statistics): every shard's counters, summed.
    pub(super) fn statistics(&self) -> KeyedStatistics {
        let mut stats = KeyedStatistics::default();
        for shard in self.shards.iter() {
            let (keys, bytes, swept, evicted) = shard.table.read(|t| (t.map.len(), t.bytes, t.swept, t.evicted));
            stats.keys += keys;
            stats.key_bytes += bytes;
            stats.swept_idle += swept;
            stats.evicted_at_limit += evicted;
            stats.rejected_at_limit += shard.rejected.load(Ordering::Relaxed);
            stats.unstored_at_limit += shard.unstored.load(Ordering::Relaxed);
            let (admitted, rejected) = shard.counts.read();
            stats.admitted = admitted.map(|a| a + stats.admitted.unwrap_or(0));
            stats.rejected = rejected.map(|r| r + stats.rejected.unwrap_or(0));
        }
        stats
    }
}
