"""The fair lock's line against waiters that stop or leave in numbers: dead waiters (their
heartbeats ran out, and long enough for a key with a TTL to expire) keep a free lock one
allowance at most, a closing client takes its waiters out of line, and many give-ups of one
client leave the line in few script calls.

Found by attacking the seams (issue 19, symptom 6 in other forms); the first two were xfail
repros on the attack branch (tests/test_attack_seams.py).
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio

import aiolock
from aiolock import scripts
from aiolock.testing import TcpProxy

QUEUE = "redisson_lock_queue:{{{}}}"
TIMEOUTS = "redisson_lock_timeout:{{{}}}"
ALIVE = "aiolock_lock_alive:{{{}}}"


async def queue_length(redis_client: redis.asyncio.Redis, name: str) -> int:
    return int(await redis_client.llen(QUEUE.format(name)))


def fair_keys(name: str) -> tuple[str, ...]:
    channel = f"redisson_lock__channel:{{{name}}}"
    return (name, QUEUE.format(name), TIMEOUTS.format(name), channel, ALIVE.format(name))


async def until_in_line(redis_client: redis.asyncio.Redis, name: str, count: int) -> None:
    async with asyncio.timeout(10):
        while await queue_length(redis_client, name) < count:  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_aclose_takes_its_fair_waiters_out_of_line(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async with aiolock.from_url(redis_url) as holder:
        await holder.fair_lock("line-close").lock()
        closing = aiolock.from_url(redis_url)
        waiter = asyncio.create_task(closing.fair_lock("line-close").lock())
        await until_in_line(redis_client, "line-close", 1)
        await closing.aclose()
        with pytest.raises(aiolock.ClientClosedError):
            await waiter
        await holder.fair_lock("line-close").unlock()
        assert await queue_length(redis_client, "line-close") == 0
        assert not await redis_client.exists(
            TIMEOUTS.format("line-close"), ALIVE.format("line-close")
        )


@pytest.mark.parametrize("state", ["parked", "subscribing"])
async def test_aclose_takes_many_waiters_out_of_line_wherever_they_are(
    redis_url: str, redis_client: redis.asyncio.Redis, proxy: TcpProxy, state: str
) -> None:
    """Waiters parked on their channels, or still waiting for their subscriptions to be
    confirmed (every request of their client 0.2 s late), when their client closes: each
    raises ClientClosedError and leaves the line before the connections close."""
    name, count = f"line-close-{state}", 20
    async with aiolock.from_url(redis_url) as holder:
        await holder.fair_lock(name).lock()
        closing = aiolock.from_url(proxy.url)
        if state == "subscribing":
            proxy.delay_requests(0.2)
        waiters = [asyncio.create_task(closing.fair_lock(name).lock()) for _ in range(count)]
        await until_in_line(redis_client, name, count)
        if state == "parked":
            async with asyncio.timeout(10):
                while closing.statistics().tasks_waiting < count:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
        else:
            assert closing.statistics().tasks_waiting == 0
        await closing.aclose()
        for waiter in waiters:
            with pytest.raises(aiolock.ClientClosedError):
                await waiter
        assert await queue_length(redis_client, name) == 0
        assert not await redis_client.exists(TIMEOUTS.format(name), ALIVE.format(name))
        await holder.fair_lock(name).unlock()


@pytest.mark.slow
async def test_dead_fair_waiters_keep_a_free_lock_one_allowance_at_most(
    redis_url: str, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    allowance, dead = 0.5, 6
    async with aiolock.from_url(redis_url) as holder, aiolock.from_url(redis_url) as live:
        await holder.fair_lock("line-dead").lock()
        cut_off = aiolock.from_url(proxy.url, command_timeout=0.5, cleanup_timeout=0.5)
        waiters = [
            asyncio.create_task(cut_off.fair_lock("line-dead", wait_allowance=allowance).lock())
            for _ in range(dead)
        ]
        await until_in_line(redis_client, "line-dead", dead)
        proxy.blackhole_requests()  # the waiters' process is gone for the server
        proxy.blackhole_replies()
        await asyncio.sleep(allowance * 2)  # their heartbeats (and the key holding them) ran out
        await holder.fair_lock("line-dead").unlock()
        started = time.monotonic()
        got = await live.fair_lock("line-dead", wait_allowance=allowance).try_lock(
            dead * allowance * 2
        )
        took = time.monotonic() - started
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        await cut_off.aclose()
        assert got
        await live.fair_lock("line-dead").unlock()
        assert took <= allowance * 1.5, f"a free lock kept {took:.2f} s from a live waiter"


async def test_the_heartbeats_outlive_every_deadline_in_line(
    redis_client: redis.asyncio.Redis,
) -> None:
    """The heartbeats' key lives at least one allowance past the last deadline in line (a
    Redisson waiter's included), and moves later with the deadlines when a renewal moves
    them; it goes, with the line, when the last aiolock waiter leaves."""
    name = "line-beats"
    keys = fair_keys(name)
    now = int(time.time() * 1000)
    await redis_client.hset(name, "holder:1", 1)
    await redis_client.pexpire(name, 30_000)
    # a Redisson waiter first, with a deadline far out (Redisson's 5-minute default)
    await redis_client.rpush(QUEUE.format(name), "redisson:1")
    await redis_client.zadd(TIMEOUTS.format(name), {"redisson:1": now + 330_000})
    for owner in ("me:1", "me:2"):
        reply = await redis_client.eval(
            scripts.FAIR_LOCK_ACQUIRE.source, 5, *keys, 30_000, owner, 1_000, now, "0", "PUBLISH"
        )
        assert reply == 250  # a quarter of its allowance: its next check
    last = float(await redis_client.zscore(TIMEOUTS.format(name), "me:2") or 0)
    assert last >= now + 330_000 + 2_000  # behind the Redisson waiter, one allowance each
    kept = await redis_client.pttl(ALIVE.format(name))
    assert last - now + 1_000 - 100 <= kept <= last - now + 1_000
    # the holder renews its lease 20 s later: every deadline and the key's expiry move 20 s
    await redis_client.pexpire(name, 10_000)
    reply = await redis_client.eval(scripts.FAIR_LOCK_RENEW.source, 1, name, 30_000, "holder:1")
    assert reply == [1]
    assert float(await redis_client.zscore(TIMEOUTS.format(name), "me:2") or 0) >= last + 19_900
    assert await redis_client.pttl(ALIVE.format(name)) >= kept + 19_800
    # both aiolock waiters leave: the key goes with their heartbeats
    for owner in ("me:1", "me:2"):
        assert await redis_client.eval(
            scripts.FAIR_LOCK_GIVE_UP.source, 5, *keys, "0", owner, 1_000, now, "PUBLISH"
        )
    assert not await redis_client.exists(ALIVE.format(name))
    assert await redis_client.lrange(QUEUE.format(name), 0, -1) == [b"redisson:1"]
    await redis_client.delete(*keys)


async def script_calls(redis_client: redis.asyncio.Redis) -> int:
    stats = await redis_client.info("commandstats")
    return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("evalsha", "eval"))


async def test_many_cancelled_waiters_leave_the_line_in_few_calls(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """300 waiters of one client cancelled at once leave the line in a few script calls
    (one pass over the line each), not one call (and pass) per waiter; another client then
    takes the freed lock at once."""
    name, count = "line-mass", 300
    async with aiolock.from_url(redis_url) as holder, aiolock.from_url(redis_url) as waiting:
        await holder.fair_lock(name).lock()
        waiters = [asyncio.create_task(waiting.fair_lock(name).lock()) for _ in range(count)]
        await until_in_line(redis_client, name, count)
        async with asyncio.timeout(10):
            while waiting.statistics().tasks_waiting < count:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        await redis_client.config_resetstat()
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        async with asyncio.timeout(10):
            while waiting.statistics().background_tasks:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert await script_calls(redis_client) <= 3
        assert not await redis_client.exists(
            QUEUE.format(name), TIMEOUTS.format(name), ALIVE.format(name)
        )
        await holder.fair_lock(name).unlock()
        assert await waiting.fair_lock(name).try_lock(0)
        await waiting.fair_lock(name).unlock()


async def test_a_batch_of_give_ups_moves_each_waiter_up_by_the_allowances_ahead_of_it(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """One give-up call for several waiters does what their give-ups one by one would: each
    waiter behind comes sooner by the allowances of those leaving ahead of it, the line keeps
    its order, and the new first waiter is woken when the first one left a free lock."""
    name = "line-batch"
    keys = fair_keys(name)
    now = int(time.time() * 1000)
    line = [f"w:{i}" for i in range(12)]
    await redis_client.rpush(QUEUE.format(name), *line)
    await redis_client.zadd(
        TIMEOUTS.format(name), {owner: now + 60_000 + i * 1_000 for i, owner in enumerate(line)}
    )
    leaving = {"w:0": 1_000, "w:3": 2_000, "w:4": 0, "w:6": 1_000, "w:7": 1_000, "w:9": 500}
    flat = [value for owner, allowance in leaving.items() for value in (owner, allowance)]
    async with redis_client.pubsub() as pubsub:
        await pubsub.subscribe(f"redisson_lock__channel:{{{name}}}:w:1")
        reply = await redis_client.eval(
            scripts.FAIR_LOCK_GIVE_UP.source,
            5,
            *keys,
            "0",
            *flat[:2],
            now,
            "PUBLISH",
            *flat[2:],
            "nobody:1",
            1_000,
        )
        assert reply == len(leaving)
        message = None
        async with asyncio.timeout(5):
            while message is None:  # the subscription's confirmation comes first
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
        assert message["data"] == b"0"
    kept = [owner for owner in line if owner not in leaving]
    assert await redis_client.lrange(QUEUE.format(name), 0, -1) == [o.encode() for o in kept]
    for owner in kept:
        i = line.index(owner)
        ahead = sum(a for o, a in leaving.items() if line.index(o) < i)
        expected = now + 60_000 + i * 1_000 - ahead
        assert await redis_client.zscore(TIMEOUTS.format(name), owner) == expected, owner
    await redis_client.delete(*keys)
