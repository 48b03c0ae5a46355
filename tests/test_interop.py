"""Redisson and aiolock on the same fair and read-write locks.

The Redisson side is tests/redisson_peer.py: Redisson's own scripts (RedissonFairLock,
RedissonReadLock, RedissonWriteLock, unlock latch included) and its waiting loop, in a process
of its own. Each side's release must wake the other side's waiter by message (holders use
30 s leases, so a hand-off after a timer would take 30 s), and the two must never overlap.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio

import aiolock
from tests.peers import PeerProcess, Peers

LEASE_MS = 30_000


async def eventually(check: Callable[[], Awaitable[object]], within: float = 10) -> None:
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def in_line(redis_client: redis.asyncio.Redis, name: str, owner: str) -> bool:
    owners = await redis_client.lrange(f"redisson_lock_queue:{{{name}}}", 0, -1)
    return owner.encode() in owners


async def _true(value: bool) -> bool:
    return value


# -- fair lock -------------------------------------------------------------------------------------


async def test_fair_aiolock_release_wakes_a_redisson_waiter(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, peers: Peers
) -> None:
    name = "interop-fair-1"
    java = await peers.start("redisson")
    lock = client.fair_lock(name)
    assert await lock.try_lock(lease_time=30)
    await java.send("t1", "fair-lock", name, 20_000, LEASE_MS)
    await eventually(lambda: in_line(redis_client, name, java.owner("t1")))
    released = time.monotonic()
    await lock.unlock()
    await peers.expect(java, "t1", "acquired")
    assert time.monotonic() - released < 5
    assert not await asyncio.create_task(lock.try_lock())
    await java.send("t1", "fair-unlock", name)
    await peers.expect(java, "t1", "unlocked")
    assert await lock.try_lock()
    await lock.unlock()


async def test_fair_redisson_release_wakes_an_aiolock_waiter(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, peers: Peers
) -> None:
    name = "interop-fair-2"
    java = await peers.start("redisson")
    await java.send("t1", "fair-lock", name, 0, LEASE_MS)
    await peers.expect(java, "t1", "acquired")
    lock = client.fair_lock(name)
    assert not await lock.try_lock()
    let_go = asyncio.Event()
    waiter = asyncio.create_task(_hold_until(lock, let_go))
    await eventually(lambda: _queue_length_is(redis_client, name, 1))
    released = time.monotonic()
    await java.send("t1", "fair-unlock", name)
    await peers.expect(java, "t1", "unlocked")
    await eventually(lambda: redis_client.exists(name))
    await java.send("t2", "fair-lock", name, 0, LEASE_MS)
    await peers.expect(java, "t2", "timeout")
    let_go.set()
    assert await waiter - released < 5


async def _hold_until(lock: aiolock.Lock, let_go: asyncio.Event) -> float:
    async with lock:
        acquired = time.monotonic()
        await let_go.wait()
    return acquired


async def _queue_length_is(redis_client: redis.asyncio.Redis, name: str, length: int) -> bool:
    return int(await redis_client.llen(f"redisson_lock_queue:{{{name}}}")) == length


@pytest.mark.parametrize("java_clock_ms", [0, 3_000], ids=["same-clock", "java-3s-ahead"])
async def test_fair_fifo_holds_across_redisson_and_aiolock(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, peers: Peers, java_clock_ms: int
) -> None:
    """Waiters of both kinds, interleaved, in two processes: each takes the lock in its turn,
    also when the Redisson client's clock runs 3 s ahead (it purges with it)."""
    name = "interop-fifo"
    java = await peers.start("redisson", java_clock_ms)
    python = await peers.start("aiolock")
    holder = client.fair_lock(name)
    assert await holder.try_lock(lease_time=30)
    expected: list[tuple[PeerProcess, str]] = []
    for i in range(10):
        peer, tid = (java, python)[i % 2], f"w{i}"
        await peer.send(tid, "fair-lock", name, -1 if peer is python else 60_000, LEASE_MS)
        owner = await peer.wait_owner(tid)
        await eventually(lambda: in_line(redis_client, name, owner))  # noqa: B023
        expected.append((peer, tid))
    await holder.unlock()
    acquired: list[tuple[PeerProcess, str]] = []
    unlocked = 0
    while unlocked < len(expected):
        event = await peers.next(within=10)
        if event.what == "unlocked":
            unlocked += 1
            continue
        assert event.what == "acquired", event
        acquired.append((event.peer, event.tid))
        assert acquired == expected[: len(acquired)]
        await event.peer.send(event.tid, "fair-unlock", name)
    assert not await redis_client.exists(
        name, f"redisson_lock_queue:{{{name}}}", f"redisson_lock_timeout:{{{name}}}"
    )


