"""A multi-lock or red lock user in a process of its own (see test_multilock, test_redlock).

multilock_worker.py hammer multi|red URL,URL,... TASKS ROUNDS
    TASKS tasks x ROUNDS ``async with`` a multi-lock of ``hammer:<i>`` on the i-th server, or
    a red lock ``hammer`` over the servers; an INCR/DECR guard on the first server counts
    overlaps; prints overlaps and rounds done
multilock_worker.py hold multi|red URL,URL,... WATCHDOG
    take the lock (watchdog timeout WATCHDOG) in a guard, print "held", hold it until killed;
    print "lost" when the guard reports the loss (e.g. after SIGSTOP and SIGCONT)
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import aiolock


async def main(command: str, kind: str, urls: str, *rest: str) -> None:
    if command not in ("hammer", "hold"):
        raise SystemExit(f"unknown command {command!r}")
    config: dict[str, Any] = {"watchdog_timeout": float(rest[0])} if command == "hold" else {}
    clients = [aiolock.from_url(url, **config) for url in urls.split(",")]
    try:
        if kind == "multi":
            lock: aiolock.MultiLock = aiolock.multi_lock(
                *(c.lock(f"hammer:{i}") for i, c in enumerate(clients))
            )
        else:
            lock = aiolock.red_lock(*clients, name="hammer")
        if command == "hold":
            try:
                async with lock.guard():
                    print("held", flush=True)
                    await asyncio.sleep(3600)
            except aiolock.LockLostError:
                print("lost", flush=True)
            return
        tasks, rounds = rest
        guard = clients[0].redis
        overlaps = done = 0

        async def worker() -> None:
            nonlocal overlaps, done
            for _ in range(int(rounds)):
                async with lock:
                    if await guard.incr("guard") != 1:
                        overlaps += 1
                    await asyncio.sleep(0.001)
                    await guard.decr("guard")
                done += 1

        await asyncio.gather(*(worker() for _ in range(int(tasks))))
        print(overlaps, done)
    finally:
        for client in clients:
            await client.aclose()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
