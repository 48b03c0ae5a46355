"""Cancellation and lost replies: no orphan hold, no double count, releases complete.

Replies and requests are delayed, dropped or cut for real through aiolock.testing.TcpProxy.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio

import aiolock
from aiolock.tasks import current_task_id
from aiolock.testing import TcpProxy


@pytest.fixture
async def via_proxy(proxy: TcpProxy) -> AsyncIterator[aiolock.AioLock]:
    async with aiolock.from_url(proxy.url) as client:
        async with client.lock("warm-up"):  # open the connections before faults start
            pass
        yield client


@pytest.fixture
async def quick_via_proxy(proxy: TcpProxy) -> AsyncIterator[aiolock.AioLock]:
    """As ``via_proxy``, with command_timeout 0.3 s: a try without a wait gives up its reply
    with a timer of its own at 0.275 s (command_timeout - margin - LOOK_AGAIN)."""
    async with aiolock.from_url(proxy.url, command_timeout=0.3) as client:
        async with client.lock("warm-up"):
            pass
        yield client


async def eventually(check: Callable[[], Awaitable[object]], within: float = 5) -> None:
    """Poll state on the server (no event to wait on there) until ``check`` is true."""
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def test_cancelled_while_the_acquire_reply_is_in_flight(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """The script ran on the server, the reply is delayed, the caller is cancelled: the hold
    is released before the CancelledError reaches the caller."""
    proxy.delay_replies(0.4)
    task = asyncio.create_task(via_proxy.lock("in-flight").try_lock(lease_time=30))
    await eventually(lambda: redis_client.exists("in-flight"))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not await redis_client.exists("in-flight")
    assert not any(via_proxy.statistics().holds.values())


async def test_cancelled_while_the_acquire_request_is_in_flight(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """The request has not reached the server yet when the caller is cancelled: it must not
    take the lock when it arrives later."""
    proxy.delay_requests(0.3)
    task = asyncio.create_task(via_proxy.lock("late").try_lock(lease_time=30))
    await asyncio.sleep(0.05)
    assert not await redis_client.exists("late")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.5)  # past the delay: anything still in flight has arrived
    assert not await redis_client.exists("late")


async def test_outer_timeout_around_a_waiting_acquire(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    await redis_client.hset("busy", "someone-else", 1)
    await redis_client.pexpire("busy", 100)
    proxy.delay_replies(0.05)
    # the holder's lease runs out during the wait, so the acquire is in flight at the timeout
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await via_proxy.lock("busy").lock(lease_time=30)
    proxy.pass_through()
    await asyncio.sleep(0.2)
    assert not any(via_proxy.statistics().holds.values())
    assert not await redis_client.exists("busy")  # expired, or taken and then released


async def test_unlock_completes_when_its_caller_is_cancelled(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    lock = via_proxy.lock("release-me")
    unlocking = asyncio.Event()

    async def hold_then_unlock() -> None:
        assert await lock.try_lock()
        proxy.delay_requests(0.3)  # the release has not reached the server when cancelled
        unlocking.set()
        await lock.unlock()

    task = asyncio.create_task(hold_then_unlock())
    await unlocking.wait()
    await asyncio.sleep(0.05)
    assert await redis_client.exists("release-me")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not await redis_client.exists("release-me")


async def test_async_with_releases_when_the_body_is_cancelled(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    entered = asyncio.Event()

    async def body() -> None:
        async with client.lock("body"):
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not await redis_client.exists("body")


async def test_cancel_after_release(client: aiolock.AioLock) -> None:
    """The race anyio calls test_cancel_after_release: the waiter is granted the lock and
    cancelled before it resumes. Either it returns holding the lock, or it is cancelled and
    holds nothing; never a hold without an owner. (The waiter acts for an explicit owner, so
    that a hold it returns with outlives its task.)"""
    lock = client.lock("race")
    for delay in [0, 0, 0.0001, 0.0002, 0.0005, 0.001, 0.002] * 4:
        assert await lock.try_lock()
        owner = client.new_owner()
        waiter = asyncio.create_task(lock.lock(owner=owner))
        await asyncio.sleep(0.002)  # the waiter is subscribed and waiting
        await lock.unlock()
        await asyncio.sleep(delay)
        waiter.cancel()
        try:
            await waiter
        except asyncio.CancelledError:
            assert not await lock.is_locked(), f"orphan hold after cancel at {delay}"
            assert lock.statistics(owner=owner).hold_count == 0
        else:
            assert await lock.hold_count(owner=owner) == 1
            await lock.unlock(owner=owner)
    assert client.statistics().subscriptions == 0


async def test_cancel_after_release_for_a_task_owner(client: aiolock.AioLock) -> None:
    """The same race for a task that waits as its own owner (its acquisition has no hold
    record until it is granted, issue 18): granted and cancelled before it resumes, it
    either returns holding the lock or is cancelled holding nothing, and no record is
    left behind either way."""
    lock = client.lock("race-task")
    for delay in [0, 0, 0.0001, 0.0002, 0.0005, 0.001, 0.002] * 4:
        assert await lock.try_lock()

        async def take() -> bool:
            await lock.lock()
            await lock.unlock()  # (completes even if cancelled meanwhile)
            return True

        waiter = asyncio.create_task(take())
        await asyncio.sleep(0.002)  # the waiter is subscribed and waiting
        await lock.unlock()
        await asyncio.sleep(delay)
        waiter.cancel()
        try:
            assert await waiter
        except asyncio.CancelledError:
            pass
        assert not await lock.is_locked(), f"orphan hold after cancel at {delay}"
        assert not any(client.statistics().holds.values())
    assert client.statistics().subscriptions == 0


async def test_a_parked_waiter_cancelled_while_its_retry_reply_is_in_flight(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """A task parked for a lock (no hold record yet) retries when the holder's lease runs
    out; the retry's script runs and takes the lock, its reply is delayed, and the task is
    cancelled: the hold is released before the CancelledError reaches it, and nothing is
    left in the client."""
    await redis_client.hset("parked", "someone-else", 1)
    await redis_client.pexpire("parked", 400)
    task = asyncio.create_task(via_proxy.lock("parked").lock(lease_time=30))
    await eventually(lambda: _true(via_proxy.statistics().tasks_waiting == 1))
    proxy.delay_replies(0.5)
    await eventually(lambda: redis_client.hexists("parked", f"{via_proxy.id}:{_task_id(task)}"))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not await redis_client.exists("parked")
    assert not any(via_proxy.statistics().holds.values())


async def _true(value: object) -> bool:
    return bool(value)


def _task_id(task: asyncio.Task[object]) -> int:
    return current_task_id(task)


async def test_lost_acquire_reply_is_not_counted_twice(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """The script ran, its reply was lost with the connection: the outcome is resolved by
    reading the owner's count, not by running the script again."""
    lock = via_proxy.lock("lost-reply")
    owner = via_proxy.new_owner()

    async def take_twice() -> bool:
        assert await lock.try_lock(owner=owner)
        proxy.blackhole_replies()
        return await lock.try_lock(owner=owner)

    task = asyncio.create_task(take_twice())
    await eventually(lambda: _value_is(redis_client.hvals("lost-reply"), [b"2"]))
    proxy.pass_through()
    proxy.reset_connections()
    assert await task
    assert await redis_client.hvals("lost-reply") == [b"2"]
    assert lock.statistics(owner=owner).hold_count == 2


