"""Testing code that uses aiolock, with aiolock's pytest plugin (docs/testing.md).

The plugin is opt-in; this suite needs it loaded, e.g. by the top-level ``conftest.py`` of
your project::

    pytest_plugins = ["aiolock.testing.pytest_plugin"]

or, from this repository's root: ``pytest -p aiolock.testing.pytest_plugin examples/testing``.
It runs on pytest-asyncio; every test gets an empty database.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import redis.asyncio

import aiolock
from aiolock.testing import TcpProxy

pytestmark = pytest.mark.asyncio


# -- the code under test: a seat goes to the first who asks, whichever process they are in ---


async def reserve(locks: aiolock.AioLock, db: redis.asyncio.Redis, seat: str, who: str) -> bool:
    """Give ``seat`` to ``who`` if it is free; True if they got it."""
    async with locks.lock(f"seat-lock:{seat}"):
        if await db.exists(f"seat:{seat}"):
            return False
        await asyncio.sleep(0.001)  # without the lock, every caller would get here
        await db.set(f"seat:{seat}", who)
        return True


# -- the tests ---------------------------------------------------------------------------------


@pytest_asyncio.fixture  # an async fixture in pytest-asyncio's strict mode (its default)
async def db(aiolock_redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """A plain Redis client on the same (emptied) database, for the code under test."""
    client = redis.asyncio.Redis.from_url(aiolock_redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def test_a_seat_goes_to_one_caller(
    aiolock_client: aiolock.AioLock, db: redis.asyncio.Redis, aiolock_redis_url: str
) -> None:
    # A second client stands for another process: its own connections, its own owner ids.
    async with aiolock.from_url(aiolock_redis_url) as other_process:
        results = await asyncio.gather(
            *(reserve(aiolock_client, db, "12A", f"alice-{i}") for i in range(10)),
            *(reserve(other_process, db, "12A", f"bob-{i}") for i in range(10)),
        )
    assert results.count(True) == 1
    assert str(await db.get("seat:12A")).startswith(("alice-", "bob-"))


async def test_every_test_starts_on_an_empty_database(db: redis.asyncio.Redis) -> None:
    assert await db.dbsize() == 0  # the seat of the test above is gone


async def test_a_silent_redis_fails_the_call_in_time(
    aiolock_proxy: TcpProxy, db: redis.asyncio.Redis
) -> None:
    # The code under test connects through the fault proxy, which then swallows the replies:
    # the call fails within its bounds (command_timeout, then cleanup_timeout to settle what a
    # lost reply did) with an error that says what is known.
    async with aiolock.from_url(aiolock_proxy.url, command_timeout=0.5, cleanup_timeout=1) as locks:
        assert await reserve(locks, db, "7B", "carol")
        aiolock_proxy.blackhole_replies()
        with pytest.raises(aiolock.RedisOperationError):
            await reserve(locks, db, "7C", "carol")
    assert await db.get("seat:7C") is None
