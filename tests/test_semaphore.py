"""The semaphore (Redisson's RSemaphore layout): permits, waiting and waking, bad input,
cancellation, lost replies (settled by request latches), a server out of memory."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
import redis.asyncio

import aiolock
from aiolock.pubsub import Entry
from aiolock.testing import TcpProxy
from tests.sync_helpers import equal, eventually, listening, message, quiet, script_calls, true


def requests_key(client: aiolock.AioLock, name: str) -> str:
    return f"{{{name}}}:aiolock_requests:{client.id}"


# -- layout ---------------------------------------------------------------------------------


async def test_redisson_layout(client: aiolock.AioLock, redis_client: redis.asyncio.Redis) -> None:
    """A string at the name holds the available permits in decimal; every release publishes
    the new count, in decimal, on redisson_sc:{name}."""
    sem = client.semaphore("sem")
    async with listening(redis_client, "redisson_sc:{sem}") as pubsub:
        assert await sem.try_set_permits(3)
        assert await redis_client.get("sem") == b"3"
        assert await message(pubsub) == b"3"
        await sem.acquire(2)
        assert await redis_client.get("sem") == b"1"
        await sem.release(2)
        assert await redis_client.get("sem") == b"3"
        assert await message(pubsub) == b"3"
        assert await sem.add_permits(2) == 5
        assert await message(pubsub) == b"5"
    # a name with a hash tag of its own keeps it: every key and channel in its slot
    assert await client.semaphore("{t}sem").try_set_permits(1)
    assert await redis_client.get("{t}sem") == b"1"
    assert client.semaphore("{t}sem")._channel_key == "redisson_sc:{t}sem"


async def test_permits_count(client: aiolock.AioLock) -> None:
    sem = client.semaphore("count")
    assert await sem.available_permits() == 0  # nothing set: no permits
    assert not await sem.try_acquire()
    assert await sem.try_set_permits(2)
    assert not await sem.try_set_permits(5)  # already set
    assert await sem.available_permits() == 2
    assert await sem.try_acquire()
    assert not await sem.try_acquire(2)
    assert await sem.try_acquire()
    assert not await sem.try_acquire()
    await sem.release()
    await sem.release()
    async with sem:
        assert await sem.available_permits() == 1
    assert await sem.drain_permits() == 2
    assert await sem.drain_permits() == 0
    assert await sem.available_permits() == 0
    assert await sem.add_permits(3) == 3
    assert await sem.add_permits(-1) == 2
    assert await client.semaphore("zero").try_set_permits(0)  # a semaphore may start closed


def unset_warnings(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "aiolock" and f"{name!r} has no permits" in r.getMessage()
    ]


async def test_a_semaphore_never_given_permits_says_so(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A semaphore without a count (never set, or deleted) has no permits, as in Redisson:
    try_acquire fails and acquire waits, which looked like a hang. A warning says why and
    what gives it permits, once until it has a count again. acquire still waits (another
    process may set the permits later) and is served once they are set."""
    sem = client.semaphore("never-set")
    caplog.set_level(logging.WARNING, logger="aiolock")
    assert not await sem.try_acquire()
    assert not await sem.try_acquire(2, wait_time=0.05)
    [warning] = unset_warnings(caplog, "never-set")
    assert "semaphore 'never-set' has no permits: it was never given any" in warning
    assert "try_set_permits(n), add_permits(n) or release()" in warning

    waiter = asyncio.create_task(sem.acquire())
    await asyncio.sleep(0.2)
    assert not waiter.done()
    assert len(unset_warnings(caplog, "never-set")) == 1
    assert await sem.try_set_permits(1)
    await asyncio.wait_for(waiter, 10)

    caplog.clear()
    assert not await sem.try_acquire()  # set, and none left: nothing to say
    assert unset_warnings(caplog, "never-set") == []
    await redis_client.delete("never-set")
    assert not await sem.try_acquire()  # deleted: said again
    assert len(unset_warnings(caplog, "never-set")) == 1


async def test_a_semaphore_set_to_zero_permits_is_not_reported(
    client: aiolock.AioLock, caplog: pytest.LogCaptureFixture
) -> None:
    sem = client.semaphore("zero")
    caplog.set_level(logging.WARNING, logger="aiolock")
    assert await sem.try_set_permits(0)
    assert not await sem.try_acquire(wait_time=0.05)
    assert unset_warnings(caplog, "zero") == []


