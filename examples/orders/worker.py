"""Payment jobs delivered at least once, paid exactly once: queue workers whose job function
is decorated with ``locks.locked(ORDER_LOCK)``.

A queue that may deliver a job twice (a retry after a timeout, a redelivery after a crash)
hands the same order to two workers at once; both would see "not paid" and charge twice.
The job function holds the order's lock for each call, named from its ``order_id``
argument: deliveries of one order take turns (the later ones find it paid and skip it),
different orders are paid in parallel.

Every key starts with ``aiolock-example:orders:``. A run deletes them at its end (and at its
start, in case an earlier run was killed), so it can be run again and again.

Run it (4 workers, each with its own client as if in its own process)::

    REDIS_URL=redis://localhost:6379/0 python -m examples.orders.worker
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable

import aiolock
from examples.orders import orders
from examples.orders.orders import ORDER_LOCK, PREFIX, AlreadyPaid

QUEUE = f"{PREFIX}:jobs"


def payer(locks: aiolock.AioLock) -> Callable[[str], Awaitable[bool]]:
    """The job function of a worker: pay ``order_id`` unless it is paid; True if it paid."""

    @locks.locked(ORDER_LOCK)  # each call holds the lock of its order_id, waiting for it
    async def pay_once(order_id: str) -> bool:
        try:
            await orders.pay(locks.redis, order_id)
        except AlreadyPaid:
            return False  # a duplicate delivery
        return True

    return pay_once


async def work(locks: aiolock.AioLock, idle_timeout: float = 1.0) -> tuple[int, int]:
    """Run jobs until the queue stays empty for ``idle_timeout`` s: (paid, duplicates)."""
    pay_once = payer(locks)
    paid = duplicates = 0
    while popped := await locks.redis.brpop([QUEUE], timeout=idle_timeout):
        if await pay_once(orders.text(popped[1])):
            paid += 1
        else:
            duplicates += 1
    return paid, duplicates


async def main(redis_url: str, workers: int = 4, count: int = 30, deliveries: int = 3) -> bool:
    """Queue ``count`` orders, each ``deliveries`` times, drain them with ``workers`` workers;
    True if every order was charged exactly once."""
    clients = [aiolock.from_url(redis_url) for _ in range(workers)]
    redis = clients[0].redis
    try:
        await orders.clear(redis)  # what a killed earlier run left
        jobs = [f"order-{n}" for n in range(count) for _ in range(deliveries)]
        random.shuffle(jobs)
        await redis.lpush(QUEUE, *jobs)
        results = await asyncio.gather(*(work(client) for client in clients))
        charged = await orders.charges(redis)
        print(f"(paid, duplicates) per worker: {results}")
        twice = sorted(order_id for order_id, n in charged.items() if n > 1)
        print(f"orders paid: {len(charged)} of {count}; charged more than once: {len(twice)}")
        return len(charged) == count and not twice
    finally:
        await orders.clear(redis)
        for client in clients:
            await client.aclose()


if __name__ == "__main__":
    ok = asyncio.run(main(os.environ.get("REDIS_URL", "redis://localhost:6379/0")))
    raise SystemExit(0 if ok else 1)
