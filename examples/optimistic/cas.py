"""Optimistic concurrency (compare-and-set on a version field) next to a lock.

An item's stock lives in a Redis hash ``{stock, version}``. Taking one, optimistically:

1. read stock and version (no lock);
2. compute the new stock (here you could call other services: nothing is held);
3. write it with a Lua compare-and-set that succeeds only if the version is still the one
   read, and bumps it. If another writer got there first, nothing is written: retry.

The version, not the stock, is compared: a stock that went 5 -> 4 -> 5 in between (the ABA
problem) would fool a compare on the value but not on the version. After ``max_tries``
conflicts a taker stops spinning and takes the item's lock; under the lock it competes only
with optimistic writers still in their first tries.

Run the comparison (low and high contention, optimistic vs lock)::

    REDIS_URL=redis://localhost:6379/0 python -m examples.optimistic.cas
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

import aiolock

PREFIX = "aiolock-example:optimistic"
"""Every key of the example starts with this; :func:`main` deletes its keys when done."""

# KEYS[1] the item hash; ARGV[1] the version read; ARGV[2] the new stock.
# Returns 1 if written (version + 1), 0 if the version changed since it was read.
CAS = """
if redis.call('hget', KEYS[1], 'version') ~= ARGV[1] then
    return 0
end
redis.call('hset', KEYS[1], 'stock', ARGV[2], 'version', tonumber(ARGV[1]) + 1)
return 1
"""


@dataclass
class Stats:
    taken: int = 0
    sold_out: int = 0
    conflicts: int = 0
    """Compare-and-sets that lost to another writer (each one is a retry)."""
    fell_back: int = 0
    """Takers that gave up spinning and took the lock."""


class Inventory:
    """One item's stock, taken one at a time, optimistically or under a lock."""

    def __init__(self, locks: aiolock.AioLock, key: str) -> None:
        self.locks = locks
        self.key = key
        self.stats = Stats()
        self._cas = locks.redis.register_script(CAS)

    async def restock(self, stock: int) -> None:
        await self.locks.redis.hset(self.key, mapping={"stock": stock, "version": 0})

    async def stock(self) -> int:
        return int(await self.locks.redis.hget(self.key, "stock") or 0)

    async def take_optimistic(self, max_tries: int = 5) -> bool:
        """Take one with compare-and-set; False if sold out. Falls back to the lock."""
        for _ in range(max_tries):
            taken = await self._try_take()
            if taken is not None:
                return taken
        self.stats.fell_back += 1
        return await self.take_locked()

    async def take_locked(self) -> bool:
        """Take one under the item's lock; False if sold out."""
        async with self.locks.lock(f"{self.key}:lock"):
            while (taken := await self._try_take()) is None:
                pass  # lost to an optimistic writer; lock holders never race each other
            return taken

    async def _try_take(self) -> bool | None:
        """One optimistic attempt: True taken, False sold out, None conflict (retry)."""
        stock, version = await self.locks.redis.hmget(self.key, ["stock", "version"])
        if int(stock or 0) <= 0:
            self.stats.sold_out += 1
            return False
        if await self._cas(keys=[self.key], args=[int(version or 0), int(stock or 0) - 1]):
            self.stats.taken += 1
            return True
        self.stats.conflicts += 1
        return None


async def sell_out(items: list[Inventory], takers_per_item: int, optimistic: bool) -> float:
    """Tasks take from each item until it is sold out; returns the seconds it took."""

    async def taker(item: Inventory) -> None:
        take = item.take_optimistic if optimistic else item.take_locked
        while await take():
            pass

    started = time.perf_counter()
    await asyncio.gather(*(taker(item) for item in items for _ in range(takers_per_item)))
    return time.perf_counter() - started


async def main(redis_url: str, total: int = 256) -> None:
    """Sell ``total`` units both ways, first spread over 64 items with one taker each (low
    contention), then from one item with 64 takers (high contention); print the cost."""
    scenarios = {"64 items x 1 taker": (64, 1), "1 item x 64 takers": (1, 64)}
    async with aiolock.from_url(redis_url) as locks:
        print(f"{'scenario':<20} {'method':<10} {'seconds':>7} {'conflicts':>9} {'fell back':>9}")
        for scenario, (n_items, takers_per_item) in scenarios.items():
            for method in ("optimistic", "lock"):
                items = [Inventory(locks, f"{PREFIX}:item:{n}") for n in range(n_items)]
                try:
                    for item in items:
                        await item.restock(total // n_items)
                    seconds = await sell_out(items, takers_per_item, method == "optimistic")
                finally:  # the items' locks delete themselves on their last unlock
                    await locks.redis.delete(*(item.key for item in items))
                conflicts = sum(item.stats.conflicts for item in items)
                fell_back = sum(item.stats.fell_back for item in items)
                print(f"{scenario:<20} {method:<10} {seconds:>7.3f} {conflicts:>9} {fell_back:>9}")


if __name__ == "__main__":
    asyncio.run(main(os.environ.get("REDIS_URL", "redis://localhost:6379/0")))
