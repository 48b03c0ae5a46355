"""The countdown latch (Redisson's RCountDownLatch layout): counting down, waiting across
tasks, clients and processes, bad input, lost replies, names with a hash tag."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

import aiolock
from aiolock.keys import latch_channel, same_slot
from aiolock.testing import RedisServer, TcpProxy, external_redis_url
from tests.sync_helpers import equal, eventually, listening, message, script_calls, true


async def test_redisson_layout(client: aiolock.AioLock, redis_client: redis.asyncio.Redis) -> None:
    """The count is a decimal string at the name (absent when open); the channel is
    redisson_countdownlatch__channel__{name}: 1 when a count is set, 0 when it opens."""
    latch = client.countdown_latch("latch")
    async with listening(redis_client, "redisson_countdownlatch__channel__{latch}") as pubsub:
        assert await latch.try_set_count(2)
        assert await redis_client.get("latch") == b"2"
        assert await message(pubsub) == b"1"
        assert await latch.count_down() == 1
        assert await redis_client.get("latch") == b"1"
        assert await latch.count_down() == 0
        assert not await redis_client.exists("latch")
        assert await message(pubsub) == b"0"
        assert await latch.try_set_count(1)
        assert await message(pubsub) == b"1"
        assert await latch.delete()
        assert await message(pubsub) == b"0"  # deleting opens it (Redisson publishes 1)
        assert not await latch.delete()


async def test_counting_and_waiting(client: aiolock.AioLock) -> None:
    latch = client.countdown_latch("latch")
    assert await latch.get_count() == 0
    assert await latch.wait()  # open: at once
    assert await latch.wait(0)
    assert await latch.try_set_count(3)
    assert not await latch.try_set_count(5)
    assert await latch.get_count() == 3
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert not await latch.wait(0.1)
    # the loop's clock (uvloop's counts whole ms: started + 0.1 reached may read 0.0999...)
    assert 0.1 - 1e-6 <= loop.time() - started < 0.1 + client.config.command_timeout
    waiters = [asyncio.create_task(latch.wait()) for _ in range(10)]
    await eventually(lambda: true(latch.statistics().tasks_waiting == 10))
    assert await latch.count_down() == 2
    assert await latch.count_down() == 1
    await asyncio.sleep(0.05)
    assert not any(w.done() for w in waiters)
    assert await latch.count_down() == 0
    assert await asyncio.gather(*waiters) == [True] * 10
    assert client.statistics().subscriptions == 0


async def test_counting_an_open_latch_down_changes_nothing(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    latch = client.countdown_latch("open")
    async with listening(redis_client, "redisson_countdownlatch__channel__{open}") as pubsub:
        with pytest.raises(aiolock.LockStateError, match="open") as caught:
            await latch.count_down()
        assert isinstance(caught.value, ValueError)
        assert await message(pubsub, within=0.2) is None
    assert not await redis_client.exists("open")


@pytest.fixture
async def offline() -> AsyncIterator[aiolock.AioLock]:
    async with aiolock.from_url("redis://127.0.0.1:1/0") as client:
        yield client


@pytest.mark.parametrize("count", [0, -1, 2**31, 1.0, "1", True, None])
async def test_bad_counts(offline: aiolock.AioLock, count: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        await offline.countdown_latch("bad").try_set_count(count)


@pytest.mark.parametrize("timeout", [-1, float("nan"), float("inf"), "1", True])
async def test_bad_timeouts(offline: aiolock.AioLock, timeout: Any) -> None:  # noqa: ASYNC109
    with pytest.raises((TypeError, ValueError)):
        await offline.countdown_latch("bad").wait(timeout)


async def test_waiters_in_clients_and_processes_are_released(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock], redis_url: str
) -> None:
    from tests.test_semaphore_processes import start_worker

    latch = client.countdown_latch("fleet")
    assert await latch.try_set_count(2)
    others = [make_client().countdown_latch("fleet") for _ in range(2)]
    waiters = [asyncio.create_task(other.wait(10)) for other in others for _ in range(20)]
    workers = [await start_worker("latch-wait", redis_url, "fleet", "50") for _ in range(2)]
    for worker in workers:
        assert await worker.line() == "waiting"
    await latch.count_down()
    await asyncio.sleep(0.05)
    assert not any(w.done() for w in waiters)
    await latch.count_down()
    assert await asyncio.gather(*waiters) == [True] * 40
    for worker in workers:
        assert await worker.line() == "open 50"
        await worker.stop()


async def test_one_message_wakes_all_waiters_without_polling(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    latch = client.countdown_latch("quiet")
    assert await latch.try_set_count(1)
    waiters = [asyncio.create_task(latch.wait()) for _ in range(50)]
    await eventually(lambda: true(latch.statistics().tasks_waiting == 50))
    calls = await script_calls(redis_client)
    await asyncio.sleep(0.3)
    assert await script_calls(redis_client) == calls
    await latch.count_down()
    assert all(await asyncio.gather(*waiters))


async def test_a_latch_deleted_by_redisson_releases_waiters(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    """Redisson's delete() publishes 1 ("closed") on a latch whose count is now 0, which
    leaves its own waiters blocked; ours re-check on every message and return."""
    latch = client.countdown_latch("deleted")
    assert await latch.try_set_count(1)
    waiter = asyncio.create_task(latch.wait(5))
    await eventually(lambda: true(latch.statistics().tasks_waiting == 1))
    assert await redis_client.delete("deleted") == 1
    await redis_client.publish("redisson_countdownlatch__channel__{deleted}", "1")
    assert await waiter


async def test_our_delete_releases_waiters(client: aiolock.AioLock) -> None:
    latch = client.countdown_latch("deleted")
    assert await latch.try_set_count(5)
    waiter = asyncio.create_task(latch.wait(5))
    await eventually(lambda: true(latch.statistics().tasks_waiting == 1))
    assert await latch.delete()
    assert await waiter


async def test_cancelled_waiters_leave_no_subscription(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    latch = client.countdown_latch("cancelled")
    assert await latch.try_set_count(1)
    waiters = [asyncio.create_task(latch.wait()) for _ in range(5)]
    await eventually(lambda: true(latch.statistics().tasks_waiting == 5))
    for waiter in waiters:
        waiter.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    assert client.statistics().subscriptions == 0
    channel = "redisson_countdownlatch__channel__{cancelled}"
    await eventually(lambda: equal(redis_client.pubsub_numsub(channel), [(channel.encode(), 0)]))


async def test_waiters_recover_after_the_pubsub_connection_is_killed(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    latch = client.countdown_latch("killed")
    assert await latch.try_set_count(1)
    waiter = asyncio.create_task(latch.wait(10))
    await eventually(lambda: true(latch.statistics().tasks_waiting == 1))
    await redis_client.client_kill_filter(_type="pubsub")
    await redis_client.delete("killed")  # opened without a message
    assert await waiter


# -- lost replies ---------------------------------------------------------------------------


async def test_a_lost_count_down_reply_never_counts_twice(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    async with aiolock.from_url(proxy.url) as client:
        latch = client.countdown_latch("lost")
        with pytest.raises(aiolock.LockStateError):  # loads the script (a NOSCRIPT reply
            await latch.count_down()  # would be blackholed too)
        assert await latch.try_set_count(3)
        proxy.blackhole_replies()
        task = asyncio.create_task(latch.count_down())
        await eventually(lambda: equal(redis_client.get("lost"), b"2"))
        proxy.pass_through()
        proxy.reset_connections()
        assert await task == 2
        assert await redis_client.get("lost") == b"2"
        assert client.statistics().fences >= 1


async def test_a_lost_reply_of_a_count_down_on_an_open_latch_never_counts_a_new_one(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """A count-down that found the latch open changed nothing, and says so: once its reply
    is lost and the latch closed again meanwhile, settling it must not send it again (which
    would count down, and here open, the new latch)."""
    async with aiolock.from_url(proxy.url) as client:
        latch = client.countdown_latch("lost-open")
        with pytest.raises(aiolock.LockStateError):  # open (this also loads the script)
            await latch.count_down()
        before = await script_calls(redis_client)
        proxy.blackhole_replies()
        task = asyncio.create_task(latch.count_down())
        await eventually(lambda: _more(script_calls(redis_client), before))  # it ran: -1
        assert await redis_client.set("lost-open", 1)  # another client closes it
        proxy.pass_through()
        proxy.reset_connections()
        with pytest.raises(aiolock.LockStateError):
            await task
        assert await redis_client.get("lost-open") == b"1"
        assert client.statistics().fences >= 1


async def _more(calls: Any, than: int) -> bool:
    return bool(await calls > than)


# -- names with a hash tag of their own -----------------------------------------------------


async def test_a_tagged_name_routes_its_channel_by_the_channel(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    """Redisson's channel for ``{t}x`` is ``...__{{t}x}``, whose hash tag is ``{t``: another
    slot than the count's. Subscriptions to it are routed by the channel itself."""
    name = "{t}x"
    channel = latch_channel(name)
    assert channel == "redisson_countdownlatch__channel__{{t}x}"
    assert not same_slot(channel, name)
    latch = client.countdown_latch(name)
    assert latch._rule.channel_key("") == channel
    assert client.countdown_latch("plain")._rule.channel_key("") == "plain"
    assert await latch.try_set_count(1)
    waiter = asyncio.create_task(latch.wait(5))
    await eventually(lambda: true(latch.statistics().tasks_waiting == 1))
    async with listening(redis_client, channel) as pubsub:
        await latch.count_down()
        assert await message(pubsub) == b"0"
    assert await waiter