async def test_release_may_raise_the_count_above_what_was_set(client: aiolock.AioLock) -> None:
    """As Redisson's (and Java's) Semaphore: permits are not tracked per holder."""
    sem = client.semaphore("unbounded")
    assert await sem.try_set_permits(1)
    await sem.release(3)
    assert await sem.available_permits() == 4


# -- bad input: refused before any Redis call (the client points where nothing listens) -----


@pytest.fixture
async def offline() -> AsyncIterator[aiolock.AioLock]:
    async with aiolock.from_url("redis://127.0.0.1:1/0") as client:
        yield client


BAD_PERMITS: list[Any] = [0, -1, 2**31, 1.0, "1", True, None]


@pytest.mark.parametrize("permits", BAD_PERMITS)
async def test_bad_permits(offline: aiolock.AioLock, permits: Any) -> None:
    sem = offline.semaphore("bad")
    for call in (sem.acquire, sem.try_acquire, sem.release):
        with pytest.raises((TypeError, ValueError)):
            await call(permits)
    if permits != -1:  # removing one permit is fine
        with pytest.raises((TypeError, ValueError)):
            await sem.add_permits(permits)
    if permits != 0:  # a semaphore may be set to no permits
        with pytest.raises((TypeError, ValueError)):
            await sem.try_set_permits(permits)
    with pytest.raises(ValueError):
        await sem.add_permits(-(2**31))


