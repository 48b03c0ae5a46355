"""A lock user in a process of its own, driven by the tests (see ``run_worker``).

proc_worker.py try URL NAME                    print "True"/"False" of try_lock()
proc_worker.py hold URL NAME SECONDS           lock, print "locked", sleep, unlock
proc_worker.py hammer URL NAME TASKS ROUNDS    TASKS tasks x ROUNDS `async with lock` with
                                               an INCR/DECR guard; print overlaps, rounds
"""

from __future__ import annotations

import asyncio
import sys

import aiolock


async def main(command: str, url: str, name: str, *rest: str) -> None:
    async with aiolock.from_url(url) as client:
        lock = client.lock(name)
        if command == "try":
            print(await lock.try_lock())
        elif command == "hold":
            await lock.lock()
            print("locked", flush=True)
            await asyncio.sleep(float(rest[0]))
            await lock.unlock()
        elif command == "hammer":
            tasks, rounds = int(rest[0]), int(rest[1])
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
        else:
            raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
