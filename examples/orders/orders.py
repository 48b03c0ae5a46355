"""Orders paid exactly once (shared by the apps and the worker of this example).

Paying an order is check-then-act over several Redis calls and a slow call to a payment
provider: is it paid already? charge the card; mark it paid. Two payments of one order at
once (a double click, a retried request, a job delivered twice) would both see "not paid"
and charge twice. Everything that pays or refunds an order holds the order's lock,
:data:`ORDER_LOCK` with the order's id filled in, so they take turns; other orders go on in
parallel.

Each order is a hash ``aiolock-example:orders:order:<id>`` with its ``status`` and how many
times it was ``charged`` (more than once would be the bug the lock prevents). Every key of
the example starts with :data:`PREFIX`.
"""

from __future__ import annotations

import asyncio
from typing import Final

from redis.asyncio import Redis, RedisCluster

Client = Redis | RedisCluster
"""The Redis connection of an aiolock client (``locks.redis``)."""

PREFIX: Final = "aiolock-example:orders"
ORDER_LOCK: Final = PREFIX + ":lock:order:{order_id}"
"""The name of an order's lock: a template that the decorator and the FastAPI dependency fill
from the call's arguments or the request's path (``order_id``)."""
CHARGE_TIME = 0.02
"""Seconds the payment provider takes to charge a card."""


class AlreadyPaid(Exception):
    """The order was paid before."""


class NotPaid(Exception):
    """The order has not been paid, so it cannot be refunded."""


def order_key(order_id: str) -> str:
    return f"{PREFIX}:order:{order_id}"


def order_lock(order_id: str) -> str:
    """The lock name of ``order_id`` (the template filled in)."""
    return ORDER_LOCK.format(order_id=order_id)


async def pay(redis: Client, order_id: str) -> dict[str, str]:
    """Charge the order once; AlreadyPaid if it was paid. Correct only under its lock."""
    key = order_key(order_id)
    if await redis.hget(key, "status") == b"paid":
        raise AlreadyPaid(f"order {order_id} is paid already")
    await asyncio.sleep(CHARGE_TIME)  # the payment provider charges the card
    await redis.hincrby(key, "charged", 1)
    await redis.hset(key, "status", "paid")
    return {"order_id": order_id, "status": "paid"}


async def refund(redis: Client, order_id: str) -> dict[str, str]:
    """Refund a paid order; NotPaid if it is not paid. Correct only under its lock."""
    key = order_key(order_id)
    if await redis.hget(key, "status") != b"paid":
        raise NotPaid(f"order {order_id} is not paid")
    await asyncio.sleep(CHARGE_TIME)  # the payment provider refunds the card
    await redis.hset(key, "status", "refunded")
    return {"order_id": order_id, "status": "refunded"}


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def state(redis: Client, order_id: str) -> dict[str, str | int]:
    """The order's status (``new`` until paid) and how many times it was charged."""
    fields = {text(k): text(v) for k, v in (await redis.hgetall(order_key(order_id))).items()}
    return {
        "order_id": order_id,
        "status": fields.get("status", "new"),
        "charged": int(fields.get("charged", 0)),
    }


async def charges(redis: Client) -> dict[str, int]:
    """How many times each order was charged."""
    found: dict[str, int] = {}
    async for key in redis.scan_iter(match=order_key("*"), count=500):
        order_id = text(key).rsplit(":", 1)[1]
        found[order_id] = int(await redis.hget(key, "charged") or 0)
    return found


async def clear(redis: Client) -> int:
    """Delete every key of the example (SCAN, not KEYS); returns how many there were."""
    deleted = 0
    async for key in redis.scan_iter(match=f"{PREFIX}:*", count=500):
        deleted += await redis.delete(key)
    return deleted