@pytest.mark.parametrize("wait_time", [-1, float("nan"), float("inf"), "1", None])
async def test_bad_wait_time(offline: aiolock.AioLock, wait_time: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        await offline.semaphore("bad").try_acquire(1, wait_time)


async def test_removing_more_permits_than_available_changes_nothing(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    sem = client.semaphore("remove")
    assert await sem.try_set_permits(2)
    with pytest.raises(aiolock.LockStateError) as caught:
        await sem.add_permits(-3)
    assert isinstance(caught.value, ValueError)
    assert await redis_client.get("remove") == b"2"


async def test_with_instead_of_async_with_says_so(offline: aiolock.AioLock) -> None:
    with pytest.raises(TypeError, match="async with"):
        with offline.semaphore("x"):
            pass


# -- waiting and waking ---------------------------------------------------------------------


async def test_try_acquire_waits_at_most_wait_time(client: aiolock.AioLock) -> None:
    sem = client.semaphore("busy")
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert not await sem.try_acquire(1, wait_time=0.2)
    # (uvloop's clock counts whole ms: started + 0.2 reached may read as 0.19999... later)
    assert 0.2 - 1e-6 <= loop.time() - started < 0.2 + client.config.command_timeout
    assert client.statistics().subscriptions == 0


class Takers:
    """Tasks that each take ``permits`` of a semaphore and hold them until told to stop."""

    def __init__(self, sem: aiolock.Semaphore) -> None:
        self.sem = sem
        self.took: list[int] = []
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, permits: int) -> None:
        index = len(self.tasks)
        self.tasks.append(asyncio.create_task(self._run(index, permits)))

    async def _run(self, index: int, permits: int) -> None:
        await self.sem.acquire(permits)
        self.took.append(index)
        await self.stop.wait()
        await self.sem.release(permits)


async def test_a_release_wakes_as_many_waiters_as_it_frees_permits(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    """No herd: a release of 2 permits wakes 2 of the 6 local waiters, each of which takes
    one with one script call; the other 4 stay parked."""
    sem = client.semaphore("herd")
    assert await sem.try_set_permits(0)
    takers = Takers(sem)
    for _ in range(6):
        takers.start(1)
    await eventually(lambda: true(sem.statistics().tasks_waiting == 6))
    before = await script_calls(redis_client)
    await sem.release(2)
    await eventually(lambda: true(len(takers.took) == 2))
    await asyncio.sleep(0.2)
    assert takers.took == [0, 1]  # first come, first served among local waiters
    assert sem.statistics().tasks_waiting == 4
    assert await script_calls(redis_client) - before == 3  # the release + 2 acquires
    await sem.release(4)
    await eventually(lambda: true(len(takers.took) == 6))
    takers.stop.set()
    await asyncio.gather(*takers.tasks)
    assert await sem.available_permits() == 6
    assert client.statistics().subscriptions == 0


async def test_a_large_request_is_passed_over_by_smaller_ones(client: aiolock.AioLock) -> None:
    """The starvation docs/synchronizers.md states: a waiter for 3 permits, first in line, is passed
    over by later waiters for 1 while fewer than 3 are free, so a steady stream of small
    requests can keep it waiting; it is served as soon as 3 are free at once."""
    sem = client.semaphore("big-and-small")
    assert await sem.try_set_permits(0)
    takers = Takers(sem)
    takers.start(3)
    await eventually(lambda: true(sem.statistics().tasks_waiting == 1))
    takers.start(1)
    takers.start(1)
    await eventually(lambda: true(sem.statistics().tasks_waiting == 3))
    await sem.release(1)
    await eventually(lambda: true(takers.took == [1]))
    await sem.release(1)
    await eventually(lambda: true(takers.took == [1, 2]))
    assert sem.statistics().tasks_waiting == 1  # the big one, still first in line
    await sem.release(3)
    await eventually(lambda: true(takers.took == [1, 2, 0]))
    takers.stop.set()
    await asyncio.gather(*takers.tasks)
    assert await sem.available_permits() == 5


# -- the wait entry's weighted wake-ups (pubsub.Entry.park / pass_on) ------------------------


def _entry(borrowers: int = 4) -> Entry:
    entry = Entry(b"redisson_sc:{w}", "w", lambda data: int(data))
    entry.refs = borrowers
    return entry


def _woken(futures: Sequence[asyncio.Future[bool]]) -> list[bool]:
    return [f.done() and f.result() for f in futures]


async def test_waiters_of_weight_one_are_woken_as_a_lock_s() -> None:
    """Locks park with weight 1: no weights are kept at all, and a wake-up of n wakes the
    first n parked, as before weights existed."""
    entry = _entry()
    until = asyncio.get_running_loop().time() + 10
    parked = [entry.park(until) for _ in range(3)]
    assert entry._weights is None
    entry.wake(2)
    assert _woken(parked) == [True, True, False]
    entry.pass_on(parked[0])  # a woken waiter leaving: its wake-up goes to the next
    assert _woken(parked) == [True, True, True]
    assert entry._weights is None
    entry.stop()  # (its last borrower leaves: the entry's timer goes)


async def test_heavier_waiters_are_passed_over_and_keep_their_place() -> None:
    entry = _entry()
    until = asyncio.get_running_loop().time() + 10
    big = entry.park(until, 3)
    small1 = entry.park(until)
    small2 = entry.park(until)
    entry.wake(2)  # 2 permits: the waiter for 3 does not fit, both for 1 do
    assert _woken([big, small1, small2]) == [False, True, True]
    later = entry.park(until)
    entry.wake(3)  # the big one is still first in line
    assert _woken([big, later]) == [True, False]
    assert not entry._weights  # a woken waiter's weight is forgotten


async def test_a_woken_heavy_waiter_that_leaves_passes_its_whole_weight_on() -> None:
    """Woken for 2 permits and cancelled (or out of time) before using them: the next
    waiters get what it would have taken, 2 waiters for 1 here."""
    entry = _entry()
    until = asyncio.get_running_loop().time() + 10
    heavy = entry.park(until, 2)
    first = entry.park(until)
    second = entry.park(until)
    entry.wake(2)
    assert _woken([heavy, first, second]) == [True, False, False]
    entry.pass_on(heavy, 2)
    assert _woken([first, second]) == [True, True]


async def test_a_heavy_waiter_that_leaves_unwoken_leaves_no_weight_behind() -> None:
    entry = _entry()
    loop = asyncio.get_running_loop()
    heavy = entry.park(loop.time() + 10, 5)
    heavy.cancel()
    entry.pass_on(heavy, 5)  # cancelled before any wake-up: nothing to pass on
    assert not entry._weights
    timed_out = entry.park(loop.time(), 5)
    await asyncio.sleep(0.01)
    assert timed_out.done() and not timed_out.result()
    entry.wake(1)  # the next wake-up drops what timed out
    assert not entry._weights


async def test_waiters_in_two_clients_share_the_permits(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock]
) -> None:
    permits = 3
    assert await client.semaphore("shared").try_set_permits(permits)
    inside = most = 0

    async def work(sem: aiolock.Semaphore) -> None:
        nonlocal inside, most
        for _ in range(10):
            async with sem:
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0.002)
                inside -= 1

    other = make_client()
    await asyncio.gather(*(work(c.semaphore("shared")) for c in (client, other) for _ in range(5)))
    assert most == permits
    assert await client.semaphore("shared").available_permits() == permits


