"""Time per `async with Semaphore` (enter + exit) and per `TokenBucket` acquire against a local
Redis, for tollgate and — if installed (`pip install self-limiters`) — self-limiters, in the
same run on the same server.

    python bench/bench.py [REDIS_URL] [ITERATIONS]

Prints the mean time per operation, one task at a time (latency) and with 50 concurrent tasks
(wall time / operations: throughput). Limits are set high so nobody waits for a permit: this
measures the cost of the round trips, not the rate.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

URL = sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
TASKS = 50


async def per_op(limiter, n: int, tasks: int) -> float:
    async def run(k: int) -> None:
        for _ in range(k):
            async with limiter:
                pass

    async with limiter:  # connect and load scripts first
        pass
    started = time.perf_counter()
    await asyncio.gather(*(run(n // tasks) for _ in range(tasks)))
    return (time.perf_counter() - started) / (n // tasks * tasks)


def makers():
    import tollgate

    yield "tollgate", lambda kind: (
        tollgate.Semaphore(f"b-{uuid.uuid4().hex}", 1000, redis_url=URL)
        if kind == "semaphore"
        else tollgate.TokenBucket(f"b-{uuid.uuid4().hex}", 10**6, 1.0, 10**6, redis_url=URL)
    )
    try:
        import self_limiters
    except ImportError:
        print("self-limiters is not installed: measuring tollgate alone")
        return
    # self-limiters' TokenBucket sleeps until the next refill even when tokens are left (measured
    # here: one refill_frequency per acquire), and hangs with a capacity of 10**6: a short
    # refill_frequency and a modest capacity give its best case.
    yield "self-limiters", lambda kind: (
        self_limiters.Semaphore(name=f"b-{uuid.uuid4().hex}", capacity=1000, redis_url=URL)
        if kind == "semaphore"
        else self_limiters.TokenBucket(name=f"b-{uuid.uuid4().hex}", capacity=1000, refill_frequency=0.01,
                                       refill_amount=1000, redis_url=URL)
    )


async def bridge_cost(n: int) -> float:
    """One await of a Rust future that completes at once: the cost of crossing to Rust and back."""
    from tollgate import _tollgate

    await _tollgate._noop()
    started = time.perf_counter()
    for _ in range(n):
        await _tollgate._noop()
    return (time.perf_counter() - started) / n


async def main() -> None:
    print(f"tollgate bridge alone: {await bridge_cost(N) * 1e6:.1f} us per await")
    results = {}
    for library, make in makers():
        for kind in ("semaphore", "token_bucket"):
            for tasks in (1, TASKS):
                slow = library == "self-limiters" and kind == "token_bucket"
                results[(library, kind, tasks)] = await per_op(make(kind), max(N // 20, tasks) if slow else N, tasks)
    for (library, kind, tasks), seconds in results.items():
        line = f"{library:14} {kind:13} tasks={tasks:<3} {seconds * 1e3:8.3f} ms/op"
        other = results.get(("self-limiters", kind, tasks))
        if library == "tollgate" and other:
            line += f"   (self-limiters / tollgate = {other / seconds:.2f})"
        print(line)


asyncio.run(main())
