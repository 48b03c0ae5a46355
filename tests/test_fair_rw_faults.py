"""Faults against the fair lock and the read-write lock together: stopped holders in other
processes, and random cancellations while a proxy delays, blackholes and resets the
connections under many users. Whatever happens: never two writers (or a writer and a
reader) inside, nothing left on the server, no hold, no subscription."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio

import aiolock
from aiolock.testing import TcpProxy, acl_user
from tests.peers import Peers


async def eventually(check: Callable[[], Awaitable[object]], within: float = 10) -> None:
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


@pytest.mark.parametrize("kind", ["fair", "write"])
async def test_a_stopped_holder_loses_the_lock_and_learns_it_when_it_resumes(
    client: aiolock.AioLock, peers: Peers, kind: str
) -> None:
    """A holder in another process (watchdog 0.6 s) is stopped (SIGSTOP): its lease runs
    out unrenewed, a waiter here gets the lock, and once resumed the holder's unlock reports
    the loss (LockLostError) instead of releasing someone else's lock."""
    name = f"stopped-{kind}"
    peer = await peers.start("aiolock", "--watchdog", 0.6)
    await peer.send("h", f"{kind}-lock", name, 0, -1)
    await peers.expect(peer, "h", "acquired")
    peer.signal(signal.SIGSTOP)
    try:
        lock = (
            client.fair_lock(name) if kind == "fair" else client.read_write_lock(name).read_lock()
        )
        started = time.monotonic()
        assert await lock.try_lock(wait_time=10, lease_time=30)
        assert time.monotonic() - started < 5
    finally:
        peer.signal(signal.SIGCONT)
    await peer.send("h", f"{kind}-unlock", name)
    event = await peers.expect(peer, "h", "error")
    assert "LockLostError" in " ".join(event.rest)
    assert await lock.hold_count() == 1  # ours, untouched by the late unlock
    await lock.unlock()


@pytest.mark.parametrize("kind", ["fair", "write"])
async def test_a_late_release_cannot_free_the_next_hold_when_fencing_is_refused(
    redis_url: str, redis_client: redis.asyncio.Redis, kind: str
) -> None:
    """Without CLIENT KILL a release held by a middlebox cannot be fenced: the hold is purged
    and the owner's next holds write another owner id (a writer's still ends in ":write", as
    Redisson's writer fields do); the old release, delivered late, changes nothing."""
    name = f"late-release-{kind}"
    rules = ("~*", "&*", "+@all", "-client", "+client|info", "+client|setname", "+client|id")
    with acl_user(redis_url, f"no-kill-{kind}", *rules) as url:
        async with (
            TcpProxy.for_url(url) as proxy,
            aiolock.from_url(proxy.url, command_timeout=0.5, cleanup_timeout=0.7) as client,
            aiolock.from_url(redis_url) as other,
        ):
            lock = (
                client.fair_lock(name)
                if kind == "fair"
                else client.read_write_lock(name).write_lock()
            )
            owner = client.new_owner()
            await lock.lock(lease_time=20, owner=owner)
            await lock.lock(lease_time=20, owner=owner)
            proxy.hold_requests()
            releasing = asyncio.create_task(lock.unlock(owner=owner))
            async with asyncio.timeout(5):
                await proxy.wait_for_held_requests()
            proxy.reset_client_side()
            with pytest.raises(aiolock.AioLockError):
                await releasing
            await eventually(lambda: _gone(redis_client, name))
            with pytest.raises(aiolock.LockLostError):
                await lock.unlock(owner=owner)  # the outer count of the lost hold
            assert await lock.try_lock(wait_time=2, lease_time=20, owner=owner)
            await proxy.release_held_requests()  # the old release runs now
            raw = await redis_client.hgetall(name)
            fields = {(f.decode() if isinstance(f, bytes) else f): v for f, v in raw.items()}
            if kind == "write":
                assert fields.pop("mode") == b"write"
                (field,) = fields
                assert field.endswith(":write") and field != owner.id + ":write"
            else:
                assert list(fields) != [owner.id]
            assert list(fields.values()) == [b"1"]
            assert await lock.hold_count(owner=owner) == 1
            rival = (
                other.fair_lock(name) if kind == "fair" else other.read_write_lock(name).read_lock()
            )
            assert not await rival.try_lock()
            await lock.unlock(owner=owner)
    assert not await redis_client.exists(name)


async def _gone(redis_client: redis.asyncio.Redis, name: str) -> bool:
    return not await redis_client.exists(name)


@pytest.mark.parametrize("kind", ["fair", "rw"])
async def test_chaos(proxy: TcpProxy, redis_client: redis.asyncio.Redis, kind: str) -> None:
    rnd = random.Random(7)
    inside = {"read": 0, "write": 0}
    overlaps: list[str] = []
    clients = [aiolock.from_url(proxy.url, command_timeout=1) for _ in range(2)]

    def pick(client: aiolock.AioLock) -> tuple[aiolock.Lock, str]:
        if kind == "fair":
            return client.fair_lock("chaos", wait_allowance=rnd.choice([0.2, 1, 10])), "write"
        rw = client.read_write_lock("chaos")
        if rnd.random() < 0.5:
            return rw.read_lock(), "read"
        return rw.write_lock(), "write"

    async def body(lock: aiolock.Lock, mode: str) -> None:
        wait = rnd.choice([None, 0, 0.01, 0.2, 2])
        lease = rnd.choice([None, 5])
        if wait is None:
            await lock.lock(lease)
        elif not await lock.try_lock(wait, lease):
            return
        try:
            if inside["write"] or (mode == "write" and inside["read"]):
                overlaps.append(f"{mode} entered with {inside}")
            inside[mode] += 1
            try:
                await asyncio.sleep(rnd.uniform(0, 0.01))
            finally:
                inside[mode] -= 1
        finally:
            await lock.unlock()

    async def user(client: aiolock.AioLock) -> None:
        for _ in range(15):
            task = asyncio.create_task(body(*pick(client)))
            if rnd.random() < 0.4:
                await asyncio.sleep(rnd.uniform(0, 0.02))
                task.cancel()
            try:
                await task
            except (asyncio.CancelledError, aiolock.AioLockError):
                pass

    async def faults() -> None:
        for _ in range(20):
            await asyncio.sleep(rnd.uniform(0.02, 0.1))
            dice = rnd.random()
            if dice < 0.3:
                proxy.delay_replies(rnd.uniform(0.005, 0.05))
            elif dice < 0.4:
                proxy.delay_requests(rnd.uniform(0.005, 0.05))
            elif dice < 0.5:
                proxy.blackhole_replies()
                await asyncio.sleep(rnd.uniform(0.01, 0.3))
                proxy.pass_through()
                proxy.reset_connections()
            else:
                proxy.pass_through()
        proxy.pass_through()

    try:
        async with asyncio.timeout(45):
            await asyncio.gather(faults(), *(user(c) for c in clients for _ in range(3)))
        assert not overlaps
        for each in clients:
            await eventually(lambda: _idle(each))  # noqa: B023
    finally:
        for each in clients:
            await each.aclose()
    await eventually(lambda: _no_keys(redis_client))


async def _idle(client: aiolock.AioLock) -> bool:
    stats = client.statistics()
    return not any(stats.holds.values()) and stats.subscriptions == 0


async def _no_keys(redis_client: redis.asyncio.Redis) -> bool:
    return not await redis_client.keys("*")
