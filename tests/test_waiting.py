"""Waiting without polling: the shared pub/sub fan-out, lock(), try_lock(wait_time), alock()."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio

import aiolock
from aiolock.default import default_client
from aiolock.pubsub import Entry
from aiolock.testing import TcpProxy
from tests.conftest import run_worker


async def eventually(check: Callable[[], Awaitable[object]], within: float = 5) -> None:
    """Poll state on the server (no event to wait on there) until ``check`` is true."""
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def script_calls(redis_client: redis.asyncio.Redis) -> int:
    stats = await redis_client.info("commandstats")
    return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("evalsha", "eval"))


async def numsub(redis_client: redis.asyncio.Redis, *channels: str) -> list[int]:
    return [count for _, count in await redis_client.pubsub_numsub(*channels)]


def channel(lock: aiolock.Lock) -> str:
    return f"redisson_lock__channel:{{{lock.name}}}"


class Waiters:
    """Tasks that take a lock, report it, and hold it until told to let go."""

    def __init__(self, lock: aiolock.Lock) -> None:
        self.lock = lock
        self.acquired: list[int] = []
        self.let_go: dict[int, asyncio.Event] = {}
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, count: int) -> None:
        for _ in range(count):
            index = len(self.tasks)
            self.let_go[index] = asyncio.Event()
            self.tasks.append(asyncio.create_task(self._run(index)))

    async def _run(self, index: int) -> None:
        async with self.lock:
            self.acquired.append(index)
            await self.let_go[index].wait()

    async def drain(self) -> None:
        """Let each holder go in turn once it has the lock; never two at once."""
        for turn in range(len(self.tasks)):
            await eventually(lambda: _true(len(self.acquired) > turn))  # noqa: B023 (awaited here)
            assert len(self.acquired) == turn + 1
            self.let_go[self.acquired[turn]].set()
        await asyncio.gather(*self.tasks)
        assert sorted(self.acquired) == list(range(len(self.tasks)))


async def test_one_release_wakes_one_local_waiter(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    lock = client.lock("one-by-one")
    assert await lock.try_lock(lease_time=30)
    waiters = Waiters(lock)
    waiters.start(5)
    await eventually(lambda: _true(lock.statistics().tasks_waiting == 5))
    before = await script_calls(redis_client)
    await lock.unlock()
    await eventually(lambda: _true(len(waiters.acquired) == 1))
    await asyncio.sleep(0.2)
    assert len(waiters.acquired) == 1
    # the release, plus one attempt by the one waiter woken: no herd of retries
    assert await script_calls(redis_client) - before <= 3
    await waiters.drain()


async def test_waiters_do_not_poll(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    """10 waiters for 2 s make no attempt while the lock stays held, and a few in all."""
    lock = client.lock("no-polling")
    assert await lock.try_lock(lease_time=30)
    await redis_client.config_resetstat()
    waiters = Waiters(lock)
    waiters.start(10)
    # all 10 parked (a loaded machine may take longer than a fixed 0.3 s to get there)
    await eventually(lambda: _true(lock.statistics().tasks_waiting == 10))
    settled = await script_calls(redis_client)
    assert settled <= 10 * 2  # a try before and after subscribing, at most
    await asyncio.sleep(2)
    assert await script_calls(redis_client) == settled  # nothing while the lock is held
    await lock.unlock()
    await waiters.drain()
    per_waiter = await script_calls(redis_client) / 10
    assert per_waiter <= 5, per_waiter  # attempts + its release, not one per poll interval


async def test_100_waiters_on_20_locks_share_one_pubsub_connection(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    locks = [client.lock(f"many:{i}") for i in range(20)]
    for lock in locks:
        assert await lock.try_lock(lease_time=30)
    groups = [Waiters(lock) for lock in locks]
    for group in groups:
        group.start(5)
    channels = [channel(lock) for lock in locks]
    await eventually(lambda: _equal(numsub(redis_client, *channels), [1] * 20))
    pubsub_clients = await redis_client.client_list(_type="pubsub")
    assert len(pubsub_clients) == 1
    assert client.statistics().pubsub_connections_opened == 1

    for lock in locks:
        await lock.unlock()
    for group in groups:
        await group.drain()
    await eventually(lambda: _equal(numsub(redis_client, *channels), [0] * 20))
    assert client.statistics().subscriptions == 0


async def test_cancelled_waiters_leave_no_subscription(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    locks = [client.lock(f"cancelled:{i}") for i in range(20)]
    for lock in locks:
        assert await lock.try_lock(lease_time=30)
    tasks = [asyncio.create_task(lock.lock()) for lock in locks for _ in range(5)]
    channels = [channel(lock) for lock in locks]
    await eventually(lambda: _equal(numsub(redis_client, *channels), [1] * 20))
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    assert client.statistics().subscriptions == 0
    await eventually(lambda: _equal(numsub(redis_client, *channels), [0] * 20))
    assert [await lock.hold_count() for lock in locks] == [1] * 20  # ours, untouched


async def test_waiters_recover_after_the_pubsub_connection_is_killed(
    client: aiolock.AioLock,
    make_client: Callable[..., aiolock.AioLock],
    redis_client: redis.asyncio.Redis,
) -> None:
    """Another client's unlock message is published while our pub/sub connection is down (so
    it is lost): the waiters are woken on reconnect, not 30 s later by the holder's TTL."""
    holder = make_client().lock("killed")
    assert await holder.try_lock(lease_time=30)
    lock = client.lock("killed")
    waiters = Waiters(lock)
    waiters.start(3)
    await eventually(lambda: _equal(numsub(redis_client, channel(lock)), [1]))
    await redis_client.client_kill_filter(_type="pubsub")
    await holder.unlock()
    await waiters.drain()
    assert client.statistics().pubsub_connections_opened >= 2


