"""Queue workers with per-key locks: jobs of the same account never overlap.

Deposits wait in a Redis list (producers LPUSH JSON, workers BRPOP). Applying one is a
read-modify-write of the account's balance with some work in between, so two deposits to the
same account applied at once would lose one. Each worker takes the account's lock around the
job: jobs of one account run one at a time, in any worker, process or host, while jobs of
different accounts run in parallel.

To show it, every job also counts itself in the account's ``active`` key while it runs; a
count above one would be an overlap, and is added to ``overlaps``.

Every key starts with ``aiolock-example:worker:``. A run deletes them when it ends (and at its
start, in case an earlier run was killed), so it can be run again and again.

Run it (8 workers, each with its own client as if in its own process)::

    REDIS_URL=redis://localhost:6379/0 python -m examples.worker.worker
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections import Counter

import aiolock

PREFIX = "aiolock-example:worker"
QUEUE = f"{PREFIX}:deposits"
OVERLAPS = f"{PREFIX}:overlaps"


def balance_key(account: str) -> str:
    return f"{PREFIX}:balance:{account}"


def active_key(account: str) -> str:
    return f"{PREFIX}:active:{account}"


def lock_name(account: str) -> str:
    return f"{PREFIX}:lock:account:{account}"


async def clear(locks: aiolock.AioLock) -> int:
    """Delete every key of the example (SCAN, not KEYS); returns how many there were."""
    deleted = 0
    async for key in locks.redis.scan_iter(match=f"{PREFIX}:*", count=500):
        deleted += await locks.redis.delete(key)
    return deleted


WORK_TIME = 0.002
"""Seconds of work between reading a balance and writing it back."""


async def enqueue(locks: aiolock.AioLock, deposits: list[tuple[str, int]]) -> None:
    """Queue (account, amount) deposits."""
    jobs = [json.dumps({"account": account, "amount": amount}) for account, amount in deposits]
    await locks.redis.lpush(QUEUE, *jobs)


async def apply(locks: aiolock.AioLock, account: str, amount: int) -> None:
    """Add ``amount`` to the balance; correct only if no other job of ``account`` runs."""
    redis = locks.redis
    if await redis.incr(active_key(account)) > 1:
        await redis.incr(OVERLAPS)
    balance = int(await redis.get(balance_key(account)) or 0)
    await asyncio.sleep(WORK_TIME)
    await redis.set(balance_key(account), balance + amount)
    await redis.decr(active_key(account))


async def work(locks: aiolock.AioLock, idle_timeout: float = 1.0) -> int:
    """Apply queued jobs until the queue stays empty for ``idle_timeout`` s; returns how many."""
    done = 0
    while popped := await locks.redis.brpop([QUEUE], timeout=idle_timeout):
        job = json.loads(popped[1])
        async with locks.lock(lock_name(job["account"])):
            await apply(locks, job["account"], job["amount"])
        done += 1
    return done


async def main(redis_url: str, workers: int = 8, jobs: int = 400, accounts: int = 5) -> bool:
    """Queue random deposits, drain them with ``workers`` workers; True if nothing was lost."""
    clients = [aiolock.from_url(redis_url) for _ in range(workers)]
    try:
        await clear(clients[0])  # what a killed earlier run left
        deposits = [
            (f"acct-{random.randrange(accounts)}", random.randint(1, 100)) for _ in range(jobs)
        ]
        expected: Counter[str] = Counter()
        for account, amount in deposits:
            expected[account] += amount
        await enqueue(clients[0], deposits)
        handled = await asyncio.gather(*(work(client) for client in clients))
        redis = clients[0].redis
        balances = {a: int(await redis.get(balance_key(a)) or 0) for a in expected}
        overlaps = int(await redis.get(OVERLAPS) or 0)
        print(f"jobs per worker: {handled}; overlapping jobs: {overlaps}")
        for account in sorted(expected):
            print(f"{account}: balance {balances[account]}, deposited {expected[account]}")
        return overlaps == 0 and balances == dict(expected)
    finally:
        await clear(clients[0])
        for client in clients:
            await client.aclose()


if __name__ == "__main__":
    ok = asyncio.run(main(os.environ.get("REDIS_URL", "redis://localhost:6379/0")))
    raise SystemExit(0 if ok else 1)
