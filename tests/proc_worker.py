"""A lock user in a process of its own, driven by the tests (see ``run_worker``).

The lock type is $AIOLOCK_TEST_LOCK_TYPE (a key of tests.test_lock_family.FACTORIES; default
"lock"), so the behaviour suite runs every type across processes.

proc_worker.py try URL NAME                    print "True"/"False" of try_lock()
proc_worker.py hold URL NAME SECONDS [WD]      lock (watchdog timeout WD), print "locked",
                                               sleep, unlock
proc_worker.py hammer URL NAME TASKS ROUNDS    TASKS tasks x ROUNDS `async with lock` with
                                               an INCR/DECR guard; print overlaps, rounds
proc_worker.py fenced-guard URL NAME WD        take a fenced lock, print "token N", hold it
                                               in a guard; print "callback", "guard-lost"
                                               and "unlock-lost" as the loss is reported
proc_worker.py guard URL NAME WD               the same with the lock type: "held" first
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiolock
from tests.test_lock_family import FACTORIES, FamilyLock


async def main(command: str, url: str, name: str, *rest: str) -> None:
    # the optional watchdog timeout: 2nd extra argument of "hold", 1st of "fenced-guard"
    watchdog = {"hold": rest[1:2], "fenced-guard": rest[:1], "guard": rest[:1]}.get(command, ())
    config: dict[str, Any] = {"watchdog_timeout": float(watchdog[0])} if watchdog else {}
    make_lock = FACTORIES[os.environ.get("AIOLOCK_TEST_LOCK_TYPE", "lock")]
    async with aiolock.from_url(url, **config) as client:
        lock = make_lock(client, name)
        if command == "try":
            print(await lock.try_lock())
        elif command == "hold":
            await lock.lock()
            print("locked", flush=True)
            await asyncio.sleep(float(rest[0]))
            await lock.unlock()
        elif command == "hammer":
            await hammer(client, name, int(rest[0]), int(rest[1]))
        elif command == "fenced-guard":
            await fenced_guard(client.fenced_lock(name))
        elif command == "guard":
            await guard(lock)
        else:
            raise SystemExit(f"unknown command {command!r}")


async def hammer(client: aiolock.AioLock, name: str, tasks: int, rounds: int) -> None:
    lock = FACTORIES[os.environ.get("AIOLOCK_TEST_LOCK_TYPE", "lock")](client, name)
    overlaps = done = 0

    async def worker() -> None:
        nonlocal overlaps, done
        for _ in range(rounds):
            async with lock:
                if await client.redis.incr(f"guard:{name}") != 1:
                    overlaps += 1
                await asyncio.sleep(0.001)
                await client.redis.decr(f"guard:{name}")
            done += 1

    await asyncio.gather(*(worker() for _ in range(tasks)))
    print(overlaps, done)


async def fenced_guard(lock: aiolock.FencedLock) -> None:
    token = await lock.lock_and_get_token()
    lock.on_lost(lambda error: print("callback", flush=True))
    try:
        async with lock.guard():
            print("token", token, flush=True)  # only now: the test pauses us after this line
            await asyncio.sleep(60)
    except aiolock.LockLostError:
        print("guard-lost", flush=True)
    try:
        await lock.unlock()
    except aiolock.LockLostError:
        print("unlock-lost", flush=True)


async def guard(lock: FamilyLock) -> None:
    await lock.lock()
    lock.on_lost(lambda error: print("callback", flush=True))
    try:
        async with lock.guard():
            print("held", flush=True)  # only now: the test pauses or kills us after this line
            await asyncio.sleep(60)
    except aiolock.LockLostError:
        print("guard-lost", flush=True)
    try:
        await lock.unlock()
    except aiolock.LockLostError:
        print("unlock-lost", flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
