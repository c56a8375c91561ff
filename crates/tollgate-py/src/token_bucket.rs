//! `TokenBucket`: a GCRA token bucket in Redis (a [`RedisLimiter`]) shared by every process
//! that uses the same name, over [`BucketCore`], which `tollgate.sync.TokenBucket` shares.

use std::future::Future;
use std::sync::Arc;

use pyo3::prelude::*;
use tollgate::{Quota, RateLimiter, Reason};
use tollgate_redis::{AlgorithmKind, RedisLimiter};

use crate::args::{self, Seconds};
use crate::connection::{Lazy, Target};
use crate::decision::Decision;
use crate::errors;
use crate::reservation::{Pending, Refusal, Settler, Taken};

/// The key prefix and limit name of a Python `TokenBucket`: its Redis key is
/// `tollgate:{<name>}:token_bucket`, the key of the Rust
/// `RedisLimiter::builder(&redis, "tollgate", AlgorithmKind::TokenBucket).limit("token_bucket", quota)`
/// deciding for key `name`.
const PREFIX: &str = "tollgate";
const LIMIT: &str = "token_bucket";

/// What the async `TokenBucket` and `tollgate.sync.TokenBucket` share: the checked quota and the
/// Redis limiter, built on the connection at first use. Both classes on one name decide on the
/// same Redis key, so sync and async processes drain one bucket.
pub(crate) struct BucketCore {
    /// Also the Redis key decided on each call.
    name: Arc<str>,
    /// "token bucket \"name\"", for messages.
    label: Arc<str>,
    quota: Quota,
    refill_frequency: f64,
    refill_amount: u64,
    max_sleep: Option<f64>,
    lazy: Arc<Lazy<RedisLimiter>>,
}

impl BucketCore {
    /// Checks every argument (a `ValueError` names the bad one); connects nothing.
    pub(crate) fn new(
        name: String,
        capacity: i64,
        refill_frequency: Seconds,
        refill_amount: i64,
        max_sleep: Option<Seconds>,
        redis_url: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<BucketCore> {
        args::redis_name(&name)?;
        let quota = args::bucket_quota(capacity, &refill_frequency, refill_amount)?;
        let max_wait = args::max_sleep(max_sleep.as_ref())?;
        let target = Target::from_arg(redis_url)?;
        let lazy = Lazy::new(target, move |redis| {
            let mut builder = RedisLimiter::builder(redis, PREFIX, AlgorithmKind::TokenBucket).limit(LIMIT, quota);
            if let Some(max_wait) = max_wait {
                builder = builder.max_wait(max_wait);
            }
            builder.build().expect("one limit is always given")
        });
        let label = format!("token bucket {name:?}").into();
        Ok(BucketCore {
            name: name.into(),
            label,
            quota,
            refill_frequency: quota.period().as_secs_f64(),
            refill_amount: refill_amount as u64,
            max_sleep: max_wait.map(|d| d.as_secs_f64()),
            lazy,
        })
    }

    /// One token, waiting for it (at most `max_sleep` seconds): `MaxSleepExceededError` at once,
    /// taking nothing, when the wait would be longer; `RedisUnavailableError` when Redis fails.
    pub(crate) fn acquire(&self) -> impl Future<Output = PyResult<()>> + Send + 'static {
        let what = self.label.clone();
        let key = self.name.clone();
        let max_sleep = self.max_sleep;
        let url = self.lazy.url().clone();
        let ready = self.lazy.then(|limiter, redis| (limiter.clone(), redis.clone()));
        async move {
            let (limiter, redis) = ready.await?;
            match limiter.acquire(&key, 1).await {
                Ok(_) => Ok(()),
                Err(no) => Err(errors::rejection(&what, &no, max_sleep, &url, redis.last_error())),
            }
        }
    }

