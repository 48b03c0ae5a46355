"""A multi-lock or red lock user in a process of its own (see test_multilock, test_redlock).

multilock_worker.py hammer multi|red URL,URL,... TASKS ROUNDS
    TASKS tasks x ROUNDS ``async with`` a multi-lock of ``hammer:<i>`` on the i-th server, or
    a red lock ``hammer`` over the servers; an INCR/DECR guard on the first server counts
    overlaps; prints overlaps and rounds done
multilock_worker.py hold multi|red URL,URL,... WATCHDOG
    take the lock (watchdog timeout WATCHDOG) in a guard, print "held", hold it until killed;
    print "lost" when the guard reports the loss (e.g. after SIGSTOP and SIGCONT)
multilock_worker.py acquire multi|red URL,URL,... WATCHDOG HOW
    open every connection (take the lock and unlock it), print "ready", wait for a line on
    stdin, then take the lock (watchdog timeout WATCHDOG, command timeout 5 s) with HOW:
    ``try_lock`` (wait_time 10), ``lock`` or ``with``; print "held" (or "not held"), unlock
    it and print "unlocked"; an aiolock error is printed as "error <type>: <message>"
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import aiolock


async def main(command: str, kind: str, urls: str, *rest: str) -> None:
    if command not in ("hammer", "hold", "acquire"):
        raise SystemExit(f"unknown command {command!r}")
    config: dict[str, Any] = {}
    if command in ("hold", "acquire"):
        config["watchdog_timeout"] = float(rest[0])
    if command == "acquire":
        config["command_timeout"] = 5.0
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
        if command == "acquire":
            await acquire(lock, rest[1])
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


async def acquire(lock: aiolock.MultiLock, how: str) -> None:
    await lock.lock()
    await lock.unlock()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    try:
        if how == "try_lock":
            held = await lock.try_lock(wait_time=10)
        elif how == "lock":
            await lock.lock()
            held = True
        else:
            async with lock:
                print("held", flush=True)
            print("unlocked", flush=True)
            return
        print("held" if held else "not held", flush=True)
        if held:
            await lock.unlock()
            print("unlocked", flush=True)
    except aiolock.AioLockError as exc:
        print(f"error {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
