"""What is special about the spin lock (Redisson's RSpinLock); the behaviour every lock type
shares runs over it in tests/test_lock_family.py, test_bounds.py, test_relock.py and
test_hold_generations.py. Here: no subscription is ever made and no release publishes, its
waiters pause between tries (never past the end of their wait), and it shares Redisson's
hash with a hold that Redisson's plain-lock script took."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis.asyncio
from redis.asyncio.client import PubSub

import aiolock
from aiolock.testing import TcpProxy
from tests.sync_helpers import eventually, script_calls, true

NAME = "spin"
CHANNEL = "redisson_lock__channel:{spin}"

# Redisson's RLock acquire and RSpinLock unlock as ../shared/REDISSON.md (2.1, 7.3) describes
# them, written for this test: KEYS = [name] / [name, latch], ARGV = [lease ms, owner, latch ms]
REDISSON_ACQUIRE = """
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
return redis.call('pttl', KEYS[1])
"""
REDISSON_SPIN_UNLOCK = """
local done = redis.call('get', KEYS[2])
if done then return tonumber(done) end
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then return nil end
if redis.call('hincrby', KEYS[1], ARGV[2], -1) > 0 then
    redis.call('pexpire', KEYS[1], ARGV[1])
    redis.call('set', KEYS[2], 0, 'px', ARGV[3])
    return 0
