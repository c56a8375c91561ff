"""The permits one context took through a semaphore and has not released, newest last.

What ``tollgate.Semaphore`` (per asyncio task: asyncio copies the context into each task) and
``tollgate.sync.Semaphore`` (per thread: each thread has its own context) keep, so that
``release()`` gives back the latest permit its caller acquired.
"""

from __future__ import annotations

import contextvars
from typing import Generic, Protocol, Tuple, TypeVar


class _Permit(Protocol):
    @property
    def held(self) -> bool: ...


P = TypeVar("P", bound=_Permit)


class Held(Generic[P]):
    """The permits the current context acquired and has not released (a context variable named
    ``name``); ``missing`` is the ``RuntimeError``'s message when it has none to give back."""

    def __init__(self, name: str, missing: str) -> None:
        self._permits: contextvars.ContextVar[Tuple[P, ...]] = contextvars.ContextVar(name, default=())
        self._missing = missing

    def push(self, permit: P) -> P:
        """Records ``permit`` as the context's latest; returns it."""
        self._permits.set(self._permits.get() + (permit,))
        return permit

    def pop(self) -> P:
        """Takes off the latest permit still held (to be released by the caller)."""
        # Permits released directly (`permit.release()`) are no longer the context's to give back.
        held = tuple(p for p in self._permits.get() if p.held)
        if not held:
            raise RuntimeError(self._missing)
        self._permits.set(held[:-1])
        return held[-1]
