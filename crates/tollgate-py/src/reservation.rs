//! Reservations for a cost known only after the work (an LLM call's tokens): `Reservation`, which
//! the async `TokenBucket.reserve` answers, and `tollgate.sync.Reservation`, which the blocking
//! `TokenBucket` and the in-process limiters answer, over one [`Slot`].
//!
//! A slot holds the core's [`tollgate::Reservation`] and how to settle it (the limiter and key it
//! was taken from). A settle takes it out for the call and puts it back when it fails (the core's
//! `SettleFailed` hands it back), so a settle Redis did not confirm may be sent again: Redis
//! applies a reservation's settle once. A settle that waits for Redis runs as a task of the
//! runtime, not in the caller's future: a cancelled `await` or a Ctrl-C does not lose it.
//!
//! Leaving the `with` block unsettled keeps the estimate (the core's rule for a reservation
//! dropped unsettled); leaving it on an exception cancels the reservation (the whole estimate is
//! given back: the work failed). That cancel's own failure keeps the estimate and is not raised
//! over the body's exception.

use std::borrow::Borrow;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use tollgate::{Answer, RateLimiter, Rejected, SettleError, SettleFailed, Settled};

use crate::args;
use crate::blocking::wait;
use crate::connection::runtime;
use crate::decision::Decision;
use crate::errors::{RedisUnavailableError, RejectedError, TollgateError};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Settles a reservation with the limiter and the key it was taken from.
pub(crate) type Settler = Arc<dyn Fn(tollgate::Reservation, u64) -> Settled + Send + Sync>;

/// A granted reservation and how to settle it.
pub(crate) struct Taken {
    reservation: tollgate::Reservation,
    settle: Settler,
}

impl Taken {
    pub(crate) fn new(reservation: tollgate::Reservation, settle: Settler) -> Taken {
        Taken { reservation, settle }
    }
}

/// A rejected reserve: raised as `RejectedError` where the GIL is held (the exception's
/// `decision` is an attribute set on it).
pub(crate) struct Refusal {
    message: String,
    decision: Decision,
}

impl Refusal {
    pub(crate) fn new(what: &str, estimate: u64, no: Rejected) -> Refusal {
        let wait = match no.retry_after() {
            Some(after) => format!("retry after {:.3}s", after.as_secs_f64()),
            None => "waiting cannot help".to_owned(),
        };
        let message = format!("{what}: a reservation of {estimate} was rejected ({}); {wait}", no.reason());
        Refusal { message, decision: Decision::from(Err(no)) }
    }

    pub(crate) fn into_err(self, py: Python<'_>) -> PyErr {
        let error = RejectedError::new_err(self.message);
        match Py::new(py, self.decision).and_then(|decision| error.value(py).setattr("decision", decision)) {
            Ok(()) => error,
            Err(failed) => failed,
        }
    }
}

/// What a reserve answers.
pub(crate) type Reserved = Result<Taken, Refusal>;

/// A reserve of a Redis limiter, not yet sent: run by awaiting (or entering) the async
/// `Reservation` made of it, or at once by the blocking class.
pub(crate) struct Pending {
    pub(crate) what: Arc<str>,
    pub(crate) url: Arc<str>,
    pub(crate) estimate: u64,
    pub(crate) reserve: BoxFuture<PyResult<Reserved>>,
}

impl Pending {
    /// The async `Reservation`: reserved when first awaited or entered.
    pub(crate) fn lazily(self) -> Reservation {
        let slot = Slot::new(self.what, self.estimate, Some(self.url), State::Unreserved(self.reserve));
        Reservation(Arc::new(slot))
    }

    /// Blocks (the GIL released) until Redis answers: the reservation, or `RejectedError`.
    pub(crate) fn wait(self, py: Python<'_>) -> PyResult<SyncReservation> {
        let reserved = wait(py, self.reserve)?;
        taken(py, self.what, self.estimate, Some(self.url), reserved)
    }
}