async def test_three_processes_hammer_one_lock(redis_url: str) -> None:
    results = await asyncio.gather(
        *(run_worker("hammer", redis_url, "hammered", "20", "10") for _ in range(3))
    )
    assert results == [["0", "200"]] * 3  # no overlap seen by the guard, every round done


async def test_try_lock_gives_up_after_wait_time(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    lock = client.lock("give-up")
    assert await lock.try_lock(lease_time=30)

    async def other() -> tuple[bool, float]:
        # the loop's clock, which the wait is measured by: uvloop's counts whole ms, so by
        # time.monotonic() a wait that reached started + 0.3 on it may read 0.299...
        loop = asyncio.get_running_loop()
        started = loop.time()
        return await lock.try_lock(wait_time=0.3), loop.time() - started

    taken, waited = await asyncio.create_task(other())
    assert not taken
    assert waited >= 0.3 - 1e-6
    await eventually(lambda: _equal(numsub(redis_client, channel(lock)), [0]))


async def test_a_wait_is_bounded_by_the_holders_lease(client: aiolock.AioLock) -> None:
    """No unlock message ever comes (the holder's lease expires): the waiter retries when
    the holder's TTL runs out."""
    lock = client.lock("expiring")
    assert await lock.try_lock(lease_time=0.3)
    assert await asyncio.create_task(lock.try_lock(wait_time=5))


async def test_force_unlock_wakes_waiters(client: aiolock.AioLock) -> None:
    lock = client.lock("forced-wake")
    assert await lock.try_lock(lease_time=30)
    waiter = asyncio.create_task(lock.try_lock(wait_time=10))
    await asyncio.sleep(0.1)
    assert await lock.force_unlock()
    assert await waiter


async def test_aclose_wakes_waiters_with_an_error(redis_url: str) -> None:
    holder = aiolock.from_url(redis_url)
    waiting = aiolock.from_url(redis_url)
    try:
        assert await holder.lock("closing").try_lock(lease_time=30)
        waiter = asyncio.create_task(waiting.lock("closing").lock())
        await asyncio.sleep(0.1)
        await waiting.aclose()
        with pytest.raises(aiolock.ClientClosedError):
            await waiter
    finally:
        await holder.aclose()
        await waiting.aclose()


async def test_a_waiter_closed_while_subscribing_raises_client_closed(
    redis_url: str, proxy: TcpProxy
) -> None:
    """aclose() tells a waiter whose subscription is not confirmed yet ClientClosedError, as
    every other waiter (attack finding A7: it was RedisUnavailableError)."""
    holder = aiolock.from_url(redis_url)
    waiting = aiolock.from_url(proxy.url)
    try:
        assert await holder.lock("closing-sub").try_lock(lease_time=30)
        waiter = asyncio.create_task(waiting.lock("closing-sub").lock())
        async with asyncio.timeout(5):
            while proxy.connections_accepted < 2:  # noqa: ASYNC110  # the pub/sub link opens
                await asyncio.sleep(0.001)
        proxy.hold_requests()  # its subscription is never confirmed
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await waiting.aclose()
        with pytest.raises(aiolock.ClientClosedError):
            await waiter
    finally:
        proxy.pass_through()
        await holder.aclose()
        await waiting.aclose()


# -- the process default client ------------------------------------------------------------


@pytest.fixture
async def default(redis_url: str) -> AsyncIterator[str]:
    aiolock.configure(redis_url)
    yield redis_url
    await default_client().aclose()
    aiolock.configure(aiolock.default.DEFAULT_URL)


async def test_alock(default: str) -> None:
    async with aiolock.alock("default-lock") as lock:
        assert await lock.is_held_by_current_task()
    assert not await lock.is_locked()


async def test_alock_times_out(default: str, client: aiolock.AioLock) -> None:
    assert await client.lock("default-busy").try_lock(lease_time=30)
    with pytest.raises(aiolock.LockTimeout) as info:
        async with aiolock.alock("default-busy", wait_time=0.1):
            pytest.fail("must not enter")
    assert isinstance(info.value, TimeoutError)
    assert info.value.name == "default-busy"


async def test_default_url_from_environment(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    aiolock.configure(aiolock.default.DEFAULT_URL)
    monkeypatch.setattr(aiolock.default, "_configured", None)
    monkeypatch.setenv("AIOLOCK_URL", redis_url)
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    try:
        async with aiolock.alock("from-env", lease_time=5):
            pass
    finally:
        await default_client().aclose()


async def test_aclose_default_closes_the_default_client(default: str) -> None:
    async with aiolock.alock("closing") as lock:
        made = default_client()
        assert await lock.is_held_by_current_task()
    await aiolock.aclose_default()
    assert made.closed
    await aiolock.aclose_default()  # twice: nothing to close
    async with aiolock.alock("closing"):  # the next use makes a new client
        assert default_client() is not made


async def test_aclose_default_leaves_a_configured_client_open(client: aiolock.AioLock) -> None:
    aiolock.configure(client)
    try:
        async with aiolock.alock("theirs"):
            pass
        await aiolock.aclose_default()
        assert not client.closed  # the caller's, closed by the caller
    finally:
        aiolock.configure(aiolock.default.DEFAULT_URL)


QUICKSTART = """
import asyncio, sys
import aiolock

async def main() -> None:
    aiolock.configure(sys.argv[1])
    async with aiolock.alock("seckill", wait_time=2):
        print("held")
    CLOSE

asyncio.run(main())
"""


@pytest.mark.parametrize("close", [True, False], ids=["aclose_default", "left-open"])
async def test_quickstart_leaves_no_resource_warning_in_dev_mode(
    redis_url: str, close: bool
) -> None:
    """Issue 20, item 8: the default client can be closed, and then ``python -X dev`` reports
    nothing; left open, asyncio reports its connection (the check is able to see it)."""
    script = QUICKSTART.replace("CLOSE", "await aiolock.aclose_default()" if close else "pass")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-X", "dev", "-c", script, redis_url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip() == "held"
    if close:
        assert err.decode() == ""
    else:
        assert "ResourceWarning: unclosed" in err.decode()


async def test_configure_rejects_bad_input() -> None:
    with pytest.raises(TypeError):
        aiolock.configure(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        aiolock.configure("redis://localhost", watchdog_timeout=-1)
    with pytest.raises(ValueError):
        async with aiolock.alock(""):
            pass


async def _true(value: bool) -> bool:
    return value


async def _equal(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


async def test_a_silent_pubsub_connection_is_replaced(
    proxy: TcpProxy, make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    """The pub/sub connection goes silent without being closed (replies blackholed), so the
    unlock message never arrives: the unanswered PING gets the connection dropped, which
    wakes the waiter to re-check, and it acquires long before the holder's 30 s lease would
    have bounded its wait."""
    holder = make_client().lock("silent")
    assert await holder.try_lock(lease_time=30)
    async with aiolock.from_url(proxy.url, ping_interval=0.2, command_timeout=0.5) as client:
        waiter = asyncio.create_task(client.lock("silent").try_lock(wait_time=20))
        await eventually(
            lambda: _equal(numsub(redis_client, "redisson_lock__channel:{silent}"), [1])
        )
        proxy.blackhole_replies()
        await holder.unlock()
        await asyncio.sleep(1)
        assert not waiter.done()
        proxy.pass_through()
        async with asyncio.timeout(5):
            assert await waiter


async def test_aclose_right_after_a_waiter_acquired(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    """Regression: the waiter's entry was just released (an UNSUBSCRIBE on its way) when the
    client closed; a pub/sub writer that survived its cancellation made aclose() hang."""
    for _ in range(5):
        holder, waiting = make_client(), make_client()
        lock = holder.lock("closing-race")
        await lock.lock(lease_time=5)
        task = asyncio.create_task(waiting.lock("closing-race").lock(lease_time=5))
        await asyncio.sleep(0.05)
        await lock.unlock()
        await task
        # waited on, not cancelled: a hung aclose() could swallow a timeout's cancellation
        closing = asyncio.create_task(waiting.aclose())
        done, _ = await asyncio.wait({closing}, timeout=3)
        assert done, "aclose() hung"
        await closing
        await holder.lock("closing-race").force_unlock()


async def test_client_alock(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock]
) -> None:
    async with client.alock("client-alock", wait_time=1) as lock:
        assert await lock.is_held_by_current_task()
        with pytest.raises(aiolock.LockTimeout):
            async with make_client().alock("client-alock", wait_time=0.1):
                pytest.fail("must not enter")
    assert not await lock.is_locked()
    with pytest.raises(ValueError):
        async with client.alock("client-alock", wait_time=-1):
            pass


async def test_from_url_passes_redis_options(redis_url: str) -> None:
    async with aiolock.from_url(redis_url, redis_options={"max_connections": 7}) as client:
        assert isinstance(client.redis, redis.asyncio.Redis)
        assert client.redis.connection_pool.max_connections == 7
        async with client.lock("options"):
            pass


# -- one timer per wait entry (pubsub.Entry), not one per waiter -----------------------------


def _wait_entry() -> Entry:
    entry = Entry(b"redisson_lock__channel:{t}", "t", lambda data: 1)
    entry.refs = 1
    return entry


async def test_an_entry_keeps_one_timer_and_each_waiter_times_out_at_its_own_deadline() -> None:
    """Waiters parked with different deadlines (in any order) share the entry's one timer,
    always set for the earliest; each gets False at its own deadline, not before."""
    loop = asyncio.get_running_loop()
    entry = _wait_entry()
    t0 = loop.time()
    late = entry.park(t0 + 0.3)
    early = entry.park(t0 + 0.05)
    middle = entry.park(t0 + 0.15)
    assert entry._timer is not None and entry._timer_at == early.until
    await asyncio.wait((early,))
    assert loop.time() >= early.until - 0.002  # (uvloop's timers: millisecond resolution)
    assert not early.result() and not middle.done() and not late.done()
    assert entry._timer_at == middle.until
    await asyncio.wait((middle,))
    assert not middle.result() and not late.done()
    await asyncio.wait((late,))
    assert not late.result()
    assert entry._timer is None and not entry._deadlines


async def test_a_woken_waiter_does_not_keep_the_entry_s_timer_for_its_deadline() -> None:
    """A waiter woken before its deadline leaves nothing due: the timer set for it ends
    nobody, and is set again for the next waiter still parked; waiters that left are dropped
    from the deadlines as more park, and the last borrower's leaving stops the timer."""
    loop = asyncio.get_running_loop()
    entry = _wait_entry()
    t0 = loop.time()
    first = entry.park(t0 + 0.05)
    second = entry.park(t0 + 0.1)
    entry.wake(1)
    assert first.result() is True
    await asyncio.wait((second,))
    assert second.result() is False and loop.time() >= second.until - 0.002
    for _ in range(1000):  # parked and woken at once, deadlines far away
        entry.park(t0 + 60)
        entry.wake(1)
    assert len(entry._deadlines) <= 130  # compacted (the heap does not keep 1000)
    entry.stop()
    assert entry._timer is None and not entry._deadlines
