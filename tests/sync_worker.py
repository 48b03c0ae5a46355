"""A semaphore or latch user in a process of its own, driven by the tests (``start_worker``
in tests/test_semaphore_processes.py); it prints what it does, a line at a time.

sync_worker.py latch-wait URL NAME N          N tasks wait for the latch: "waiting" once
                                              all are parked, "open N" when all returned
sync_worker.py pes-hammer URL NAME N TASKS SECONDS WD
                                              TASKS tasks take permits of a permit-expirable
sync_worker.py pes-guard URL NAME WD           take a permit (watchdog timeout WD) in a
                                              guard: "permit ID"; then "guard-lost",
                                              "release-lost" as the loss is reported
sync_worker.py sem-hammer URL NAME N TASKS SECONDS
                                              (or plain) semaphore of N permits in turn for
                                              SECONDS; inside, each adds itself to the set
                                              "inside:NAME" and counts an overlap in
                                              "overlaps:NAME" if it finds more than N there.
                                              "started", then "done ROUNDS LOST" at the end
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from typing import Any

import aiolock

#: enter: add ARGV[1] to KEYS[1]; more than ARGV[2] members inside is an overlap (KEYS[2]);
#: every entry counts in KEYS[3], so the rounds of killed workers count too
ENTER = """
redis.call('sadd', KEYS[1], ARGV[1])
redis.call('incr', KEYS[3])
local inside = redis.call('scard', KEYS[1])
if inside > tonumber(ARGV[2]) then
    redis.call('incr', KEYS[2])
end
return inside
"""


async def main(command: str, url: str, name: str, *rest: str) -> None:
    config: dict[str, Any] = {}
    if command == "pes-hammer":
        config["watchdog_timeout"] = float(rest[3])
    elif command == "pes-guard":
        config["watchdog_timeout"] = float(rest[0])
    async with aiolock.from_url(url, **config) as client:
        if command == "latch-wait":
            await latch_wait(client, name, int(rest[0]))
        elif command == "pes-guard":
            await pes_guard(client.permit_expirable_semaphore(name))
        elif command in ("pes-hammer", "sem-hammer"):
            await hammer(client, command, name, int(rest[0]), int(rest[1]), float(rest[2]))
        else:
            raise SystemExit(f"unknown command {command!r}")


async def latch_wait(client: aiolock.AioLock, name: str, count: int) -> None:
    latch = client.countdown_latch(name)
    waiters = [asyncio.create_task(latch.wait(30)) for _ in range(count)]
    while latch.statistics().tasks_waiting < count:  # noqa: ASYNC110 (local state, no event)
        await asyncio.sleep(0.005)
    print("waiting", flush=True)
    results = await asyncio.gather(*waiters)
    print("open", sum(results), flush=True)


async def pes_guard(pes: aiolock.PermitExpirableSemaphore) -> None:
    permit = ""
    try:
        async with pes.guard() as permit:
            print("permit", permit, flush=True)  # the test pauses us after this line
            await asyncio.sleep(60)
    except aiolock.LockLostError:
        print("guard-lost", flush=True)
    try:
        await pes.release(permit)
    except aiolock.LockLostError:
        print("release-lost", flush=True)
    except aiolock.LockNotOwnedError:
        print("release-not-held", flush=True)


async def hammer(
    client: aiolock.AioLock, command: str, name: str, permits: int, tasks: int, seconds: float
) -> None:
    redis = client.redis
    enter = redis.register_script(ENTER)
    keys = [f"inside:{name}", f"overlaps:{name}", f"rounds:{name}"]
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    rounds = lost = 0
    pid = os.getpid()

    async def inside(member: str) -> None:
        await enter(keys=keys, args=[member, permits])
        try:
            await asyncio.sleep(random.uniform(0.001, 0.01))
        finally:
            await redis.srem(keys[0], member)

    async def pes_worker(index: int) -> None:
        nonlocal rounds, lost
        pes = client.permit_expirable_semaphore(name)
        while loop.time() < until:
            try:
                async with pes.guard(wait_time=0.5):
                    await inside(f"{pid}:{index}")
            except aiolock.LockTimeout:
                continue
            except aiolock.LockLostError:
                lost += 1  # left the guarded body at once (a slow machine's late renewal)
            rounds += 1

    async def sem_worker(index: int) -> None:
        nonlocal rounds
        sem = client.semaphore(name)
        while loop.time() < until:
            if not await sem.try_acquire(1, wait_time=0.5):
                continue
            try:
                await inside(f"{pid}:{index}")
            finally:
                await sem.release()
            rounds += 1

    worker = pes_worker if command == "pes-hammer" else sem_worker
    print("started", flush=True)
    await asyncio.gather(*(worker(i) for i in range(tasks)))
    print("done", rounds, lost, flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