/// Reserves `estimate` from an in-process limiter for `key` (as `K`, the key type the limiter
/// decides on): answered at once.
pub(crate) fn in_process<K, Q, L>(
    py: Python<'_>,
    what: String,
    limiter: &Arc<L>,
    key: Q,
    estimate: i64,
) -> PyResult<SyncReservation>
where
    K: ?Sized,
    Q: Borrow<K> + Send + Sync + 'static,
    L: RateLimiter<K> + 'static,
{
    let estimate = args::count("estimate", estimate)?;
    let reserved = match limiter.reserve(key.borrow(), estimate) {
        Answer::Ready(reserved) => reserved,
        Answer::Pending(_) => unreachable!("an in-process limiter answers at once"),
    };
    let reserved = reserved
        .map(|reservation| {
            let limiter = limiter.clone();
            let settle: Settler =
                Arc::new(move |r: tollgate::Reservation, actual| r.settle(&*limiter, key.borrow(), actual));
            Taken::new(reservation, settle)
        })
        .map_err(|no| Refusal::new(&what, estimate, no));
    taken(py, what.into(), estimate, None, reserved)
}

fn taken(
    py: Python<'_>,
    what: Arc<str>,
    estimate: u64,
    url: Option<Arc<str>>,
    reserved: Reserved,
) -> PyResult<SyncReservation> {
    match reserved {
        Ok(taken) => {
            let slot = Slot::new(what, estimate, url, State::Reserving);
            slot.hold(&mut slot.lock(), taken);
            Ok(SyncReservation(Arc::new(slot)))
        }
        Err(refusal) => Err(refusal.into_err(py)),
    }
}

enum State {
    /// Made by the async `TokenBucket.reserve`: the reserve runs when the reservation is first
    /// awaited or entered.
    Unreserved(BoxFuture<PyResult<Reserved>>),
    Reserving,
    Held(Taken),
    Settling,
    /// Settled for this many (0: cancelled).
    Settled(u64),
    /// The `with` block ended unsettled: dropped, the estimate taken.
    Kept,
    Rejected,
    /// The reserve failed (Redis) or its await was cancelled.
    Failed,
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            State::Unreserved(_) => "unreserved",
            State::Reserving => "reserving",
            State::Held(_) => "reserved",
            State::Settling => "settling",
            State::Settled(0) => "cancelled",
            State::Settled(_) => "settled",
            State::Kept => "kept",
            State::Rejected => "rejected",
            State::Failed => "failed",
        }
    }
}

struct Inner {
    state: State,
    /// The `with` block ended: a settle in flight that fails drops the reservation.
    closed: bool,
    /// The reserve's decision, once granted.
    decision: Option<Decision>,
}

/// What both reservation classes share.
pub(crate) struct Slot {
    /// "token bucket \"name\"", "KeyedTokenBucket key \"alice\"", for messages.
    what: Arc<str>,
    estimate: u64,
    /// Redis's, for messages; `None` in process.
    url: Option<Arc<str>>,
    inner: Mutex<Inner>,
}

/// A settle: done (in process), or a future of it (Redis), running on the runtime meanwhile.
pub(crate) enum Settling {
    Now(PyResult<()>),
    Later(BoxFuture<PyResult<()>>),
}

impl Settling {
    /// Blocks for it (the GIL released).
    fn wait(self, py: Python<'_>) -> PyResult<()> {
        match self {
            Settling::Now(result) => result,
            Settling::Later(settling) => wait(py, settling),
        }
    }

    /// An asyncio future of it.
    fn spawn(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        match self {
            Settling::Now(result) => crate::bridge::spawn(py, async move { result }),
            Settling::Later(settling) => crate::bridge::spawn(py, settling),
        }
    }

    /// The same, its error ignored (leaving a block on an exception: the estimate stays taken).
    fn quietly(self) -> Settling {
        match self {
            Settling::Now(_) => Settling::Now(Ok(())),
            Settling::Later(settling) => Settling::Later(Box::pin(async move {
                let _ = settling.await;
                Ok(())
            })),
        }
    }
}

