"""Reservations (`reserve(estimate)` then `settle(actual)`): the in-process limiters on a manual
clock, the Redis token bucket async and sync against a real redis-server (no sleeping to make
time pass: Redis buckets refill one token per 100 s or slower)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

import tollgate
from conftest import RedisServer
from tollgate import (
    KeyedSlidingWindow,
    KeyedTokenBucket,
    KeyedWeightedWindow,
    LocalSlidingWindow,
    LocalTokenBucket,
    LocalWeightedWindow,
    ManualClock,
    RedisUnavailableError,
    RejectedError,
    TokenBucket,
    TollgateError,
    sync,
)

# --- in-process limiters --------------------------------------------------------------------

# Each in-process class with a limit of 10 (a token bucket refilling 1 token a second), and how it
# is asked: (reserve, try_acquire) for its one limit or for key "k".
LOCAL = {
    "LocalTokenBucket": lambda clock: LocalTokenBucket(10, 10.0, 10, clock=clock),
    "LocalSlidingWindow": lambda clock: LocalSlidingWindow(10, 1.0, clock=clock),
    "LocalWeightedWindow": lambda clock: LocalWeightedWindow(10, 1.0, clock=clock),
    "KeyedTokenBucket": lambda clock: KeyedTokenBucket(10, 10.0, 10, clock=clock),
    "KeyedSlidingWindow": lambda clock: KeyedSlidingWindow(10, 1.0, clock=clock),
    "KeyedWeightedWindow": lambda clock: KeyedWeightedWindow(10, 1.0, clock=clock),
}


class Asked:
    """One limit of a local class: reserve and try_acquire without caring whether it is keyed."""

    def __init__(self, kind: str, clock: ManualClock) -> None:
        self.limiter = LOCAL[kind](clock)
        self.key = ("k",) if kind.startswith("Keyed") else ()

    def reserve(self, estimate):
        return self.limiter.reserve(*self.key, estimate)

    def try_acquire(self, n=1):
        return self.limiter.try_acquire(*self.key, n)


@pytest.fixture(params=sorted(LOCAL))
def local(request):
    clock = ManualClock()
    clock.advance(100)  # a window-aligned start: windows count from whole periods
    return Asked(request.param, clock), clock


def test_settling_below_the_estimate_gives_the_difference_back(local):
    limit, _ = local
    with limit.reserve(6) as r:
        assert isinstance(r, sync.Reservation) and r.estimate == 6 and r.actual is None
        assert r.decision and r.decision.remaining == 4
        r.settle(2)
    assert r.actual == 2
    after = limit.try_acquire(8)
    assert after and after.remaining == 0, "4 of the 6 came back"
    assert not limit.try_acquire()


def test_settling_above_the_estimate_is_a_debt_paid_before_anything_is_admitted(local):
    limit, clock = local
    with limit.reserve(10) as r:
        r.settle(13)  # 3 past the limit
    with pytest.raises(RejectedError) as raised:
        limit.reserve(1)
    assert raised.value.decision.reason == "exhausted"
    assert raised.value.decision.retry_after > 0
    clock.advance(1.0)  # a window later (or 1 token: not enough to pay 3 and take 1)
    if isinstance(limit.limiter, (LocalTokenBucket, KeyedTokenBucket)):
        no = limit.try_acquire()
        assert not no and no.retry_after == pytest.approx(3.0), "2 more tokens of debt, then 1 to take"
        clock.advance(3.0)
    clock.advance(1.0)
    assert limit.try_acquire()


def test_the_token_bucket_debt_is_the_exact_excess():
    clock = ManualClock()
    bucket = LocalTokenBucket(capacity=1000, refill_frequency=1.0, refill_amount=1000, clock=clock)
    with bucket.reserve(600) as r:  # the core's example: 1,000 LLM tokens a second
        r.settle(1300)
    with pytest.raises(RejectedError, match=r"a reservation of 1 was rejected .*retry after 0\.301s") as raised:
        bucket.reserve(1)
    assert raised.value.decision.retry_after == pytest.approx(0.301)
    clock.advance(0.301)
    with bucket.reserve(1) as r:
        r.cancel()
    assert r.actual == 0


def test_cancel_gives_the_whole_estimate_back(local):
    limit, _ = local
    r = limit.reserve(7)
    r.cancel()
    assert r.actual == 0
    assert limit.try_acquire(10), "nothing stays taken"
    with pytest.raises(RuntimeError, match="was cancelled already"):
        r.settle(3)


def test_leaving_the_block_unsettled_keeps_the_estimate(local):
    limit, _ = local
    with limit.reserve(7) as r:
        pass
    assert r.actual is None and "kept" in repr(r)
    assert not limit.try_acquire(4) and limit.try_acquire(3), "the 7 stay taken"
    with pytest.raises(RuntimeError, match="ended unsettled with its `with` block: the estimate stays taken"):
        r.settle(1)


def test_a_reservation_kept_without_a_block_can_be_settled_later(local):
    limit, _ = local
    r = limit.reserve(7)
    assert not limit.try_acquire(4)
    r.settle(1)
    assert limit.try_acquire(9)


def test_an_exception_in_the_block_cancels_the_reservation_and_propagates(local):
    limit, _ = local
    with pytest.raises(KeyError):
        with limit.reserve(9) as r:
            raise KeyError("the model call failed")
    assert r.actual == 0
    assert limit.try_acquire(10), "the work failed: all given back"


def test_an_exception_after_the_settle_keeps_the_settle(local):
    limit, _ = local
    with pytest.raises(KeyError):
        with limit.reserve(9) as r:
            r.settle(4)
            raise KeyError("after the settle")
    assert r.actual == 4
    assert not limit.try_acquire(7) and limit.try_acquire(6)


def test_settling_twice_raises_a_clear_error_and_changes_nothing(local):
    limit, _ = local
    with limit.reserve(5) as r:
        r.settle(2)
        with pytest.raises(RuntimeError, match=r"the reservation of 5 was settled already \(for 2\)"):
            r.settle(1)
        with pytest.raises(RuntimeError, match="settled already"):
            r.cancel()
    assert r.actual == 2
    assert not limit.try_acquire(9) and limit.try_acquire(8)


def test_a_rejected_reserve_raises_rejected_error_with_the_decision_and_takes_nothing(local):
    limit, _ = local
    with pytest.raises(RejectedError) as raised:
        with limit.reserve(11):
            pytest.fail("entered a rejected reservation")
    error = raised.value
    assert isinstance(error, TollgateError)
    assert not error.decision and error.decision.reason == "exceeds_capacity" and error.decision.retry_after is None
    assert "a reservation of 11 was rejected" in str(error) and "waiting cannot help" in str(error)
    assert limit.try_acquire(10), "nothing was taken"
    with pytest.raises(RejectedError, match="retry after"):
        limit.reserve(1)


def test_keyed_reservations_settle_their_own_key():
    clock = ManualClock()
    per_user = KeyedTokenBucket(capacity=10, refill_frequency=10.0, refill_amount=10, clock=clock)
    with per_user.reserve(key="alice", estimate=10) as r:
        r.settle(12)
    assert "KeyedTokenBucket key \"alice\"" in repr(r)
    assert not per_user.try_acquire("alice")
    assert per_user.try_acquire("bob", 10), "bob has his own bucket"


@pytest.mark.parametrize(
    "call, param",
    [
        (lambda b: b.reserve(0), "estimate"),
        (lambda b: b.reserve(-1), "estimate"),
        (lambda b: b.reserve(1).settle(-1), "actual"),
    ],
)
def test_bad_estimates_and_actuals_are_value_errors_naming_the_parameter(call, param):
    with pytest.raises(ValueError, match=param):
        call(LocalTokenBucket(10, 1.0, 10))


def test_a_value_error_leaves_the_reservation_to_settle():
    bucket = LocalTokenBucket(10, 1000.0, 1, clock=ManualClock())
    r = bucket.reserve(5)
    with pytest.raises(ValueError):
        r.settle(-3)
    r.settle(0)
    assert bucket.try_acquire(10)


# --- the Redis token bucket, async ----------------------------------------------------------

SLOW = dict(capacity=10, refill_frequency=100.0, refill_amount=1)  # 1 token per 100 s


async def test_async_settling_gives_back_below_the_estimate_and_charges_a_debt_above(redis_url, name):
    bucket = TokenBucket(name, redis_url=redis_url, **SLOW)
    async with bucket.reserve(6) as r:
        assert isinstance(r, tollgate.Reservation) and r.decision.remaining == 4
        await r.settle(2)
    assert r.actual == 2
    assert (await bucket.try_acquire()).remaining == 7, "4 came back"
    async with bucket.reserve(7) as r:
        await r.settle(9)  # 2 past the limit
    no = await bucket.try_acquire()
    assert not no and 290 < no.retry_after <= 300, "2 tokens of debt, then 1 to take: 300 s"
    with pytest.raises(RejectedError) as raised:
        async with bucket.reserve(1):
            pytest.fail("entered a rejected reservation")
    assert raised.value.decision.reason == "exhausted" and 290 < raised.value.decision.retry_after <= 300
    assert "token bucket" in str(raised.value) and name in str(raised.value)


async def test_async_reservation_is_taken_when_awaited_or_entered_once(redis_url, name):
    bucket = TokenBucket(name, redis_url=redis_url, **SLOW)
    pending = bucket.reserve(3)
    assert pending.decision is None and "unreserved" in repr(pending)
    with pytest.raises(RuntimeError, match="not reserved yet"):
        await pending.settle(1)
    r = await pending
    assert r is pending and r.decision.remaining == 7
    async with r as entered:  # already reserved: entering takes nothing more
        assert entered is r
    assert (await bucket.try_acquire()).remaining == 6, "3 kept, taken once"
    with pytest.raises(RuntimeError, match="ended unsettled"):
        await r.settle(1)


async def test_async_cancel_exception_and_settling_twice(redis_url, name):
    bucket = TokenBucket(name, redis_url=redis_url, **SLOW)
    r = await bucket.reserve(8)
    await r.cancel()
    assert r.actual == 0
    with pytest.raises(RuntimeError, match="cancelled already"):
        await r.settle(8)
    with pytest.raises(KeyError):
        async with bucket.reserve(9) as failed:
            raise KeyError("the model call failed")
    assert failed.actual == 0
    async with bucket.reserve(5) as r:
        await r.settle(3)
        with pytest.raises(RuntimeError, match=r"settled already \(for 3\)"):
            await r.settle(3)
    assert (await bucket.try_acquire(7)).remaining == 0, "3 taken, the rest given back"


async def test_a_cancelled_await_does_not_cancel_the_settle(redis_url, name):
    bucket = TokenBucket(name, redis_url=redis_url, **SLOW)
    r = await bucket.reserve(8)
    settling = asyncio.ensure_future(r.settle(2))
    settling.cancel()
    deadline = time.monotonic() + 5
    while r.actual is None:  # polls the settle's outcome, not a clock
        assert time.monotonic() < deadline, "the settle never finished"
        await asyncio.sleep(0.005)
    assert r.actual == 2
    assert (await bucket.try_acquire(8)).remaining == 0


# --- the Redis token bucket, sync -----------------------------------------------------------


async def test_sync_reservations_share_the_bucket_with_async_ones(redis_url, name):
    bucket = sync.TokenBucket(name, redis_url=redis_url, **SLOW)
    with bucket.reserve(6) as r:
        assert isinstance(r, sync.Reservation)
        r.settle(2)
    with pytest.raises(KeyError):
        with bucket.reserve(8) as failed:
            raise KeyError("the model call failed")
    assert failed.actual == 0
    with bucket.reserve(1) as kept:
        pass
    with bucket.reserve(7) as r:
        r.settle(9)
        with pytest.raises(RuntimeError, match="settled already"):
            r.settle(9)
    with pytest.raises(RejectedError) as raised:
        bucket.reserve(1)
    assert 290 < raised.value.decision.retry_after <= 300, "2 + 1 + 9 = 12 of 10: 2 of debt, then 1"
    aio = TokenBucket(name, redis_url=redis_url, **SLOW)
    no = await aio.try_acquire()
    assert not no and 290 < no.retry_after <= 300, "the async bucket of the name sees the debt"
    assert kept.actual is None


# --- a settle Redis did not confirm ---------------------------------------------------------


@pytest.fixture
def own_redis():
    """A redis-server of this test's own, to stop and continue (SIGSTOP, SIGCONT)."""
    server = RedisServer()
    yield server
    os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


