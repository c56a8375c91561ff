"""The in-process limiters, on a manual clock (no sleeping)."""

from __future__ import annotations

import re

import pytest

from tollgate import (
    KeyedSlidingWindow,
    KeyedTokenBucket,
    KeyedWeightedWindow,
    LocalSlidingWindow,
    LocalTokenBucket,
    LocalWeightedWindow,
    ManualClock,
)


def test_token_bucket_admits_its_capacity_then_refills_evenly():
    clock = ManualClock()
    bucket = LocalTokenBucket(capacity=5, refill_frequency=1.0, refill_amount=10, clock=clock)
    assert all(bucket.try_acquire() for _ in range(5))
    no = bucket.try_acquire()
    assert not no and no.remaining == 0
    assert no.retry_after == pytest.approx(0.1)
    clock.advance(0.1)
    assert bucket.try_acquire()
    assert not bucket.try_acquire()
    # Over 10 s, exactly the configured rate.
    admitted = 0
    for _ in range(1000):
        clock.advance(0.01)
        admitted += bool(bucket.try_acquire())
    assert admitted == 100


def test_asking_for_more_than_the_capacity_can_never_succeed():
    bucket = LocalTokenBucket(3, 1.0, 3)
    no = bucket.try_acquire(4)
    assert not no and no.retry_after is None and no.reason == "exceeds_capacity"


def test_sliding_window_counts_the_last_window():
    clock = ManualClock()
    window = LocalSlidingWindow(limit=10, window=1.0, clock=clock)
    assert window.try_acquire(10)
    assert not window.try_acquire()
    clock.advance(0.5)
    assert not window.try_acquire(), "half a window later the old permits still count"
    clock.advance(0.6)
    assert window.try_acquire(10)


def test_weighted_window_weighs_the_previous_window_by_its_overlap():
    clock = ManualClock()
    weighted = LocalWeightedWindow(limit=10, window=1.0, clock=clock)
    sliding = LocalSlidingWindow(limit=10, window=1.0, clock=clock)
    assert weighted.try_acquire(10) and sliding.try_acquire(10)
    clock.advance(1.5)
    # Half of the previous window still overlaps: 5 of its 10 count. The segmented sliding window
    # has forgotten them all: the two names are two algorithms.
    probe = weighted.try_acquire(5)
    assert probe and probe.remaining == 0
    assert not weighted.try_acquire()
    assert sliding.try_acquire(10)
    clock.advance(0.5)
    # At 2.0 s the first window no longer overlaps; the 5 taken at 1.5 s count whole.
    later = weighted.try_acquire(5)
    assert later and later.remaining == 0


def test_keyed_weighted_windows_keep_one_window_per_key():
    clock = ManualClock()
    windows = KeyedWeightedWindow(limit=2, window=60, max_keys=10, clock=clock)
    assert windows.try_acquire("a", 2) and windows.try_acquire("b")
    assert not windows.try_acquire("a")
    assert len(windows) == 2


def test_keyed_limiters_keep_one_limit_per_key():
    clock = ManualClock()
    buckets = KeyedTokenBucket(capacity=2, refill_frequency=1.0, refill_amount=2, max_keys=10, clock=clock)
    assert buckets.try_acquire("alice", 2)
    assert not buckets.try_acquire("alice")
    assert buckets.try_acquire("bob", 2)
    assert len(buckets) == 2
    windows = KeyedSlidingWindow(limit=1, window=60, clock=clock)
    assert windows.try_acquire("a") and windows.try_acquire("b")
    assert not windows.try_acquire("a")


