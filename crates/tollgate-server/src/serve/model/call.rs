//! One call and its answer: what it asks ([`Action`]), how a store decides it ([`Mode`]), and
//! what comes back ([`Outcome`], one [`Status`] per counter), or why nothing was decided
//! ([`CallError`]). Protocols turn these into their own replies.

use std::sync::Arc;

use tollgate::Meta;
use tollgate_policy::{Enforcement, Limit};

use super::bounds::Oversize;
use super::loaded::Loaded;

/// Accuracy vs throughput, as seed 003 defines them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// All counters a request touches are checked and updated together, under locks on those
    /// counters only: no overshoot, no undershoot, whatever the concurrency.
    Accuracy,
    /// Each counter is updated on its own and a rejection gives back what it took: faster, but a
    /// concurrent request can see a counter that is briefly too high (overshoot, measured by
    /// `tollgate bench`).
    Throughput,
}

/// What a call asks for (Limitador's three HTTP endpoints; Envoy's RLS is `CheckAndReport`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Would `delta` hits be allowed? Counts nothing.
    Check,
    /// Count `delta` hits without deciding; a counter saturates at its limit.
    Report,
    /// Decide and, if allowed, count: all counters or none.
    CheckAndReport,
}

/// One counter's part in a decision.
#[derive(Clone, Debug)]
pub struct Status {
    /// Index of the limit in the policy's limits (see [`Outcome::limit`]).
    pub limit: usize,
    /// The descriptor the counter is attributed to.
    pub descriptor: usize,
    /// The hits the call asked of this counter (its descriptor's own `hits_addend`, else the
    /// request's), whether they were taken or not.
    pub hits: u64,
    /// The counter's state after the decision.
    pub meta: Meta,
    /// True when this counter (alone) did not have room for the request.
    pub limited: bool,
    /// The hits the counter holds past its limit: a limit that [counts
    /// past](Limit::counts_past) it counts every hit (`meta` says 0 remaining then); 0 for the
    /// others.
    pub past: u64,
    /// True when the hits were charged whatever the call's outcome (a limit that counts past
    /// its limit, on a storage that [charges it](super::StorageKind::counts_past)).
    pub charged: bool,
}

/// The result of one call.
pub struct Outcome {
    loaded: Arc<Loaded>,
    /// Every counter the request touched.
    pub statuses: Vec<Status>,
    /// The answer to give: false means "limited" (HTTP 429, RLS `OVER_LIMIT`).
    pub allowed: bool,
    /// True when an enforcing limit said no, or every pooled limit of the call is over; differs
    /// from `!allowed` only in shadow mode (`--shadow`). Shadow and quota limits never set it:
    /// see [`Outcome::marked`].
    pub would_limit: bool,
    /// The statistics keys of the counters whose limit keeps statistics per value (limit,
    /// descriptor, key; see [`Limit::stats_key`]).
    stats_keys: Vec<(usize, usize, String)>,
}

impl Outcome {
    /// The outcome of a call decided on `loaded` with `statuses`: limited when an enforcing
    /// limit had no room, allowed anyway in shadow mode.
    /// Pooled limits (envoy/ratelimit's `quota_mode`) limit it when every one it touched is over
    /// (an unlimited one is not counted, as envoy/ratelimit skips it). Each status's state is as
    /// its limit reports it ([`Limit::reported`]), what it holds past the limit in `past`.
    pub(crate) fn new(loaded: Arc<Loaded>, mut statuses: Vec<Status>, shadow: bool) -> Outcome {
        let limits = loaded.policy.limits();
        let mut pooled = (0, 0);
        for status in &mut statuses {
            let limit = &limits[status.limit];
            if limit.counts_past() && !limit.unlimited() {
                status.past = limit.count(status.meta).saturating_sub(limit.max_value());
                status.meta = limit.reported(status.meta);
            }
            if limit.enforcement() == Enforcement::Pooled && !limit.unlimited() {
                pooled = (pooled.0 + 1, pooled.1 + usize::from(status.limited));
            }
        }
        let enforced = statuses.iter().any(|s| s.limited && limits[s.limit].enforcement().denies());
        let would_limit = enforced || (pooled.0 > 0 && pooled.0 == pooled.1);
        Outcome { loaded, statuses, allowed: !would_limit || shadow, would_limit, stats_keys: Vec::new() }
    }

    /// The outcome with the statistics keys of its per-value counters: (limit, descriptor, key).
    pub(crate) fn with_stats_keys(self, stats_keys: Vec<(usize, usize, String)>) -> Outcome {
        Outcome { stats_keys, ..self }
    }

    /// The key of a status's statistics when its limit keeps them per value
    /// ([`Limit::stats_key`]).
    pub fn stats_key(&self, status: &Status) -> Option<&str> {
        let found = self.stats_keys.iter().find(|(l, d, _)| *l == status.limit && *d == status.descriptor);
        found.map(|(_, _, key)| key.as_str())
    }

    /// The limit a status is about.
    pub fn limit(&self, status: &Status) -> &Limit {
        &self.loaded.policy.limits()[status.limit]
    }

    /// The hits a status's counter allows per window: its limit's `max_value`, or the request's
    /// own for a limit [set by requests](Limit::set_by_request) (the stores report its counters
    /// against it).
    pub fn max_value(&self, status: &Status) -> u64 {
        let limit = self.limit(status);
        if limit.set_by_request() { status.meta.limit } else { limit.max_value() }
    }

    /// The limits that decided.
    pub fn loaded(&self) -> &Loaded {
        &self.loaded
    }

    /// The generation of the limits that decided.
    pub fn generation(&self) -> u64 {
        self.loaded.generation
    }

    /// True when the limits that decided have a limit in `namespace`.
    pub fn names_namespace(&self, namespace: &str) -> bool {
        !self.loaded.policy.namespace_indexes(namespace).is_empty()
    }

    /// The counters without room whose limit did not deny: shadow limits (and every limit under
    /// `--shadow`), quota limits and pooled ones, with what each did instead.
    pub fn marked(&self) -> impl Iterator<Item = (&Status, Enforcement)> + '_ {
        self.statuses.iter().filter(|s| s.limited).filter_map(move |s| match self.limit(s).enforcement() {
            Enforcement::Enforce if self.allowed => Some((s, Enforcement::Shadow)),
            Enforcement::Enforce => None,
            other => Some((s, other)),
        })
    }

    /// The names (or ids, for unnamed limits) of the quota and pooled limits this call exceeded.
    pub fn quotas_exceeded(&self) -> Vec<String> {
        self.marked()
            .filter(|(_, e)| matches!(e, Enforcement::Quota | Enforcement::Pooled))
            .map(|(s, _)| {
                let limit = self.limit(s);
                limit.name().map_or_else(|| limit.id().to_string(), str::to_string)
            })
            .collect()
    }
}

/// Why [`Engine::call`](crate::serve::Engine::call) decided nothing.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The request is over one of the [`RequestBounds`](super::RequestBounds) (HTTP 400, gRPC `INVALID_ARGUMENT`).
    #[error(transparent)]
    Oversize(#[from] Oversize),
    /// The storage could not answer: Redis down or slow (HTTP 503, gRPC `UNAVAILABLE`).
    #[error("counter storage unavailable: {0}")]
    Storage(#[from] tollgate_redis::BackendError),
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outcome")
            .field("allowed", &self.allowed)
            .field("would_limit", &self.would_limit)
            .field("statuses", &self.statuses)
            .field("generation", &self.loaded.generation)
            .finish()
    }
}
