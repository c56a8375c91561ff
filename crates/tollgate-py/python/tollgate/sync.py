"""Blocking versions of the Redis limiters, for threads, batch jobs and Celery/RQ workers.

They use the same Redis keys as the asyncio classes of the same ``name``
(``tollgate.Semaphore``, ``tollgate.TokenBucket``), so sync and async processes share one
limit::

    from tollgate.sync import Semaphore, TokenBucket

    exports = Semaphore("exports", capacity=5, redis_url="redis://127.0.0.1:6379")
    api = TokenBucket("partner-api", capacity=10, refill_frequency=1.0, refill_amount=10)

    def export(item):
        with exports:      # at most 5 at once, across every process, sync or async
            with api:      # at most 10 per second, across every process
                ...

``bucket.reserve(estimate)`` returns a ``Reservation`` to settle for the actual cost (an LLM
call's tokens): ``with bucket.reserve(2_000) as r: ...; r.settle(used)``. The in-process limiters
of ``tollgate`` answer the same class.

A blocking call waits with the GIL released (other threads run), and Ctrl-C interrupts it
(leaving the queue, taking nothing). Leases are renewed on Tollgate's own threads, so a holder
keeps its slot however long it computes. Do not call them from a running asyncio event loop:
they would block it; use the classes of ``tollgate`` there.
"""

from __future__ import annotations

from typing import Any, Optional

from tollgate._held import Held
from tollgate._tollgate import SyncPermit as Permit
from tollgate._tollgate import SyncReservation as Reservation
from tollgate._tollgate import SyncSemaphore as _NativeSemaphore
from tollgate._tollgate import SyncTokenBucket as TokenBucket

__all__ = ["Permit", "Reservation", "Semaphore", "TokenBucket"]


class Semaphore(_NativeSemaphore):
    """A counting semaphore in Redis shared by every process that uses the same ``name``.

    The blocking twin of ``tollgate.Semaphore``: same keys, same FIFO queue, same leases. At
    most ``capacity`` holders at once, sync and async together.

    ``with sem:`` holds a slot for the body and releases it however the body ends. ``permit =
    sem.acquire()`` blocks until a slot is free and returns the ``Permit``; ``sem.release()``
    gives back the latest permit the current thread (context) acquired, or call
    ``permit.release()``. ``sem.try_acquire()`` returns a ``Permit`` or ``None`` at once.

    Args: those of ``tollgate.Semaphore`` (``name``, ``capacity``, ``max_sleep``, ``redis_url``,
    ``lease_ttl``), with the same meanings and defaults.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Per thread (each thread has its own context).
        self._held: Held[Permit] = Held(
            f"tollgate.sync.Semaphore({self.name!r}).held",
            f"tollgate.sync.Semaphore {self.name!r}: release() without a held permit in this thread",
        )

    def acquire(self) -> Permit:
        """Blocks until a slot is free; returns its ``Permit``."""
        return self._held.push(super().acquire())

    def release(self) -> bool:
        """Gives back the latest permit the current thread acquired and has not released.

        Returns ``True`` if its lease was still held. Raises ``RuntimeError`` if the thread holds
        none.
        """
        return self._held.pop().release()

    def __enter__(self) -> Permit:
        return self.acquire()

    def __exit__(self, exc_type: Optional[type], exc: Optional[BaseException], tb: Any) -> None:
        self.release()
