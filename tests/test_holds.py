"""Hold state under faults: one owner of hold state (the lease registry), reproduced symptoms of
issue "Core, part 2", each against real servers and real faults."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import pytest
import redis.asyncio

import aiolock
from aiolock.testing import RedisServer, TcpProxy, acl_user


async def eventually(check: Callable[[], Awaitable[object]], within: float = 5) -> None:
    """Poll server state (there is no event to wait on there) until ``check`` is true."""
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def _true(value: object) -> bool:
    return bool(value)


@pytest.fixture
async def via_proxy(proxy: TcpProxy) -> AsyncIterator[aiolock.AioLock]:
    async with aiolock.from_url(
        proxy.url, watchdog_timeout=1, command_timeout=0.5, cleanup_timeout=1
    ) as client:
        async with client.lock("warm-up"):  # open the connections before faults start
            pass
        yield client


# -- 1. a failed unlock never leaves a hold renewed --


async def test_a_failed_unlock_stops_renewal_and_the_lock_is_freed(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """The release at the end of an ``async with`` cannot get through (the link is dark):
    the exit raises, renewal stops at once, and once the server answers again the hold is
    released in the background (it would have expired unrenewed anyway)."""
    lock = via_proxy.lock("failed-unlock")
    with pytest.raises(aiolock.RedisOperationError):
        async with lock:
            proxy.blackhole_requests()
    assert via_proxy.statistics().renewals == 0
    proxy.pass_through()
    await eventually(lambda: not_(redis_client.exists("failed-unlock")), within=3)
    assert not await lock.is_locked()
    await eventually(lambda: _true(not any(via_proxy.statistics().holds.values())))


async def not_(value: Awaitable[object]) -> bool:
    return not await value


async def test_a_nested_unlock_refused_loses_the_hold_and_frees_the_lock(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """The nested release (HINCRBY) is refused by the server (here the client's ACL user
    loses HINCRBY once the lock is held twice; a server out of memory used to refuse it too,
    until the release scripts wrote first with PEXPIRE: see tests/test_lock.py): the hold
    can no longer be trusted, so it is lost (the outer unlock says so), never renewed, and
    purged (HDEL is still allowed), so nobody waits a lease for it."""
    with acl_user(redis_url, "no-hincrby", "~*", "&*", "+@all") as url:
        async with aiolock.from_url(url, watchdog_timeout=1) as client:
            lock = client.lock("refused-nested")
            assert await lock.try_lock()
            assert await lock.try_lock()
            await redis_client.acl_setuser("no-hincrby", enabled=True, commands=["-hincrby"])
            refused = "releasing 'refused-nested' failed"
            with pytest.raises(aiolock.RedisOperationError, match=refused):
                await lock.unlock()
            assert client.statistics().renewals == 0
            with pytest.raises(aiolock.LockLostError):
                await lock.unlock()
            await eventually(lambda: not_(redis_client.exists("refused-nested")), within=2)


# -- 2. a hold whose task ended is released --


@pytest.mark.parametrize("how", ["gather", "wait_for", "create_task"])
async def test_a_hold_whose_task_ended_is_released(
    client: aiolock.AioLock,
    redis_client: redis.asyncio.Redis,
    how: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The acquire ran in a child task that ended holding (gather, wait_for on 3.11, a plain
    task): the hold is released with a warning naming the lock, and never renewed."""
    lock = client.lock("orphaned-by-task")
    with caplog.at_level(logging.WARNING, logger="aiolock"):
        if how == "gather":
            await asyncio.gather(lock.lock())
        elif how == "wait_for":
            await asyncio.wait_for(asyncio.ensure_future(lock.lock()), 5)
        else:
            await asyncio.create_task(lock.lock())
        await eventually(lambda: not_(redis_client.exists("orphaned-by-task")))
    assert client.statistics().renewals == 0
    assert "ended holding lock 'orphaned-by-task'" in caplog.text