    /// `n` tokens now if the bucket has them; never waits. `n` is checked before anything runs.
    pub(crate) fn try_acquire(&self, n: i64) -> PyResult<impl Future<Output = PyResult<Decision>> + Send + 'static> {
        let n = args::count("n", n)?;
        let key = self.name.clone();
        let url = self.lazy.url().clone();
        let ready = self.lazy.then(|limiter, redis| (limiter.clone(), redis.clone()));
        Ok(async move {
            let (limiter, redis) = ready.await?;
            let decision = limiter.try_acquire(&key, n).await;
            match &decision {
                Err(no) if no.reason() == Reason::Unavailable => Err(errors::unavailable(&url, redis.last_error())),
                _ => Ok(Decision::from(decision)),
            }
        })
    }

    /// A reserve of `estimate` tokens (checked now), sent when run: the same decision as
    /// `try_acquire`, never waiting; the reservation settles on the same Redis key, once per
    /// reservation whatever the retries.
    pub(crate) fn reserve(&self, estimate: i64) -> PyResult<Pending> {
        let n = args::count("estimate", estimate)?;
        let what = self.label.clone();
        let key = self.name.clone();
        let url = self.lazy.url().clone();
        let ready = self.lazy.then(|limiter, redis| (limiter.clone(), redis.clone()));
        let reserve = {
            let (what, url) = (what.clone(), url.clone());
            async move {
                let (limiter, redis) = ready.await?;
                match RateLimiter::<str>::reserve(&limiter, &key, n).await {
                    Ok(reservation) => {
                        let settle: Settler =
                            Arc::new(move |r: tollgate::Reservation, actual| r.settle(&limiter, &*key, actual));
                        Ok(Ok(Taken::new(reservation, settle)))
                    }
                    Err(no) if no.reason() == Reason::Unavailable => Err(errors::unavailable(&url, redis.last_error())),
                    Err(no) => Ok(Err(Refusal::new(&what, n, no))),
                }
            }
        };
        Ok(Pending { what, url, estimate: n, reserve: Box::pin(reserve) })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.quota.burst()
    }

    pub(crate) fn refill_frequency(&self) -> f64 {
        self.refill_frequency
    }

    pub(crate) fn refill_amount(&self) -> u64 {
        self.refill_amount
    }

    pub(crate) fn max_sleep(&self) -> Option<f64> {
        self.max_sleep
    }

    /// `class(name=…, …)` with the URL's credentials hidden.
    pub(crate) fn repr(&self, class: &str) -> String {
        format!(
            "{class}(name={:?}, capacity={}, refill_frequency={}, refill_amount={}, max_sleep={}, redis_url={:?})",
            self.name,
            self.quota.burst(),
            self.refill_frequency,
            self.refill_amount,
            args::py_option(self.max_sleep),
            self.lazy.url().clone()
        )
    }
}

/// The `#[pymethods]` of a Python class over a [`BucketCore`] (the async `TokenBucket` and
/// `tollgate.sync.TokenBucket`): the constructor, the getters and `repr` (named `$repr`), written
/// once, around the class's own (waiting) methods.
macro_rules! bucket_methods {
    ($class:ident, $repr:literal; $($methods:tt)*) => {
        $crate::methods::core_methods! {
            $class, $repr, $crate::token_bucket::BucketCore;
            new (name, capacity, refill_frequency, refill_amount, max_sleep=None, redis_url=None) (
                name: String,
                capacity: i64,
                refill_frequency: $crate::args::Seconds,
                refill_amount: i64,
                max_sleep: Option<$crate::args::Seconds>,
                redis_url: Option<&::pyo3::Bound<'_, ::pyo3::PyAny>>,
            );
            getters {
                /// The name (shared by every process using this bucket).
                name -> &str;
                /// Most tokens at once.
                capacity -> u64;
                /// Seconds between refills of `refill_amount` tokens.
                refill_frequency -> f64;
                /// Tokens added per `refill_frequency`.
                refill_amount -> u64;
                /// Longest `acquire` waits, in seconds (`None`: unbounded).
                max_sleep -> Option<f64>;
            }
            $($methods)*
        }
    };
}
pub(crate) use bucket_methods;

/// A token bucket in Redis: `capacity` tokens, `refill_amount` more every `refill_frequency`
/// seconds (spread evenly, one every `refill_frequency / refill_amount` s), shared by every
/// process using the same `name`.
///
/// `async with bucket:` waits for a token: the token is reserved in the same round trip that
/// computes the wait, so callers are served in the order they reached Redis, and the time is
/// Redis's own (client clocks never mix).
#[pyclass(module = "tollgate._tollgate", name = "TokenBucket")]
pub struct TokenBucket(BucketCore);

bucket_methods! {
    TokenBucket, "TokenBucket";
    /// Waits for one token (at most `max_sleep` seconds). Raises `MaxSleepExceededError` at once,
    /// taking nothing, when the wait would be longer; `RedisUnavailableError` when Redis fails.
    fn acquire<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        crate::bridge::spawn(py, self.0.acquire())
    }

    /// Takes `n` tokens now if the bucket has them; never waits. Resolves to a `Decision`
    /// (`retry_after`: seconds until `n` tokens would be there).
    #[pyo3(signature = (n=1))]
    fn try_acquire<'py>(&self, py: Python<'py>, n: i64) -> PyResult<Bound<'py, PyAny>> {
        crate::bridge::spawn(py, self.0.try_acquire(n)?)
    }

    /// Reserves `estimate` tokens for work whose cost is known only afterwards (an LLM call's
    /// tokens): `async with bucket.reserve(500) as r: ...; await r.settle(used)`, or
    /// `r = await bucket.reserve(500)`. The tokens are taken when the `Reservation` is awaited or
    /// entered: the decision of `try_acquire`, never waiting; `RejectedError` (its `decision`
    /// has `retry_after`) when they are not there now.
    fn reserve(&self, estimate: i64) -> PyResult<crate::reservation::Reservation> {
        Ok(self.0.reserve(estimate)?.lazily())
    }

    fn __aenter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.acquire(py)
    }

    /// Nothing to give back (tokens are spent); never suppresses the body's exception.
    #[pyo3(signature = (*_exc))]
    fn __aexit__<'py>(&self, py: Python<'py>, _exc: &Bound<'py, pyo3::types::PyTuple>) -> PyResult<Bound<'py, PyAny>> {
        crate::bridge::spawn(py, async { Ok(false) })
    }

}