end
redis.call('del', KEYS[1])
redis.call('set', KEYS[2], 1, 'px', ARGV[3])
return 1
"""
JAVA_OWNER = "6e3d30b7-83b1-433a-9335-5e8b9916d3ac:731"


async def _published(pubsub: PubSub) -> list[object]:
    """The messages ``pubsub`` (subscribed to the pattern ``*``) received."""
    seen: list[object] = []
    while (got := await pubsub.get_message(timeout=0.1)) is not None:
        if got["type"] == "pmessage":
            seen.append(got)
    return seen


async def test_waiters_never_subscribe_and_releases_publish_nothing(
    client: aiolock.AioLock,
    make_client: Callable[..., aiolock.AioLock],
    redis_client: redis.asyncio.Redis,
) -> None:
    listener = redis_client.pubsub()
    await listener.psubscribe("*")  # every message published on the server from now on
    holder = make_client().spin_lock(NAME)
    assert await holder.try_lock(lease_time=30)
    lock = client.spin_lock(NAME)

    async def take() -> bool:
        if not await lock.try_lock(wait_time=10):
            return False
        await asyncio.sleep(0.01)
        await lock.unlock()
        return True

    waiters = [asyncio.create_task(take()) for _ in range(3)]
    await eventually(lambda: true(client.statistics().tasks_waiting == 3))
    assert lock.statistics().tasks_waiting == 3
    assert [count for _, count in await redis_client.pubsub_numsub(CHANNEL)] == [0]
    await holder.unlock()  # no message: a waiter finds it free at its next try
    assert await asyncio.gather(*waiters) == [True] * 3
    await lock.force_unlock()  # publishes nothing either
    assert await holder.try_lock()
    await holder.unlock()
    stats = client.statistics()
    assert stats.subscriptions == stats.pubsub_connections_opened == stats.tasks_waiting == 0
    try:
        assert await _published(listener) == []
    finally:
        await listener.aclose()  # type: ignore[no-untyped-call]


@pytest.mark.slow
async def test_the_last_try_comes_before_the_wait_ends_however_long_the_pause(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock]
) -> None:
    """A pause is cut to the time left: a 10 s pause does not keep a 0.6 s wait from trying
    once more just before it ends (and taking the lock released meanwhile), nor from
    returning within its bound."""
    holder = make_client().spin_lock(NAME)
    assert await holder.try_lock(lease_time=30)
    slow = client.spin_lock(NAME, initial_delay=10, max_delay=10)
    loop = asyncio.get_running_loop()
    started = loop.time()
    owner = client.new_owner()  # the hold outlives the waiting task
    waiter = asyncio.create_task(slow.try_lock(wait_time=0.6, owner=owner))
    await asyncio.sleep(0.2)
    await holder.unlock()
    assert await waiter
    assert loop.time() - started < 0.6 + client.config.command_timeout
    await slow.unlock(owner=owner)
    assert await holder.try_lock(lease_time=30)
    started = loop.time()
    assert not await slow.try_lock(wait_time=0.3)
    assert 0.3 - 0.05 <= loop.time() - started < 0.3 + client.config.command_timeout


@pytest.mark.slow
async def test_waiters_back_off(
    client: aiolock.AioLock,
    make_client: Callable[..., aiolock.AioLock],
    redis_client: redis.asyncio.Redis,
) -> None:
    """A waiter's pauses double up to max_delay (128 ms): over a 1 s wait it tries about
    15 times (1+2+4+...+128 ms, then every 128 ms), not once per millisecond."""
    holder = make_client().spin_lock(NAME)
    assert await holder.try_lock(lease_time=30)
    before = await script_calls(redis_client)
    assert not await client.spin_lock(NAME).try_lock(wait_time=1)
    tries = await script_calls(redis_client) - before
    assert 2 <= tries <= 20, tries
    await holder.unlock()


@pytest.mark.parametrize("unlock", ["redisson", "expiry"])
async def test_a_hold_taken_by_redissons_lock_script(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, unlock: str
) -> None:
    """Redisson's layout both ways: its plain-lock script's hold keeps the spin lock busy and
    its spin-lock unlock (which publishes nothing) frees it for a waiter; or the hold just
    expires. Our hold keeps its script out, and is a hash field '<client id>:<n>' -> 1."""
    acquire = redis_client.register_script(REDISSON_ACQUIRE)
    java_unlock = redis_client.register_script(REDISSON_SPIN_UNLOCK)
    lease_ms = 30_000 if unlock == "redisson" else 500
    assert await acquire(keys=[NAME], args=[lease_ms, JAVA_OWNER]) is None
    lock = client.spin_lock(NAME)
    assert not await lock.try_lock()
    owner = client.new_owner()  # the hold outlives the waiting task
    waiter = asyncio.create_task(lock.try_lock(wait_time=10, owner=owner))
    if unlock == "redisson":
        await eventually(lambda: true(lock.statistics().tasks_waiting == 1))
        latch = "redisson_unlock_latch:{spin}:" + "ab" * 16
        assert await java_unlock(keys=[NAME, latch], args=[30_000, JAVA_OWNER, 20_000]) == 1
    assert await waiter
    owners = await redis_client.hgetall(NAME)
    assert [(field[: len(client.id) + 1], n) for field, n in owners.items()] == [
        (f"{client.id}:".encode(), b"1")
    ]
    assert 0 < await redis_client.pttl(NAME) <= client.config.watchdog_timeout * 1000
    assert await acquire(keys=[NAME], args=[30_000, JAVA_OWNER]) > 0  # busy: its PTTL
    await lock.unlock(owner=owner)
    assert not await redis_client.exists(NAME)


async def test_a_plain_lock_and_a_spin_lock_of_one_name_exclude_each_other(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock]
) -> None:
    other = make_client()
    async with client.lock(NAME):
        assert not await other.spin_lock(NAME).try_lock()
        async with client.spin_lock(NAME):  # the same hash and owner: reentrant
            assert await client.lock(NAME).hold_count() == 2
    async with other.spin_lock(NAME):
        assert not await client.lock(NAME).try_lock()


async def test_a_closed_clients_waiter_raises_at_its_next_try(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    holder = make_client().spin_lock(NAME)
    assert await holder.try_lock(lease_time=30)
    client = make_client()
    waiter = asyncio.create_task(client.spin_lock(NAME).lock())
    await eventually(lambda: true(client.statistics().tasks_waiting == 1))
    await client.aclose()
    with pytest.raises(aiolock.ClientClosedError):
        async with asyncio.timeout(5):  # its next try, at most max_delay (128 ms) later
            await waiter
    assert client.statistics().tasks_waiting == 0


@pytest.mark.parametrize("kind", ["lock", "spin_lock"])
async def test_a_try_whose_reply_is_lost_does_not_end_the_wait(proxy: TcpProxy, kind: str) -> None:
    """Replies come 1 s late (command_timeout 0.5 s) for the first 0.7 s of a
    ``try_lock(5)``: the first try's reply is lost and cannot be settled
    within that try's own bound. Each try of a spin lock is the shared loop's acquisition
    without waiting, bounded by command_timeout: its RedisTimeoutError ("settled in the
    background") ended the whole wait at once, with more than 4 s of it left, where the
    plain lock, in the same fault, goes on and takes the lock. The spin lock must go on
    too: its next try waits for that settlement (the owner's turn) and takes the lock."""
    async with aiolock.from_url(proxy.url, command_timeout=0.5) as client:
        lock = client.lock(NAME) if kind == "lock" else client.spin_lock(NAME)
        owner = client.new_owner()
        assert await lock.try_lock(owner=owner)  # the connections are open
        await lock.unlock(owner=owner)
        proxy.delay_replies(1.0)
        taking = asyncio.ensure_future(lock.try_lock(5, owner=owner))
        await asyncio.sleep(0.7)
        proxy.pass_through()
        async with asyncio.timeout(10):
            assert await taking
        assert lock.statistics(owner=owner).held
        await lock.unlock(owner=owner)


async def test_bad_backoffs_are_refused(client: aiolock.AioLock) -> None:
    with pytest.raises(ValueError):
        client.spin_lock(NAME, initial_delay=0)
    with pytest.raises(ValueError):
        client.spin_lock(NAME, initial_delay=0.2, max_delay=0.1)
    with pytest.raises(ValueError):
        client.spin_lock(NAME, multiplier=0.5)
    for bad in (True, "2", None, float("nan")):
        with pytest.raises((TypeError, ValueError)):
            client.spin_lock(NAME, multiplier=bad)  # type: ignore[arg-type]
