"""Leases kept alive by the watchdog, losses reported at once, and the fenced lock."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable

import pytest
import redis.asyncio

import aiolock
from aiolock.testing import TcpProxy
from tests.conftest import Worker


async def test_hold_survives_long_work_and_ttl_stays_high(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    """watchdog_timeout=1 s, 5 s of work: the TTL never falls far below 2/3 of the lease."""
    client = make_client(watchdog_timeout=1)
    lock = client.lock("long-work")
    lowest = 1000
    async with lock:
        for _ in range(100):
            await asyncio.sleep(0.05)
            lowest = min(lowest, await redis_client.pttl("long-work"))
        assert await lock.hold_count() == 1
    assert lowest > 550, lowest  # renewed every 333 ms: ~667 ms left at worst, less jitter
    assert not await redis_client.exists("long-work")
    assert client.statistics().renewals == 0


async def test_renewal_entries_follow_the_holds(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    client = make_client(watchdog_timeout=3)
    lock = client.lock("entries")

    def renewals() -> int:
        return client.statistics().renewals

    assert await lock.try_lock(lease_time=5)
    assert renewals() == 0  # an explicit lease is never renewed
    assert not lock.statistics().renewed
    await lock.unlock()
    assert await lock.try_lock()
    assert await lock.try_lock()
    assert renewals() == 1  # reentrant holds share one entry
    assert lock.statistics().renewed
    await lock.unlock()
    assert renewals() == 1
    await lock.unlock()
    assert renewals() == 0
    assert await lock.try_lock()
    assert await lock.force_unlock()
    assert renewals() == 0
    assert await lock.try_lock()
    await client.aclose()
    assert renewals() == 0
    assert client.id not in aiolock.leases.RENEWALS  # the process-wide map is left too


async def test_a_cancelled_acquire_leaves_no_renewal(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """Redisson's open bug: an interrupted acquire whose renewal was registered kept the key
    alive forever. Here the undo drops the entry with the hold."""
    async with aiolock.from_url(proxy.url, watchdog_timeout=1) as client:
        assert not await client.lock("warm-up").is_locked()
        proxy.delay_replies(0.3)
        task = asyncio.create_task(client.lock("interrupted").lock())
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert client.statistics().renewals == 0
        proxy.pass_through()
        await asyncio.sleep(1.2)  # past the lease: nothing renewed it
        assert not await redis_client.exists("interrupted")


async def test_killed_holder_frees_the_lock_after_its_lease(
    redis_url: str, client: aiolock.AioLock, workers: list[Worker]
) -> None:
    worker = await Worker.start("hold", redis_url, "killed-holder", "60", "1")
    workers.append(worker)
    assert await worker.line() == "locked"
    lock = client.lock("killed-holder")
    assert not await lock.try_lock()
    worker.signal(signal.SIGKILL)
    started = asyncio.get_running_loop().time()
    assert await lock.try_lock(wait_time=10)
    waited = asyncio.get_running_loop().time() - started
    # watchdog_timeout + a margin for a loaded machine, not forever (nor wait_time's 10 s)
    assert waited < 1 + 4, waited


async def test_paused_holder_learns_it_lost_the_lock(
    redis_url: str, client: aiolock.AioLock, workers: list[Worker]
) -> None:
    """SIGSTOP past the lease: another process takes the lock with a higher token; once the
    first resumes, its callback runs, its guarded body is cancelled with LockLostError and
    its unlock raises LockLostError."""
    worker = await Worker.start("fenced-guard", redis_url, "paused", "1")
    workers.append(worker)
    first = await worker.line()
    assert first.startswith("token ")
    worker.signal(signal.SIGSTOP)
    token = await client.fenced_lock("paused").try_lock_and_get_token(wait_time=10)
    assert token is not None and token > int(first.split()[1])
    worker.signal(signal.SIGCONT)
    assert sorted([await worker.line(), await worker.line(), await worker.line()]) == [
        "callback",
        "guard-lost",
        "unlock-lost",
    ]
    assert await worker.proc.wait() == 0


async def test_blackholed_renewals_are_reported_before_the_lease_ends(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    # The local deadline is 1 % of the lease (+ 2 ms) before the server's: a 5 s lease leaves
    # 52 ms for a loaded machine to run the timer and the callback (a 1 s lease left 12 ms).
    async with aiolock.from_url(proxy.url, watchdog_timeout=5) as client:
        lock = client.lock("blackholed")
        await lock.lock()
        told: list[float] = []

        def on_lost(error: aiolock.LockLostError) -> None:
            told.append(time.time() * 1000)

        lock.on_lost(on_lost)
        proxy.blackhole_replies()
        proxy.blackhole_requests()  # and the removal of the lost hold does not get through
        # when the server expires the key (unix ms), as the last renewal that got through
        # set it: read now, not from the callback (that round trip may end after it)
        # (TIME then PTTL, not PEXPIRETIME, which some servers lack: it errs early, if at all)
        seconds, micros = await redis_client.time()
        pttl = await redis_client.pttl("blackholed")
        assert pttl > 0
        expires_at = seconds * 1000 + micros / 1000 + pttl
        async with asyncio.timeout(15):
            while not told:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        # told while the server still held our lease, not after it had expired
        assert told[0] < expires_at, (expires_at - told[0], told)
        proxy.pass_through()
        with pytest.raises(aiolock.LockLostError):
            await lock.unlock()


async def test_client_pause_longer_than_the_lease_is_reported(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    client = make_client(watchdog_timeout=1)
    lock = client.lock("paused-server")
    lost = asyncio.Event()
    await lock.lock()
    lock.on_lost(lambda error: lost.set())
    started = asyncio.get_running_loop().time()
    await redis_client.client_pause(2500, all=False)  # CLIENT PAUSE 2500 WRITE
    await asyncio.wait_for(lost.wait(), 3)
    # the lease cannot expire on the server while writes are paused; we knew before that
    assert asyncio.get_running_loop().time() - started < 2.5
    with pytest.raises(aiolock.LockLostError):
        await lock.unlock()


async def test_guard_cancels_the_body_when_the_hold_is_lost(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    """Another client force-unlocks our lock: the next renewal finds it gone, the guarded
    body is cancelled and the guard raises LockLostError."""
    lock = make_client(watchdog_timeout=0.6).lock("guarded")
    reached_end = False
    started = asyncio.get_running_loop().time()
    with pytest.raises(aiolock.LockLostError, match="watchdog found the lock gone"):
        async with lock.guard():
            assert await make_client().lock("guarded").force_unlock()
            await asyncio.sleep(10)
            reached_end = True
    assert not reached_end
    assert asyncio.get_running_loop().time() - started < 10
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.unlock()  # the guard's own count is used up


async def test_each_unlock_of_a_lost_hold_reports_the_loss(client: aiolock.AioLock) -> None:
    lock = client.lock("lost-twice")
    assert await lock.try_lock(lease_time=0.1)
    assert await lock.try_lock(lease_time=0.1)
    await asyncio.sleep(0.3)
    for _ in range(2):
        with pytest.raises(aiolock.LockLostError):
            await lock.unlock()
    with pytest.raises(aiolock.LockNotOwnedError) as info:
        await lock.unlock()
    assert not isinstance(info.value, aiolock.LockLostError)


async def test_guard_without_loss_releases(client: aiolock.AioLock) -> None:
    lock = client.lock("guard-ok")
    async with lock.guard() as held:
        assert held is lock
        assert await lock.hold_count() == 1
    assert not await lock.is_locked()


async def test_explicit_lease_running_out_is_a_loss(client: aiolock.AioLock) -> None:
    lock = client.lock("lease-out")
    errors: list[aiolock.LockLostError] = []
    with pytest.raises(aiolock.LockLostError, match="lease ran out"):
        async with lock.guard(lease_time=0.2):
            lock.on_lost(errors.append)
            await asyncio.sleep(5)
    assert len(errors) == 1


async def test_on_lost_needs_a_hold(client: aiolock.AioLock) -> None:
    with pytest.raises(aiolock.LockNotOwnedError):
        client.lock("nothing").on_lost(print)


async def test_10000_locks_stay_held_for_three_renewal_periods(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    # A 6 s lease renewed every 2 s: 10,000 renewals per period are work for the loop, and on
    # a loaded machine a 1.5 s lease (renewed every 0.5 s) ran out before some were renewed,
    # or before some acquires' replies were read (a grant after its own lease is no grant).
    watchdog_timeout = 6
    period = watchdog_timeout / 3
    client = make_client(watchdog_timeout=watchdog_timeout)
    names = [f"many:{i}" for i in range(10_000)]

    async def take(chunk: list[str]) -> None:
        owner = client.new_owner()  # the holds outlive this task
        for name in chunk:
            assert await client.lock(name).try_lock(owner=owner)

    await asyncio.gather(*(take(names[i::100]) for i in range(100)))
    calls_before = client.statistics().renewal_calls
    await asyncio.sleep(3 * period + 0.2)
    assert await redis_client.dbsize() == 10_000
    stats = client.statistics()
    assert stats.holds["held"] == 10_000
    assert stats.holds["lost"] == 0
    assert stats.renewals == 10_000
    assert min(await redis_client.pttl(names[0]), await redis_client.pttl(names[-1])) > 500
    # batched: about (ticks per period + 10,000 / 100) calls per period, not 10,000
    assert stats.renewal_calls - calls_before < 4 * (10 + 100) + 50


# -- fenced lock --------------------------------------------------------------------------


async def test_fencing_tokens_grow_across_holders(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock], redis_url: str
) -> None:
    fenced = client.fenced_lock("fenced")
    assert await fenced.get_token() == 0
    first = await fenced.lock_and_get_token()
    assert await fenced.lock_and_get_token() == first  # reentrant: same hold, same token
    assert await asyncio.create_task(fenced.try_lock_and_get_token()) is None
    await fenced.unlock()
    await fenced.unlock()
    other = make_client().fenced_lock("fenced")
    second = await other.try_lock_and_get_token(wait_time=1)
    assert second is not None and second > first
    assert await fenced.get_token() == second


async def test_fenced_lock_layout(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    token = await client.fenced_lock("layout").lock_and_get_token()
    assert await redis_client.get("redisson_lock_token:{layout}") == str(token).encode()
    assert await redis_client.type("layout") == b"hash"


async def test_the_watchdogs_warning_says_what_happened_in_plain_words(
    proxy: TcpProxy, caplog: pytest.LogCaptureFixture
) -> None:
    async with aiolock.from_url(proxy.url, watchdog_timeout=0.6, command_timeout=0.2) as client:
        lock = client.lock("warned")
        await lock.lock()
        proxy.blackhole_replies()
        with caplog.at_level("WARNING", logger="aiolock.watchdog"):
            await asyncio.sleep(0.6)
        proxy.pass_through()
    warnings = [r.getMessage() for r in caplog.records if r.name == "aiolock.watchdog"]
    assert warnings, caplog.text
    assert "no reply" in warnings[0]
    assert "OutcomeUnknown" not in warnings[0] and "NotSent" not in warnings[0]
