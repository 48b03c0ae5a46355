"""One behaviour suite over every exclusive lock type (trio's test_sync.py pattern):
reentrancy, mutual exclusion across tasks, clients and processes, waiting, leases and their
loss, 1,000 random cancellations, kill -9 and SIGSTOP of holder processes, a server restart,
CLIENT KILL of the pub/sub connection, and a proxy that delays and blackholes. A new lock
type joins by adding its factory to FACTORIES (tests/proc_worker.py uses it too). The cases
that need no reentrancy and no lock in another process also run a 1-permit permit-expirable
semaphore (EXCLUSIVE)."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

import pytest
import redis.asyncio

import aiolock
from aiolock.testing import RedisServer, TcpProxy
from tests.conftest import Worker, run_worker
from tests.sync_helpers import eventually, true

FamilyLock = aiolock.Lock | aiolock.MultiLock
LockFactory = Callable[[aiolock.AioLock, str], FamilyLock]

FACTORIES: dict[str, LockFactory] = {
    "lock": lambda client, name: client.lock(name),
    "fenced_lock": lambda client, name: client.fenced_lock(name),
    "spin_lock": lambda client, name: client.spin_lock(name),
    "fair_lock": lambda client, name: client.fair_lock(name),
    "write_lock": lambda client, name: client.read_write_lock(name).write_lock(),
    # composites of one member (tests/test_multilock.py and test_redlock.py span servers)
    "multi_lock": lambda client, name: aiolock.multi_lock(client.lock(name)),
    "red_lock": lambda client, name: aiolock.red_lock(client, name=name),
}


@pytest.fixture(params=sorted(FACTORIES))
def lock_type(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def make_lock(lock_type: str) -> LockFactory:
    return FACTORIES[lock_type]


class ExclusiveHold(Protocol):
    """What the cases that need no reentrancy use of a lock."""

    async def try_lock(self, wait_time: float = 0, lease_time: float | None = None) -> bool: ...
    async def lock(self, lease_time: float | None = None) -> None: ...
    async def unlock(self) -> None: ...
    async def is_locked(self) -> bool: ...
    async def __aenter__(self) -> object: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class PermitLock:
    """A permit-expirable semaphore of one permit as an exclusive hold: each permit is a
    hold of its own (renewed, reported lost), but not reentrant (the same task asking again
    waits for itself) and released by its id, so it runs the family's cases that need no
    reentrancy and no lock in another process. The permit id is kept per task here."""

    def __init__(self, client: aiolock.AioLock, name: str) -> None:
        self.pes = client.permit_expirable_semaphore(name)
        self.permits: dict[asyncio.Task[object], str] = {}

    async def try_lock(self, wait_time: float = 0, lease_time: float | None = None) -> bool:
        await self.pes.try_set_permits(1)
        permit = await self.pes.try_acquire(wait_time, lease_time)
        if permit is not None:
            self.permits[_task()] = permit
        return permit is not None

    async def lock(self, lease_time: float | None = None) -> None:
        await self.pes.try_set_permits(1)
        self.permits[_task()] = await self.pes.acquire(lease_time)

    async def unlock(self) -> None:
        await self.pes.release(self.permits.pop(_task()))

    async def is_locked(self) -> bool:
        return await self.pes.acquired_permits() > 0

    async def __aenter__(self) -> PermitLock:
        await self.lock()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.unlock()


def _task() -> asyncio.Task[object]:
    task = asyncio.current_task()
    assert task is not None
    return task


ExclusiveFactory = Callable[[aiolock.AioLock, str], ExclusiveHold]

EXCLUSIVE: dict[str, ExclusiveFactory] = {
    **FACTORIES,
    "permit_expirable_semaphore(1)": PermitLock,
}


@pytest.fixture(params=sorted(EXCLUSIVE))
def make_exclusive(request: pytest.FixtureRequest) -> ExclusiveFactory:
    return EXCLUSIVE[request.param]


async def test_reentrant(client: aiolock.AioLock, make_lock: LockFactory) -> None:
    lock = make_lock(client, "family")
    async with lock:
        async with lock:
            assert await lock.hold_count() == 2
        assert await lock.hold_count() == 1
    assert not await lock.is_locked()


async def test_excludes_other_tasks_and_clients(
    client: aiolock.AioLock,
    make_client: Callable[..., aiolock.AioLock],
    make_lock: LockFactory,
    lock_type: str,
    redis_url: str,
) -> None:
    lock = make_lock(client, "family")
    assert await lock.try_lock()
    assert not await asyncio.create_task(lock.try_lock())
    assert not await make_lock(make_client(), "family").try_lock()
    assert await run_worker("try", redis_url, "family", lock_type=lock_type) == ["False"]
    await lock.unlock()
    assert await make_lock(make_client(), "family").try_lock()


async def test_mutual_exclusion_under_contention(
    client: aiolock.AioLock,
    make_client: Callable[..., aiolock.AioLock],
    make_exclusive: ExclusiveFactory,
) -> None:
    inside = 0
    entered = 0

    async def worker(lock: ExclusiveHold) -> None:
        nonlocal inside, entered
        for _ in range(10):
            async with lock:
                inside += 1
                assert inside == 1
                await asyncio.sleep(0.001)
                inside -= 1
                entered += 1

    other = make_client()
    await asyncio.gather(
        *(worker(make_exclusive(c, "contended")) for c in (client, other) for _ in range(5))
    )
    assert entered == 100


async def test_waiter_gets_it_on_release(
    client: aiolock.AioLock, make_exclusive: ExclusiveFactory
) -> None:
    lock = make_exclusive(client, "family")
    assert await lock.try_lock(lease_time=30)
    waiter = asyncio.create_task(lock.try_lock(wait_time=10))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await lock.unlock()
    assert await waiter


async def test_cancelled_waiter_holds_nothing(
    client: aiolock.AioLock, make_exclusive: ExclusiveFactory
) -> None:
    lock = make_exclusive(client, "family")
    assert await lock.try_lock(lease_time=30)
    waiter = asyncio.create_task(lock.lock())
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await lock.unlock()
    assert not await lock.is_locked()
    assert not any(client.statistics().holds.values())


# -- leases, losses and their reporting ------------------------------------------------------


async def test_a_lease_runs_out_and_the_loss_is_reported(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock], make_lock: LockFactory
) -> None:
    lock = make_lock(client, "family-lease")
    assert await lock.try_lock(lease_time=0.2)
    lost: list[aiolock.LockLostError] = []
    lock.on_lost(lost.append)
    # reported soon after the lease ends (0.2 s); a loaded machine may run the timer late
    await eventually(lambda: true(lost and lock.statistics().lost), within=5)
    assert await make_lock(make_client(), "family-lease").try_lock()
    with pytest.raises(aiolock.LockLostError):
        await lock.unlock()
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.unlock()


async def test_a_force_unlock_elsewhere_cancels_the_guard(
    make_client: Callable[..., aiolock.AioLock], make_lock: LockFactory
) -> None:
    lock = make_lock(make_client(watchdog_timeout=0.6), "family-forced")
    with pytest.raises(aiolock.LockLostError):
        async with lock.guard():
            assert await make_lock(make_client(), "family-forced").force_unlock()
            await asyncio.sleep(10)
    assert not lock.statistics().held


@pytest.mark.slow
async def test_a_guard_tells_a_loss_at_once_when_the_server_is_gone(
    proxy: TcpProxy, make_lock: LockFactory
) -> None:
    """Issue 20, item 6: the server stops answering, the hold is lost when its lease runs
    out unrenewed and the guarded body is cancelled; LockLostError reaches the caller at
    once, not after waiting out cleanup_timeout for a release that cannot succeed (the
    hold's cleanup goes on in the background)."""
    loop = asyncio.get_running_loop()
    command_timeout = 0.8  # the cleanup's attempt to remove the hold waits at least this
    async with aiolock.from_url(
        proxy.url, watchdog_timeout=1.0, command_timeout=command_timeout, cleanup_timeout=3
    ) as client:
        lock = make_lock(client, "family-gone")
        cancelled_at: float | None = None
        with pytest.raises(aiolock.LockLostError):
            async with lock.guard():
                proxy.blackhole_replies()
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    cancelled_at = loop.time()
                    raise
        told_at = loop.time()
        proxy.pass_through()
        assert cancelled_at is not None
        assert told_at - cancelled_at < command_timeout / 2
        assert not lock.statistics().held


STALLED: dict[str, LockFactory] = {
    **FACTORIES,
    "read_lock": lambda client, name: client.read_write_lock(name).read_lock(),
}


@pytest.mark.parametrize("stalled_type", sorted(STALLED))
async def test_on_lost_of_a_hold_lost_right_after_its_grant_is_told_at_once(
    make_client: Callable[..., aiolock.AioLock], stalled_type: str
) -> None:
    """Issue 19, symptom 16: the process does not run (a GC pause, SIGSTOP; here the event
    loop is blocked) for longer than the lease right after the grant, so the hold is lost
    before on_lost is registered. Registering must tell the loss (the callback runs once,
    soon, from the event loop), never claim the hold never existed (LockNotOwnedError); the
    unlock then reports it, and the lock can be taken again."""
    lock = STALLED[stalled_type](make_client(watchdog_timeout=0.3), "family-stalled")
    await lock.lock()
    time.sleep(0.4)  # noqa: ASYNC251 (the fault: nothing runs here for longer than the lease)
    assert lock.statistics().lost and not lock.statistics().held
    lost: list[aiolock.LockLostError] = []
    lock.on_lost(lost.append)
    await eventually(lambda: true(lost), within=5)
    await asyncio.sleep(0.05)
    assert len(lost) == 1 and isinstance(lost[0], aiolock.LockLostError)
    with pytest.raises(aiolock.LockLostError):
        await lock.unlock()
    with pytest.raises(aiolock.LockNotOwnedError) as not_owned:
        lock.on_lost(lost.append)  # unlocked: nothing held, nothing lost left to tell
    assert not isinstance(not_owned.value, aiolock.LockLostError)
    assert await lock.try_lock()
    await lock.unlock()


async def test_on_lost_after_the_client_closed_tells_the_loss(
    make_client: Callable[..., aiolock.AioLock], make_lock: LockFactory
) -> None:
    """Closing a client loses its holds; registering on one afterwards tells that loss (as
    its unlock does), for composites too."""
    client = make_client()
    lock = make_lock(client, "family-closed")
    await lock.lock()
    await client.aclose()
    lost: list[aiolock.LockLostError] = []
    lock.on_lost(lost.append)
    await eventually(lambda: true(lost), within=5)
    assert len(lost) == 1
    with pytest.raises(aiolock.LockLostError):
        await lock.unlock()
    with pytest.raises((aiolock.LockNotOwnedError, aiolock.ClientClosedError)) as nothing:
        lock.on_lost(lost.append)
    assert not isinstance(nothing.value, aiolock.LockLostError)


async def test_on_lost_of_a_permit_lost_right_after_its_grant_is_told_at_once(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    """Symptom 16 for a permit of a permit-expirable semaphore (renewed like a lock)."""
    pes = make_client(watchdog_timeout=0.3).permit_expirable_semaphore("family-stalled-permit")
    await pes.try_set_permits(1)
    permit = await pes.acquire()
    time.sleep(0.4)  # noqa: ASYNC251 (the fault: nothing runs here for longer than the lease)
    lost: list[aiolock.LockLostError] = []
    pes.on_lost(permit, lost.append)
    await eventually(lambda: true(lost), within=5)
    await asyncio.sleep(0.05)
    assert len(lost) == 1 and isinstance(lost[0], aiolock.LockLostError)
    with pytest.raises(aiolock.LockLostError):
        await pes.release(permit)
    with pytest.raises(aiolock.LockNotOwnedError):
        pes.on_lost(permit, lost.append)


async def test_1000_random_cancellations_leave_nothing_behind(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, make_lock: LockFactory
) -> None:
    """Tasks lock, try_lock, hold and unlock a few names and are cancelled at random moments
    (before, during and after every await): when all is done, no key, hold, subscription,
    renewal or background work is left, and the locks still work."""
    rng = random.Random(20261122)
    names = [f"family-cancel:{i}" for i in range(3)]

    async def user(name: str) -> None:
        lock = make_lock(client, name)
        while True:
            if rng.random() < 0.5:
                await lock.lock(lease_time=None if rng.random() < 0.5 else 5)
            elif not await lock.try_lock(wait_time=rng.choice([0, 0.001, 0.01])):
                continue
            if rng.random() < 0.3:
                async with lock:  # reentrant
                    await asyncio.sleep(0)
            await asyncio.sleep(rng.choice([0, 0, 0.0005, 0.001]))
            await lock.unlock()

    cancelled = 0
    while cancelled < 1000:
        tasks = [asyncio.create_task(user(rng.choice(names))) for _ in range(10)]
        await asyncio.sleep(rng.choice([0, 0.0002, 0.0005, 0.001, 0.003]))
        for task in tasks:
            await asyncio.sleep(rng.choice([0, 0, 0.0001, 0.0003]))
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        cancelled += sum(isinstance(result, asyncio.CancelledError) for result in results)
        assert not [r for r in results if not isinstance(r, asyncio.CancelledError)], results

    async def settled() -> bool:
        stats = client.statistics()
        keys = [key async for key in redis_client.scan_iter("family-cancel:*")]
        return (
            not keys
            and not any(stats.holds.values())
            and stats.subscriptions == 0
            and stats.renewals == 0
            and stats.background_tasks == 0
        )

    async with asyncio.timeout(10):
        while not await settled():  # noqa: ASYNC110 (server state: nothing to wait on)
            await asyncio.sleep(0.02)
    for name in names:
        async with make_lock(client, name):
            pass


# -- other processes: kill -9 and SIGSTOP of a holder --------------------------------------------


async def test_a_killed_holder_frees_the_lock_after_its_lease(
    redis_url: str,
    client: aiolock.AioLock,
    workers: list[Worker],
    lock_type: str,
    make_lock: LockFactory,
) -> None:
    worker = await Worker.start("hold", redis_url, "family-killed", "60", "1", lock_type=lock_type)
    workers.append(worker)
    assert await worker.line() == "locked"
    lock = make_lock(client, "family-killed")
    assert not await lock.try_lock()
    worker.signal(signal.SIGKILL)
    started = asyncio.get_running_loop().time()
    assert await lock.try_lock(wait_time=10)
    assert asyncio.get_running_loop().time() - started < 1 + 1.5  # its lease, not forever


async def test_a_paused_holder_learns_it_lost_the_lock(
    redis_url: str,
    client: aiolock.AioLock,
    workers: list[Worker],
    lock_type: str,
    make_lock: LockFactory,
) -> None:
    """SIGSTOP past the lease: another process takes the lock; once the first resumes, its
    callback runs, its guarded body is cancelled and its unlock says the hold was lost."""
    worker = await Worker.start("guard", redis_url, "family-paused", "1", lock_type=lock_type)
    workers.append(worker)
    assert await worker.line() == "held"
    worker.signal(signal.SIGSTOP)
    assert await make_lock(client, "family-paused").try_lock(wait_time=10)
    worker.signal(signal.SIGCONT)
    lines = sorted([await worker.line(), await worker.line(), await worker.line()])
    assert lines == ["callback", "guard-lost", "unlock-lost"]
    assert await worker.proc.wait() == 0


async def test_processes_hammer_one_lock(redis_url: str, lock_type: str) -> None:
    results = await asyncio.gather(
        *(
            run_worker("hammer", redis_url, "family-hammered", "10", "10", lock_type=lock_type)
            for _ in range(3)
        )
    )
    assert results == [["0", "100"]] * 3  # no overlap seen by the guard, every round done


# -- the server and the links fail ---------------------------------------------------------------


async def test_a_server_restart_loses_holds_and_waiters_recover(
    fresh_server: RedisServer, make_lock: LockFactory
) -> None:
    async with (
        aiolock.from_url(fresh_server.url, watchdog_timeout=0.9, command_timeout=0.5) as holder,
        aiolock.from_url(fresh_server.url, command_timeout=0.5) as other,
    ):
        lock = make_lock(holder, "family-restart")
        await lock.lock()
        waiter = asyncio.create_task(make_lock(other, "family-restart").try_lock(wait_time=15))
        await asyncio.sleep(0.1)
        fresh_server.kill()
        fresh_server.restart()  # empty: the hold is gone
        async with asyncio.timeout(5):
            while not lock.statistics().lost:  # noqa: ASYNC110 (the watchdog reports it)
                await asyncio.sleep(0.02)
        assert await waiter  # woken to re-check, not left hanging
        with pytest.raises(aiolock.LockLostError):
            await lock.unlock()


async def test_waiters_recover_after_client_kill_of_the_pubsub_connection(
    client: aiolock.AioLock,
    make_client: Callable[..., aiolock.AioLock],
    redis_client: redis.asyncio.Redis,
    make_lock: LockFactory,
) -> None:
    holder = make_lock(make_client(), "family-pubsub-killed")
    assert await holder.try_lock(lease_time=30)
    waiters = [
        asyncio.create_task(make_lock(client, "family-pubsub-killed").try_lock(wait_time=10))
        for _ in range(3)
    ]
    async with asyncio.timeout(5):
        while client.statistics().tasks_waiting < 3:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    await redis_client.client_kill_filter(_type="pubsub")
    await holder.unlock()  # published while our pub/sub connection is down: lost
    started = asyncio.get_running_loop().time()
    results = []
    for waiter in waiters:
        results.append(await waiter)
        await asyncio.sleep(0)
    assert results.count(True) >= 1
    assert asyncio.get_running_loop().time() - started < 5  # not the 30 s lease


async def test_a_delaying_proxy_changes_nothing_but_time(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis, make_lock: LockFactory
) -> None:
    async with aiolock.from_url(proxy.url) as client:
        lock = make_lock(client, "family-slow")
        proxy.delay_replies(0.05)
        proxy.delay_requests(0.02)
        async with lock:
            async with lock:
                assert lock.statistics().hold_count == 2
        assert not await redis_client.exists("family-slow")


async def test_a_blackholed_server_bounds_try_lock(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis, make_lock: LockFactory
) -> None:
    """Nothing answers: try_lock(wait_time=W) returns or raises within W + command_timeout,
    and whatever it may have taken is removed once the server answers again."""
    async with aiolock.from_url(proxy.url, command_timeout=0.5, cleanup_timeout=0.5) as client:
        lock = make_lock(client, "family-dark")
        assert not await lock.is_locked()
        proxy.blackhole_replies()
        started = asyncio.get_running_loop().time()
        with pytest.raises(aiolock.RedisOperationError):
            await lock.try_lock(wait_time=0.3)
        assert asyncio.get_running_loop().time() - started < 0.3 + 0.5 + 0.25
        proxy.pass_through()
        async with asyncio.timeout(5):
            while await redis_client.exists("family-dark"):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
