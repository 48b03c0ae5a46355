"""One behaviour suite over every exclusive lock type (trio's test_sync.py pattern):
reentrancy, mutual exclusion across tasks, clients and processes, waiting, cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import aiolock
from tests.conftest import run_worker

LockFactory = Callable[[aiolock.AioLock, str], aiolock.Lock]

FACTORIES: dict[str, LockFactory] = {
    "lock": lambda client, name: client.lock(name),
    "fenced_lock": lambda client, name: client.fenced_lock(name),
}


@pytest.fixture(params=sorted(FACTORIES))
def make_lock(request: pytest.FixtureRequest) -> LockFactory:
    return FACTORIES[request.param]


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
    redis_url: str,
) -> None:
    lock = make_lock(client, "family")
    assert await lock.try_lock()
    assert not await asyncio.create_task(lock.try_lock())
    assert not await make_lock(make_client(), "family").try_lock()
    assert await run_worker("try", redis_url, "family") == ["False"]
    await lock.unlock()
    assert await make_lock(make_client(), "family").try_lock()


async def test_mutual_exclusion_under_contention(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock], make_lock: LockFactory
) -> None:
    inside = 0
    entered = 0

    async def worker(lock: aiolock.Lock) -> None:
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
        *(worker(make_lock(c, "contended")) for c in (client, other) for _ in range(5))
    )
    assert entered == 100


async def test_waiter_gets_it_on_release(client: aiolock.AioLock, make_lock: LockFactory) -> None:
    lock = make_lock(client, "family")
    assert await lock.try_lock(lease_time=30)
    waiter = asyncio.create_task(lock.try_lock(wait_time=10))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await lock.unlock()
    assert await waiter


async def test_cancelled_waiter_holds_nothing(
    client: aiolock.AioLock, make_lock: LockFactory
) -> None:
    lock = make_lock(client, "family")
    assert await lock.try_lock(lease_time=30)
    waiter = asyncio.create_task(lock.lock())
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await lock.unlock()
    assert not await lock.is_locked()
    assert client._holds == {}
