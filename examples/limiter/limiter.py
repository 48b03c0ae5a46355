"""At most LIMIT calls at once to a partner's API, across every worker: a semaphore.

The partner takes at most 3 requests at a time. Workers (each with its own client, as if in
its own process) run tasks that call it; every call holds a permit of one semaphore, so no
more than 3 calls run at once, however many workers and tasks there are. To show it, each
call counts itself in the ``active`` key while it runs, and the run reports the most seen.

It runs the same calls with both kinds of semaphore:

* ``client.semaphore(name)``: Redisson's RSemaphore, a count of permits. A worker killed
  while it holds permits never gives them back.
* ``client.permit_expirable_semaphore(name)``: each permit is a hold with a lease, renewed by
  the watchdog while its task lives; a killed worker's permits return to the pool by
  themselves one lease later. Use it when workers can die.

A semaphore must be given its permits once: ``try_set_permits(LIMIT)`` sets them unless
someone has (every worker may call it at start; the first one wins). One never given any has
none: ``acquire()`` waits until someone does, and aiolock logs a warning saying so.

Every key starts with ``aiolock-example:limiter:`` (or ``{aiolock-example:limiter:``, the
semaphores' side keys). A run deletes them when it ends (and at its
start, in case an earlier run was killed), so it can be run again and again.

Run it (4 workers of 5 tasks each, 40 calls)::

    REDIS_URL=redis://localhost:6379/0 python -m examples.limiter.limiter
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import aiolock

PREFIX = "aiolock-example:limiter"
LIMIT = 3
ACTIVE = f"{PREFIX}:active"
CALL_TIME = 0.02
"""Seconds one call to the partner takes."""

Permit = Callable[[aiolock.AioLock], AbstractAsyncContextManager[object]]


async def clear(locks: aiolock.AioLock) -> int:
    """Delete every key of the example (SCAN, not KEYS); returns how many there were. The
    semaphores' side keys are ``{name}:...`` (the permits taken, the records that settle
    lost replies): their names are in braces, which keep them in the semaphore's slot."""
    deleted = 0
    for pattern in (f"{PREFIX}:*", f"{{{PREFIX}:*"):
        async for key in locks.redis.scan_iter(match=pattern, count=500):
            deleted += await locks.redis.delete(key)
    return deleted


class Partner:
    """The partner's API: a call takes CALL_TIME, and counts how many run at once."""

    def __init__(self) -> None:
        self.peak = 0
        self.calls = 0

    async def call(self, locks: aiolock.AioLock) -> None:
        running = await locks.redis.incr(ACTIVE)
        self.peak = max(self.peak, running)
        await asyncio.sleep(CALL_TIME)
        await locks.redis.decr(ACTIVE)
        self.calls += 1


def semaphore(kind: str) -> Permit:
    """Hold one permit of the semaphore of type ``kind`` for the ``async with`` body."""
    name = f"{PREFIX}:{kind}"
    if kind == "semaphore":
        return lambda locks: locks.semaphore(name)  # async with sem: one permit
    if kind == "permit_expirable_semaphore":
        return lambda locks: locks.permit_expirable_semaphore(name).permit()
    raise ValueError(f"unknown kind {kind!r}")


async def set_permits(locks: aiolock.AioLock, kind: str) -> None:
    """Give the semaphore its LIMIT permits, unless someone already has."""
    name = f"{PREFIX}:{kind}"
    if kind == "semaphore":
        await locks.semaphore(name).try_set_permits(LIMIT)
    else:
        await locks.permit_expirable_semaphore(name).try_set_permits(LIMIT)


@asynccontextmanager
async def nothing(locks: aiolock.AioLock) -> AsyncIterator[None]:
    yield  # no limit: the control experiment


async def worker(
    locks: aiolock.AioLock, partner: Partner, permit: Permit, tasks: int, calls: int
) -> None:
    """``tasks`` tasks of this worker share ``calls`` calls, each under a permit."""
    queue = list(range(calls))

    async def task() -> None:
        while queue:
            queue.pop()
            async with permit(locks):
                await partner.call(locks)

    await asyncio.gather(*(task() for _ in range(tasks)))


async def run(
    redis_url: str, kind: str | None, workers: int = 4, tasks: int = 5, calls: int = 10
) -> Partner:
    """``workers`` workers make ``calls`` calls each, limited by a semaphore of type ``kind``
    (None: not limited); the partner, which saw the most calls at once."""
    clients = [aiolock.from_url(redis_url) for _ in range(workers)]
    partner = Partner()
    try:
        await clear(clients[0])  # what a killed earlier run left
        if kind is not None:
            for client in clients:  # each worker at its start; the first one sets them
                await set_permits(client, kind)
        permit = semaphore(kind) if kind is not None else nothing
        await asyncio.gather(*(worker(c, partner, permit, tasks, calls) for c in clients))
        return partner
    finally:
        await clear(clients[0])
        for client in clients:
            await client.aclose()


async def main(redis_url: str) -> bool:
    """Both kinds; True if neither let more than LIMIT calls run at once."""
    ok = True
    for kind in ("semaphore", "permit_expirable_semaphore"):
        partner = await run(redis_url, kind)
        print(f"{kind}: {partner.calls} calls, at most {partner.peak} at once (limit {LIMIT})")
        ok = ok and partner.peak <= LIMIT
    return ok


if __name__ == "__main__":
    ok = asyncio.run(main(os.environ.get("REDIS_URL", "redis://localhost:6379/0")))
    raise SystemExit(0 if ok else 1)