impl Slot {
    fn new(what: Arc<str>, estimate: u64, url: Option<Arc<str>>, state: State) -> Slot {
        Slot { what, estimate, url, inner: Mutex::new(Inner { state, closed: false, decision: None }) }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds `taken`, with its decision.
    fn hold(&self, inner: &mut Inner, taken: Taken) {
        inner.decision = Some(Decision::from(Ok(taken.reservation.lease().detached())));
        inner.state = State::Held(taken);
    }

    /// The reserve, the first time an async reservation is awaited or entered; `None` once it
    /// ran. The future answers the refusal, to be raised where the GIL is held.
    fn reserving(self: &Arc<Self>) -> PyResult<Option<impl Future<Output = PyResult<Option<Refusal>>> + use<>>> {
        let mut inner = self.lock();
        match std::mem::replace(&mut inner.state, State::Reserving) {
            State::Unreserved(reserve) => {
                let guard = Reserving(self.clone());
                Ok(Some(async move {
                    let reserved = reserve.await;
                    let slot = &guard.0;
                    let mut inner = slot.lock();
                    match reserved {
                        Ok(Ok(taken)) => {
                            slot.hold(&mut inner, taken);
                            Ok(None)
                        }
                        Ok(Err(refusal)) => {
                            inner.state = State::Rejected;
                            Ok(Some(refusal))
                        }
                        Err(error) => {
                            inner.state = State::Failed;
                            Err(error)
                        }
                    }
                }))
            }
            state @ (State::Reserving | State::Rejected | State::Failed) => {
                let error = self.misuse(&state);
                inner.state = state;
                Err(error)
            }
            state => {
                inner.state = state;
                Ok(None)
            }
        }
    }

    /// Takes the reservation out to settle it for `actual`.
    fn settle(self: &Arc<Self>, actual: u64) -> PyResult<Settling> {
        let taken = {
            let mut inner = self.lock();
            match std::mem::replace(&mut inner.state, State::Settling) {
                State::Held(taken) => taken,
                state => {
                    let error = self.misuse(&state);
                    inner.state = state;
                    return Err(error);
                }
            }
        };
        Ok(self.run(taken, actual))
    }

    /// Leaving the `with` block: unsettled, the estimate is kept; if the block `raised`, the
    /// reservation is cancelled, and that cancel's failure (the estimate kept) is not raised.
    fn exit(self: &Arc<Self>, raised: bool) -> Settling {
        let taken = {
            let mut inner = self.lock();
            inner.closed = true;
            if !matches!(inner.state, State::Held(_)) {
                return Settling::Now(Ok(()));
            }
            match std::mem::replace(&mut inner.state, if raised { State::Settling } else { State::Kept }) {
                State::Held(taken) if raised => taken,
                // Dropped here: the estimate stays taken.
                _ => return Settling::Now(Ok(())),
            }
        };
        self.run(taken, 0).quietly()
    }

    fn run(self: &Arc<Self>, taken: Taken, actual: u64) -> Settling {
        let Taken { reservation, settle } = taken;
        match settle(reservation, actual) {
            Answer::Ready(result) => Settling::Now(self.finish(result, settle, actual)),
            Answer::Pending(settling) => {
                let slot = self.clone();
                let task = runtime().spawn(async move {
                    let result = settling.await;
                    slot.finish(result, settle, actual)
                });
                Settling::Later(Box::pin(async move {
                    task.await.unwrap_or_else(|e| Err(TollgateError::new_err(format!("the settle was abandoned: {e}"))))
                }))
            }
        }
    }

    /// Records a settle's outcome: a failed one hands the reservation back, to be settled again
    /// (or dropped, the estimate kept, once the block has ended).
    fn finish(&self, result: Result<(), SettleFailed>, settle: Settler, actual: u64) -> PyResult<()> {
        let mut inner = self.lock();
        match result {
            Ok(()) => {
                inner.state = State::Settled(actual);
                Ok(())
            }
            Err(SettleFailed { error, reservation }) => {
                inner.state = if inner.closed { State::Kept } else { State::Held(Taken::new(reservation, settle)) };
                Err(self.settle_error(error))
            }
        }
    }

    fn settle_error(&self, error: SettleError) -> PyErr {
        let (what, estimate) = (&self.what, self.estimate);
        match (error, &self.url) {
            (SettleError::Unavailable { cause, .. }, Some(url)) => RedisUnavailableError::new_err(format!(
                "Redis at {url} did not confirm the settle of {what}'s reservation of {estimate}: {cause}; \
                 settle it again (Redis applies it once)"
            )),
            (error, _) => {
                TollgateError::new_err(format!("{what}: the reservation of {estimate} could not be settled: {error}"))
            }
        }
    }

    fn misuse(&self, state: &State) -> PyErr {
        let why = match state {
            State::Unreserved(_) => "is not reserved yet: await it, or enter it with `async with`".to_owned(),
            State::Reserving => "is being reserved (by another await)".to_owned(),
            State::Held(_) => "is reserved".to_owned(),
            State::Settling => "is being settled (a settle is in flight)".to_owned(),
            State::Settled(0) => "was cancelled already".to_owned(),
            State::Settled(actual) => format!("was settled already (for {actual})"),
            State::Kept => "ended unsettled with its `with` block: the estimate stays taken".to_owned(),
            State::Rejected => "was rejected".to_owned(),
            State::Failed => "failed (the reserve did not complete): reserve again".to_owned(),
        };
        PyRuntimeError::new_err(format!("{}: the reservation of {} {why}", self.what, self.estimate))
    }

    fn actual(&self) -> Option<u64> {
        match self.lock().state {
            State::Settled(actual) => Some(actual),
            _ => None,
        }
    }

    fn decision(&self) -> Option<Decision> {
        self.lock().decision.clone()
    }

    fn repr(&self, class: &str) -> String {
        let state = self.lock().state.name();
        format!("{class}({}, estimate={}, state={state:?})", self.what, self.estimate)
    }
}

/// Marks the reservation failed if its reserve is dropped before it answered (a cancelled await).
struct Reserving(Arc<Slot>);

impl Drop for Reserving {
    fn drop(&mut self) {
        let mut inner = self.0.lock();
        if matches!(inner.state, State::Reserving) {
            inner.state = State::Failed;
        }
    }
}

/// An `actual` cost: an integer >= 0.
fn actual(value: i64) -> PyResult<u64> {
    u64::try_from(value)
        .map_err(|_| pyo3::exceptions::PyValueError::new_err(format!("actual must be an integer >= 0, got {value}")))
}

/// Whether `__exit__`'s arguments carry an exception.
fn raised(exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
    Ok(!exc.is_empty() && !exc.get_item(0)?.is_none())
}

/// The `#[pymethods]` of a reservation class: what it tells, around its own settle, cancel and
/// context-manager methods.
macro_rules! reservation_methods {
    ($class:ident, $repr:literal; $($methods:tt)*) => {
        #[pymethods]
        impl $class {
            $($methods)*

            /// The permits reserved.
            #[getter]
            fn estimate(&self) -> u64 {
                self.0.estimate
            }

            /// What it was settled for (0 once cancelled); `None` until then.
            #[getter]
            fn actual(&self) -> Option<u64> {
                self.0.actual()
            }

            /// The reserve's `Decision` (`remaining` after the estimate was taken); `None` until
            /// reserved.
            #[getter]
            fn decision(&self) -> Option<Decision> {
                self.0.decision()
            }

            fn __repr__(&self) -> String {
                self.0.repr($repr)
            }
        }
    };
}

/// Permits reserved for an estimate with the async `TokenBucket`, to settle for the actual cost.
///
/// `async with bucket.reserve(estimate) as r:` (or `r = await bucket.reserve(estimate)`) takes the
/// estimate; `await r.settle(actual)` gives back what it exceeded, or charges the rest past the
/// limit as a debt that later requests pay first. Leaving the block unsettled keeps the estimate;
/// leaving it on an exception cancels (gives the whole estimate back).
#[pyclass(frozen, module = "tollgate._tollgate", name = "Reservation")]
pub struct Reservation(Arc<Slot>);

/// The reserve's answer, made a Python value where the GIL is held (on the event loop's thread):
/// the reservation, or the `RejectedError` raised.
enum Entered {
    Reserved(Py<Reservation>),
    Refused(Refusal),
}

impl<'py> IntoPyObject<'py> for Entered {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Entered::Reserved(reservation) => Ok(reservation.into_bound(py).into_any()),
            Entered::Refused(refusal) => Err(refusal.into_err(py)),
        }
    }
}

