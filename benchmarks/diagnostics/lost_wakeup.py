"""``python -m benchmarks.diagnostics.lost_wakeup [uvloop] [rounds]``: stranded waiters?

Two processes x 25 tasks contend for one lock (1 ms holds, watchdog lease) for 3 s, then
stop taking it. Every task still waiting must get the lock within a few hand-offs. A task
still waiting 5 s later while the lock is free was not woken: its wake-up was lost and it
sleeps until its TTL-bounded wait runs out (up to the 30 s watchdog lease).

Seen with aiolock at the time of the benchmark (about 1 run in 3 on uvloop): the unlock
message of a process's own release can be dispatched before the release's reply (they come
on different connections), and the skip-the-echo counter that ``wake_local`` added after the
reply then swallowed another process's genuine unlock message.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sys
import time
from typing import Any

import aiolock
from aiolock.testing import RedisServer

NAME = "diag:lost-wakeup"
TASKS = 25


def _process(url: str, seconds: float, queue: Any, use_uvloop: bool) -> None:
    async def run() -> None:
        client = aiolock.from_url(url)
        end = time.monotonic() + seconds

        async def task() -> None:
            lock = client.lock(NAME)
            while time.monotonic() < end:
                async with lock:
                    await asyncio.sleep(0.001)

        tasks = [asyncio.ensure_future(task()) for _ in range(TASKS)]
        _, pending = await asyncio.wait(tasks, timeout=seconds + 5)
        free = not await client.redis.exists(NAME)
        queue.put({"still_waiting_5s_after_end": len(pending), "lock_free": free})
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    if use_uvloop:
        import uvloop

        uvloop.run(run())
    else:
        asyncio.run(run())


def main() -> None:
    use_uvloop = "uvloop" in sys.argv[1:]
    rounds = int(next((a for a in sys.argv[1:] if a.isdigit()), "3"))
    stranded = 0
    with RedisServer() as server:
        for rnd in range(rounds):
            queue: Any = multiprocessing.Queue()
            procs = [
                multiprocessing.Process(target=_process, args=(server.url, 3.0, queue, use_uvloop))
                for _ in range(2)
            ]
            for p in procs:
                p.start()
            results = [queue.get() for _ in procs]
            for p in procs:
                p.join()
            stranded += sum(r["still_waiting_5s_after_end"] for r in results)
            print(f"round {rnd + 1}: {results}")
    print(f"stranded waiters in {rounds} rounds: {stranded} (must be 0)")


if __name__ == "__main__":
    main()
