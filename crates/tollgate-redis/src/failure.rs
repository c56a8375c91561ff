//! [`FailurePolicy`]: who decides when Redis cannot, within the deadline.

use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tollgate::{Keyed, Lease, Meta, Quota, QuotaError, Reason, Rejected, SystemClock, TokenBucket};

/// What a distributed limiter answers when Redis fails or misses its deadline. The outcome's
/// [`Reason`] says so ([`Reason::Unavailable`], [`Reason::FailOpen`], [`Reason::Fallback`]), so
/// "limited" and "Redis was down" are never confused.
#[derive(Clone, Default)]
pub enum FailurePolicy {
    /// Reject (fail closed). The default: a limit that silently stops limiting is worse.
    #[default]
    Deny,
    /// Admit (fail open). Over-admits by everything asked during the outage.
    Allow,
    /// Decide with an in-memory limiter, per key, and count what it granted in Redis when Redis
    /// answers again (see [`LocalFallback`]).
    Local(Arc<LocalFallback>),
}

impl FailurePolicy {
    /// A local token bucket per key with `quota` split across `replicas` processes (each gets
    /// `limit / replicas`, at least 1), so the replicas together stay near the global limit.
    pub fn local_share(quota: Quota, replicas: u64) -> Result<FailurePolicy, QuotaError> {
        let replicas = replicas.max(1);
        let share = Quota::per(quota.period(), (quota.limit() / replicas).max(1))?
            .with_burst((quota.burst() / replicas).max(1))?;
        Ok(FailurePolicy::Local(Arc::new(LocalFallback::new(share))))
    }

    pub(crate) fn decide(&self, key: &str, n: u64, capacity: u64) -> Result<Lease, Rejected> {
        let meta = Meta { limit: capacity, remaining: 0, reset_ns: 0, retry_ns: None };
        match self {
            FailurePolicy::Deny => Err(Rejected::new(meta, n, Reason::Unavailable)),
            FailurePolicy::Allow => {
                Ok(Lease::new(Meta { remaining: capacity, ..meta }, n, 0).with_reason(Reason::FailOpen))
            }
            FailurePolicy::Local(local) => local.decide(key, n),
        }
    }

    /// What the local limiter granted for `key` that Redis has not counted yet, as a charge to
    /// send before the key's next decision (`None` for the other policies, or nothing owed).
    pub(crate) fn pending_charge(&self, key: &str) -> Option<Charge> {
        match self {
            FailurePolicy::Local(local) => local.pending_charge(key),
            _ => None,
        }
    }

    /// A decision's call to Redis is on its way until the returned guard is dropped (answered,
    /// failed, or given up at its deadline): a local fallback grants nothing meanwhile.
    pub(crate) fn calling(&self) -> Option<InFlight<'_>> {
        match self {
            FailurePolicy::Local(local) => {
                local.in_flight.fetch_add(1, Ordering::AcqRel);
                Some(InFlight(&local.in_flight))
            }
            _ => None,
        }
    }

    /// Redis answered a decision for `key`.
    pub(crate) fn answered(&self, key: &str) {
        if let FailurePolicy::Local(local) = self {
            local.answered(key);
        }
    }

    /// `charge` was counted in Redis.
    pub(crate) fn charged(&self, key: &str, charge: Charge) {
        if let FailurePolicy::Local(local) = self {
            local.charged(key, charge);
        }
    }
}

/// A call to Redis on its way ([`FailurePolicy::calling`]).
#[derive(Debug)]
pub(crate) struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a [`LocalFallback`] granted for one key in one outage, to count in Redis (`charge.lua`):
/// the outage's id and everything granted in it so far, not the part not yet counted. Redis keeps
/// the largest total it counted under the id, so a charge sent again after its answer was lost,
/// or a late copy landing after a later charge, counts nothing twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Charge {
    /// The outage's id, unique to this process's fallback and key.
    pub(crate) outage: u64,
    /// The permits granted in the outage so far.
    pub(crate) total: u64,
}

/// One key's outage, as [`LocalFallback`] keeps it until Redis has counted what it granted.
#[derive(Debug)]
struct Debt {
    outage: u64,
    granted: u64,
    /// The largest total Redis has confirmed counting.
    counted: u64,
}

impl std::fmt::Debug for FailurePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FailurePolicy::Deny => f.write_str("Deny"),
            FailurePolicy::Allow => f.write_str("Allow"),
            FailurePolicy::Local(local) => f.debug_tuple("Local").field(local).finish(),
        }
    }
}

