"""extend(): pushing the lease of a fixed-lease hold, only while its owner holds it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis.asyncio

import aiolock
from aiolock import LockLostError, LockNotOwnedError, LockUsageError
from aiolock.testing import TcpProxy


def _remaining(lock: aiolock.Lock, owner: aiolock.Owner | None = None) -> float:
    remaining = lock.statistics(owner=owner).lease_remaining
    assert remaining is not None
    return remaining


async def test_extend_moves_the_pttl_and_the_local_deadline(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    lock = client.lock("ext-moves")
    await lock.lock(lease_time=2)
    assert await redis_client.pttl("ext-moves") <= 2000
    await lock.extend(20)
    assert 19_000 < await redis_client.pttl("ext-moves") <= 20_000
    assert 19 < _remaining(lock) <= 20
    assert not lock.statistics().renewed  # still a fixed lease: nobody renews it
    await lock.extend(5)  # never shortens
    assert await redis_client.pttl("ext-moves") > 19_000
    await lock.unlock()
    assert not await redis_client.exists("ext-moves")


@pytest.mark.slow
async def test_an_extended_hold_outlives_its_first_lease(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    lock = client.lock("ext-outlives")
    told: list[LockLostError] = []
    await lock.lock(lease_time=0.5)
    lock.on_lost(told.append)
    await asyncio.sleep(0.3)
    await lock.extend(1.5)
    await asyncio.sleep(0.6)  # past the first lease
    assert await redis_client.exists("ext-outlives")
    assert lock.statistics().held and not told
    await lock.unlock()
    assert not told


async def test_the_whole_family_can_extend(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    for lock in (
        client.fenced_lock("ext-fenced"),
        client.fair_lock("ext-fair"),
        client.read_write_lock("ext-rw").read_lock(),
        client.read_write_lock("ext-rw2").write_lock(),
    ):
        await lock.lock(lease_time=2)
        await lock.extend(30)
        assert _remaining(lock) > 29
        assert await redis_client.pttl(lock.name) > 29_000
        await lock.unlock()
        assert not await lock.is_locked()


async def test_extend_of_a_watchdog_hold_is_a_usage_error(client: aiolock.AioLock) -> None:
    lock = client.lock("ext-watchdog")
    async with lock:
        with pytest.raises(LockUsageError, match="max_hold"):
            await lock.extend(10)
        assert lock.statistics().held


async def test_extend_without_a_hold_raises_not_owned(client: aiolock.AioLock) -> None:
    lock = client.lock("ext-not-owned")
    with pytest.raises(LockNotOwnedError) as caught:
        await lock.extend(10)
    assert type(caught.value) is LockNotOwnedError
    await lock.lock(lease_time=5)

    async def other_task() -> None:
        await lock.extend(10)  # another owner: it holds nothing

    with pytest.raises(LockNotOwnedError):
        await asyncio.create_task(other_task())
    await lock.unlock()


@pytest.mark.slow
async def test_extend_after_the_lease_ran_out_raises_lost(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    lock = client.lock("ext-expired")
    await lock.lock(lease_time=0.3)
    await asyncio.sleep(0.5)
    with pytest.raises(LockLostError, match="lease ran out"):
        await lock.extend(10)
    assert not await redis_client.exists("ext-expired")  # nothing was brought back
    with pytest.raises(LockLostError):  # the unlock still reports it, once
        await lock.unlock()
    with pytest.raises(LockNotOwnedError):
        await lock.unlock()


async def test_extend_of_a_force_unlocked_hold_finds_it_gone(
    client: aiolock.AioLock,
    make_client: Callable[..., aiolock.AioLock],
    redis_client: redis.asyncio.Redis,
) -> None:
    lock = client.lock("ext-forced")
    await lock.lock(lease_time=10)
    told: list[LockLostError] = []
    lock.on_lost(told.append)
    assert await make_client().lock("ext-forced").force_unlock()  # behind this client's back
    with pytest.raises(LockLostError, match="extend"):
        await lock.extend(10)
    assert not await redis_client.exists("ext-forced")
    await asyncio.sleep(0)
    assert len(told) == 1
    with pytest.raises(LockLostError):
        await lock.unlock()


async def test_bad_seconds_are_refused(client: aiolock.AioLock) -> None:
    lock = client.lock("ext-bad")
    await lock.lock(lease_time=5)
    for bad, error in ((0, ValueError), (-1, ValueError), ("5", TypeError), (None, TypeError)):
        with pytest.raises(error, match="seconds"):
            await lock.extend(bad)  # type: ignore[arg-type]
    await lock.unlock()


@pytest.mark.slow
async def test_a_cancelled_extend_settles_the_record_to_the_server(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """The extend is on the wire when its caller is cancelled: the reply is applied when it
    comes (the caller waits for that, within cleanup_timeout), and the local deadline is
    never later than the server's."""
    async with aiolock.from_url(proxy.url) as client:
        lock = client.lock("ext-cancelled")
        owner = client.new_owner()  # shared with the task that extends
        await lock.lock(lease_time=3, owner=owner)
        proxy.delay_replies(0.4)
        task = asyncio.create_task(lock.extend(30, owner=owner))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        proxy.pass_through()
        pttl = await redis_client.pttl("ext-cancelled")
        assert pttl > 29_000  # it ran on the server...
        assert 29 < _remaining(lock, owner) <= pttl / 1000  # ...and the record says so
        await lock.unlock(owner=owner)
        assert not await redis_client.exists("ext-cancelled")


@pytest.mark.slow
async def test_an_extend_cancelled_before_its_reply_is_never_ahead_of_the_server(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """Requests held back: the cancelled extend has not run; the record has not moved."""
    async with aiolock.from_url(proxy.url, cleanup_timeout=0.3) as client:
        lock = client.lock("ext-held")
        owner = client.new_owner()  # shared with the task that extends
        await lock.lock(lease_time=3, owner=owner)
        proxy.hold_requests()
        task = asyncio.create_task(lock.extend(30, owner=owner))
        await proxy.wait_for_held_requests(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task  # back after cleanup_timeout, its reply still to come
        assert _remaining(lock, owner) < 3  # not extended here while not known there
        assert await redis_client.pttl("ext-held") <= 3000
        await proxy.release_held_requests()  # now it runs, and its reply is applied
        for _ in range(100):
            if _remaining(lock, owner) > 28:
                break
            await asyncio.sleep(0.01)
        pttl = await redis_client.pttl("ext-held")
        assert pttl > 28_000
        assert 28 < _remaining(lock, owner) <= pttl / 1000
        await lock.unlock(owner=owner)
        assert not await redis_client.exists("ext-held")


@pytest.mark.slow
async def test_a_lost_reply_is_settled_by_fencing_and_asking_again(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    async with aiolock.from_url(proxy.url, command_timeout=0.5) as client:
        lock = client.lock("ext-lost-reply")
        await lock.lock(lease_time=5)
        proxy.drop_next_reply(to="EVALSHA")
        try:
            await lock.extend(30)  # settled in the call: the link fenced, asked again
        except aiolock.RedisOperationError:
            assert _remaining(lock) < 5  # not settled in time: the old deadline stands
        for _ in range(100):  # else settled in the background
            if _remaining(lock) > 20:
                break
            await asyncio.sleep(0.05)
        pttl = await redis_client.pttl("ext-lost-reply")
        assert 20 < _remaining(lock) <= pttl / 1000
        await lock.unlock()
        assert not await redis_client.exists("ext-lost-reply")
