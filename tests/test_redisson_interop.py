"""aiolock and a Redisson peer (tests/redisson_peer.py: Redisson's scripts and waiting
loops, as REDISSON.md describes them, in another process) share semaphores, permit-
expirable semaphores and latches: contention, and wake-ups both ways."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio

import aiolock
from tests.sync_helpers import eventually, true

PEER = Path(__file__).with_name("redisson_peer.py")


class Peer:
    """One command of the Redisson peer, running in its own process."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def line(self, within: float = 20) -> str:
        assert self.proc.stdout is not None
        async with asyncio.timeout(within):
            line = (await self.proc.stdout.readline()).decode().strip()
        if not line:
            assert self.proc.stderr is not None
            raise AssertionError((await self.proc.stderr.read()).decode())
        return line

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()


@pytest.fixture
async def peers() -> AsyncIterator[list[Peer]]:
    started: list[Peer] = []
    yield started
    for peer in started:
        await peer.stop()


async def run_peer(peers: list[Peer], *args: str) -> Peer:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(PEER),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    peers.append(Peer(proc))
    return peers[-1]


# -- semaphore ------------------------------------------------------------------------------


async def test_semaphore_wake_ups_both_ways(
    client: aiolock.AioLock, redis_url: str, peers: list[Peer]
) -> None:
    sem = client.semaphore("shared")
    assert await sem.try_set_permits(2)
    await sem.acquire(2)
    # the peer waits (subscribed); our release's message wakes it
    waiting = await run_peer(peers, "sem-acquire", redis_url, "shared", "2", "10")
    assert await waiting.line() == "waiting"
    await sem.release(2)
    # woken by the message, well before its own 10 s wait would end
    assert await waiting.line(within=8) == "acquired"
    assert await sem.available_permits() == 0
    # our waiter waits; the peer's release wakes it (a plain semaphore's waiter never polls)
    waiter = asyncio.create_task(sem.try_acquire(2, wait_time=10))
    await eventually(lambda: true(sem.statistics().tasks_waiting == 1))
    assert await (await run_peer(peers, "sem-release", redis_url, "shared", "2")).line() == (
        "released 2"
    )
    released = time.monotonic()  # not before the peer's process started: that took seconds
    assert await waiter
    assert time.monotonic() - released < 5  # woken by the message, not its 10 s wait ending


async def test_semaphore_contention(
    client: aiolock.AioLock, redis_url: str, redis_client: redis.asyncio.Redis, peers: list[Peer]
) -> None:
    """Two Redisson peers and 6 of our tasks take 2 permits in turn: never 3 inside."""
    permits = 2
    sem = client.semaphore("contended")
    assert await sem.try_set_permits(permits)
    hammers = [
        await run_peer(peers, "sem-hammer", redis_url, "contended", str(permits), "40")
        for _ in range(2)
    ]
    enter = redis_client.register_script(ENTER)

    async def ours(index: int) -> None:
        for _ in range(15):
            async with sem:
                await enter(keys=["inside:contended", "overlaps:contended"], args=[index, permits])
                await asyncio.sleep(0.002)
                await redis_client.srem("inside:contended", index)

    await asyncio.gather(*(ours(i) for i in range(6)))
    for hammer in hammers:
        assert await hammer.line(within=60) == "done"
    assert await redis_client.get("overlaps:contended") is None
    assert await sem.available_permits() == permits


ENTER = """
redis.call('sadd', KEYS[1], ARGV[1])
local inside = redis.call('scard', KEYS[1])
if inside > tonumber(ARGV[2]) then
    redis.call('incr', KEYS[2])
end
return inside
"""


# -- permit-expirable semaphore -------------------------------------------------------------


async def test_permit_semaphore_wake_ups_both_ways(
    client: aiolock.AioLock, redis_url: str, redis_client: redis.asyncio.Redis, peers: list[Peer]
) -> None:
    pes = client.permit_expirable_semaphore("shared")
    assert await pes.try_set_permits(1)
    mine = await pes.acquire()
    # the peer waits; our release wakes it; the peer's permit is its raw 16 bytes, no lease
    waiting = await run_peer(peers, "pes-acquire", redis_url, "shared", "-1", "10")
    assert await waiting.line() == "waiting"
    await pes.release(mine)
    line = await waiting.line(within=8)  # woken, well before its own 10 s wait would end
    assert line.startswith("acquired ")
    theirs = line.split()[1]
    assert await redis_client.zscore("{shared}:timeout", bytes.fromhex(theirs)) == 922337203685477
    # our waiter waits (for a message: the peer's permit never expires); its release wakes us
    waiter = asyncio.create_task(pes.try_acquire(wait_time=10, owner=client.new_owner()))
    await eventually(lambda: true(pes.statistics().tasks_waiting == 1))
    assert await (await run_peer(peers, "pes-release", redis_url, "shared", theirs)).line() == (
        "released"
    )
    ours = await waiter
    assert ours is not None
    # and the peer releases our permit by its id (as Redisson allows any client to)
    assert await (await run_peer(peers, "pes-release", redis_url, "shared", ours)).line() == (
        "released"
    )
    assert await pes.available_permits() == 1