async def test_fair_a_redisson_waiter_that_gives_up_keeps_the_line_moving(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, peers: Peers
) -> None:
    """A Redisson waiter ahead of an aiolock one times out (its acquireFailed script removes
    it): the aiolock waiter is next, and a release wakes it."""
    name = "interop-give-up"
    java = await peers.start("redisson")
    holder = client.fair_lock(name)
    assert await holder.try_lock(lease_time=30)
    await java.send("t1", "fair-lock", name, 500, LEASE_MS)
    await eventually(lambda: in_line(redis_client, name, java.owner("t1")))
    waiter = asyncio.create_task(_hold_briefly(client.fair_lock(name)))
    await eventually(lambda: _queue_length_is(redis_client, name, 2))
    await peers.expect(java, "t1", "timeout")
    assert await _queue_length_is(redis_client, name, 1)
    released = time.monotonic()
    await holder.unlock()
    assert await waiter - released < 5


async def _hold_briefly(lock: aiolock.Lock) -> float:
    async with lock:
        return time.monotonic()


# -- read-write lock -------------------------------------------------------------------------------


async def test_rw_readers_of_both_share_and_exclude_writers_of_both(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, peers: Peers
) -> None:
    name = "interop-rw"
    java = await peers.start("redisson")
    rw = client.read_write_lock(name)
    await java.send("r1", "read-lock", name, 0, LEASE_MS)
    await peers.expect(java, "r1", "acquired")
    assert await rw.read_lock().try_lock(lease_time=30)  # shared with Redisson's reader
    assert not await asyncio.create_task(rw.write_lock().try_lock())
    await java.send("w1", "write-lock", name, 0, LEASE_MS)
    await peers.expect(java, "w1", "timeout")
    # a Redisson writer waits; it gets the lock when both readers are gone
    await java.send("w1", "write-lock", name, 20_000, LEASE_MS)
    await asyncio.sleep(0.2)
    await rw.read_lock().unlock()
    await java.send("r1", "read-unlock", name)
    await peers.expect(java, "r1", "unlocked")
    await peers.expect(java, "w1", "acquired")
    assert await rw.mode() == "write"
    assert not await asyncio.create_task(rw.read_lock().try_lock())
    await java.send("w1", "write-unlock", name)
    await peers.expect(java, "w1", "unlocked")
    assert not await redis_client.exists(name)


async def test_rw_redisson_write_unlock_wakes_aiolock_readers(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock], peers: Peers
) -> None:
    name = "interop-rw-wake-readers"
    java = await peers.start("redisson")
    await java.send("w1", "write-lock", name, 0, LEASE_MS)
    await peers.expect(java, "w1", "acquired")
    readers = [c.read_write_lock(name).read_lock() for c in (client, make_client())]
    tasks = [asyncio.create_task(_hold_briefly(r)) for r in readers for _ in range(3)]
    await asyncio.sleep(0.2)
    released = time.monotonic()
    await java.send("w1", "write-unlock", name)
    for when in await asyncio.gather(*tasks):
        assert when - released < 5


async def test_rw_aiolock_write_unlock_wakes_redisson_readers_and_writers(
    client: aiolock.AioLock, peers: Peers
) -> None:
    name = "interop-rw-wake-java"
    java = await peers.start("redisson")
    write = client.read_write_lock(name).write_lock()
    assert await write.try_lock(lease_time=30)
    for tid in ("r1", "r2"):
        await java.send(tid, "read-lock", name, 20_000, LEASE_MS)
    await asyncio.sleep(0.3)
    released = time.monotonic()
    await write.unlock()
    for _ in range(2):
        event = await peers.next()
        assert event.what == "acquired"
    assert time.monotonic() - released < 5
    await java.send("w1", "write-lock", name, 20_000, LEASE_MS)
    await asyncio.sleep(0.2)
    for tid in ("r1", "r2"):
        await java.send(tid, "read-unlock", name)
    # Redisson's last read unlock publishes "0": its own writer wakes
    events = [await peers.next() for _ in range(3)]
    assert sorted(e.what for e in events) == ["acquired", "unlocked", "unlocked"]
    await java.send("w1", "write-unlock", name)
    await peers.expect(java, "w1", "unlocked")


async def test_rw_aiolock_downgrade_wakes_redisson_readers(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, peers: Peers
) -> None:
    name = "interop-downgrade"
    java = await peers.start("redisson")
    rw = client.read_write_lock(name)
    await rw.write_lock().lock()
    await rw.read_lock().lock()
    await java.send("r1", "read-lock", name, 20_000, LEASE_MS)
    await asyncio.sleep(0.3)
    downgraded = time.monotonic()
    await rw.write_lock().unlock()
    await peers.expect(java, "r1", "acquired")
    assert time.monotonic() - downgraded < 5
    await rw.read_lock().unlock()
    await java.send("r1", "read-unlock", name)
    await peers.expect(java, "r1", "unlocked")
    assert not await redis_client.exists(name)


async def test_rw_redisson_reader_release_wakes_an_aiolock_writer(
    client: aiolock.AioLock, peers: Peers
) -> None:
    name = "interop-rw-writer"
    java = await peers.start("redisson")
    await java.send("r1", "read-lock", name, 0, LEASE_MS)
    await peers.expect(java, "r1", "acquired")
    writer = asyncio.create_task(_hold_briefly(client.read_write_lock(name).write_lock()))
    await asyncio.sleep(0.2)
    released = time.monotonic()
    await java.send("r1", "read-unlock", name)
    assert await writer - released < 5
