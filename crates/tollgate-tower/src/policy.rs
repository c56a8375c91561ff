//! A [`Policy`]: a name, a key, a limit and a cost; [`Policies`] combine them all-or-nothing.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tollgate::{Lease, Meta, Rejected};

use crate::key::{KeyExtractor, RequestInfo};
use crate::limit::Limit;

/// What to do with a request whose key cannot be extracted (no peer address, no header...).
#[derive(Clone, Debug)]
pub enum MissingKey<K> {
    /// Answer with this status (e.g. 400 Bad Request) without calling the service.
    Reject(StatusCode),
    /// Let it through without counting it.
    Allow,
    /// Count it against this one shared key.
    Shared(K),
}

/// Permits a request costs.
pub type CostFn = Arc<dyn Fn(&RequestInfo<'_>) -> u64 + Send + Sync>;

/// One limit applied to requests: which key they count under, how much each costs.
///
/// ```
/// use std::sync::Arc;
/// use tollgate::{Keyed, Quota, TokenBucket};
/// use tollgate_tower::{ClientIp, MissingKey, Policy};
/// let per_ip = Policy::new("per-ip", ClientIp::new(), Keyed::new(TokenBucket::new(Quota::per_minute(60)?)))
///     .cost(|req| if req.method == http::Method::POST { 5 } else { 1 })
///     .on_missing_key(MissingKey::Reject(http::StatusCode::BAD_REQUEST));
/// # let _ = per_ip;
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
pub struct Policy<X: KeyExtractor, L> {
    name: Arc<str>,
    key: X,
    limit: Arc<L>,
    cost: Option<CostFn>,
    missing: MissingKey<X::Key>,
}

impl<X: KeyExtractor, L> Clone for Policy<X, L> {
    fn clone(&self) -> Self {
        Policy {
            name: self.name.clone(),
            key: self.key.clone(),
            limit: self.limit.clone(),
            cost: self.cost.clone(),
            missing: self.missing.clone(),
        }
    }
}

impl<X: KeyExtractor, L: Limit<X::Key>> Policy<X, L> {
    /// A policy named `name` (it appears in the `RateLimit` headers), keyed by `key`, limited by
    /// `limit`. Each request costs 1 permit; requests without a key are rejected with 400.
    pub fn new(name: &str, key: X, limit: L) -> Self {
        Self::shared(name, key, Arc::new(limit))
    }

    /// Like [`Policy::new`] with a limit that is also used elsewhere.
    pub fn shared(name: &str, key: X, limit: Arc<L>) -> Self {
        Policy { name: name.into(), key, limit, cost: None, missing: MissingKey::Reject(StatusCode::BAD_REQUEST) }
    }

    /// Permits a request costs, e.g. by route or by `Content-Length`. A cost of 0 lets the
    /// request through without counting it.
    pub fn cost(mut self, cost: impl Fn(&RequestInfo<'_>) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// What to do when the key cannot be extracted (default: reject with 400).
    pub fn on_missing_key(mut self, missing: MissingKey<X::Key>) -> Self {
        self.missing = missing;
        self
    }

    /// The limit this policy asks.
    pub fn limit(&self) -> &Arc<L> {
        &self.limit
    }
}

/// The state of one policy after a decision, for the response headers.
#[derive(Clone, Debug)]
pub struct PolicyState {
    /// The policy's name.
    pub name: Arc<str>,
    /// Metadata of the decision.
    pub meta: Meta,
    /// The quota's window, if it has one.
    pub window: Option<Duration>,
}

/// Why a request was turned away.
#[derive(Clone, Debug)]
pub struct Denied {
    /// The status to answer with (the layer's configured status, or the missing-key status).
    pub status: StatusCode,
    /// The policy that said no.
    pub policy: PolicyState,
    /// The limiter's rejection; `None` when the request had no key.
    pub rejected: Option<Rejected>,
}

/// One or more policies decided together, all-or-nothing.
pub trait Policies: Clone + Send + Sync + 'static {
    /// What an admitted request holds until its response body ends.
    type Permit: Send + 'static;

    /// Decides on a request; `status` is what a rejection answers with.
    fn decide(&self, req: &RequestInfo<'_>, status: StatusCode) -> Result<Self::Permit, Box<Denied>>;

    /// Undoes an admission (a later policy said no).
    fn give_back(&self, permit: Self::Permit);

    /// True when dropping the permit releases something (a concurrency limit), so it must be
    /// held until the response body ends.
    fn holds(permit: &Self::Permit) -> bool;

    /// Appends the state of each policy to `out`, for the response headers.
    fn describe(&self, permit: &Self::Permit, out: &mut Vec<PolicyState>);
}

/// What one [`Policy`] holds for an admitted request.
pub struct PolicyPermit<K> {
    taken: Option<(K, Lease)>,
}

impl<X: KeyExtractor, L: Limit<X::Key>> Policies for Policy<X, L> {
    type Permit = PolicyPermit<X::Key>;

    #[inline]
    fn decide(&self, req: &RequestInfo<'_>, status: StatusCode) -> Result<Self::Permit, Box<Denied>> {
        let key = match self.key.extract(req) {
            Some(key) => key,
            None => match &self.missing {
                MissingKey::Allow => return Ok(PolicyPermit { taken: None }),
                MissingKey::Shared(k) => k.clone(),
                MissingKey::Reject(status) => {
                    let policy = PolicyState { name: self.name.clone(), meta: Meta::default(), window: None };
                    return Err(Box::new(Denied { status: *status, policy, rejected: None }));
                }
            },
        };
        let n = self.cost.as_ref().map_or(1, |c| c(req));
        if n == 0 {
            return Ok(PolicyPermit { taken: None });
        }
        match self.limit.try_acquire(&key, n) {
            Ok(lease) => Ok(PolicyPermit { taken: Some((key, lease)) }),
            Err(rejected) => {
                let policy =
                    PolicyState { name: self.name.clone(), meta: rejected.meta(), window: self.limit.window() };
                Err(Box::new(Denied { status, policy, rejected: Some(rejected) }))
            }
        }
    }

    fn give_back(&self, permit: Self::Permit) {
        if let Some((key, lease)) = permit.taken {
            self.limit.give_back(&key, lease);
        }
    }

    fn holds(permit: &Self::Permit) -> bool {
        permit.taken.as_ref().is_some_and(|(_, lease)| lease.releases_on_drop())
    }

    fn describe(&self, permit: &Self::Permit, out: &mut Vec<PolicyState>) {
        if let Some((_, lease)) = &permit.taken {
            out.push(PolicyState { name: self.name.clone(), meta: lease.meta(), window: self.limit.window() });
        }
    }
}

/// Two policies, all-or-nothing: when the second rejects, the first's admission is given back.
#[derive(Clone)]
pub struct Both<A, B>(pub A, pub B);

impl<A: Policies, B: Policies> Policies for Both<A, B> {
    type Permit = (A::Permit, B::Permit);

    #[inline]
    fn decide(&self, req: &RequestInfo<'_>, status: StatusCode) -> Result<Self::Permit, Box<Denied>> {
        let a = self.0.decide(req, status)?;
        match self.1.decide(req, status) {
            Ok(b) => Ok((a, b)),
            Err(denied) => {
                self.0.give_back(a);
                Err(denied)
            }
        }
    }

    fn give_back(&self, (a, b): Self::Permit) {
        self.1.give_back(b);
        self.0.give_back(a);
    }

    fn holds((a, b): &Self::Permit) -> bool {
        A::holds(a) || B::holds(b)
    }

    fn describe(&self, (a, b): &Self::Permit, out: &mut Vec<PolicyState>) {
        self.0.describe(a, out);
        self.1.describe(b, out);
    }
}
