"""tollgate.sync against a real redis-server: one limit shared by sync and async users, `with`
on exceptions, blocking waits that release the GIL and keep leases renewed, interrupts, errors."""

from __future__ import annotations

import _thread
import asyncio
import threading
import time

import pytest

import tollgate
from tollgate import MaxSleepExceededError, RedisUnavailableError, sync


def eventually(what, condition, timeout=5.0):
    """Polls a condition (not a clock) until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


async def test_a_sync_holder_fails_an_async_try_acquire_and_an_async_holder_a_sync_one(redis_url, name):
    blocking = sync.Semaphore(name, 1, redis_url=redis_url)
    aio = tollgate.Semaphore(name, 1, redis_url=redis_url)
    with blocking as permit:
        assert permit.held
        assert await aio.try_acquire() is None, "the sync holder has the only slot"
        assert (await aio.state())["holders"] == 1
    assert not permit.held
    async with aio:
        assert blocking.try_acquire() is None, "the async holder has the only slot"
        assert blocking.state()["holders"] == 1
    granted = blocking.try_acquire()
    assert isinstance(granted, sync.Permit)
    assert granted.release() is True
    assert blocking.state() == {"capacity": 1, "holders": 0, "waiting": 0}


async def test_a_blocked_sync_waiter_leaves_the_event_loop_running_and_gets_the_slot_async_frees(redis_url, name):
    blocking = sync.Semaphore(name, 1, redis_url=redis_url)
    aio = tollgate.Semaphore(name, 1, redis_url=redis_url)
    held = await aio.acquire()
    waiter = asyncio.ensure_future(asyncio.to_thread(blocking.acquire))
    # The loop keeps running Python while the thread waits: the wait does not hold the GIL.
    deadline = time.monotonic() + 5
    while (await aio.state())["waiting"] != 1:
        assert time.monotonic() < deadline, "the sync waiter never queued"
        await asyncio.sleep(0.005)
    assert not waiter.done()
    assert await held.release() is True
    permit = await asyncio.wait_for(waiter, 5)
    assert permit.fencing_token > held.fencing_token
    assert await aio.try_acquire() is None
    assert permit.release() is True


async def test_a_sync_and_an_async_token_bucket_drain_one_bucket(redis_url, name):
    config = dict(capacity=10, refill_frequency=1000, refill_amount=1, redis_url=redis_url)  # no refill in the test
    blocking = sync.TokenBucket(name, **config)
    aio = tollgate.TokenBucket(name, **config)
    assert blocking.try_acquire(3)
    with blocking:
        pass
    assert [bool(await aio.try_acquire()) for _ in range(7)] == [True] * 6 + [False]
    refused = blocking.try_acquire()
    assert not refused and refused.reason == "exhausted" and refused.remaining == 0
    assert 990 < refused.retry_after <= 1000


def test_with_releases_the_slot_when_the_body_raises(redis_url, name):
    sem = sync.Semaphore(name, 1, redis_url=redis_url)
    with pytest.raises(KeyError):
        with sem:
            assert sem.state()["holders"] == 1
            raise KeyError("boom")
    assert sem.state()["holders"] == 0
    with pytest.raises(ValueError):
        with sem.acquire() as permit:
            raise ValueError("boom")
    assert not permit.held
    assert sem.state()["holders"] == 0


def test_the_lease_is_renewed_while_the_holder_keeps_the_gil_busy(redis_url, name):
    ttl = 0.3
    sem = sync.Semaphore(name, 1, redis_url=redis_url, lease_ttl=ttl)
    other = sync.Semaphore(name, 1, redis_url=redis_url)
    permit = sem.acquire()
    # Pure Python for four TTLs, never releasing the GIL on purpose: renewals run on Tollgate's
    # own threads, which never need it.
    until = time.monotonic() + 4 * ttl
    spins = 0
    while time.monotonic() < until:
        spins += 1
    assert not permit.is_lost()
    assert other.try_acquire() is None, "the lease lapsed while its holder was busy"
    assert permit.release() is True


def test_acquire_and_release_methods(redis_url, name):
    sem = sync.Semaphore(name, 2, redis_url=redis_url)
    a = sem.acquire()
    b = sem.acquire()
    assert b.fencing_token > a.fencing_token
    assert sem.try_acquire() is None
    assert sem.release() is True  # releases b, the latest
    assert b.release() is False  # already released
    assert sem.release() is True  # releases a
    with pytest.raises(RuntimeError, match="without a held permit"):
        sem.release()
    assert sem.state()["holders"] == 0


def test_threads_never_exceed_the_capacity(redis_url, name):
    sem = sync.Semaphore(name, 2, redis_url=redis_url)
    lock = threading.Lock()
    inside = peak = 0

    def work():
        nonlocal inside, peak
        for _ in range(3):
            with sem:
                with lock:
                    inside += 1
                    peak = max(peak, inside)
                time.sleep(0.01)  # hold long enough for the threads to overlap
                with lock:
                    inside -= 1

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert peak == 2, f"{peak} inside at once"
    assert sem.state() == {"capacity": 2, "holders": 0, "waiting": 0}


def test_max_sleep_raises_without_taking_anything(redis_url, name):
    sem = sync.Semaphore(name, 1, redis_url=redis_url)
    patient = sync.Semaphore(name, 1, redis_url=redis_url, max_sleep=0.2)
    permit = sem.acquire()
    with pytest.raises(MaxSleepExceededError, match="max_sleep=0.2"):
        with patient:
            pytest.fail("entered a full semaphore")
    assert sem.state() == {"capacity": 1, "holders": 1, "waiting": 0}
    assert permit.release()
    bucket = sync.TokenBucket(name, capacity=1, refill_frequency=100, refill_amount=1, redis_url=redis_url,
                              max_sleep=1)
    bucket.acquire()
    with pytest.raises(MaxSleepExceededError, match=r"the wait would be (9\d\.\d+|100\.0+)s"):
        bucket.acquire()


def test_ctrl_c_interrupts_a_blocked_acquire_and_leaves_the_queue(redis_url, name):
    sem = sync.Semaphore(name, 1, redis_url=redis_url)
    watcher = sync.Semaphore(name, 1, redis_url=redis_url)
    permit = sem.acquire()

    def interrupt_once_queued():
        eventually("the waiter to queue", lambda: watcher.state()["waiting"] == 1)
        _thread.interrupt_main()

    threading.Thread(target=interrupt_once_queued).start()
    with pytest.raises(KeyboardInterrupt):
        sem.acquire()
    eventually("the interrupted waiter to leave", lambda: sem.state()["waiting"] == 0)
    assert sem.state()["holders"] == 1
    assert permit.release() is True


def test_unreachable_redis_raises_naming_the_url(name):
    sem = sync.Semaphore(name, 1, redis_url="redis://127.0.0.1:1")
    with pytest.raises(RedisUnavailableError, match="127.0.0.1:1"):
        with sem:
            pytest.fail("entered without Redis")
    bucket = sync.TokenBucket(name, capacity=1, refill_frequency=1, refill_amount=1, redis_url="redis://127.0.0.1:1")
    with pytest.raises(RedisUnavailableError, match="127.0.0.1:1"):
        bucket.try_acquire()


@pytest.mark.parametrize(
    "make, param",
    [
        (lambda: sync.Semaphore("", 1), "name"),
        (lambda: sync.Semaphore("x", 0), "capacity"),
        (lambda: sync.Semaphore("x", 1, max_sleep=-1), "max_sleep"),
        (lambda: sync.Semaphore("x", 1, lease_ttl=0.001), "lease_ttl"),
        (lambda: sync.Semaphore("x", 1, redis_url="http://example.com"), "redis_url"),
        (lambda: sync.TokenBucket("a{b}", 1, 1, 1), "name"),
        (lambda: sync.TokenBucket("x", 0, 1, 1), "capacity"),
        (lambda: sync.TokenBucket("x", 1, "soon", 1), "refill_frequency"),
        (lambda: sync.TokenBucket("x", 1, 1, -1), "refill_amount"),
        (lambda: sync.TokenBucket("x", 1, 1, 1, max_sleep=float("nan")), "max_sleep"),
        (lambda: sync.TokenBucket("x", 1, 1, 1).try_acquire(0), "n"),
    ],
)
def test_bad_arguments_are_value_errors_naming_the_parameter(make, param):
    with pytest.raises(ValueError, match=rf"\b{param}\b"):
        make()


def test_repr_and_properties():
    sem = sync.Semaphore("jobs", 3, max_sleep=1.5, redis_url="redis://app:hunter2@127.0.0.1:6379", lease_ttl=2)
    assert (sem.name, sem.capacity, sem.max_sleep, sem.lease_ttl) == ("jobs", 3, 1.5, 2.0)
    assert repr(sem) == (
        'tollgate.sync.Semaphore(name="jobs", capacity=3, max_sleep=1.5, redis_url="redis://***@127.0.0.1:6379", '
        "lease_ttl=2)"
    )
    bucket = sync.TokenBucket("api", 10, "1m", 10, max_sleep="250ms")
    assert (bucket.name, bucket.capacity, bucket.refill_frequency, bucket.refill_amount, bucket.max_sleep) == (
        "api", 10, 60.0, 10, 0.25)
    assert repr(bucket).startswith('tollgate.sync.TokenBucket(name="api", capacity=10, refill_frequency=60')
    assert (sync.Semaphore.__module__, sync.Permit.__name__, sync.TokenBucket.__qualname__) == (
        "tollgate.sync", "Permit", "TokenBucket")