def _low_free_port() -> int:
    """A free port below 55536 (and its cluster bus port, + 10000, free too)."""
    import random
    import socket

    for _ in range(100):
        port = random.randint(20000, 55000)
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair")


@pytest.fixture
def cluster_node(tmp_path: Path) -> Any:
    """A one-node Redis Cluster holding every slot: it refuses scripts whose keys are in
    different slots (CROSSSLOT), as any cluster does."""
    if external_redis_url() is not None:
        pytest.skip("needs its own redis-server")
    server = RedisServer(
        ["--cluster-enabled", "yes", "--cluster-config-file", str(tmp_path / "nodes.conf")],
        port=_low_free_port(),  # the cluster bus listens on port + 10000
    )
    server.start()
    try:
        import redis as sync_redis

        with sync_redis.Redis.from_url(server.url) as r:
            r.execute_command("CLUSTER", "ADDSLOTS", *range(16384))
            deadline = time.monotonic() + 10
            while b"cluster_state:ok" not in r.execute_command("CLUSTER", "INFO"):
                assert time.monotonic() < deadline, "the cluster did not come up"
                time.sleep(0.05)
        yield server
    finally:
        server.stop()


async def test_a_tagged_latch_works_on_a_cluster(cluster_node: RedisServer) -> None:
    """Redisson passes the channel among its scripts' keys: for ``{t}x`` a cluster answers
    CROSSSLOT. aiolock passes it as an argument, so the latch works there."""
    name = "{t}x"
    r = redis.asyncio.Redis.from_url(cluster_node.url)
    try:
        with pytest.raises(redis.ResponseError, match="same slot"):  # CROSSSLOT
            await r.eval("return redis.call('exists', KEYS[1])", 2, name, latch_channel(name))
        # A cluster node is served by the cluster client (a redis:// client is refused there).
        rc = redis.asyncio.RedisCluster.from_url(cluster_node.url)
        async with aiolock.AioLock(rc) as client:
            client._owns_redis = True
            latch = client.countdown_latch(name)
            assert await latch.try_set_count(2)
            waiter = asyncio.create_task(latch.wait(5))
            await eventually(lambda: true(latch.statistics().tasks_waiting == 1))
            assert await latch.count_down() == 1
            assert await latch.count_down() == 0
            assert await waiter
            assert await latch.try_set_count(1)
            assert await latch.delete()
    finally:
        await r.aclose()