/// The in-memory limiter of [`FailurePolicy::Local`], made to keep the bound across an outage:
///
/// - a key's local bucket starts each outage **empty**: it does not know how much of its burst
///   Redis granted just before, so it grants only what the rate earns from the outage's start,
///   never a second burst on top of Redis's;
/// - it grants nothing while a call to Redis is on its way (one that has neither been answered
///   nor passed its deadline): a slow Redis may still answer that call, granting from a bucket
///   that does not know of the local grants, and both would count the same permits. A call sent
///   once the local grants exist carries their charge ahead of its decision, but grants made while
///   it travels would be unknown to it too. So while Redis is merely slow, Redis decides; the
///   fallback grants once its calls are answered or given up (a hung Redis: between the back-off's
///   probes);
/// - what it grants is owed to Redis: the first decision Redis answers for the key after the
///   outage first counts those permits there (`charge.lua`, one extra round trip, once), so Redis
///   does not grant them again. A charge that misses its deadline is sent again with the next
///   decision; it names its outage and carries the outage's total, and Redis counts only what no
///   charge of that outage counted before, so a late copy that lands too counts nothing twice.
///
/// Measured with the fault campaign's history checker (`tests/faults.rs`): a token bucket keeps
/// its bound over the whole run through a blackholed or hung Redis. The window algorithms count
/// the debt in the window open when Redis answers again; the window that was open when the outage
/// began may hold up to twice its limit (Redis's count plus the local grants).
///
/// ```
/// use tollgate::Quota;
/// use tollgate_redis::{FailurePolicy, LocalFallback};
/// let local = std::sync::Arc::new(LocalFallback::new(Quota::per_second(100)?));
/// let policy = FailurePolicy::Local(local.clone());
/// # let _ = policy;
/// assert_eq!(local.owed(), 0);
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
pub struct LocalFallback {
    limiter: Keyed<String, TokenBucket, SystemClock>,
    /// Per key in an outage: the permits granted, and how many of them Redis has counted.
    debts: Mutex<HashMap<String, Debt>>,
    /// The next outage's id: random at start (replicas share keys, and each counts its own
    /// outages), then one more per outage.
    next_outage: AtomicU64,
    /// Whether `debts` has any entry: the only thing a healthy decision reads.
    in_outage: AtomicBool,
    /// Calls to Redis on their way, of every key ([`FailurePolicy::calling`]).
    in_flight: AtomicUsize,
}

/// What a fallback decision refused because a call to Redis is on its way says to wait, at
/// least: the call is answered or given up within the deadline (50 ms by default).
const IN_FLIGHT_RETRY_NS: u64 = 1_000_000;

impl LocalFallback {
    /// A local token bucket per key with `quota`.
    pub fn new(quota: Quota) -> LocalFallback {
        LocalFallback::with_limiter(Keyed::new(TokenBucket::new(quota)))
    }

    /// Around a keyed token bucket of your own (its cap, shards, statistics).
    pub fn with_limiter(limiter: Keyed<String, TokenBucket, SystemClock>) -> LocalFallback {
        let first = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        LocalFallback {
            limiter,
            debts: Mutex::new(HashMap::new()),
            next_outage: AtomicU64::new(first),
            in_outage: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
        }
    }

    /// The local limiter.
    pub fn limiter(&self) -> &Keyed<String, TokenBucket, SystemClock> {
        &self.limiter
    }

    /// Permits granted locally that Redis has not counted yet, over all keys.
    pub fn owed(&self) -> u64 {
        self.debts.lock().unwrap_or_else(|e| e.into_inner()).values().map(|d| d.granted.saturating_sub(d.counted)).sum()
    }

    fn decide(&self, key: &str, n: u64) -> Result<Lease, Rejected> {
        let mut debts = self.debts.lock().unwrap_or_else(|e| e.into_inner());
        if !debts.contains_key(key) {
            // The outage's first decision for this key: start from an empty bucket.
            if let Ok(remaining) = self.limiter.check(key, 0).map(|m| m.remaining)
                && remaining > 0
            {
                // A token bucket's lease holds nothing to release: the permits stay taken.
                drop(self.limiter.try_acquire(key, remaining));
            }
            let outage = self.next_outage.fetch_add(1, Ordering::Relaxed);
            debts.insert(key.to_owned(), Debt { outage, granted: 0, counted: 0 });
            self.in_outage.store(true, Ordering::Relaxed);
        }
        if self.in_flight.load(Ordering::Acquire) > 0 {
            // Not now: Redis may yet grant what a call on its way asked (see the type's docs).
            let meta = self.limiter.check(key, 0).unwrap_or_else(|rejected| rejected.meta());
            let meta =
                Meta { remaining: 0, retry_ns: Some(meta.retry_ns.unwrap_or(0).max(IN_FLIGHT_RETRY_NS)), ..meta };
            return Err(Rejected::new(meta, n, Reason::Fallback));
        }
        match self.limiter.try_acquire(key, n) {
            Ok(lease) => {
                if let Some(debt) = debts.get_mut(key) {
                    debt.granted += n;
                }
                Ok(lease.with_reason(Reason::Fallback))
            }
            Err(rejected) => Err(rejected.because(Reason::Fallback)),
        }
    }