impl Reservation {
    /// An asyncio future of the reservation, reserved first if it is not yet.
    fn entering(slf: Py<Self>, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        match slf.get().0.reserving()? {
            Some(reserving) => crate::bridge::spawn(py, async move {
                Ok(match reserving.await? {
                    None => Entered::Reserved(slf),
                    Some(refusal) => Entered::Refused(refusal),
                })
            }),
            None => crate::bridge::spawn(py, async move { Ok(slf) }),
        }
    }
}

reservation_methods! {
    Reservation, "Reservation";
    /// Settles for the `actual` cost (an awaitable): gives back what the estimate exceeded, or
    /// charges the rest past the limit (a debt later requests pay first). Raises
    /// `RedisUnavailableError` when Redis did not confirm it: the reservation may be settled again
    /// (Redis applies it once). The settle runs to completion even if the awaiting task is
    /// cancelled. Raises `RuntimeError` if already settled or cancelled.
    fn settle<'py>(&self, py: Python<'py>, actual: i64) -> PyResult<Bound<'py, PyAny>> {
        self.0.settle(self::actual(actual)?)?.spawn(py)
    }

    /// Gives the whole estimate back (an awaitable; a settle for 0): the work was not done.
    fn cancel<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.0.settle(0)?.spawn(py)
    }

    /// `await bucket.reserve(n)`: takes the estimate now, or raises `RejectedError`.
    fn __await__<'py>(slf: Py<Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Reservation::entering(slf, py)?.call_method0("__await__")
    }

    fn __aenter__<'py>(slf: Py<Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Reservation::entering(slf, py)
    }

    /// Unsettled, keeps the estimate; on an exception, cancels. Never suppresses the exception.
    #[pyo3(signature = (*exc))]
    fn __aexit__<'py>(&self, py: Python<'py>, exc: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyAny>> {
        let leaving = self.0.exit(raised(exc)?);
        crate::bridge::spawn(py, async move {
            if let Settling::Later(settling) = leaving {
                settling.await?;
            }
            Ok(false)
        })
    }
}