async def test_an_explicit_owner_hands_a_hold_across_tasks(client: aiolock.AioLock) -> None:
    lock = client.lock("handed")
    owner = client.new_owner()
    await asyncio.create_task(lock.lock(owner=owner))
    await asyncio.sleep(0.05)  # the task that took it has ended: the hold stays
    assert await lock.hold_count(owner=owner) == 1
    assert lock.statistics(owner=owner).renewed
    assert not await lock.try_lock()  # the current task is another owner
    await asyncio.create_task(lock.unlock(owner=owner))
    assert not await lock.is_locked()


# -- 3. aclose() ends holds loudly --


async def test_aclose_reports_holds_lost_cancels_guards_and_releases(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    client = aiolock.from_url(redis_url)
    lock = client.lock("closing")
    lost: list[aiolock.LockLostError] = []
    cleaned_up = asyncio.Event()
    entered = asyncio.Event()

    async def guarded() -> None:
        async with lock.guard():
            lock.on_lost(lost.append)
            entered.set()
            try:
                await asyncio.sleep(60)
            finally:
                await asyncio.sleep(0.01)  # cleanup in the body still runs
                cleaned_up.set()

    task = asyncio.create_task(guarded())
    await entered.wait()
    await client.aclose()
    with pytest.raises(aiolock.LockLostError, match="client was closed"):
        await task
    assert cleaned_up.is_set()
    await asyncio.sleep(0)
    assert len(lost) == 1
    assert not await redis_client.exists("closing")  # released, not left for a lease


async def test_a_closed_clients_statistics_count_no_holds(redis_url: str) -> None:
    """Attack finding A8: holds the close took from their owners (never unlocked) are not
    counted as lost-and-pending by a closed client's statistics(): it keeps nothing alive.
    Their owners are still told: the lock's own statistics say lost, unlock() raises."""
    client = aiolock.from_url(redis_url)
    lock, other = client.lock("closed-stats"), client.fenced_lock("closed-stats-2")
    owner = client.new_owner()
    await lock.lock()
    await other.lock(owner=owner)
    assert client.statistics().holds["held"] == 2
    await client.aclose()
    assert not any(client.statistics().holds.values()), client.statistics().holds
    assert lock.statistics().lost
    with pytest.raises(aiolock.LockLostError, match="client was closed"):
        await lock.unlock()
    with pytest.raises(aiolock.LockLostError, match="client was closed"):
        await other.unlock(owner=owner)
    assert not any(client.statistics().holds.values())


async def test_a_closed_client_starts_no_background_work(redis_url: str) -> None:
    """Attack finding A11: once aclose() returned, no background task starts on the client
    (its work needed the client): a composite's release on a member client already closed
    tells the loss at once instead."""
    ran = []

    async def work() -> None:
        ran.append(1)

    async with aiolock.from_url(redis_url) as other:
        closing = aiolock.from_url(redis_url)
        multi = aiolock.multi_lock(closing.lock("closed-spawn-a"), other.lock("closed-spawn-b"))
        await multi.lock()
        await closing.aclose()
        with pytest.raises(aiolock.ClientClosedError):
            await closing.unchecked_runtime.spawn(work())
        assert not ran
        with pytest.raises(aiolock.LockLostError, match="client was closed"):
            await multi.unlock()
        assert closing.statistics().background_tasks == 0
        assert not any(closing.statistics().holds.values())
        assert not any(other.statistics().holds.values())


# -- 4, 5. no re-entering a lost hold; a lost hold leaves the server --


async def test_no_reentering_a_lost_hold(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    """The watchdog cannot confirm a renewal in time (CLIENT PAUSE WRITE): the hold is lost
    while its field is still on the server. A nested lock() then does not re-enter it (the
    server would count 2 while the owner unlocks once): it raises LockLostError, no token is
    handed out twice, the outer unlock says the hold was lost, and the field is removed from
    the server instead of blocking others for a lease."""
    client = make_client(watchdog_timeout=0.6, command_timeout=2)
    fenced = client.fenced_lock("lost-then-nested")
    token = await fenced.lock_and_get_token()
    await redis_client.client_pause(900, all=False)
    await eventually(lambda: _true(fenced.statistics().lost), within=3)
    with pytest.raises(aiolock.LockLostError):
        await fenced.lock_and_get_token()
    assert await fenced.get_token() == token  # none handed out again
    with pytest.raises(aiolock.LockLostError):
        await fenced.unlock()
    await eventually(lambda: not_(redis_client.exists("lost-then-nested")), within=3)
    assert await fenced.lock_and_get_token() > token  # a new hold, a new token


async def test_a_grant_that_arrives_after_its_lease_is_not_a_grant(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    async with aiolock.from_url(proxy.url, command_timeout=3) as client:
        lock = client.lock("late-grant")
        assert not await lock.is_locked()
        proxy.delay_replies(0.3)
        assert not await lock.try_lock(lease_time=0.2)
        proxy.pass_through()
        assert lock.statistics().hold_count == 0
        assert not await lock.is_locked()


# -- 6. a release still running serializes with the next acquire --


async def test_a_background_release_does_not_race_the_next_lock(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    lock = via_proxy.lock("serialized")
    owner = via_proxy.new_owner()
    await lock.lock(owner=owner)
    proxy.delay_requests(0.3)
    unlocking = asyncio.create_task(lock.unlock(owner=owner))
    await asyncio.sleep(0.05)
    unlocking.cancel()  # the release goes on in the background
    with pytest.raises(asyncio.CancelledError):
        await unlocking
    proxy.pass_through()
    await lock.lock(owner=owner)  # waits for the release, then takes a fresh hold
    stats = lock.statistics(owner=owner)
    assert (stats.hold_count, stats.renewed) == (1, True)
    await asyncio.sleep(1.2)  # past the lease: it is renewed
    assert await lock.is_held_by_current_task(owner=owner)
    await lock.unlock(owner=owner)
    assert not await redis_client.exists("serialized")


# -- 7. a short nested lease never shortens the outer one --


async def test_a_nested_short_lease_does_not_shorten_a_watchdog_hold(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock]
) -> None:
    lock = client.lock("nested-lease")
    async with lock:
        assert await lock.try_lock(lease_time=0.2)
        await asyncio.sleep(0.5)
        assert not await make_client().lock("nested-lease").try_lock()
        ttl = await lock.remaining_ttl()
        assert ttl is not None and ttl > 20
        await lock.unlock()
        assert not await make_client().lock("nested-lease").try_lock()


# -- 8. no stuck echo: a real unlock by someone else always wakes --


async def test_a_local_release_never_swallows_another_clients_unlock(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock]
) -> None:
    lock = client.lock("echo")
    other = make_client().lock("echo")
    for _ in range(3):
        assert await lock.try_lock(lease_time=30)
        waiter = asyncio.create_task(lock.try_lock(wait_time=5, lease_time=30))
        await asyncio.sleep(0.05)
        await lock.unlock()  # a local release hands it to the local waiter
        assert await waiter
        await asyncio.sleep(0.05)
    # held by the waiter tasks (ended: released); now another client holds it
    await eventually(lambda: not_(lock.is_locked()))
    assert await other.try_lock(lease_time=30)
    started = asyncio.get_running_loop().time()
    waiter = asyncio.create_task(lock.try_lock(wait_time=10, lease_time=5))
    await asyncio.sleep(0.1)
    await other.unlock()
    assert await waiter
    assert asyncio.get_running_loop().time() - started < 2  # woken, not the 30 s lease


# -- 9. one bad key fails only its own hold --


async def test_one_bad_key_fails_only_its_own_renewal(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    client = make_client(watchdog_timeout=0.6)
    owner = client.new_owner()
    locks = [client.lock(f"batch:{i}") for i in range(5)]
    for lock in locks:
        assert await lock.try_lock(owner=owner)
    await redis_client.delete("batch:2")
    await redis_client.set("batch:2", "not a hash any more")
    await eventually(lambda: _true(locks[2].statistics(owner=owner).lost), within=2)
    await asyncio.sleep(0.5)  # a further renewal round
    for i, lock in enumerate(locks):
        assert lock.statistics(owner=owner).lost == (i == 2)
    assert client.statistics().renewals == 4


# -- 10. the process-wide renewal map and many loops in many threads --


def test_clients_on_many_loops_and_threads(redis_url: str) -> None:
    errors: list[BaseException] = []

    def run(n: int) -> None:
        async def main() -> None:
            for round_ in range(5):
                async with aiolock.from_url(redis_url, watchdog_timeout=0.3) as client:
                    owner = client.new_owner()
                    for i in range(20):
                        await client.lock(f"threads:{n}:{round_}:{i}").lock(owner=owner)
                    await asyncio.sleep(0.15)

        try:
            asyncio.run(main())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert not aiolock.leases.RENEWALS


# -- 11. guard() cancels once; cancellation under anyio scopes waits for the undo --


async def test_guard_cancels_its_body_once_and_cleanup_runs(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    client = make_client(watchdog_timeout=0.6)
    lock = client.lock("guard-once")
    rolled_back = False

    async def rollback() -> None:
        nonlocal rolled_back
        await asyncio.sleep(0.05)  # not cancelled again: the guard cancels only once
        rolled_back = True

    with pytest.raises(aiolock.LockLostError):
        async with lock.guard():
            assert await make_client().lock("guard-once").force_unlock()
            try:
                await asyncio.sleep(10)
            finally:
                await rollback()
    assert rolled_back


async def test_anyio_cancel_scope_waits_for_the_undo_of_a_cancelled_acquire(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """FastAPI/Starlette cancel with anyio scopes (level cancellation): the acquire's script
    ran, its reply is late, the scope is cancelled: when the scope exits, the hold it took
    has been released already."""
    proxy.delay_replies(0.3)
    with anyio.move_on_after(0.1):
        await via_proxy.lock("anyio-undo").lock()
    assert not await redis_client.exists("anyio-undo")


async def test_asyncio_timeout_waits_for_the_undo_of_a_cancelled_acquire(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    proxy.delay_replies(0.3)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await via_proxy.lock("asyncio-undo").lock()
    assert not await redis_client.exists("asyncio-undo")


async def test_anyio_cancel_scope_around_async_with_still_releases(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    with anyio.move_on_after(0.1):
        async with client.lock("anyio-exit"):
            await asyncio.sleep(10)
    assert not await redis_client.exists("anyio-exit")


# -- 12. the body's exception wins over a failed unlock --


async def test_the_bodys_exception_wins_over_a_failed_unlock(
    via_proxy: aiolock.AioLock, proxy: TcpProxy
) -> None:
    with pytest.raises(ValueError, match="the body's own") as info:
        async with via_proxy.lock("body-wins"):
            proxy.blackhole_requests()
            raise ValueError("the body's own error")
    notes = getattr(info.value, "__notes__", [])
    assert any("releasing 'body-wins' failed" in note for note in notes)
    assert via_proxy.statistics().renewals == 0


@pytest.mark.skipif(sys.version_info < (3, 11), reason="add_note")
async def test_client_alock_lets_the_body_exception_win(
    via_proxy: aiolock.AioLock, proxy: TcpProxy
) -> None:
    with pytest.raises(KeyError):
        async with via_proxy.alock("alock-body-wins", wait_time=1):
            proxy.blackhole_requests()
            raise KeyError("mine")


# -- found by attacking the core --


async def test_a_late_grant_is_removed_before_the_next_try(
    proxy: TcpProxy, redis_url: str, make_client: Callable[..., aiolock.AioLock]
) -> None:
    """The first try's grant comes back after its 1 s lease: it is no grant, and it is
    removed before the next try (which re-entered it before); the grant that follows is the
    owner's only hold, still there once everything has settled, so nobody else gets in."""
    async with aiolock.from_url(proxy.url, command_timeout=3) as client:
        lock = client.lock("late-then-valid")
        owner = client.new_owner()
        assert not await lock.is_locked()
        proxy.delay_replies(1.3)
        asyncio.get_running_loop().call_later(1.1, proxy.pass_through)
        assert await lock.try_lock(wait_time=5, lease_time=1.0, owner=owner)
        await asyncio.sleep(0.1)  # anything queued has run
        assert lock.statistics(owner=owner).hold_count == 1
        assert await lock.hold_count(owner=owner) == 1
        assert not await make_client().lock("late-then-valid").try_lock()


async def test_a_nested_grant_after_the_hold_was_lost_is_not_a_new_hold(
    proxy: TcpProxy, make_client: Callable[..., aiolock.AioLock]
) -> None:
    """The hold runs out while a nested lock() of its owner is in flight: the nested grant
    belongs to the lost hold, so it raises LockLostError instead of counting as a fresh
    first hold (the server would count 2, and the loss's cleanup would then free it)."""
    async with aiolock.from_url(proxy.url, command_timeout=3) as client:
        lock = client.lock("lost-while-nested")
        owner = client.new_owner()
        await lock.lock(lease_time=1.0, owner=owner)
        lock.on_lost(lambda error: None, owner=owner)  # told at once, by a timer
        await asyncio.sleep(0.93)
        proxy.delay_replies(0.2)
        with pytest.raises(aiolock.LockLostError):
            await lock.try_lock(lease_time=1.0, owner=owner)
        proxy.pass_through()
        assert not lock.statistics(owner=owner).held
        other = make_client().lock("lost-while-nested")
        assert await other.try_lock(wait_time=2)


async def test_a_late_release_cannot_free_the_next_hold_when_fencing_is_refused(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """Without CLIENT KILL a release held by a middlebox cannot be fenced: the hold is purged
    and the owner takes the lock again; the old release, delivered late, expects the old
    count (2) and finds 1: it changes nothing (compare and decrement)."""
    rules = ("~*", "&*", "+@all", "-client", "+client|info", "+client|setname", "+client|id")
    with acl_user(redis_url, "no-kill-release", *rules) as url:
        async with (
            TcpProxy.for_url(url) as proxy,
            aiolock.from_url(proxy.url, command_timeout=0.5, cleanup_timeout=0.7) as client,
            aiolock.from_url(redis_url) as other,
        ):
            lock = client.lock("late-release-unfenced")
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
            await eventually(lambda: not_(redis_client.exists("late-release-unfenced")))
            with pytest.raises(aiolock.LockLostError):
                await lock.unlock(owner=owner)  # the outer count of the lost hold
            assert await lock.try_lock(wait_time=2, lease_time=20, owner=owner)
            await proxy.release_held_requests()  # the old release runs now
            assert await redis_client.hvals("late-release-unfenced") == [b"1"]
            assert not await other.lock("late-release-unfenced").try_lock()


async def test_aclose_from_another_event_loop_is_refused(redis_url: str) -> None:
    client = aiolock.from_url(redis_url)
    assert await client.lock("loop-bound").try_lock(lease_time=5)

    def elsewhere() -> None:
        asyncio.run(client.aclose())

    with pytest.raises(aiolock.WrongEventLoopError):
        await asyncio.to_thread(elsewhere)
    assert not client.closed
    await client.aclose()


async def test_a_wake_up_that_comes_as_the_wait_ends_is_passed_on(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    """A try_lock's wait_time runs out in the loop turn its wake-up arrives: it returns
    False and hands the wake-up to the next local waiter, which gets the free lock at once
    instead of sleeping until the old holder's lease would have run out."""
    holder, client = make_client(), make_client()
    await holder.lock("passed-on").lock(owner=holder.new_owner())  # a 30 s lease
    loop = asyncio.get_running_loop()
    started = loop.time()
    first = asyncio.create_task(client.lock("passed-on").try_lock(wait_time=1.0))
    await asyncio.sleep(0.1)
    second = asyncio.create_task(client.lock("passed-on").try_lock(wait_time=20, lease_time=5))
    await asyncio.sleep(started + 0.97 - loop.time())
    await redis_client.eval(  # the holder's last release, as another process does it
        "redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], '0')",
        2,
        "passed-on",
        "redisson_lock__channel:{passed-on}",
    )
    released = loop.time()
    time.sleep(0.06)  # noqa: ASYNC251 (the loop is busy as the message and the deadline arrive)
    await first
    assert await second
    # at once, not when the old holder's 30 s lease would have run out (room for a loaded
    # machine: the bound rules out 30 s, not 2)
    assert loop.time() - released < 10


async def test_a_grant_arriving_while_the_client_closes_is_given_back(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    client = aiolock.from_url(proxy.url, watchdog_timeout=3)
    await client.lock("other").lock(owner=client.new_owner())  # aclose() waits on its cleanup
    proxy.delay_replies(0.3)
    acquiring = asyncio.create_task(client.lock("closing-grant").lock())
    await asyncio.sleep(0.05)  # its acquire is in flight
    await client.aclose()
    proxy.pass_through()
    with pytest.raises(aiolock.ClientClosedError):
        await acquiring
    await eventually(lambda: not_(redis_client.exists("closing-grant")))


async def test_unlocking_as_often_as_locking_is_enough_after_a_loss(
    fresh_server: RedisServer,
) -> None:
    """The hold is lost while a release of one of its two counts is in flight (the server is
    stopped past the lease): that failed unlock used its count, so one more unlock reports
    the loss and the owner may take the lock again, not locked out for ever."""
    async with aiolock.from_url(
        fresh_server.url, watchdog_timeout=1.5, command_timeout=3, cleanup_timeout=3
    ) as client:
        lock = client.lock("stale-count")
        await lock.lock()
        await lock.lock()
        lock.on_lost(lambda error: None)
        await asyncio.sleep(0.2)
        fresh_server.pause()
        try:
            with pytest.raises(aiolock.AioLockError):
                await lock.unlock()
        finally:
            fresh_server.resume()
        with pytest.raises(aiolock.LockLostError):
            await lock.unlock()
        assert await lock.try_lock(wait_time=2)
        await lock.unlock()


async def test_a_caller_cancelled_while_the_link_is_write_blocked_leaves_no_lock(
    fresh_server: RedisServer,
) -> None:
    """The server stops reading and the socket fills (flow control): callers cancelled while
    their command waits for the socket sent nothing, so nothing is left held."""
    async with aiolock.from_url(fresh_server.url, command_timeout=10, cleanup_timeout=2) as client:
        assert not await client.lock("warm").is_locked()
        fresh_server.pause()
        big = "x" * 200_000
        fillers = [
            asyncio.create_task(client.lock(f"{i}:{big}").try_lock(wait_time=30, lease_time=60))
            for i in range(60)
        ]
        await asyncio.sleep(0.5)
        late = [asyncio.create_task(client.lock(f"late:{i}").lock()) for i in range(20)]
        await asyncio.sleep(0.3)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        fresh_server.resume()
        await asyncio.gather(*fillers, return_exceptions=True)
        with redis.Redis.from_url(fresh_server.url) as admin:
            await eventually(lambda: _true(not admin.keys("late:*")), within=5)


async def test_aclose_with_an_acquire_in_flight_gives_back_what_it_took(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    client = aiolock.from_url(proxy.url, cleanup_timeout=2)
    assert not await client.lock("warm").is_locked()
    proxy.delay_replies(0.3)
    acquiring = asyncio.create_task(client.lock("in-flight-at-close").lock())
    await asyncio.sleep(0.05)
    await client.aclose()
    with pytest.raises(aiolock.ClientClosedError):
        await acquiring
    assert not await redis_client.exists("in-flight-at-close")
    assert client.statistics().background_tasks == 0


async def test_clients_made_and_closed_in_one_long_task_leave_nothing(redis_url: str) -> None:
    """A long-lived task that makes, uses and closes clients: no client stays reachable from
    the task (its done callbacks) or from the process-wide renewal map."""
    import gc
    import weakref

    refs = []
    for _ in range(20):
        client = aiolock.from_url(redis_url)
        async with client.lock("churn"):
            pass
        await client.aclose()
        refs.append(weakref.ref(client))
        del client
    await asyncio.sleep(0.05)  # callbacks the loop already holds run
    gc.collect()
    assert [r for r in refs if r() is not None] == []
    assert not aiolock.leases.RENEWALS


async def test_replies_out_of_step_are_never_handed_out(
    proxy: TcpProxy, redis_url: str, make_client: Callable[..., aiolock.AioLock]
) -> None:
    """A middlebox loses one reply and keeps the connection: without a check every later
    reply would go to the caller before it (a busy try on X would get the grant meant for
    Y: two holders). The batch's marker comes back out of place, the link is dropped, and
    what each command did is settled on the server."""
    holder = make_client()
    await holder.lock("step-x").lock(lease_time=30, owner=holder.new_owner())
    async with aiolock.from_url(proxy.url, command_timeout=1) as client:
        assert not await client.lock("warm").is_locked()
        proxy.drop_next_reply(to="EVALSHA")
        ox, oy = client.new_owner(), client.new_owner()
        got_x, got_y = await asyncio.gather(
            client.lock("step-x").try_lock(lease_time=30, owner=ox),
            client.lock("step-y").try_lock(lease_time=30, owner=oy),
        )
        assert (got_x, got_y) == (False, True)
        assert not client.lock("step-x").statistics(owner=ox).held
        assert await client.lock("step-y").hold_count(owner=oy) == 1


async def test_on_lost_refuses_what_is_not_callable(client: aiolock.AioLock) -> None:
    """on_lost checks its callback first (TypeError, held or not), for every type with one
    (attack finding A2): a bad callback would otherwise fail only when a loss fires."""
    lock = client.lock("attack-on-lost")
    sem = client.permit_expirable_semaphore("attack-on-lost-sem")
    multi = aiolock.multi_lock(client.lock("attack-on-lost-m"))
    for bad in (None, 1, "f"):
        with pytest.raises(TypeError, match="callable"):
            lock.on_lost(bad)  # type: ignore[arg-type]  # not held: still a TypeError first
        with pytest.raises(TypeError, match="callable"):
            multi.on_lost(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="callable"):
            sem.on_lost("0" * 32, bad)  # type: ignore[arg-type]
    assert await sem.try_set_permits(1)
    async with lock, multi:
        permit = await sem.acquire()
        for bad in (None, 1, "f"):
            with pytest.raises(TypeError, match="callable"):
                lock.on_lost(bad)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="callable"):
                multi.on_lost(bad)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="callable"):
                sem.on_lost(permit, bad)  # type: ignore[arg-type]
        await sem.release(permit)


# -- no hold record for a waiter until it is granted (issue 18) ------------------------------


async def test_a_task_waiting_for_a_lock_has_no_hold_record_until_granted(
    client: aiolock.AioLock,
) -> None:
    """A task's first acquisition of a lock makes its hold record at the grant: while it
    waits, the client keeps only the holder's; granted, it holds as any other."""
    lock = client.lock("deferred-record")
    assert await lock.try_lock(lease_time=30)
    taken = asyncio.Event()
    done = asyncio.Event()

    async def wait_for_it() -> tuple[bool, int]:
        await lock.lock()
        stats = lock.statistics()
        taken.set()
        await done.wait()
        await lock.unlock()
        return stats.held, stats.hold_count

    waiter = asyncio.create_task(wait_for_it())
    async with asyncio.timeout(5):
        while client.statistics().tasks_waiting != 1:  # noqa: ASYNC110 (local state)
            await asyncio.sleep(0.01)
    holds = client.statistics().holds
    assert holds["held"] == 1 and sum(holds.values()) == 1  # the holder's only
    await lock.unlock()
    await asyncio.wait_for(taken.wait(), 5)
    assert client.statistics().holds["held"] == 1
    done.set()
    assert await waiter == (True, 1)
    assert not any(client.statistics().holds.values())


async def test_acquisitions_of_one_explicit_owner_from_two_tasks_still_take_turns(
    client: aiolock.AioLock,
) -> None:
    """An explicit owner may be used by several tasks at once: its acquisitions keep a
    record from the start, and take turns on it (the second waits for the first to be
    granted, then re-enters)."""
    lock = client.lock("shared-owner")
    assert await lock.try_lock(lease_time=30)
    owner = client.new_owner()
    first = asyncio.create_task(lock.lock(owner=owner))
    async with asyncio.timeout(5):
        while client.statistics().tasks_waiting != 1:  # noqa: ASYNC110 (local state)
            await asyncio.sleep(0.01)
    second = asyncio.create_task(lock.lock(owner=owner))
    await asyncio.sleep(0.05)
    assert client.statistics().holds["acquiring"] == 1
    assert client.statistics().tasks_waiting == 1  # the second waits for the turn
    await lock.unlock()
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert lock.statistics(owner=owner).hold_count == 2
    await lock.unlock(owner=owner)
    await lock.unlock(owner=owner)
    assert not await lock.is_locked()
