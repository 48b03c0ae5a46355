"""Replica acknowledgement (``Config.replica_acks``, Redisson's ``checkLockSyncedSlaves``):
``WAIT n timeout`` right after each acquire and release script, on the same connection.

A master and its replica (real redis-server processes) serve the module. The fault is real:
the replica is frozen with SIGSTOP, so it acknowledges nothing; the master still counts it
as connected. A grant nobody acknowledged is given back (the keys are checked) and
ReplicationError raised, within replica_ack_timeout + command_timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import aiolock
from aiolock.testing import RedisServer, find_redis_server_binary
from aiolock.transport import Chain, Link, ServerSettings, pack
from tests.test_lock_family import EXCLUSIVE

pytestmark = pytest.mark.skipif(
    find_redis_server_binary() is None, reason="needs a redis-server binary"
)

ACKS: dict[str, Any] = {"replica_acks": 1, "replica_ack_timeout": 0.5, "command_timeout": 3.0}


def _wait_for_link(replica: RedisServer, master: RedisServer) -> None:
    with redis.Redis(*replica.address, socket_timeout=10) as client:
        client.replicaof(master.host, master.port)
        for _ in range(600):
            info = client.info("replication")
            if info.get("master_link_status") == "up" and not info.get("master_sync_in_progress"):
                return
            time.sleep(0.05)
    raise AssertionError("the replica did not come up")


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[RedisServer, RedisServer]]:
    with RedisServer() as master, RedisServer() as replica:
        _wait_for_link(replica, master)
        yield master, replica


@pytest.fixture
def servers(pair: tuple[RedisServer, RedisServer]) -> tuple[RedisServer, RedisServer]:
    master, replica = pair
    if replica.is_paused:
        replica.resume()
    with redis.Redis(*master.address, socket_timeout=10) as client:
        client.flushall()
        client.execute_command("WAIT", 1, 5000)
    return master, replica


@pytest.fixture
async def make_client(
    servers: tuple[RedisServer, RedisServer],
) -> AsyncIterator[Callable[..., aiolock.AioLock]]:
    made: list[aiolock.AioLock] = []

    def make(**config: Any) -> aiolock.AioLock:
        made.append(aiolock.from_url(servers[0].url, **{**ACKS, **config}))
        return made[-1]

    yield make
    for client in made:
        await client.aclose()


def _keys(master: RedisServer) -> list[bytes]:
    """The keys that would say something is held (not a fenced lock's token counter, which
    only grows, nor request latches)."""
    with redis.Redis(*master.address) as client:
        return sorted(
            key
            for key in client.keys("*")
            if b"aiolock_requests" not in key and not key.startswith(b"redisson_lock_token:")
        )


@pytest.mark.parametrize("kind", sorted(EXCLUSIVE))
async def test_acquire_and_release_with_a_replica(
    make_client: Callable[..., aiolock.AioLock], servers: tuple[RedisServer, RedisServer], kind: str
) -> None:
    client = make_client()
    lock = EXCLUSIVE[kind](client, "acks")
    assert await lock.try_lock(5)
    with redis.Redis(*servers[1].address) as replica:
        assert replica.exists("acks")  # acknowledged: the replica has it
    await lock.unlock()
    assert not await lock.is_locked()


async def test_shared_types_with_a_replica(make_client: Callable[..., aiolock.AioLock]) -> None:
    client = make_client()
    rw = client.read_write_lock("acks:rw")
    async with rw.read_lock(), rw.read_lock():
        pass
    semaphore = client.semaphore("acks:sem")
    assert await semaphore.try_set_permits(1)
    assert await semaphore.try_acquire(1, 1)
    await semaphore.release()
    latch = client.countdown_latch("acks:latch")  # waiting on an open latch writes nothing
    assert await latch.wait(1)


@pytest.mark.parametrize("kind", sorted(EXCLUSIVE))
async def test_a_frozen_replica_fails_the_acquire_and_leaves_nothing(
    make_client: Callable[..., aiolock.AioLock], servers: tuple[RedisServer, RedisServer], kind: str
) -> None:
    master, replica = servers
    client = make_client()
    lock = EXCLUSIVE[kind](client, "acks:frozen")
    replica.pause()
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(aiolock.RedisOperationError, match="no replica acknowledged") as caught:
            await lock.try_lock(0)
        spent = loop.time() - started
        if kind != "red_lock":  # (a red lock reports its members' failures as a lost quorum)
            assert isinstance(caught.value, aiolock.ReplicationError)
            assert caught.value.acknowledged == 0 and caught.value.requested == 1
        assert spent <= 30  # bounded (a hang is the failure; no speed is asserted)
        assert not await lock.is_locked()  # given back
        if kind != "permit_expirable_semaphore(1)":  # (its permit count stays, at 1)
            assert _keys(master) == []
        assert client.statistics().holds["held"] == 0
    finally:
        replica.resume()
    assert await lock.try_lock(5)  # acknowledged again
    await lock.unlock()


async def test_a_frozen_replica_fails_a_reentrant_acquire_and_keeps_the_outer_hold(
    make_client: Callable[..., aiolock.AioLock], servers: tuple[RedisServer, RedisServer]
) -> None:
    master, replica = servers
    lock = make_client().lock("acks:reentrant")
    await lock.lock()
    replica.pause()
    try:
        with pytest.raises(aiolock.ReplicationError):
            await lock.lock()
        assert await lock.hold_count() == 1  # only the unacknowledged count was taken back
    finally:
        replica.resume()
    await lock.unlock()
    assert _keys(master) == []


async def test_a_frozen_replica_does_not_fail_a_release(
    make_client: Callable[..., aiolock.AioLock], servers: tuple[RedisServer, RedisServer]
) -> None:
    """A release nobody acknowledged still released the lock on the master (a failover
    could bring it back until its lease ends): it is logged, not raised."""
    master, replica = servers
    lock = make_client().lock("acks:release")
    await lock.lock()
    replica.pause()
    try:
        await lock.unlock()
        assert _keys(master) == []
    finally:
        replica.resume()


async def test_no_replica_at_all_fails_closed(make_client: Callable[..., aiolock.AioLock]) -> None:
    with RedisServer() as alone:
        async with aiolock.from_url(alone.url, **ACKS) as client:
            with pytest.raises(aiolock.ReplicationError, match="no replica acknowledged"):
                await client.lock("acks:alone").try_lock(0)
            with redis.Redis(*alone.address) as direct:
                assert direct.keys("*") == []


async def test_a_flushed_script_cache_is_refilled_inside_the_chain(
    make_client: Callable[..., aiolock.AioLock], servers: tuple[RedisServer, RedisServer]
) -> None:
    """NOSCRIPT (a promoted replica's empty script cache) on the script of a Chain: the
    script is sent whole (EVAL), with its WAIT again, and one reply settles the call."""
    client = make_client()
    async with client.lock("acks:noscript"):
        pass
    with redis.Redis(*servers[0].address) as direct:
        direct.script_flush()
    async with client.lock("acks:noscript") as lock:
        assert await lock.hold_count() == 1


async def test_a_chain_settles_one_call_with_every_reply(
    servers: tuple[RedisServer, RedisServer],
) -> None:
    master, _ = servers
    link = await Link.open(
        ServerSettings(master.host, master.port), command_timeout=5, ping_interval=5
    )
    try:
        before = link.send(pack(("PING", "a")))
        chain = link.send(Chain.of(pack(("SET", "k", "v")), pack(("WAIT", 1, 1000))))
        after = link.send(pack(("GET", "k")))
        assert await before.future == b"a"
        assert await chain.future == (b"OK", 1)
        assert await after.future == b"v"
        error = link.send(Chain.of(pack(("NOSUCHCOMMAND",)), pack(("PING",))))
        first, second = await error.future
        assert isinstance(first, Exception) and second == b"PONG"
    finally:
        link.close()


def test_config_checks() -> None:
    with pytest.raises(ValueError, match="below command_timeout"):
        aiolock.Config(replica_acks=1, replica_ack_timeout=3, command_timeout=3)
    with pytest.raises(ValueError):
        aiolock.Config(replica_acks=-1)
    with pytest.raises(TypeError):
        aiolock.Config(replica_acks=1.5)  # type: ignore[arg-type]
    assert aiolock.Config(replica_acks=2).replica_ack_timeout == 1.0


async def test_20_concurrent_acquires_with_a_frozen_replica(
    make_client: Callable[..., aiolock.AioLock], servers: tuple[RedisServer, RedisServer]
) -> None:
    """WAIT blocks the client's one command link on the server, so concurrent acquires queue
    behind each other's WAIT: with a frozen replica each fails (ReplicationError, or a
    timeout settled in the background), in bounded time, and nothing stays held."""
    master, replica = servers
    client = make_client()
    replica.pause()
    try:

        async def one(i: int) -> str:
            lock = client.lock(f"acks:many:{i}")
            try:
                if await lock.try_lock(1):
                    await lock.unlock()
                    return "acquired"
                return "not acquired"
            except aiolock.RedisOperationError as exc:
                return type(exc).__name__

        async with asyncio.timeout(60):
            outcomes = await asyncio.gather(*(one(i) for i in range(20)))
        assert "acquired" not in outcomes, outcomes
        for _ in range(600):  # settled in the background: poll, at most ~30 s
            if not _keys(master):
                break
            await asyncio.sleep(0.05)
        assert _keys(master) == []
    finally:
        replica.resume()
    async with client.lock("acks:many:0"):
        pass


async def test_replica_acks_are_refused_on_a_cluster() -> None:
    """Not supported on a Redis Cluster yet: refused before any I/O."""
    cluster = redis.asyncio.RedisCluster(host="127.0.0.1", port=1)
    with pytest.raises(ValueError, match="not supported on a Redis Cluster"):
        aiolock.AioLock(cluster, config=aiolock.Config(replica_acks=1))
    await cluster.aclose()
