"""Tollgate: rate limiting that is correct to the permit.

Distributed limiters shared by every process through Redis, as asyncio context managers::

    from tollgate import Semaphore, TokenBucket

    exports = Semaphore("exports", capacity=5, redis_url="redis://127.0.0.1:6379")
    api = TokenBucket("partner-api", capacity=10, refill_frequency=1.0, refill_amount=10)

    async def export(item):
        async with exports:        # at most 5 at once, across every process
            async with api:        # at most 10 per second, across every process
                ...

``tollgate.sync`` has the same two with blocking methods and ``with`` (for threads, batch jobs,
Celery/RQ workers), on the same Redis keys, so sync and async processes share one limit::

    from tollgate import sync

    exports_sync = sync.Semaphore("exports", capacity=5, redis_url="redis://127.0.0.1:6379")

    def export_sync(item):
        with exports_sync:         # the same 5 slots as `exports` above
            ...

There are also in-process limiters for one process (``LocalTokenBucket``, ``LocalSlidingWindow``,
``LocalWeightedWindow``, ``KeyedTokenBucket``, ``KeyedSlidingWindow``, ``KeyedWeightedWindow``)
whose ``try_acquire()`` answers at once with a ``Decision``. ``SlidingWindow`` is the segmented
window; ``WeightedWindow`` is the two-window approximation (previous window weighted by overlap).

Token budgets (an LLM call's tokens, known only after the call): every bucket's ``reserve(estimate)``
takes the estimate, and the ``Reservation`` is settled for the actual cost::

    llm = TokenBucket("llm-tokens", capacity=100_000, refill_frequency=60, refill_amount=100_000)

    async def complete(prompt):
        async with llm.reserve(2_000) as r:      # max_tokens: RejectedError if not there now
            response = await call_the_model(prompt)
            await r.settle(response.usage.total_tokens)

Settling for less gives the rest back; for more, the rest is charged past the limit, a debt the
next requests pay first. Leaving the block unsettled keeps the estimate; leaving it on an exception
cancels the reservation (all given back: the work failed). ``tollgate.sync.TokenBucket`` and the
in-process limiters answer a ``tollgate.sync.Reservation`` (``with``, ``r.settle(n)``).

Durations (``window``, ``refill_frequency``, ``max_sleep``, ``lease_ttl``) are seconds as a
number, or text as on the ``tollgate`` command line: ``"250ms"``, ``"10s"``, ``"1m30s"`` (the
core's one parser; a bad string is a ``ValueError`` naming the parameter and the text).

Messages and ``repr`` show a Redis URL without its credentials (``redis://***@host:6379``).
"""

from __future__ import annotations

from typing import Any, Optional

from tollgate._held import Held
from tollgate._tollgate import (
    Decision,
    KeyedSlidingWindow,
    KeyedTokenBucket,
    KeyedWeightedWindow,
    LocalSlidingWindow,
    LocalTokenBucket,
    LocalWeightedWindow,
    ManualClock,
    MaxSleepExceededError,
    Permit,
    RedisUnavailableError,
    RejectedError,
    Reservation,
    TokenBucket,
    TollgateError,
    __version__,
)
from tollgate._tollgate import Semaphore as _NativeSemaphore

# After the names above: `tollgate.sync` imports from the native module too.
from tollgate import sync

__all__ = [
    "Decision",
    "KeyedSlidingWindow",
    "KeyedTokenBucket",
    "KeyedWeightedWindow",
    "LocalSlidingWindow",
    "LocalTokenBucket",
    "LocalWeightedWindow",
    "ManualClock",
    "MaxSleepExceededError",
    "Permit",
    "RedisUnavailableError",
    "RejectedError",
    "Reservation",
    "Semaphore",
    "TokenBucket",
    "TollgateError",
    "__version__",
    "sync",
]


class Semaphore(_NativeSemaphore):
    """A counting semaphore in Redis shared by every process that uses the same ``name``.

    At most ``capacity`` holders at once, served first come first served (in call order within
    a process, and in arrival order at Redis across processes). A holder that dies frees its
    slot within ``lease_ttl`` seconds (leases are renewed every ``lease_ttl / 3`` while held).

    ``async with sem:`` holds a slot for the body and releases it however the body ends
    (return, exception, cancellation). ``await sem.acquire()`` returns the ``Permit``;
    ``await sem.release()`` gives back the latest permit the current task acquired, or call
    ``await permit.release()``.

    Args:
        name: shared by every process using this semaphore (non-empty, no braces).
        capacity: most holders at once (>= 1).
        max_sleep: longest ``acquire`` waits, in seconds; ``None`` waits for ever. Past it,
            ``MaxSleepExceededError`` is raised and nothing is held.
        redis_url: a Redis URL, or a list of Redis Cluster node URLs.
        lease_ttl: seconds a lease lives without renewal (>= 0.03; default 10).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Per task (asyncio copies the context into each task).
        self._held: Held[Permit] = Held(
            f"tollgate.Semaphore({self.name!r}).held",
            f"Semaphore {self.name!r}: release() without a held permit in this task",
        )

    async def acquire(self) -> Permit:
        """Waits for a slot; returns its ``Permit``."""
        return self._held.push(await super().acquire())

    async def release(self) -> bool:
        """Gives back the latest permit the current task acquired and has not released.

        Returns ``True`` if its lease was still held. Raises ``RuntimeError`` if the task holds
        none.
        """
        return await self._held.pop().release()

    async def __aenter__(self) -> Permit:
        return await self.acquire()

    async def __aexit__(self, exc_type: Optional[type], exc: Optional[BaseException], tb: Any) -> None:
        await self.release()
