"""Type stubs of the native module ``tollgate._tollgate`` (re-exported by ``tollgate``)."""

from typing import Any, Dict, Generator, List, Optional, Union, type_check_only

__version__: str

Seconds = Union[float, str]
"""A duration: seconds as a number (``0.25``), or text as on the ``tollgate`` command line
(``"250ms"``, ``"10s"``, ``"1m30s"``), read by the core's one duration parser."""

class TollgateError(Exception):
    """Base class of the exceptions Tollgate raises (besides ValueError and RedisUnavailableError)."""

class MaxSleepExceededError(TollgateError):
    """Waiting would take longer than ``max_sleep`` seconds; nothing was taken."""

class RejectedError(TollgateError):
    """A ``reserve`` was rejected; nothing was taken. ``decision`` says why and ``retry_after``."""

    decision: Decision

class RedisUnavailableError(ConnectionError):
    """Redis could not be reached or did not answer in time; the message names the URL."""

class Decision:
    """What a ``try_acquire`` decided; truthy when allowed."""

    @property
    def allowed(self) -> bool: ...
    @property
    def limit(self) -> int: ...
    @property
    def remaining(self) -> int: ...
    @property
    def retry_after(self) -> Optional[float]: ...
    @property
    def reset_after(self) -> float: ...
    @property
    def reason(self) -> str: ...
    def __bool__(self) -> bool: ...

# The async classes and their blocking twins (`Sync*`, named without the prefix in
# `tollgate.sync`) share a core and its Python methods (constructor, getters): the stubs say them
# once, in bases that exist for the stubs only (as `core_methods!` and `permit_methods!` write
# them once on the Rust side); each class adds its own waiting methods.

@type_check_only
class _Held:
    """What a held slot tells of its lease (``Permit`` and ``SyncPermit``)."""

    @property
    def fencing_token(self) -> int: ...
    @property
    def lease_id(self) -> str: ...
    @property
    def held(self) -> bool: ...
    def is_lost(self) -> bool: ...

@type_check_only
class _RedisCore:
    """The getters of every Redis class."""

    @property
    def name(self) -> str: ...
    @property
    def capacity(self) -> int: ...
    @property
    def max_sleep(self) -> Optional[float]: ...

@type_check_only
class _SemaphoreCore(_RedisCore):
    """The constructor and getters of ``Semaphore`` and ``SyncSemaphore``."""

    def __init__(
        self,
        name: str,
        capacity: int,
        max_sleep: Optional[Seconds] = None,
        redis_url: Union[str, List[str], None] = None,
        lease_ttl: Seconds = 10.0,
    ) -> None: ...
    @property
    def lease_ttl(self) -> float: ...

@type_check_only
class _BucketCore(_RedisCore):
    """The constructor and getters of ``TokenBucket`` and ``SyncTokenBucket``."""

    def __init__(
        self,
        name: str,
        capacity: int,
        refill_frequency: Seconds,
        refill_amount: int,
        max_sleep: Optional[Seconds] = None,
        redis_url: Union[str, List[str], None] = None,
    ) -> None: ...
    @property
    def refill_frequency(self) -> float: ...
    @property
    def refill_amount(self) -> int: ...

@type_check_only
class _Reservation:
    """What every reservation tells (``Reservation`` and ``SyncReservation``)."""

    @property
    def estimate(self) -> int:
        """The permits reserved."""
    @property
    def actual(self) -> Optional[int]:
        """What it was settled for (0 once cancelled); ``None`` until then."""
    @property
    def decision(self) -> Optional[Decision]:
        """The reserve's decision (``remaining`` after the estimate); ``None`` until reserved."""

class Reservation(_Reservation):
    """Tokens reserved with ``TokenBucket.reserve``, settled for the actual cost.

    Taken when first awaited or entered (``async with bucket.reserve(n) as r``, or
    ``r = await bucket.reserve(n)``); ``RejectedError`` if not there now. Leaving the block
    unsettled keeps the estimate; on an exception, the reservation is cancelled (all given back).
    """

    async def settle(self, actual: int) -> None:
        """Gives back what the estimate exceeded, or charges the rest past the limit (a debt).

        ``RedisUnavailableError``: not confirmed; settle again (applied once). ``RuntimeError``:
        settled or cancelled already.
        """
    async def cancel(self) -> None:
        """Gives the whole estimate back (a settle for 0)."""
    def __await__(self) -> Generator[Any, None, "Reservation"]: ...
    async def __aenter__(self) -> "Reservation": ...
    async def __aexit__(self, *exc: Any) -> bool: ...

class SyncReservation(_Reservation):
    """Permits reserved with ``tollgate.sync.TokenBucket`` or an in-process limiter's ``reserve``
    (``tollgate.sync.Reservation``), settled for the actual cost; ``with`` as ``Reservation``'s
    ``async with``."""

    def settle(self, actual: int) -> None:
        """Gives back what the estimate exceeded, or charges the rest past the limit (a debt).

        ``RedisUnavailableError``: not confirmed; settle again (applied once). ``RuntimeError``:
        settled or cancelled already.
        """
    def cancel(self) -> None:
        """Gives the whole estimate back (a settle for 0)."""
    def __enter__(self) -> "SyncReservation": ...
    def __exit__(self, *exc: Any) -> bool: ...