@pytest.mark.parametrize("at_max_keys", ["reject", "evict", "admit"])
def test_keyed_limiters_never_store_more_than_max_keys(at_max_keys):
    clock = ManualClock()
    buckets = KeyedTokenBucket(1, 60.0, 1, max_keys=64, clock=clock, at_max_keys=at_max_keys)
    decisions = [buckets.try_acquire(f"ip-{i}") for i in range(1000)]
    assert len(buckets) <= 64
    rejected = [d for d in decisions if not d]
    if at_max_keys == "reject":
        assert rejected and all(d.reason == "key_limit" for d in rejected)
        # Told when a stored key goes idle (60 s after its permit), not "never".
        assert all(d.retry_after == 60.0 for d in rejected)
    else:
        assert not rejected


def test_decision_is_data():
    d = LocalTokenBucket(1, 1.0, 1).try_acquire()
    assert d.allowed and d.limit == 1 and d.remaining == 0 and d.reason == "granted"
    assert repr(d).startswith("Decision(allowed=True, limit=1, remaining=0")


@pytest.mark.parametrize(
    "make, param",
    [
        (lambda: LocalTokenBucket(0, 1, 1), "capacity"),
        (lambda: LocalTokenBucket(1, -1, 1), "refill_frequency"),
        (lambda: LocalTokenBucket(1, 1, 0), "refill_amount"),
        (lambda: LocalSlidingWindow(0, 1), "limit"),
        (lambda: LocalSlidingWindow(1, 0), "window"),
        (lambda: LocalSlidingWindow(1, 1, segments=0), "segments"),
        (lambda: KeyedTokenBucket(1, 1, 1, max_keys=0), "max_keys"),
        (lambda: KeyedSlidingWindow(1, 1, max_keys=-1), "max_keys"),
        (lambda: LocalWeightedWindow(0, 1), "limit"),
        (lambda: LocalWeightedWindow(1, float("nan")), "window"),
        (lambda: KeyedWeightedWindow(1, 1, max_keys=0), "max_keys"),
        (lambda: KeyedTokenBucket(1, 1, 1, at_max_keys="drop"), "at_max_keys"),
        (lambda: LocalTokenBucket(1, 1, 1).try_acquire(0), "n"),
        (lambda: KeyedTokenBucket(1, 1, 1).try_acquire("k", -1), "n"),
        (lambda: ManualClock().advance(-1), "seconds"),
    ],
)
def test_bad_arguments_are_value_errors_naming_the_parameter(make, param):
    with pytest.raises(ValueError, match=param):
        make()


def test_wrong_types_are_type_errors_naming_the_argument():
    with pytest.raises(TypeError, match="capacity"):
        LocalTokenBucket("ten", 1, 1)


def test_durations_may_be_written_as_on_the_command_line():
    clock = ManualClock()
    window = LocalSlidingWindow(limit=2, window="1m30s", clock=clock)
    assert window.try_acquire(2)
    no = window.try_acquire()
    assert not no and 0 < no.retry_after <= 90
    slow = LocalTokenBucket(capacity=2, refill_frequency="1m30s", refill_amount=2, clock=clock)
    assert slow.try_acquire(2)
    assert slow.try_acquire().retry_after == pytest.approx(45)
    bucket = LocalTokenBucket(capacity=1, refill_frequency="250ms", refill_amount=1, clock=clock)
    assert bucket.try_acquire()
    no = bucket.try_acquire()
    assert not no and no.retry_after == pytest.approx(0.25)
    clock.advance("250ms")
    assert bucket.try_acquire()
    assert KeyedWeightedWindow(1, " 2s ").try_acquire("k")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: LocalSlidingWindow(1, "fast"), 'window: invalid duration "fast"'),
        (lambda: LocalSlidingWindow(1, "0s"), 'window: invalid duration "0s": "0s" is zero'),
        (lambda: LocalTokenBucket(1, "1 parsec", 1), 'refill_frequency: invalid duration "1 parsec"'),
        (lambda: KeyedTokenBucket(1, "", 1), 'refill_frequency: invalid duration "": nothing given'),
    ],
)
def test_bad_duration_strings_are_value_errors_naming_the_parameter_and_the_text(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()