    /// A lease it granted, given back: restored locally, and no longer owed.
    pub(crate) fn give_back(&self, key: &str, lease: Lease) {
        let n = lease.permits();
        if let Some(debt) = self.debts.lock().unwrap_or_else(|e| e.into_inner()).get_mut(key) {
            // Below what Redis counted, the charge counts nothing more (the safe side).
            debt.granted = debt.granted.saturating_sub(n);
        }
        self.limiter.give_back(key, lease);
    }

    /// A key reset ([`crate::RedisLimiter::reset`]): its local state and its debt are dropped.
    pub(crate) fn forget(&self, key: &str) {
        self.end_outage(&mut self.debts.lock().unwrap_or_else(|e| e.into_inner()), key);
        self.limiter.reset(key);
    }

    fn pending_charge(&self, key: &str) -> Option<Charge> {
        if !self.in_outage.load(Ordering::Relaxed) {
            return None;
        }
        let debts = self.debts.lock().unwrap_or_else(|e| e.into_inner());
        let debt = debts.get(key).filter(|d| d.granted > d.counted)?;
        Some(Charge { outage: debt.outage, total: debt.granted })
    }

    /// Redis answered a decision for `key`: an outage that owes nothing is over. (Not before: a
    /// key whose first fallback decisions granted nothing is still in its outage, its bucket
    /// still emptied once.)
    fn answered(&self, key: &str) {
        if !self.in_outage.load(Ordering::Relaxed) {
            return;
        }
        let mut debts = self.debts.lock().unwrap_or_else(|e| e.into_inner());
        if debts.get(key).is_some_and(|d| d.granted <= d.counted) {
            self.end_outage(&mut debts, key);
        }
    }

    fn charged(&self, key: &str, charge: Charge) {
        let mut debts = self.debts.lock().unwrap_or_else(|e| e.into_inner());
        // Another outage's entry (this one ended, and Redis failed again meanwhile) owes its own.
        let Some(debt) = debts.get_mut(key).filter(|d| d.outage == charge.outage) else { return };
        debt.counted = debt.counted.max(charge.total);
        if debt.granted <= debt.counted {
            self.end_outage(&mut debts, key);
        }
    }

    fn end_outage(&self, debts: &mut HashMap<String, Debt>, key: &str) {
        debts.remove(key);
        if debts.is_empty() {
            self.in_outage.store(false, Ordering::Relaxed);
        }
    }
}

impl std::fmt::Debug for LocalFallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalFallback").field("limiter", &self.limiter).field("owed", &self.owed()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// While a call to Redis is on its way, a fallback decision grants nothing (Redis may still
    /// grant the same permits); once it is answered or given up, the rate's permits are granted.
    #[test]
    fn nothing_is_granted_locally_while_a_call_to_redis_is_on_its_way() {
        let quota = Quota::per_second(1000).unwrap().with_burst(10).unwrap();
        let policy = FailurePolicy::local_share(quota, 1).unwrap();
        let FailurePolicy::Local(local) = &policy else { unreachable!() };
        let call = policy.calling();
        let refused = policy.decide("k", 1, 10).unwrap_err();
        assert_eq!(refused.reason(), Reason::Fallback);
        assert!(refused.retry_after().is_some_and(|d| d >= std::time::Duration::from_millis(1)), "{refused:?}");
        assert_eq!(local.owed(), 0);
        let second = policy.calling();
        drop(call);
        assert!(policy.decide("k", 1, 10).is_err(), "one call is still on its way");
        drop(second);
        // The outage's bucket started empty: the first permit comes with the rate (1 ms).
        let started = std::time::Instant::now();
        while policy.decide("k", 1, 10).is_err() {
            assert!(started.elapsed() < std::time::Duration::from_secs(5), "never granted");
            std::thread::yield_now();
        }
        assert_eq!(local.owed(), 1);
        // The other policies have no fallback to hold back.
        assert!(FailurePolicy::Deny.calling().is_none());
    }
}