class Permit(_Held):
    """A held slot of a ``Semaphore``; an async context manager that releases it."""

    async def release(self) -> bool: ...
    async def __aenter__(self) -> "Permit": ...
    async def __aexit__(self, *exc: Any) -> bool: ...

class Semaphore(_SemaphoreCore):
    """A counting semaphore in Redis (see ``tollgate.Semaphore``)."""

    async def acquire(self) -> Permit: ...
    async def try_acquire(self) -> Optional[Permit]: ...
    async def state(self) -> Dict[str, int]: ...

class TokenBucket(_BucketCore):
    """A token bucket in Redis shared by every process using the same name."""

    async def acquire(self) -> None: ...
    async def try_acquire(self, n: int = 1) -> Decision: ...
    def reserve(self, estimate: int) -> Reservation:
        """Reserves ``estimate`` tokens when awaited or entered; never waits (``RejectedError``)."""
    async def __aenter__(self) -> None: ...
    async def __aexit__(self, *exc: Any) -> bool: ...

class SyncPermit(_Held):
    """A held slot of a ``tollgate.sync.Semaphore``; a context manager that releases it."""

    def release(self) -> bool: ...
    def __enter__(self) -> "SyncPermit": ...
    def __exit__(self, *exc: Any) -> bool: ...

class SyncSemaphore(_SemaphoreCore):
    """The blocking semaphore in Redis (see ``tollgate.sync.Semaphore``); the keys of ``Semaphore``."""

    def acquire(self) -> SyncPermit: ...
    def try_acquire(self) -> Optional[SyncPermit]: ...
    def state(self) -> Dict[str, int]: ...

class SyncTokenBucket(_BucketCore):
    """The blocking token bucket in Redis (``tollgate.sync.TokenBucket``); the key of ``TokenBucket``."""

    def acquire(self) -> None: ...
    def try_acquire(self, n: int = 1) -> Decision: ...
    def reserve(self, estimate: int) -> SyncReservation:
        """Reserves ``estimate`` tokens now; never waits for tokens (``RejectedError``)."""
    def __enter__(self) -> None: ...
    def __exit__(self, *exc: Any) -> bool: ...

class ManualClock:
    """A clock that moves only when told (for tests of the in-process limiters)."""

    def __init__(self) -> None: ...
    def advance(self, seconds: Seconds) -> None: ...
    @property
    def now(self) -> float: ...

@type_check_only
class _LocalLimiter:
    """What every in-process limiter answers (for the stubs only: no such class at run time)."""

    def try_acquire(self, n: int = 1) -> Decision: ...
    def reserve(self, estimate: int) -> SyncReservation:
        """Reserves ``estimate`` permits now, to settle for the actual cost (``RejectedError``)."""

@type_check_only
class _KeyedLimiter:
    """What every keyed in-process limiter answers (for the stubs only: no such class at run time)."""

    def try_acquire(self, key: str, n: int = 1) -> Decision: ...
    def reserve(self, key: str, estimate: int) -> SyncReservation:
        """Reserves ``estimate`` permits of ``key``'s limit now (``RejectedError``)."""
    def __len__(self) -> int: ...

class LocalTokenBucket(_LocalLimiter):
    """An in-process token bucket."""

    def __init__(
        self, capacity: int, refill_frequency: Seconds, refill_amount: int, clock: Optional[ManualClock] = None
    ) -> None: ...

class LocalSlidingWindow(_LocalLimiter):
    """An in-process sliding window: about ``limit`` permits in any ``window`` seconds."""

    def __init__(
        self, limit: int, window: Seconds, segments: int = 10, clock: Optional[ManualClock] = None
    ) -> None: ...

class LocalWeightedWindow(_LocalLimiter):
    """An in-process weighted window: the previous window weighted by overlap plus the current one."""

    def __init__(self, limit: int, window: Seconds, clock: Optional[ManualClock] = None) -> None: ...

class KeyedTokenBucket(_KeyedLimiter):
    """One in-process token bucket per key."""

    def __init__(
        self,
        capacity: int,
        refill_frequency: Seconds,
        refill_amount: int,
        max_keys: int = 100000,
        clock: Optional[ManualClock] = None,
        at_max_keys: str = "reject",
    ) -> None: ...

class KeyedSlidingWindow(_KeyedLimiter):
    """One in-process sliding window per key."""

    def __init__(
        self,
        limit: int,
        window: Seconds,
        segments: int = 10,
        max_keys: int = 100000,
        clock: Optional[ManualClock] = None,
        at_max_keys: str = "reject",
    ) -> None: ...

class KeyedWeightedWindow(_KeyedLimiter):
    """One in-process weighted window per key."""

    def __init__(
        self,
        limit: int,
        window: Seconds,
        max_keys: int = 100000,
        clock: Optional[ManualClock] = None,
        at_max_keys: str = "reject",
    ) -> None: ...
