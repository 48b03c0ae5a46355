"""Multi-locks and red locks end within their documented bounds when a member's server
freezes (``tests/test_bounds.py`` holds single locks to theirs).

The bounds (docs/multilock.md): ``try_lock(wait_time=W)`` returns or raises within
``W + command_timeout``, a frozen server included; ``unlock()`` within ``cleanup_timeout``; a
cancelled acquisition within ``cleanup_timeout`` of its cancellation. Each test runs 20 calls
at once against three servers, one or two of them frozen (SIGSTOP) at the worst moment, and
holds every call to exactly its bound. Before the fix the composites computed their own
deadlines with no margin (a give-back of the members taken waited until exactly
``W + command_timeout``, so the call returned after it), and a cancelled multi-lock waited
for its member's own give-back (up to ``cleanup_timeout``) before it began to give back the
members taken before it (another ``cleanup_timeout``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import aiolock
from aiolock.testing import RedisServer
from tests.masters import (
    Connect,
    Servers,
    aiolock_fields,
    connect_fixture,  # noqa: F401
    servers_fixture,  # noqa: F401
)
from tests.test_bounds import _assert_within, _ended_within

#: calls are timed against their bounds (see tests/conftest.py)
pytestmark = pytest.mark.usefixtures("frozen_heap")

N = 20
COMMAND_TIMEOUT = 1.0
CLEANUP_TIMEOUT = 1.0
CONFIG: dict[str, Any] = {
    "command_timeout": COMMAND_TIMEOUT,
    "cleanup_timeout": CLEANUP_TIMEOUT,
    "watchdog_timeout": 3.0,
}
#: for try_lock: a give-back on the frozen server (bounded by cleanup_timeout) outlasts what
#: is left of ``W + command_timeout``, so the call must stop waiting for it in time
TRY_CONFIG: dict[str, Any] = {**CONFIG, "cleanup_timeout": 2.0}


def ordered(srv: list[RedisServer], clients: list[aiolock.AioLock]) -> list[int]:
    """The indexes of the servers in the order a multi-lock takes their members."""
    return sorted(range(len(srv)), key=lambda i: clients[i].deployment)


async def nothing_left(srv: list[RedisServer], names: list[str], within: float = 15) -> None:
    """Once every server answers again, what the calls left to the background is done."""
    async with asyncio.timeout(within):
        while await aiolock_fields(srv, names):  # noqa: ASYNC110 (server state)
            await asyncio.sleep(0.05)


async def test_multi_lock_try_locks_end_within_wait_time_plus_command_timeout(
    servers: Servers, connect: Connect
) -> None:
    """Half the calls hold the first two members and wait for the third (held by another
    client) when the first member's server freezes: their wait ends, and the give-back of
    the frozen member must not take them past the bound. The other half start once it is
    frozen, on free multi-locks, and meet the frozen server at their first member."""
    srv = servers(3)
    clients = connect(srv, **TRY_CONFIG)
    holders = connect(srv)
    first, _, last = ordered(srv, clients)
    waits = [0.5 + 0.05 * i for i in range(N // 2)]
    for i in range(N // 2):
        assert await holders[last].lock(f"w{i}").try_lock(lease_time=10)
    waiting = [
        asyncio.create_task(
            _ended_within(
                wait + COMMAND_TIMEOUT,
                aiolock.multi_lock(*(c.lock(f"w{i}") for c in clients)).try_lock(
                    wait, owner=clients[0].new_owner()
                ),
            )
        )
        for i, wait in enumerate(waits)
    ]
    async with asyncio.timeout(5):
        while clients[last].statistics().tasks_waiting < len(waiting):  # noqa: ASYNC110
            await asyncio.sleep(0.005)
    srv[first].pause()
    try:
        trying = [
            _ended_within(
                0.1 * i + COMMAND_TIMEOUT,
                aiolock.multi_lock(*(c.lock(f"f{i}") for c in clients)).try_lock(0.1 * i),
            )
            for i in range(N // 2)
        ]
        results = [*await asyncio.gather(*trying), *await asyncio.gather(*waiting)]
    finally:
        srv[first].resume()
    _assert_within(results)
    assert all(outcome != "True" for _, outcome in results), results
    for i in range(N // 2):
        await holders[last].lock(f"w{i}").unlock()
    await nothing_left(srv, [f"w{i}" for i in range(N // 2)] + [f"f{i}" for i in range(N // 2)])


async def test_red_lock_try_locks_end_within_wait_time_plus_command_timeout(
    servers: Servers, connect: Connect
) -> None:
    """Two masters are held by someone else, so every round takes the third (a minority),
    gives it back and tries again, until that master freezes: the round then under way
    waits for a give-back or a cancelled attempt on the frozen master, and must stop
    waiting in time. Every call ends (False) within ``W + command_timeout``."""
    srv = servers(3)
    clients = connect(srv, **TRY_CONFIG)
    holders = connect(srv)
    for i in range(N):
        for busy in (0, 1):
            assert await holders[busy].lock(f"r{i}").try_lock(lease_time=10)
    calls = [
        asyncio.create_task(
            _ended_within(
                0.5 + 0.05 * i + COMMAND_TIMEOUT,
                aiolock.red_lock(*clients, name=f"r{i}").try_lock(0.5 + 0.05 * i),
            )
        )
        for i in range(N)
    ]
    await asyncio.sleep(0.3)  # rounds take and give back the third master meanwhile
    srv[2].pause()
    try:
        results = await asyncio.gather(*calls)
    finally:
        srv[2].resume()
    _assert_within(results)
    assert all(outcome == "False" for _, outcome in results), results
    for i in range(N):
        for busy in (0, 1):
            await holders[busy].lock(f"r{i}").unlock()
    await nothing_left(srv, [f"r{i}" for i in range(N)])


@pytest.mark.parametrize("kind", ["multi_lock", "red_lock"])
async def test_unlocks_end_within_cleanup_timeout(
    servers: Servers, connect: Connect, kind: str
) -> None:
    """20 composites held, one server frozen, all unlocked at once."""
    srv = servers(3)
    clients = connect(srv, **CONFIG)
    owners = [clients[0].new_owner() for _ in range(N)]
    if kind == "red_lock":
        locks: list[aiolock.MultiLock] = [
            aiolock.red_lock(*clients, name=f"u{i}") for i in range(N)
        ]
    else:
        locks = [aiolock.multi_lock(*(c.lock(f"u{i}") for c in clients)) for i in range(N)]
    for lock, owner in zip(locks, owners, strict=True):
        await lock.lock(owner=owner)
    srv[0].pause()
    try:
        results = await asyncio.gather(
            *(
                _ended_within(CLEANUP_TIMEOUT, lock.unlock(owner=owner))
                for lock, owner in zip(locks, owners, strict=True)
            )
        )
    finally:
        srv[0].resume()
    _assert_within(results)
    await nothing_left(srv, [f"u{i}" for i in range(N)])


async def test_a_cancelled_multi_lock_ends_within_cleanup_timeout_of_its_cancellation(
    servers: Servers, connect: Connect
) -> None:
    """The race: a multi-lock ``lock()`` has taken its first member and waits for the
    second's reply when both servers freeze, and is cancelled. The second member's own
    give-back is waited for (its acquire was cancelled with its command in flight), and the
    release of the first member must fit in the same ``cleanup_timeout`` from the
    cancellation, not start once that wait ended (the campaign saw one end 1 s late)."""
    srv = servers(3)
    clients = connect(srv, **CONFIG)
    first, second, _ = ordered(srv, clients)
    for client in clients:  # connections open: the second member's try is sent
        assert not await client.lock("warm").is_locked()
    srv[second].pause()  # and goes unanswered
    calls = [
        asyncio.create_task(
            aiolock.multi_lock(*(c.lock(f"c{i}") for c in clients)).lock(
                owner=clients[0].new_owner()
            )
        )
        for i in range(N)
    ]
    try:
        async with asyncio.timeout(5):
            while clients[first].statistics().holds["held"] < N:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)  # the second members' tries are written, unanswered
        srv[first].pause()  # and the first members' give-backs will be too

        async def cancelled(call: asyncio.Task[None]) -> tuple[float, str]:
            async def wait() -> str:
                call.cancel()
                try:
                    await call
                except asyncio.CancelledError:
                    return "cancelled"
                return "returned"

            return await _ended_within(CLEANUP_TIMEOUT, wait())

        results = await asyncio.gather(*(cancelled(call) for call in calls))
    finally:
        srv[first].resume()
        srv[second].resume()
    _assert_within(results)
    assert all(outcome == "'cancelled'" for _, outcome in results), results
    await nothing_left(srv, [f"c{i}" for i in range(N)])