def settled_once(settle, what):
    """Sends `settle` again until Redis answers (the client backs off after a timeout)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return settle()
        except RedisUnavailableError:
            assert time.monotonic() < deadline, f"{what}: Redis never answered again"
            time.sleep(0.02)


async def test_an_unconfirmed_async_settle_raises_and_may_be_sent_again_applied_once(own_redis, name):
    bucket = TokenBucket(name, redis_url=own_redis.url, **SLOW)
    r = await bucket.reserve(4)
    os.kill(own_redis.process.pid, signal.SIGSTOP)
    with pytest.raises(RedisUnavailableError, match="did not confirm the settle .* settle it again"):
        await r.settle(7)  # 3 past the estimate; Redis runs it once it continues
    assert r.actual is None and "reserved" in repr(r), "handed back, to settle again"
    os.kill(own_redis.process.pid, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while True:
        try:
            await r.settle(7)
            break
        except RedisUnavailableError:
            assert time.monotonic() < deadline, "Redis never answered again"
            await asyncio.sleep(0.02)
    assert r.actual == 7
    assert await bucket.try_acquire(3), "charged 7 in all: 3 left"
    assert not await bucket.try_acquire(), "charged once, not twice"


def test_an_unconfirmed_sync_settle_raises_and_may_be_sent_again_applied_once(own_redis, name):
    bucket = sync.TokenBucket(name, redis_url=own_redis.url, **SLOW)
    r = bucket.reserve(4)
    os.kill(own_redis.process.pid, signal.SIGSTOP)
    with pytest.raises(RedisUnavailableError, match="settle it again"):
        r.settle(7)
    assert r.actual is None
    os.kill(own_redis.process.pid, signal.SIGCONT)
    settled_once(lambda: r.settle(7), "settle")
    assert r.actual == 7
    assert bucket.try_acquire(3) and not bucket.try_acquire()


def test_reserve_without_redis_raises_naming_the_url(name):
    bucket = sync.TokenBucket(name, capacity=1, refill_frequency=1, refill_amount=1, redis_url="redis://127.0.0.1:1")
    with pytest.raises(RedisUnavailableError, match="127.0.0.1:1"):
        bucket.reserve(1)

    async def enter():
        aio = TokenBucket(name, capacity=1, refill_frequency=1, refill_amount=1, redis_url="redis://127.0.0.1:1")
        pending = aio.reserve(1)
        with pytest.raises(RedisUnavailableError, match="127.0.0.1:1"):
            async with pending:
                pytest.fail("entered without Redis")
        with pytest.raises(RuntimeError, match="reserve again"):
            await pending

    asyncio.run(enter())