/// Permits reserved for an estimate with `tollgate.sync.TokenBucket` or an in-process limiter,
/// to settle for the actual cost: `with bucket.reserve(estimate) as r: ...; r.settle(actual)`.
/// Leaving the block unsettled keeps the estimate; leaving it on an exception cancels (gives the
/// whole estimate back).
#[pyclass(frozen, module = "tollgate.sync", name = "Reservation")]
pub struct SyncReservation(Arc<Slot>);

reservation_methods! {
    SyncReservation, "tollgate.sync.Reservation";
    /// Settles for the `actual` cost: gives back what the estimate exceeded, or charges the rest
    /// past the limit (a debt later requests pay first). A Redis bucket's settle blocks with the
    /// GIL released and raises `RedisUnavailableError` when Redis did not confirm it: the
    /// reservation may be settled again (Redis applies it once). Raises `RuntimeError` if already
    /// settled or cancelled.
    fn settle(&self, py: Python<'_>, actual: i64) -> PyResult<()> {
        self.0.settle(self::actual(actual)?)?.wait(py)
    }

    /// Gives the whole estimate back (a settle for 0): the work was not done.
    fn cancel(&self, py: Python<'_>) -> PyResult<()> {
        self.0.settle(0)?.wait(py)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Unsettled, keeps the estimate; on an exception, cancels. Never suppresses the exception.
    #[pyo3(signature = (*exc))]
    fn __exit__(&self, py: Python<'_>, exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.0.exit(raised(exc)?).wait(py).map(|()| false)
    }
}
