"""TokenBucket against a real redis-server: the admitted rate, max_sleep, sharing with Rust."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time

import pytest

from conftest import REPO
from tollgate import Decision, MaxSleepExceededError, RedisUnavailableError, TokenBucket


async def test_admitted_rate_matches_the_configuration_within_5_percent_over_10_seconds(redis_url, name):
    # 50 tokens per second, capacity 1 (no burst to blur the rate); demand far above it.
    bucket = TokenBucket(name, capacity=1, refill_frequency=0.2, refill_amount=10, redis_url=redis_url)
    duration = 10.0
    admitted = 0
    await bucket.acquire()  # connect, and start from an empty bucket
    started = time.monotonic()

    async def demand():
        nonlocal admitted
        while True:
            async with bucket:
                if time.monotonic() - started >= duration:
                    return
                admitted += 1

    await asyncio.gather(*(demand() for _ in range(8)))
    expected = 50 * duration
    print(f"admitted {admitted} in {duration}s against {expected:.0f} configured ({admitted / expected:.3f}x)")
    assert abs(admitted - expected) <= 0.05 * expected, admitted


async def test_max_sleep_raises_at_once_and_consumes_nothing(redis_url, name):
    slow = dict(capacity=2, refill_frequency=100.0, refill_amount=1, redis_url=redis_url)
    bucket = TokenBucket(name, **slow)
    impatient = TokenBucket(name, max_sleep=1.0, **slow)
    started = time.monotonic()
    async with bucket:
        pass
    async with bucket:
        pass
    with pytest.raises(MaxSleepExceededError, match=r"max_sleep=1(\.0)?s \(the wait would be (9\d\.\d+|100\.0+)s\)"):
        async with impatient:
            pytest.fail("entered an empty bucket")
    assert time.monotonic() - started < 1.0, "raised without sleeping"
    # Had the refused call reserved a token, the next one would be ~200 s away, not ~100 s.
    decision = await bucket.try_acquire()
    assert isinstance(decision, Decision) and not decision
    assert 95 < decision.retry_after <= 100, decision


async def test_try_acquire_reports_the_decision(redis_url, name):
    bucket = TokenBucket(name, capacity=3, refill_frequency=1.0, refill_amount=3, redis_url=redis_url)
    first = await bucket.try_acquire(2)
    assert first and first.allowed and first.remaining == 1 and first.limit == 3
    second = await bucket.try_acquire(2)
    assert not second and second.reason == "exhausted"
    assert 0 < second.retry_after <= 1 / 3 + 0.01
    too_many = await bucket.try_acquire(4)
    assert not too_many and too_many.retry_after is None


async def test_a_rust_process_and_a_python_process_share_one_bucket(redis_url, name):
    cargo = shutil.which("cargo") or os.path.expanduser("~/.cargo/bin/cargo")
    config = ["10", "1000", "1"]  # capacity 10, 1 token per 1000 s: no refill during the test
    bucket = TokenBucket(name, capacity=10, refill_frequency=1000, refill_amount=1, redis_url=redis_url)
    assert all([await bucket.try_acquire() for _ in range(4)])
    # .ci/run builds it beforehand; elsewhere cargo builds it on first use.
    binary = os.environ.get("TOLLGATE_SHARED_BUCKET")
    command = [binary] if binary else [cargo, "run", "-q", "-p", "tollgate-redis", "--example", "shared_bucket", "--"]
    rust = subprocess.run(command + [redis_url, name, *config, "10"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert rust.returncode == 0, rust.stderr
    assert rust.stdout.strip() == "6", f"Rust was granted {rust.stdout.strip()} of the 6 tokens Python left"
    assert not await bucket.try_acquire(), "Rust took the rest"


async def test_unreachable_redis_raises_naming_the_url(name):
    bucket = TokenBucket(name, capacity=1, refill_frequency=1, refill_amount=1, redis_url="redis://127.0.0.1:1")
    with pytest.raises(RedisUnavailableError, match="redis://127.0.0.1:1"):
        async with bucket:
            pytest.fail("entered without Redis")


async def test_no_message_or_repr_shows_the_password_of_the_url(name):
    url = "redis://app:hunter2@127.0.0.1:1/0"
    bucket = TokenBucket(name, capacity=1, refill_frequency=1, refill_amount=1, redis_url=url)
    assert "hunter2" not in repr(bucket) and "redis://***@127.0.0.1:1/0" in repr(bucket)
    with pytest.raises(RedisUnavailableError) as raised:
        await bucket.try_acquire()
    assert "redis://***@127.0.0.1:1/0" in str(raised.value)
    assert "hunter2" not in str(raised.value) and "hunter2" not in repr(raised.value)
    with pytest.raises(ValueError) as raised:
        TokenBucket(name, capacity=1, refill_frequency=1, refill_amount=1, redis_url="redis://app:hunter2@h:port/")
    assert "hunter2" not in str(raised.value), str(raised.value)


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(capacity=0, refill_frequency=1, refill_amount=1), "capacity"),
        (dict(capacity=1, refill_frequency=0, refill_amount=1), "refill_frequency"),
        (dict(capacity=1, refill_frequency=float("inf"), refill_amount=1), "refill_frequency"),
        (dict(capacity=1, refill_frequency=1, refill_amount=0), "refill_amount"),
        (dict(capacity=1, refill_frequency=1, refill_amount=1, max_sleep=-0.5), "max_sleep"),
        (dict(capacity=1, refill_frequency=1e-12, refill_amount=10), "refill_frequency"),
    ],
)
def test_bad_arguments_are_value_errors_naming_the_parameter(kwargs, param):
    with pytest.raises(ValueError, match=param):
        TokenBucket("x", **kwargs)


def test_properties_and_repr():
    bucket = TokenBucket("api", 10, 60, 10, max_sleep=600)
    assert (bucket.name, bucket.capacity, bucket.refill_frequency, bucket.refill_amount, bucket.max_sleep) == (
        "api", 10, 60.0, 10, 600.0)
    assert repr(bucket).startswith('TokenBucket(name="api", capacity=10, refill_frequency=60')
    spelled = TokenBucket("api", 10, "1m", 10, max_sleep="250ms")
    assert (spelled.refill_frequency, spelled.max_sleep) == (60.0, 0.25)
