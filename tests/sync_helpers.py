"""Helpers shared by the tests of the semaphores and the latch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import redis.asyncio
from redis.asyncio.client import PubSub

import aiolock


async def eventually(check: Callable[[], Awaitable[object]], within: float = 5) -> None:
    """Poll state (on the server, or a client's statistics) until ``check`` is true."""
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def true(value: object) -> bool:
    return bool(value)


async def equal(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


async def quiet(client: aiolock.AioLock) -> None:
    """Wait until the client's background work (undoing, settling) is done."""
    await eventually(lambda: true(client.statistics().background_tasks == 0))


async def script_calls(redis_client: redis.asyncio.Redis) -> int:
    stats = await redis_client.info("commandstats")
    return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("evalsha", "eval"))


@asynccontextmanager
async def listening(redis_client: redis.asyncio.Redis, channel: str) -> AsyncIterator[PubSub]:
    """A redis-py subscription to ``channel``, confirmed; read it with :func:`message`."""
    pubsub = redis_client.pubsub()
    await pubsub.subscribe(channel)
    try:
        confirmation = await pubsub.get_message(timeout=5)
        assert confirmation is not None and confirmation["type"] == "subscribe"
        yield pubsub
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]


async def message(pubsub: PubSub, within: float = 5) -> bytes | None:
    """The payload of the next message (None if none came ``within`` seconds)."""
    got = await pubsub.get_message(timeout=within)
    if got is None:
        return None
    data = got["data"]
    assert isinstance(data, bytes)
    return data
