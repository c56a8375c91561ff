"""Run by the tests as a separate OS process.

    python holder.py hold URL NAME LEASE_TTL
        takes a slot of Semaphore(NAME, 1), prints "held", and waits to be killed.
    python holder.py crowd URL NAME CAPACITY TASKS OUT
        runs TASKS asyncio tasks that each hold a slot of Semaphore(NAME, CAPACITY) for a moment,
        and writes one JSON line per task: index, fencing token, enter and exit times (monotonic
        ns, comparable across processes on one machine).
"""

import asyncio
import json
import os
import sys
import time

from tollgate import Semaphore


async def hold(url: str, name: str, ttl: float) -> None:
    sem = Semaphore(name, 1, redis_url=url, lease_ttl=ttl)
    await sem.acquire()
    print("held", flush=True)
    await asyncio.Event().wait()


async def crowd(url: str, name: str, capacity: int, tasks: int, out: str) -> None:
    sem = Semaphore(name, capacity, redis_url=url)
    records = []
    start = asyncio.Event()

    async def one(index: int) -> None:
        await start.wait()
        async with sem as permit:
            enter = time.monotonic_ns()
            # Hold long enough that the other processes' tasks overlap with this one.
            await asyncio.sleep(0.03)
            records.append({"pid": os.getpid(), "index": index, "token": permit.fencing_token,
                            "enter": enter, "exit": time.monotonic_ns()})

    runners = [asyncio.ensure_future(one(i)) for i in range(tasks)]
    # Wait for a go file so that all processes contend at once.
    while not os.path.exists(out + ".go"):
        await asyncio.sleep(0.005)
    start.set()
    await asyncio.gather(*runners)
    with open(out, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    mode, url, name, *rest = sys.argv[1:]
    if mode == "hold":
        asyncio.run(hold(url, name, float(rest[0])))
    else:
        asyncio.run(crowd(url, name, int(rest[0]), int(rest[1]), rest[2]))
