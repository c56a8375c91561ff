//! The counters of one limit in memory: one keyed limiter per limit, keyed by the values of the
//! limit's variables.

use tollgate::{Clock, FixedWindow, Keyed, Lease, Meta, Rejected, SlidingWindow, TokenBucket, WeightedWindow};
use tollgate_policy::{AlgorithmKind, Limit};

/// Idle counters are swept before a table grows; this caps the rest so that a flood of distinct
/// variable values cannot take the server's memory (over it, requests are rejected: `KeyLimit`).
const MAX_COUNTERS_PER_LIMIT: usize = 10_000_000;

/// Sliding windows are counted in this many segments.
const SLIDING_SEGMENTS: u64 = tollgate_policy::SLIDING_SEGMENTS;

pub(crate) enum Counters<C: Clock> {
    Fixed(Keyed<Vec<String>, FixedWindow, C>),
    Bucket(Keyed<Vec<String>, TokenBucket, C>),
    Sliding(Keyed<Vec<String>, SlidingWindow, C>),
    Weighted(Keyed<Vec<String>, WeightedWindow, C>),
}

macro_rules! each {
    ($self:expr, $k:ident => $body:expr) => {
        match $self {
            Counters::Fixed($k) => $body,
            Counters::Bucket($k) => $body,
            Counters::Sliding($k) => $body,
            Counters::Weighted($k) => $body,
        }
    };
}

impl<C: Clock + Clone> Counters<C> {
    pub(crate) fn new(limit: &Limit, clock: &C) -> Counters<C> {
        // The policy crate validated the quota when it read the file.
        let quota = limit.quota().expect("a validated limit has a usable quota");
        let cap = std::num::NonZeroUsize::new(MAX_COUNTERS_PER_LIMIT).expect("nonzero");
        match limit.algorithm() {
            AlgorithmKind::FixedWindow => {
                Counters::Fixed(Keyed::builder(FixedWindow::new(quota)).clock(clock.clone()).max_keys(cap).build())
            }
            AlgorithmKind::TokenBucket => {
                Counters::Bucket(Keyed::builder(TokenBucket::new(quota)).clock(clock.clone()).max_keys(cap).build())
            }
            AlgorithmKind::SlidingWindow => Counters::Sliding(
                Keyed::builder(
                    SlidingWindow::new(quota, SLIDING_SEGMENTS).expect("segments fit a whole-second window"),
                )
                .clock(clock.clone())
                .max_keys(cap)
                .build(),
            ),
            AlgorithmKind::WeightedWindow => Counters::Weighted(
                Keyed::builder(WeightedWindow::new(quota)).clock(clock.clone()).max_keys(cap).build(),
            ),
        }
    }

    pub(crate) fn check(&self, key: &[String], n: u64) -> Result<Meta, Rejected> {
        each!(self, k => k.check(key, n))
    }

    pub(crate) fn take(&self, key: &[String], n: u64) -> Result<Lease, Rejected> {
        each!(self, k => k.try_acquire(key, n))
    }

    pub(crate) fn give_back(&self, key: &[String], lease: Lease) {
        each!(self, k => k.give_back(key, lease))
    }

    /// A new `max_value` for a kept limit: each counter carries over by its algorithm's rule.
    pub(crate) fn set_quota(&self, quota: tollgate::Quota) {
        each!(self, k => k.set_quota(quota))
    }

    pub(crate) fn for_each(&self, f: impl FnMut(&Vec<String>, Meta)) {
        each!(self, k => k.for_each(f))
    }
}
