"""The permit-expirable semaphore (Redisson's RPermitExpirableSemaphore layout): permits are
holds, renewed by the watchdog, reported lost, and return to the pool by themselves."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
import redis.asyncio

import aiolock
from aiolock.testing import TcpProxy, acl_user
from tests.sync_helpers import equal, eventually, listening, message, quiet, script_calls, true

TIMEOUTS = "{pes}:timeout"


async def server_ms(redis_client: redis.asyncio.Redis) -> int:
    seconds, micros = await redis_client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def plant_permit(redis_client: redis.asyncio.Redis, name: str, expires_in_ms: int) -> bytes:
    """A permit taken by someone else (a crashed peer): the count went down, the id is in
    the set with its expiry."""
    permit = os.urandom(16)
    timeouts = f"{{{name}}}:timeout"
    await redis_client.zadd(timeouts, {permit: await server_ms(redis_client) + expires_in_ms})
    await redis_client.decr(name)
    return permit


# -- layout ---------------------------------------------------------------------------------


async def test_redisson_layout(client: aiolock.AioLock, redis_client: redis.asyncio.Redis) -> None:
    """The count is a decimal string at the name; each permit is its 16 raw bytes in
    {name}:timeout, scored with its expiry in ms; users see 32 hex digits."""
    pes = client.permit_expirable_semaphore("pes")
    assert await pes.try_set_permits(2)
    assert await redis_client.get("pes") == b"2"
    before = await server_ms(redis_client)
    permit = await pes.acquire(lease_time=10)
    assert len(permit) == 32 and int(permit, 16) >= 0
    assert await redis_client.get("pes") == b"1"
    assert await redis_client.zrange(TIMEOUTS, 0, -1) == [bytes.fromhex(permit)]
    score = await redis_client.zscore(TIMEOUTS, bytes.fromhex(permit))
    assert score is not None
    assert before + 10_000 <= score <= await server_ms(redis_client) + 10_000
    renewed = await pes.acquire()  # no lease: the watchdog's, 30 s by default
    score = await redis_client.zscore(TIMEOUTS, bytes.fromhex(renewed))
    assert score is not None and score - await server_ms(redis_client) > 29_000
    async with listening(redis_client, "redisson_sc:{pes}") as pubsub:
        await pes.release(permit)
        assert await message(pubsub) == b"1"  # the new count, in decimal
    await pes.release(renewed)
    assert await redis_client.get("pes") == b"2"
    assert await redis_client.zcard(TIMEOUTS) == 0


async def test_counts(client: aiolock.AioLock) -> None:
    pes = client.permit_expirable_semaphore("pes")
    assert await pes.get_permits() == 0
    assert await pes.try_acquire() is None
    assert await pes.try_set_permits(3)
    assert not await pes.try_set_permits(1)
    first = await pes.acquire()
    assert (await pes.available_permits(), await pes.acquired_permits()) == (2, 1)
    assert await pes.get_permits() == 3
    assert await pes.add_permits(1) == 3
    with pytest.raises(aiolock.LockStateError):
        await pes.add_permits(-4)
    assert await pes.add_permits(-3) == 0
    assert await pes.try_acquire() is None
    assert await pes.try_release(first)
    assert not await pes.try_release(first)
    assert await pes.available_permits() == 1


async def test_a_semaphore_never_given_permits_says_so(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """As the plain semaphore's: no count, no permits (try_acquire returns None, acquire
    waits until they are set), and a warning says why, once until it has a count again."""
    pes = client.permit_expirable_semaphore("pes-never-set")
    caplog.set_level(logging.WARNING, logger="aiolock")

    def warnings() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "aiolock" and "'pes-never-set' has no permits" in r.getMessage()
        ]

    assert await pes.try_acquire() is None
    assert await pes.try_acquire(wait_time=0.05) is None
    [warning] = warnings()
    assert warning.startswith("aiolock: permit-expirable semaphore 'pes-never-set' has no")
    waiter = asyncio.create_task(pes.acquire(lease_time=10))
    await asyncio.sleep(0.2)
    assert not waiter.done()
    assert await pes.try_set_permits(1)
    await pes.release(await asyncio.wait_for(waiter, 10))
    caplog.clear()
    assert await pes.try_set_permits(0) is False  # it has a count: 1
    taken = await pes.try_acquire()
    assert taken is not None
    assert await pes.try_acquire() is None  # none left, but set: nothing to say
    assert warnings() == []
    await pes.release(taken)
    await redis_client.delete("pes-never-set")
    assert await pes.try_acquire() is None
    assert len(warnings()) == 1


async def test_releasing_a_permit_not_held_changes_nothing(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    pes = client.permit_expirable_semaphore("pes")
    assert await pes.try_set_permits(1)
    permit = await pes.acquire()
    unknown = os.urandom(16).hex()
    with pytest.raises(aiolock.LockNotOwnedError, match="not held"):
        await pes.release(unknown)
    assert not await pes.try_release(unknown)
    assert await redis_client.get("pes") == b"0"
    assert await redis_client.zcard(TIMEOUTS) == 1
    await pes.release(permit.upper())  # ids are hex: either case
    with pytest.raises(aiolock.LockNotOwnedError):
        await pes.release(permit)
    assert await redis_client.get("pes") == b"1"


@pytest.fixture
async def offline() -> AsyncIterator[aiolock.AioLock]:
    async with aiolock.from_url("redis://127.0.0.1:1/0") as client:
        yield client


@pytest.mark.parametrize("permit", [None, 1, b"0" * 32, "0" * 31, "0" * 33, "g" * 32, ""])
async def test_bad_permit_ids(offline: aiolock.AioLock, permit: Any) -> None:
    pes = offline.permit_expirable_semaphore("bad")
    for call in (pes.release, pes.try_release):
        with pytest.raises((TypeError, ValueError)):
            await call(permit)
    with pytest.raises((TypeError, ValueError)):
        pes.on_lost(permit, lambda error: None)


@pytest.mark.parametrize("value", [-1, 0, float("nan"), float("inf"), "1", True])
async def test_bad_times(offline: aiolock.AioLock, value: Any) -> None:
    pes = offline.permit_expirable_semaphore("bad")
    with pytest.raises((TypeError, ValueError)):
        await pes.acquire(lease_time=value)
    with pytest.raises((TypeError, ValueError)):
        await pes.try_acquire(lease_time=value)
    if value != 0:
        with pytest.raises((TypeError, ValueError)):
            await pes.try_acquire(wait_time=value)
    bad_permits: list[Any] = [0, 2**31, -(2**31), True, 1.0]
    for permits in bad_permits:
        with pytest.raises((TypeError, ValueError)):
            await pes.add_permits(permits)


# -- waiting --------------------------------------------------------------------------------


async def test_one_release_wakes_one_waiter(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    pes = client.permit_expirable_semaphore("pes")
    assert await pes.try_set_permits(1)
    held = await pes.acquire()
    got: list[str] = []

    async def waiter() -> None:
        got.append(await pes.acquire(owner=owner))

    owner = client.new_owner()
    tasks = [asyncio.create_task(waiter()) for _ in range(5)]
    await eventually(lambda: true(pes.statistics().tasks_waiting == 5))
    before = await script_calls(redis_client)
    await pes.release(held)
    await eventually(lambda: true(len(got) == 1))
    await asyncio.sleep(0.2)
    assert len(got) == 1 and pes.statistics().tasks_waiting == 4
    assert await script_calls(redis_client) - before == 2  # the release and one acquire
    for _ in range(4):
        count = len(got)
        await pes.release(got[-1])
        await eventually(lambda: true(len(got) == count + 1))  # noqa: B023 (awaited here)
    await asyncio.gather(*tasks)
    await pes.release(got[-1])
    assert await pes.available_permits() == 1


async def test_a_waiter_wakes_when_a_lease_runs_out(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock]
) -> None:
    """Redis says nothing when a permit expires: the waiter wakes by itself when the earliest
    one does, and takes it (returned to the pool by its own attempt)."""
    pes = client.permit_expirable_semaphore("pes")
    assert await pes.try_set_permits(1)
    expiring = await make_client().permit_expirable_semaphore("pes").acquire(lease_time=0.3)
    started = time.monotonic()
    permit = await pes.try_acquire(wait_time=5)
    assert permit is not None and permit != expiring
    assert 0.25 < time.monotonic() - started < 3  # at the expiry, well before wait_time


async def test_a_permit_without_expiry_is_waited_for_by_message(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    """A Redisson permit taken without a lease never expires (score 922337203685477): a
    waiter waits for the release message only."""
    pes = client.permit_expirable_semaphore("pes")
    assert await pes.try_set_permits(1)
    peer = os.urandom(16)
    await redis_client.zadd(TIMEOUTS, {peer: 922337203685477})
    await redis_client.decr("pes")
    waiter = asyncio.create_task(pes.try_acquire(wait_time=5))
    await eventually(lambda: true(pes.statistics().tasks_waiting == 1))
    calls = await script_calls(redis_client)
    await asyncio.sleep(0.3)
    assert await script_calls(redis_client) == calls  # no polling meanwhile
    await redis_client.zrem(TIMEOUTS, peer)
    await redis_client.incr("pes")
    await redis_client.publish("redisson_sc:{pes}", "1")
    assert await waiter is not None


# -- leases: renewal, expiry, loss ----------------------------------------------------------


async def test_the_watchdog_renews_a_permit_past_its_lease(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    client = make_client(watchdog_timeout=0.6)
    pes = client.permit_expirable_semaphore("pes")
    assert await pes.try_set_permits(1)
    permit = await pes.acquire()
    assert pes.statistics().renewed == 1
    await asyncio.sleep(1.5)
    assert await redis_client.zscore(TIMEOUTS, bytes.fromhex(permit)) is not None
    assert await pes.available_permits() == 0
    await pes.release(permit)
    assert client.statistics().renewals == 0


async def test_expired_permits_return_to_the_pool_by_the_watchdog(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    """A crashed peer's expired permit is returned to the pool by the renewal of this
    client's permit, with nobody calling the semaphore (and the new count published)."""
    client = make_client(watchdog_timeout=0.6)
    pes = client.permit_expirable_semaphore("pes")
    assert await pes.try_set_permits(3)
    mine = await pes.acquire()
    dead = await plant_permit(redis_client, "pes", expires_in_ms=100)
    assert await redis_client.get("pes") == b"1"
    async with listening(redis_client, "redisson_sc:{pes}") as pubsub:
        assert await message(pubsub, within=5) == b"2"
    assert await redis_client.zscore(TIMEOUTS, dead) is None
    assert await redis_client.get("pes") == b"2"
    await pes.release(mine)