async def test_waiters_recover_after_the_pubsub_connection_is_killed(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    """The release message is lost with the pub/sub connection: the waiter re-checks when it
    is reconnected (a plain semaphore's waiter has no lease to bound its wait)."""
    sem = client.semaphore("killed")
    assert await sem.try_set_permits(0)
    waiter = asyncio.create_task(sem.try_acquire(1, wait_time=10))
    await eventually(lambda: true(sem.statistics().tasks_waiting == 1))
    await redis_client.client_kill_filter(_type="pubsub")
    await redis_client.incr("killed")  # a permit appears without any message
    assert await waiter


# -- cancellation ---------------------------------------------------------------------------


async def test_cancelled_waiter_takes_nothing(client: aiolock.AioLock) -> None:
    sem = client.semaphore("cancel-wait")
    assert await sem.try_set_permits(0)
    waiter = asyncio.create_task(sem.acquire(2))
    await eventually(lambda: true(sem.statistics().tasks_waiting == 1))
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await sem.release(2)
    await asyncio.sleep(0.05)
    assert await sem.available_permits() == 2
    assert client.statistics().subscriptions == 0


async def test_cancel_after_release(client: aiolock.AioLock) -> None:
    """The race anyio calls test_cancel_after_release: the waiter is granted the permits and
    cancelled before it resumes. Either it returns with them, or it is cancelled and they
    are back; never permits taken by nobody."""
    sem = client.semaphore("race")
    assert await sem.try_set_permits(0)
    for delay in [0, 0, 0.0001, 0.0002, 0.0005, 0.001, 0.002] * 4:
        waiter = asyncio.create_task(sem.acquire(2))
        await asyncio.sleep(0.002)  # subscribed and waiting
        await sem.release(2)
        await asyncio.sleep(delay)
        waiter.cancel()
        try:
            await waiter
        except asyncio.CancelledError:
            await quiet(client)
            assert await sem.available_permits() == 2, f"permits lost after cancel at {delay}"
        else:
            assert await sem.available_permits() == 0
            await sem.release(2)
        assert await sem.drain_permits() == 2
    assert client.statistics().subscriptions == 0


async def test_aclose_with_an_acquire_in_flight_gives_the_permits_back(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """As for a lock: a grant whose reply arrives while the client closes is no grant (the
    caller could not release it on a closed client): its permits go back first."""
    client = aiolock.from_url(proxy.url, cleanup_timeout=2)
    sem = client.semaphore("in-flight-at-close")
    assert await sem.try_set_permits(2)
    proxy.delay_replies(0.3)
    acquiring = asyncio.create_task(sem.acquire(2))
    await asyncio.sleep(0.05)
    await client.aclose()
    with pytest.raises(aiolock.ClientClosedError):
        await acquiring
    assert await redis_client.get("in-flight-at-close") == b"2"
    assert client.statistics().background_tasks == 0


async def test_random_cancellations_leave_the_count_exact(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """1,000 tasks, each cancelled at a random moment of acquiring, holding or releasing
    (half of them through a proxy that delays replies, so that some are cancelled with a
    script in flight): afterwards the semaphore has exactly its permits again."""
    permits = 4
    rng = random.Random(7)
    async with (
        TcpProxy.for_url(redis_url) as proxy,
        aiolock.from_url(redis_url) as direct,
        aiolock.from_url(proxy.url) as delayed,
    ):
        proxy.delay_replies(0.002)
        assert await direct.semaphore("cancelled").try_set_permits(permits)

        async def user(client: aiolock.AioLock, index: int) -> None:
            sem = client.semaphore("cancelled")
            if index % 3 == 0:
                async with sem:
                    await asyncio.sleep(0.001)
            elif index % 3 == 1:
                if await sem.try_acquire(2, wait_time=0.05):
                    await sem.release(2)
            else:
                await sem.acquire(1)
                await sem.release(1)

        cancelled = 0
        for wave in range(20):
            tasks = [
                asyncio.create_task(user(direct if i % 2 else delayed, wave * 50 + i))
                for i in range(50)
            ]
            for task in tasks:
                asyncio.get_running_loop().call_later(rng.uniform(0, 0.006), task.cancel)
            results = await asyncio.gather(*tasks, return_exceptions=True)
            cancelled += sum(isinstance(r, asyncio.CancelledError) for r in results)
            errors = [r for r in results if isinstance(r, BaseException)]
            assert all(isinstance(r, asyncio.CancelledError) for r in errors), errors
        assert cancelled > 500
        await quiet(direct)
        await quiet(delayed)
        assert await redis_client.get("cancelled") == str(permits).encode()
        assert direct.statistics().subscriptions == delayed.statistics().subscriptions == 0


# -- lost replies ---------------------------------------------------------------------------


@pytest.fixture
async def via_proxy(proxy: TcpProxy) -> AsyncIterator[aiolock.AioLock]:
    async with aiolock.from_url(proxy.url) as client:
        await client.semaphore("warm-up").available_permits()  # connect before the faults
        yield client


async def test_a_lost_release_reply_never_adds_twice(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """The release ran, its reply was lost with the connection: the request latch says it
    ran, so it is not sent again and the permits are added once."""
    sem = via_proxy.semaphore("lost-release")
    assert await sem.try_set_permits(1)
    proxy.blackhole_replies()
    releasing = asyncio.create_task(sem.release(2))
    await eventually(lambda: equal(redis_client.get("lost-release"), b"3"))
    proxy.pass_through()
    proxy.reset_connections()
    await releasing
    assert await redis_client.get("lost-release") == b"3"
    assert via_proxy.statistics().fences >= 1


async def test_a_lost_acquire_reply_is_settled(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """The acquire ran, its reply was lost: its latch says it took the permits (they are
    not taken a second time)."""
    sem = via_proxy.semaphore("lost-acquire")
    assert await sem.try_set_permits(3)
    proxy.blackhole_replies()
    acquiring = asyncio.create_task(sem.try_acquire(2))
    await eventually(lambda: equal(redis_client.get("lost-acquire"), b"1"))
    proxy.pass_through()
    proxy.reset_connections()
    assert await acquiring
    assert await redis_client.get("lost-acquire") == b"1"


async def test_a_lost_request_is_sent_again(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """The release never reached the server: no latch, so it is sent again, once."""
    sem = via_proxy.semaphore("lost-request")
    assert await sem.try_set_permits(0)
    proxy.blackhole_requests()
    releasing = asyncio.create_task(sem.release())
    await asyncio.sleep(0.1)
    assert await redis_client.get("lost-request") == b"0"
    proxy.pass_through()
    proxy.reset_connections()
    await releasing
    assert await redis_client.get("lost-request") == b"1"


async def test_a_cancelled_release_still_releases(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    sem = via_proxy.semaphore("cancelled-release")
    assert await sem.try_set_permits(0)
    proxy.delay_requests(0.3)
    releasing = asyncio.create_task(sem.release())
    await asyncio.sleep(0.05)
    releasing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await releasing
    assert await redis_client.get("cancelled-release") == b"1"


async def test_request_latches_stay_few(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    """Each script forgets the latches of the client's earlier requests whose replies
    arrived: the hash holds the last few requests, not every request ever made."""
    sem = client.semaphore("latches")
    assert await sem.try_set_permits(2)
    for _ in range(200):
        async with sem:
            pass
    key = requests_key(client, "latches")
    assert await redis_client.hlen(key) <= 2
    assert 0 < await redis_client.pttl(key) <= 60_000


async def test_permits_can_be_given_back_on_a_server_out_of_memory() -> None:
    """Under OOM (noeviction) taking permits fails with an aiolock error, but releasing
    them goes through (the release script's first write needs no memory)."""
    from aiolock.testing import RedisServer, external_redis_url

    if external_redis_url() is not None:
        pytest.skip("needs its own redis-server")
    with RedisServer(["--maxmemory-policy", "noeviction"]) as server:
        async with aiolock.from_url(server.url) as client:
            sem = client.semaphore("oom")
            assert await sem.try_set_permits(3)
            await sem.acquire()
            await sem.acquire()
            await client.redis.config_set("maxmemory", 1)
            try:
                with pytest.raises(aiolock.RedisOperationError, match="OOM"):
                    await sem.try_acquire()  # (with ids to forget: still refused)
                with pytest.raises(aiolock.RedisOperationError, match="OOM"):
                    await client.semaphore("other").try_set_permits(1)
                await sem.release()
                await sem.release()
                assert await sem.available_permits() == 3
            finally:
                await client.redis.config_set("maxmemory", 0)
