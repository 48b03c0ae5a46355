r"""A coupon flash sale in Redis, made safe with aiolock locks (used by the web examples).

The sale is three Redis keys: the stock (a counter), the buyers (a set) and the orders (a
list). Selling a coupon is check-then-act over several Redis calls: has this user bought?
is there stock? write back one less, record the buyer. Two locks make that safe across any
number of tasks, processes and servers:

* the user's lock ``<sale>:lock:user:<id>`` makes "check, then record" one step per user,
  so a double click cannot buy two coupons;
* the stock lock ``<sale>:lock:stock``, held only around the check-and-decrement, makes
  overselling impossible while keeping the hot section short.

The user's lock is always taken first, so the two can never deadlock.

Every key lives under the sale's name (``aiolock-example:seckill`` unless told otherwise), so
the example never touches anyone else's data. Several app instances may share one sale: each
one :meth:`~CouponSale.open`\ s it when it starts and :meth:`~CouponSale.close`\ s it when it
stops, and the last one to stop deletes the sale's keys, so a second run starts afresh.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import aiolock

DEFAULT_NAME: Final = "aiolock-example:seckill"

# KEYS: the instance counter, then every key of the sale. Returns the instances left.
_LEAVE: Final = """
local left = redis.call('decr', KEYS[1])
if left <= 0 then
    redis.call('del', unpack(KEYS))
end
return left
"""


class SoldOut(Exception):
    """No coupon left."""


class AlreadyBought(Exception):
    """This user already has a coupon of this sale."""


@dataclass(frozen=True)
class Order:
    user_id: str
    coupons_left: int


class CouponSale:
    """One sale, on the Redis connection of an aiolock client."""

    def __init__(self, locks: aiolock.AioLock, name: str = DEFAULT_NAME) -> None:
        self.locks = locks
        self.redis = locks.redis
        self.name = name
        self.stock_key = f"{name}:stock"
        self.buyers_key = f"{name}:buyers"
        self.orders_key = f"{name}:orders"
        self.instances_key = f"{name}:instances"
        self._leave = self.redis.register_script(_LEAVE)

    async def open(self, coupons: int) -> None:
        """Join the sale, putting ``coupons`` on sale unless another instance already did."""
        await self.redis.incr(self.instances_key)
        await self.redis.set(self.stock_key, coupons, nx=True)

    async def close(self) -> None:
        """Leave the sale; the last instance to leave deletes its keys."""
        keys = [self.instances_key, self.stock_key, self.buyers_key, self.orders_key]
        await self._leave(keys=keys)

    async def stock(self) -> int:
        return int(await self.redis.get(self.stock_key) or 0)

    async def orders(self) -> list[str]:
        """The buyer of every order, in order."""
        users = await self.redis.lrange(self.orders_key, 0, -1)
        return [user.decode() if isinstance(user, bytes) else user for user in users]

    async def buy(self, user_id: str, *, wait_time: float | None = None) -> Order:
        """Sell one coupon to ``user_id``.

        Waits for the locks as long as it takes, or at most ``wait_time`` seconds for each,
        then raises :class:`aiolock.LockTimeout`. Raises :class:`AlreadyBought` or
        :class:`SoldOut` when there is nothing to sell to this user.
        """
        async with self.locks.alock(f"{self.name}:lock:user:{user_id}", wait_time=wait_time):
            if await self.redis.sismember(self.buyers_key, user_id):
                raise AlreadyBought(f"user {user_id} already has a coupon")
            async with self.locks.alock(f"{self.name}:lock:stock", wait_time=wait_time):
                stock = await self.stock()
                if stock <= 0:
                    raise SoldOut("sold out")
                await self.redis.set(self.stock_key, stock - 1)
            await self.redis.sadd(self.buyers_key, user_id)
            await self.redis.rpush(self.orders_key, user_id)
        return Order(user_id, stock - 1)