async def test_a_peers_expiring_permit_wakes_our_waiter(
    client: aiolock.AioLock, redis_url: str, peers: list[Peer]
) -> None:
    """The peer's permit expires (its lease, by its clock): our waiter wakes by itself when
    it does and takes it, with no message from anyone."""
    pes = client.permit_expirable_semaphore("expiring")
    assert await pes.try_set_permits(1)
    peer = await run_peer(peers, "pes-acquire", redis_url, "expiring", "400", "5")
    assert (await peer.line()).startswith("acquired ")
    started = time.monotonic()
    assert await pes.try_acquire(wait_time=5) is not None
    assert time.monotonic() - started < 4  # at the peer's 0.4 s expiry, before wait_time


async def test_a_peer_waits_for_our_expiring_permit(
    client: aiolock.AioLock, redis_url: str, peers: list[Peer]
) -> None:
    pes = client.permit_expirable_semaphore("expiring")
    assert await pes.try_set_permits(1)
    # a lease long enough for the peer's process to start and find the permit taken on a
    # loaded machine (0.4 s was not: the permit had expired before the peer's first try)
    await pes.acquire(lease_time=3)
    peer = await run_peer(peers, "pes-acquire", redis_url, "expiring", "1000", "15")
    assert await peer.line() == "waiting"
    assert (await peer.line(within=15)).startswith("acquired ")


async def test_permit_semaphore_contention(
    client: aiolock.AioLock, redis_url: str, redis_client: redis.asyncio.Redis, peers: list[Peer]
) -> None:
    permits = 2
    pes = client.permit_expirable_semaphore("contended")
    assert await pes.try_set_permits(permits)
    hammers = [
        await run_peer(peers, "pes-hammer", redis_url, "contended", str(permits), "40")
        for _ in range(2)
    ]
    enter = redis_client.register_script(ENTER)

    async def ours(index: int) -> None:
        for _ in range(15):
            async with pes.permit():
                await enter(keys=["inside:contended", "overlaps:contended"], args=[index, permits])
                await asyncio.sleep(0.002)
                await redis_client.srem("inside:contended", index)

    await asyncio.gather(*(ours(i) for i in range(6)))
    for hammer in hammers:
        assert await hammer.line(within=60) == "done"
    assert await redis_client.get("overlaps:contended") is None
    assert await pes.available_permits() == permits


# -- latch ----------------------------------------------------------------------------------


async def test_latch_wake_ups_both_ways(
    client: aiolock.AioLock, redis_url: str, peers: list[Peer]
) -> None:
    latch = client.countdown_latch("shared")
    assert await latch.try_set_count(2)
    waiting = [await run_peer(peers, "latch-await", redis_url, "shared", "10") for _ in range(2)]
    for peer in waiting:
        assert await peer.line() == "waiting"
    ours = asyncio.create_task(latch.wait(10))
    await eventually(lambda: true(latch.statistics().tasks_waiting == 1))
    await latch.count_down()  # ours
    counted = await run_peer(peers, "latch-count-down", redis_url, "shared")
    assert await counted.line() == "counted"  # the peer's takes it to 0: everyone opens
    assert await ours
    for peer in waiting:
        assert await peer.line(within=8) == "open"  # before their own 10 s wait ends


async def test_a_latch_deleted_by_the_peer_releases_our_waiters(
    client: aiolock.AioLock, redis_url: str, peers: list[Peer]
) -> None:
    """Redisson's delete() publishes "1" and leaves its own waiters blocked; ours re-check
    and find the latch open."""
    latch = client.countdown_latch("deleted")
    assert await latch.try_set_count(3)
    ours = asyncio.create_task(latch.wait(10))
    await eventually(lambda: true(latch.statistics().tasks_waiting == 1))
    deleted = await run_peer(peers, "latch-delete", redis_url, "deleted")
    assert await deleted.line() == "deleted 1"
    assert await ours


async def test_our_delete_releases_the_peers_waiters(
    client: aiolock.AioLock, redis_url: str, peers: list[Peer]
) -> None:
    """aiolock's delete() publishes "0" (open), which a Redisson waiter treats as open."""
    latch = client.countdown_latch("deleted")
    assert await latch.try_set_count(3)
    peer = await run_peer(peers, "latch-await", redis_url, "deleted", "10")
    assert await peer.line() == "waiting"
    assert await latch.delete()
    assert await peer.line(within=8) == "open"  # before its own 10 s wait ends