async def test_lost_request_is_tried_again(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """The request never reached the server: the count shows it did not run, so it is sent
    again and takes the lock once."""
    proxy.blackhole_requests()
    owner = via_proxy.new_owner()
    task = asyncio.create_task(via_proxy.lock("lost-request").try_lock(owner=owner))
    await asyncio.sleep(0.1)
    proxy.pass_through()
    proxy.reset_connections()
    assert await task
    assert await redis_client.hvals("lost-request") == [b"1"]


async def test_unresolvable_outcome_is_an_aiolock_error(
    via_proxy: aiolock.AioLock, proxy: TcpProxy
) -> None:
    proxy.blackhole_replies()
    task = asyncio.create_task(via_proxy.lock("dark").try_lock())
    await asyncio.sleep(0.1)
    await proxy.aclose()  # the server can no longer be reached at all
    with pytest.raises(aiolock.RedisOperationError):
        await task


async def _value_is(values: Awaitable[object], expected: object) -> bool:
    return await values == expected


@pytest.mark.parametrize("cancel_first", [False, True], ids=["give-up first", "cancel first"])
async def test_a_cancellation_at_the_moment_a_try_gives_up_is_never_lost(
    quick_via_proxy: aiolock.AioLock,
    proxy: TcpProxy,
    redis_client: redis.asyncio.Redis,
    cancel_first: bool,
) -> None:
    """``try_lock()`` (no wait) gives up a reply that does not come in time with a timer of
    its own; the caller is cancelled in the same loop iteration as that timer goes off (the
    loop was held up past both, so both are due at once), in either order. The caller gets
    its CancelledError (a give-up that swallowed it would lose the cancellation), and what
    the try took is given back."""
    client = quick_via_proxy
    proxy.delay_replies(0.6)
    loop = asyncio.get_running_loop()
    start = loop.time()
    task = asyncio.create_task(client.lock("both-due").try_lock(lease_time=30))
    # The try's own timer is due at start + 0.275 s (+ the few ms before it starts). The
    # cancellation is due 15 ms after or before it, and the loop is held up until both are.
    loop.call_at(start + (0.26 if cancel_first else 0.29), task.cancel)
    loop.call_at(start + 0.2, time.sleep, 0.2)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    proxy.delay_replies(0)
    await eventually(lambda: _gone(redis_client, "both-due"))
    await eventually(lambda: _idle(client))


async def _gone(r: redis.asyncio.Redis, key: str) -> bool:
    return not await r.exists(key)


async def _idle(client: aiolock.AioLock) -> bool:
    return not any(client.statistics().holds.values())


@pytest.mark.parametrize("delay", [0.0, 0.6], ids=["reply in time", "reply late"])
async def test_a_cancellation_pending_when_a_try_starts_is_never_lost(
    quick_via_proxy: aiolock.AioLock,
    proxy: TcpProxy,
    redis_client: redis.asyncio.Redis,
    delay: float,
) -> None:
    """The race: the caller's task is cancelled while it runs (``task.cancel()`` on itself,
    or an ``asyncio.TaskGroup`` whose eager child failed at once, on 3.12+), so the
    cancellation is pending when ``try_lock()`` arms its own give-up timer, and it cancels
    the reply's future at the first wait, before that timer: the task's cancellation count
    does not move then. The caller gets its CancelledError (it got the grant, True, or
    RedisTimeoutError), and what the try took is given back."""
    client = quick_via_proxy
    proxy.delay_replies(delay)

    async def cancelled_first() -> bool:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        return await client.lock("pending").try_lock(lease_time=30)

    task = asyncio.create_task(cancelled_first())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    proxy.delay_replies(0)
    await eventually(lambda: _gone(redis_client, "pending"))
    await eventually(lambda: _idle(client))


@pytest.mark.skipif(sys.version_info < (3, 12), reason="eager tasks came in Python 3.12")
async def test_a_task_group_cancelling_its_parent_at_once_is_not_lost_by_a_try(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    """The race of the test above as it comes about: with eager tasks, a TaskGroup's child
    that fails at once cancels the parent task while the parent runs, before its
    ``try_lock()``. The try raises CancelledError (the body does not go on holding the lock
    the task group is about to give up), and leaves nothing taken."""
    async with client.lock("warm-up"):  # open the connection first: the try waits for nothing else
        pass
    loop = asyncio.get_running_loop()
    factory = loop.get_task_factory()
    loop.set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined,unused-ignore]
    went_on = False

    async def fails_at_once() -> None:
        raise ValueError("the child failed")

    try:
        with pytest.raises(ExceptionGroup) as raised:
            async with asyncio.TaskGroup() as group:
                group.create_task(fails_at_once())
                await client.lock("group").try_lock(lease_time=30)
                went_on = True
    finally:
        loop.set_task_factory(factory)
    assert raised.group_contains(ValueError)  # type: ignore[attr-defined,unused-ignore]
    assert not went_on
    await eventually(lambda: _gone(redis_client, "group"))
    await eventually(lambda: _idle(client))
