"""The three ways the demo sells a coupon.

* ``naive``: read the stock, check it, write it back; check the buyer, record the buyer. Each
  step is fine alone, but between the read and the write other buyers read the same stock:
  coupons are oversold and a user who clicks twice gets two.
* ``lock``: the same steps, with aiolock locks around them: a per-user lock for one coupon per
  user and the stock lock around the check-and-decrement.
* ``lua``: the playbook's fast path: one script checks and takes the coupon atomically inside
  Redis and queues the order on a stream; :mod:`aiolock.demo.orders` writes it to the database.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Final, Protocol

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from ..client import AioLock
from .sale import Outcome, SaleKeys


@dataclass(frozen=True, slots=True)
class LuaScript:
    """A Lua script of the demo package: its source and the SHA1 that EVALSHA names it by."""

    name: str
    source: str
    sha: str

    @classmethod
    def load(cls, name: str) -> LuaScript:
        """``<name>.lua`` beside this module."""
        package = resources.files(__name__.rpartition(".")[0])
        source = package.joinpath(f"{name}.lua").read_text(encoding="utf-8")
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())


SECKILL_BUY: Final = LuaScript.load("seckill_buy")

WORK_DELAY: Final = 0.002
"""Seconds between reading the stock and writing it back: the service's own work and its
database round trip in a real shop. It is what makes the naive race visible."""

NAMES: Final = ("naive", "lock", "lua")

_LUA_OUTCOMES: Final = {0: Outcome.BOUGHT, 1: Outcome.SOLD_OUT, 2: Outcome.ALREADY_BOUGHT}


class Strategy(Protocol):
    """One way of selling: ``buy`` makes one purchase attempt and returns its outcome."""

    async def buy(self, user_id: int, order_id: str) -> Outcome: ...


class _ReadModifyWrite:
    """The shop's steps as separate Redis calls; safe only if the caller serialises them."""

    def __init__(self, redis: Redis, keys: SaleKeys) -> None:
        self.redis = redis
        self.keys = keys

    async def has_bought(self, user_id: int) -> bool:
        return bool(await self.redis.sismember(self.keys.buyers, str(user_id)))

    async def take_one(self) -> bool:
        """Read the stock; if a coupon is left, write back one less. False if sold out."""
        stock = int(await self.redis.get(self.keys.stock) or 0)
        if stock <= 0:
            return False
        await asyncio.sleep(WORK_DELAY)
        await self.redis.set(self.keys.stock, stock - 1)
        return True

    async def record(self, user_id: int) -> None:
        await self.redis.sadd(self.keys.buyers, str(user_id))
        await self.redis.rpush(self.keys.orders, str(user_id))


class Naive(_ReadModifyWrite):
    """No locks: check-then-act races with every other buyer."""

    async def buy(self, user_id: int, order_id: str) -> Outcome:
        if await self.has_bought(user_id):
            return Outcome.ALREADY_BOUGHT
        if not await self.take_one():
            return Outcome.SOLD_OUT
        await self.record(user_id)
        return Outcome.BOUGHT


class Locked(_ReadModifyWrite):
    """The naive steps under aiolock locks.

    The user's lock (taken first) makes "has this user bought? then record the purchase" one
    step per user; the stock lock, held only around the check-and-decrement, keeps the hot
    section short. Locks are always taken in this order, so they cannot deadlock.
    """

    def __init__(self, locks: AioLock, keys: SaleKeys) -> None:
        assert isinstance(locks.redis, Redis), "the demo runs on one Redis server"
        super().__init__(locks.redis, keys)
        self.locks = locks

    async def buy(self, user_id: int, order_id: str) -> Outcome:
        async with self.locks.lock(self.keys.user_lock(user_id)):
            if await self.has_bought(user_id):
                return Outcome.ALREADY_BOUGHT
            async with self.locks.lock(self.keys.stock_lock):
                if not await self.take_one():
                    return Outcome.SOLD_OUT
            await self.record(user_id)
        return Outcome.BOUGHT


class Atomic:
    """One Lua script does it all inside Redis; the order goes to the stream.

    redis-py may send the script again when a reply is lost; that is safe here, because a
    second run for the same user answers "already bought" instead of selling again.
    """

    def __init__(self, redis: Redis, keys: SaleKeys) -> None:
        self.redis = redis
        self.keys = keys

    async def buy(self, user_id: int, order_id: str) -> Outcome:
        keys_and_args = (self.keys.stock, self.keys.buyers, self.keys.stream, user_id, order_id)
        try:
            reply = await self.redis.evalsha(SECKILL_BUY.sha, 3, *keys_and_args)
        except NoScriptError:  # not run: the script cache is empty; EVAL runs and caches it
            reply = await self.redis.eval(SECKILL_BUY.source, 3, *keys_and_args)
        return _LUA_OUTCOMES[int(reply)]
