"""LocalSentinel: a master, its replica and three real Sentinels, with failovers.

One setup serves the whole module (~2-3 s to come up: the Sentinels find each other through
hello messages every 2 s); every test starts from ``heal()``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio
import redis.asyncio.sentinel

from aiolock.testing import LocalSentinel, find_redis_server_binary

pytestmark = pytest.mark.skipif(
    find_redis_server_binary() is None, reason="needs a redis-server binary"
)

HANG_GUARD = 30  # seconds; only there so that a bug fails instead of hanging


@pytest.fixture(scope="module")
def shared_setup() -> Iterator[LocalSentinel]:
    with LocalSentinel() as setup:
        yield setup


@pytest.fixture
def setup(shared_setup: LocalSentinel) -> LocalSentinel:
    shared_setup.heal()
    return shared_setup


@pytest.fixture
async def sentinel(setup: LocalSentinel) -> AsyncIterator[redis.asyncio.sentinel.Sentinel]:
    sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        setup.sentinel_addresses, socket_timeout=5
    )
    try:
        yield sentinel
    finally:
        for connection in sentinel.sentinels:
            await connection.aclose()


@pytest.fixture
async def master_client(
    setup: LocalSentinel, sentinel: redis.asyncio.sentinel.Sentinel
) -> AsyncIterator[redis.asyncio.Redis]:
    client = sentinel.master_for(setup.master_name)
    try:
        await client.flushall()
        yield client
    finally:
        await client.aclose()


async def write_after_failover(client: redis.asyncio.Redis, key: str, value: str) -> None:
    """redis-py's Sentinel client answers the first READONLY from the demoted master with
    ConnectionError("The previous master is now a slave"), then asks the Sentinels again."""
    for _ in range(3):
        with contextlib.suppress(redis.ConnectionError):
            await client.set(key, value)
            return
    await client.set(key, value)


async def test_starts_a_master_a_replica_and_three_sentinels(
    setup: LocalSentinel, sentinel: redis.asyncio.sentinel.Sentinel
) -> None:
    assert len(setup.sentinels) == 3
    assert len(setup.sentinel_addresses) == 3
    master = setup.master()
    (replica,) = setup.replicas()
    assert setup.master_address() == master.address
    assert setup.replica_addresses() == [replica.address]
    assert await sentinel.discover_master(setup.master_name) == master.address
    assert await sentinel.discover_slaves(setup.master_name) == [replica.address]
    async with redis.asyncio.Redis.from_url(replica.url, decode_responses=True) as direct:
        info = await direct.info("replication")
        assert (info["role"], info["master_port"]) == ("slave", master.port)


async def test_manual_failover_and_master_for_follows(
    setup: LocalSentinel, master_client: redis.asyncio.Redis
) -> None:
    await master_client.set("k", "before")
    assert await master_client.wait(1, 5000) == 1  # the replica has it
    old = setup.master()
    async with asyncio.timeout(HANG_GUARD):
        new = await asyncio.to_thread(setup.failover)
    assert new is not old
    assert setup.master() is new
    assert setup.replicas() == [old]  # demoted at once, and in sync
    await write_after_failover(master_client, "k2", "after")
    async with redis.asyncio.Redis.from_url(new.url) as direct:
        assert await direct.mget("k", "k2") == [b"before", b"after"]


async def test_kill_master_promotes_the_replica(
    setup: LocalSentinel, master_client: redis.asyncio.Redis
) -> None:
    await master_client.set("k", "kept")
    assert await master_client.wait(1, 5000) == 1  # the replica has it
    (replica,) = setup.replicas()
    killed = setup.kill_master()
    assert not killed.is_running
    async with asyncio.timeout(HANG_GUARD):
        new = await asyncio.to_thread(setup.wait_for_new_master)
    assert new is replica
    assert await master_client.get("k") == b"kept"
    assert setup.replicas() == []

    await asyncio.to_thread(setup.restart, killed)
    assert setup.replicas() == [killed]


def test_heal_after_a_master_and_a_sentinel_died(setup: LocalSentinel) -> None:
    old = setup.kill_master()
    setup.sentinels[0].kill()
    setup.heal()  # waits for the failover first, then brings both back
    assert setup.master() is not old
    assert setup.replicas() == [old]
    assert all(sentinel.is_running for sentinel in setup.sentinels)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        LocalSentinel(master_name="two words")
    with pytest.raises(ValueError):
        LocalSentinel(sentinels=1, quorum=2)
    with pytest.raises(TypeError):
        LocalSentinel(extra_args="--maxmemory 1mb")
    with pytest.raises(ValueError, match="previous="):
        LocalSentinel().wait_for_new_master()
