"""Multi-locks and red locks under attack: holder processes killed (kill -9) or paused
(SIGSTOP), cancellation during unlock, a member's client closed while held, every master
down."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from collections.abc import AsyncIterator

import pytest

import aiolock
from aiolock.testing import RedisServer
from tests.masters import (
    Connect,
    Servers,
    aiolock_fields,
    connect_fixture,  # noqa: F401
    held_anywhere,
    servers_fixture,  # noqa: F401
)
from tests.test_multilock import MULTI_WORKER

KINDS = ["multi", "red"]
#: the names of the worker's locks: the red lock's, the multi-lock's members
NAMES = ["hammer", "hammer:0", "hammer:1", "hammer:2"]


def composite(kind: str, clients: list[aiolock.AioLock]) -> aiolock.MultiLock:
    """The lock tests/multilock_worker.py takes, on these clients."""
    if kind == "multi":
        return aiolock.multi_lock(*(c.lock(f"hammer:{i}") for i, c in enumerate(clients)))
    return aiolock.red_lock(*clients, name="hammer")


class Holder:
    """tests/multilock_worker.py ``hold`` in a process of its own, read line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def line(self, within: float = 10) -> str:
        assert self.proc.stdout is not None
        async with asyncio.timeout(within):
            return (await self.proc.stdout.readline()).decode().strip()

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.proc.pid, sig)


@pytest.fixture
async def holder() -> AsyncIterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for each in started:
        if each.proc.returncode is None:
            each.proc.send_signal(signal.SIGCONT)
            each.proc.kill()
        await each.proc.wait()


async def start_holder(holders: list[Holder], kind: str, srv: list[RedisServer]) -> Holder:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(MULTI_WORKER),
        "hold",
        kind,
        ",".join(s.url for s in srv),
        "0.6",
        stdout=asyncio.subprocess.PIPE,
    )
    holders.append(Holder(proc))
    assert await holders[-1].line() == "held"
    return holders[-1]


@pytest.mark.parametrize("kind", KINDS)
async def test_holder_process_killed(
    servers: Servers, connect: Connect, holder: list[Holder], kind: str
) -> None:
    """kill -9 of the holding process: its members expire with their leases (0.6 s)."""
    srv = servers(3)
    lock = composite(kind, connect(srv))
    worker = await start_holder(holder, kind, srv)
    assert not await lock.try_lock()
    worker.signal(signal.SIGKILL)
    assert await lock.try_lock(wait_time=5)
    assert lock.statistics().members_held == 3
    await lock.unlock()


@pytest.mark.parametrize("kind", KINDS)
async def test_holder_process_paused_learns_it_lost_the_lock(
    servers: Servers, connect: Connect, holder: list[Holder], kind: str
) -> None:
    """SIGSTOP of the holding process for longer than its lease: another owner takes the
    lock; when the holder runs again its guard reports the loss (what it cannot do is
    notice while it is stopped: only fencing covers that)."""
    srv = servers(3)
    lock = composite(kind, connect(srv))
    worker = await start_holder(holder, kind, srv)
    worker.signal(signal.SIGSTOP)
    assert await lock.try_lock(wait_time=5)
    worker.signal(signal.SIGCONT)
    assert await worker.line() == "lost"
    assert lock.statistics().held
    await lock.unlock()


@pytest.mark.parametrize("kind", KINDS)
async def test_cancelled_unlock_still_releases_every_member(
    servers: Servers, connect: Connect, kind: str
) -> None:
    srv = servers(3)
    clients = connect(srv)
    lock = composite(kind, clients)
    rnd = random.Random(3)
    for round_ in range(30):
        owner = clients[0].new_owner()
        assert await lock.try_lock(owner=owner)
        task = asyncio.create_task(lock.unlock(owner=owner))
        await asyncio.sleep(rnd.uniform(0, 0.002))
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        assert await aiolock_fields(srv, NAMES) == [], round_
        assert lock.statistics(owner=owner).members_held == 0


@pytest.mark.parametrize("kind", KINDS)
async def test_a_members_client_closed_while_held(
    servers: Servers, connect: Connect, kind: str
) -> None:
    """Closing a client loses its holds: the multi-lock is lost; the red lock keeps its
    quorum with the two other masters."""
    srv = servers(3)
    clients = connect(srv)
    lock = composite(kind, clients)
    lost = asyncio.Event()
    await lock.lock()
    lock.on_lost(lambda error: lost.set())
    await clients[1].aclose()
    stats = lock.statistics()
    assert stats.members_held == 2
    if kind == "multi":
        await asyncio.wait_for(lost.wait(), 5)
        assert stats.lost and not stats.held
        with pytest.raises(aiolock.LockLostError):
            await lock.unlock()
    else:
        await asyncio.sleep(0.01)
        assert not lost.is_set() and stats.held and not stats.lost
        await lock.unlock()
    assert await held_anywhere([srv[0], srv[2]], NAMES, lock.owner().id) == []


async def test_red_lock_with_every_master_down_raises_at_once(
    servers: Servers, connect: Connect
) -> None:
    srv = servers(3)
    red = aiolock.red_lock(*connect(srv, reconnect_max_delay=0.1), name="down")
    for server in srv:
        server.kill()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(aiolock.RedisOperationError, match="quorum"):
        await red.lock()
    assert loop.time() - started < 5