async def test_expired_permits_return_to_the_pool_on_every_call(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    pes = client.permit_expirable_semaphore("pes")
    assert await pes.try_set_permits(2)
    for _ in range(2):
        await plant_permit(redis_client, "pes", expires_in_ms=-1)
    assert await redis_client.get("pes") == b"0"
    assert await pes.available_permits() == 2
    assert await redis_client.zcard(TIMEOUTS) == 0


async def test_a_lost_permit_is_reported(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    """Someone removed the permit (here by hand): the next renewal finds it gone, on_lost
    callbacks run, guard cancels its body, and the release says it was lost."""
    client = make_client(watchdog_timeout=0.6)
    pes = client.permit_expirable_semaphore("pes")
    assert await pes.try_set_permits(1)
    lost: list[aiolock.LockLostError] = []
    with pytest.raises(aiolock.LockLostError):
        async with pes.guard() as permit:
            pes.on_lost(permit, lost.append)
            await redis_client.zrem(TIMEOUTS, bytes.fromhex(permit))
            await asyncio.sleep(5)
    assert len(lost) == 1 and lost[0].owner == permit
    assert pes.statistics().permits_held == 0
    assert await redis_client.get("pes") == b"0"  # the permit was taken away, not returned


async def test_a_lease_running_out_is_a_loss(client: aiolock.AioLock) -> None:
    pes = client.permit_expirable_semaphore("pes")
    assert await pes.try_set_permits(1)
    permit = await pes.acquire(lease_time=0.1)
    await eventually(lambda: true(pes.statistics().lost == 1), within=5)
    with pytest.raises(aiolock.LockLostError):
        await pes.release(permit)
    assert await pes.available_permits() == 1
    with pytest.raises(aiolock.LockNotOwnedError):
        await pes.release(permit)


async def test_a_permit_released_by_another_client_is_lost_by_its_holder(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    """Any client may release a permit by its id (Redisson's semantics); the holder learns
    at its next renewal that it no longer has it."""
    holder = make_client(watchdog_timeout=0.6).permit_expirable_semaphore("pes")
    other = make_client().permit_expirable_semaphore("pes")
    assert await holder.try_set_permits(1)
    permit = await holder.acquire()
    lost = asyncio.Event()
    holder.on_lost(permit, lambda error: lost.set())
    await other.release(permit)
    assert await other.available_permits() == 1
    async with asyncio.timeout(5):  # the next renewal (every 0.2 s), late on a loaded machine
        await lost.wait()


async def _in_a_child_task(how: str, acquire: Callable[[], Coroutine[Any, Any, str]]) -> str:
    """A permit taken in a task that ends right after: asyncio.wait_for runs its coroutine in
    a task of its own on Python 3.11 (3.12 runs it in the caller's), gather and create_task
    always do."""
    if how == "wait_for":
        return await asyncio.wait_for(acquire(), 10)
    if how == "gather":
        (permit,) = await asyncio.gather(acquire())
        return permit
    return await asyncio.create_task(acquire())


@pytest.mark.slow
@pytest.mark.parametrize("lease", [None, 30.0], ids=["renewed", "leased"])
@pytest.mark.parametrize("how", ["wait_for", "gather", "create_task"])
async def test_a_permit_taken_in_a_child_task_is_held_until_released(
    make_client: Callable[..., aiolock.AioLock], how: str, lease: float | None
) -> None:
    """A permit id is a handle (Redisson passes them between threads): the task that took it
    ending gives nothing back. The id names the permit, ``release(id)`` gives it back, and
    nobody else gets it meanwhile (two users never share one permit). Without a lease it is
    renewed while the client lives (here past two leases); closing the client gives it back."""
    client = make_client(watchdog_timeout=0.6)
    pes = client.permit_expirable_semaphore("pes")
    other = make_client().permit_expirable_semaphore("pes")
    assert await pes.try_set_permits(1)
    permit = await _in_a_child_task(how, lambda: pes.acquire(lease_time=lease))
    await asyncio.sleep(1.5)  # the task is long gone; a lease of 0.6 s ran out twice meanwhile
    assert await other.try_acquire() is None
    assert await pes.available_permits() == 0
    stats = pes.statistics()
    assert (stats.permits_held, stats.renewed, stats.lost) == (1, lease is None, 0)
    await pes.release(permit)
    assert await other.available_permits() == 1
    permit = await _in_a_child_task(how, lambda: pes.acquire(lease_time=lease))
    await client.aclose()  # the client's holds end with it: the permit is given back
    assert await other.available_permits() == 1


async def test_a_child_task_s_permit_is_released_by_another_task(client: aiolock.AioLock) -> None:
    """The id is enough: any task of the client releases it, and reports its loss."""
    pes = client.permit_expirable_semaphore("pes")
    assert await pes.try_set_permits(2)
    kept = await asyncio.create_task(pes.acquire(owner=client.new_owner()))  # explicit owner
    short = await asyncio.create_task(pes.acquire(lease_time=0.1))
    await asyncio.create_task(pes.release(kept))
    await eventually(lambda: true(pes.statistics().lost == 1), within=5)
    with pytest.raises(aiolock.LockLostError):
        await asyncio.create_task(pes.release(short))
    assert await pes.available_permits() == 2


async def test_permit_context_manager(client: aiolock.AioLock) -> None:
    pes = client.permit_expirable_semaphore("pes")
    assert await pes.try_set_permits(1)
    async with pes.permit() as permit:
        assert pes.statistics().permits_held == 1
        with pytest.raises(aiolock.LockTimeout):
            async with pes.permit(wait_time=0.05):
                pass
    assert await pes.available_permits() == 1
    with pytest.raises(ZeroDivisionError):
        async with pes.permit(lease_time=5):
            1 / 0  # noqa: B018
    assert await pes.available_permits() == 1
    assert not await pes.try_release(permit)


# -- cancellation and lost replies ----------------------------------------------------------


@pytest.fixture
async def via_proxy(proxy: TcpProxy) -> AsyncIterator[aiolock.AioLock]:
    async with aiolock.from_url(proxy.url) as client:
        assert await client.permit_expirable_semaphore("pes").try_set_permits(2)
        yield client


async def test_cancelled_while_the_acquire_reply_is_in_flight(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    proxy.delay_replies(0.3)
    task = asyncio.create_task(via_proxy.permit_expirable_semaphore("pes").acquire())
    await eventually(lambda: equal(redis_client.zcard(TIMEOUTS), 1))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await quiet(via_proxy)
    assert await redis_client.zcard(TIMEOUTS) == 0
    assert await redis_client.get("pes") == b"2"
    assert not any(via_proxy.statistics().holds.values())


async def test_a_wait_for_that_times_out_with_the_reply_in_flight_gives_the_permit_back(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """A permit belongs to no task, yet an acquire cancelled after its script took a permit
    (``wait_for`` timing out while the reply is delayed) still gives it back."""
    pes = via_proxy.permit_expirable_semaphore("pes")
    proxy.delay_replies(0.5)
    task = asyncio.create_task(asyncio.wait_for(pes.acquire(), 0.3))
    await eventually(lambda: equal(redis_client.zcard(TIMEOUTS), 1))  # taken, reply delayed
    with pytest.raises(TimeoutError):
        await task
    proxy.pass_through()
    await quiet(via_proxy)
    assert await redis_client.zcard(TIMEOUTS) == 0
    assert await redis_client.get("pes") == b"2"
    assert not any(via_proxy.statistics().holds.values())


async def test_a_lost_acquire_reply_takes_one_permit(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    pes = via_proxy.permit_expirable_semaphore("pes")
    proxy.blackhole_replies()
    task = asyncio.create_task(pes.acquire(owner=via_proxy.new_owner()))
    await eventually(lambda: equal(redis_client.zcard(TIMEOUTS), 1))
    proxy.pass_through()
    proxy.reset_connections()
    permit = await task
    assert await redis_client.zrange(TIMEOUTS, 0, -1) == [bytes.fromhex(permit)]
    assert await redis_client.get("pes") == b"1"
    assert pes.statistics().permits_held == 1
    await pes.release(permit)


async def test_a_lost_release_reply_returns_the_permit_once(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    pes = via_proxy.permit_expirable_semaphore("pes")
    permit = await pes.acquire()
    proxy.blackhole_replies()
    task = asyncio.create_task(pes.release(permit))
    await eventually(lambda: equal(redis_client.zcard(TIMEOUTS), 0))
    proxy.pass_through()
    proxy.reset_connections()
    await task
    assert await redis_client.get("pes") == b"2"
    assert pes.statistics().permits_held == 0


async def test_an_acquire_that_cannot_be_fenced_taints_nothing(
    redis_url: str, redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Without CLIENT KILL an acquire held by a middlebox cannot be fenced. A lock's owner
    would write another owner id for its next holds (Leases.taint), so the late request
    matches none of them. A permit's owner id is its permit id: never used for another hold
    (the late request can match no later permit), and the very id its scripts store and
    renew, so nothing is tainted: the task's next permits are plain permit ids, renewed and
    released as usual. The late acquire, when it finally runs, takes a permit nobody renews,
    which returns to the pool after its lease."""
    rules = ("~*", "&*", "+@all", "-client", "+client|info", "+client|setname", "+client|id")
    name = "pes-unfenced"
    with acl_user(redis_url, "no-kill-permit", *rules) as url:
        async with (
            TcpProxy.for_url(url) as proxy,
            aiolock.from_url(proxy.url, command_timeout=0.5, cleanup_timeout=0.7) as client,
        ):
            pes = client.permit_expirable_semaphore(name)
            assert await pes.try_set_permits(2)
            leases = client.runtime().leases
            proxy.hold_requests()
            acquiring = asyncio.create_task(pes.acquire(lease_time=1))
            async with asyncio.timeout(5):
                await proxy.wait_for_held_requests()
            proxy.reset_client_side()
            with caplog.at_level(logging.WARNING, logger="aiolock"):
                with pytest.raises(aiolock.AioLockError):
                    await acquiring
                await quiet(client)
            assert "from now on" not in caplog.text  # no fresh owner id was made
            assert not leases._fields
            permit = await pes.acquire()  # renewed by the watchdog, by its permit id
            hold = leases.holds[(name, permit)]
            assert hold.field == permit
            assert leases.field(name, hold.owner) == permit
            await proxy.release_held_requests()  # the old acquire runs now
            await eventually(lambda: equal(redis_client.zcard(f"{{{name}}}:timeout"), 2))
            assert await pes.available_permits() == 0
            await eventually(lambda: equal(pes.available_permits(), 1), within=5)
            assert pes.statistics().permits_held == 1
            await pes.release(permit)
            assert await pes.available_permits() == 2


async def test_counts_of_an_unreachable_server_raise_an_aiolock_error(
    fresh_server: aiolock.testing.RedisServer,
) -> None:
    """The counts are read by a script that may return expired permits to the pool; when no
    connection can be opened they raised the transport's internal NotSent, which is no
    AioLockError (an ``except aiolock.AioLockError`` let it through), unlike every other
    read: RedisUnavailableError, as the plain semaphore's ``available_permits()``."""
    async with aiolock.from_url(
        fresh_server.url, command_timeout=0.5, reconnect_max_delay=0.1
    ) as client:
        pes = client.permit_expirable_semaphore("unreachable")
        assert await pes.try_set_permits(2)
        fresh_server.kill()
        for read in (pes.available_permits, pes.acquired_permits, pes.get_permits):
            with pytest.raises(aiolock.RedisUnavailableError, match="unreachable"):
                await read()
        with pytest.raises(aiolock.RedisUnavailableError, match="unreachable"):
            await pes.add_permits(-1)  # reads the counts first
        with pytest.raises(aiolock.RedisUnavailableError):
            await client.semaphore("unreachable").available_permits()


async def test_permits_can_be_given_back_on_a_server_out_of_memory() -> None:
    from aiolock.testing import RedisServer, external_redis_url

    if external_redis_url() is not None:
        pytest.skip("needs its own redis-server")
    with RedisServer(["--maxmemory-policy", "noeviction"]) as server:
        async with aiolock.from_url(server.url) as client:
            pes = client.permit_expirable_semaphore("oom")
            assert await pes.try_set_permits(2)
            permit = await pes.acquire()
            await client.redis.config_set("maxmemory", 1)
            try:
                with pytest.raises(aiolock.RedisOperationError, match="OOM"):
                    await pes.acquire()
                await pes.release(permit)
            finally:
                await client.redis.config_set("maxmemory", 0)
            assert await pes.available_permits() == 2


@pytest.mark.slow
async def test_permits_stay_renewed_on_a_server_out_of_memory_as_locks_do() -> None:
    """maxmemory reached (noeviction): Redis refuses a script's memory-growing command only
    if it is the script's first write. The lock's renewal starts with PEXPIRE; the permits'
    must start with a write that needs no memory too, or every permit without a lease
    expires after one lease while the locks beside it stay renewed."""
    from aiolock.testing import RedisServer, external_redis_url

    if external_redis_url() is not None:
        pytest.skip("needs its own redis-server")
    with RedisServer(["--maxmemory-policy", "noeviction"]) as server:
        async with aiolock.from_url(server.url, watchdog_timeout=0.6) as client:
            pes = client.permit_expirable_semaphore("oom")
            assert await pes.try_set_permits(3)
            expired = await pes.acquire(lease_time=0.3)  # the renewal also returns it
            permit = await pes.acquire()
            lock = client.lock("oom-lock")
            await lock.lock()
            await client.redis.config_set("maxmemory", 1)
            try:
                await asyncio.sleep(2)  # over 3 leases
                assert lock.statistics().held
                assert pes.statistics().permits_held == 1
                await pes.release(permit)
                await lock.unlock()
                with pytest.raises(aiolock.LockLostError):
                    await pes.release(expired)
            finally:
                await client.redis.config_set("maxmemory", 0)
            assert await pes.available_permits() == 3
