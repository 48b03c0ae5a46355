"""Multi-locks and red locks under attack: holder processes killed (kill -9) or paused
(SIGSTOP), cancellation during unlock, a member's client closed while held, every master
down; member servers restarted empty while held, and an acquiring process stopped between
two grants (issue 19: a composite reports a loss exactly as a plain lock does)."""

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
    SOMEONE_ELSE,
    Connect,
    Servers,
    aiolock_fields,
    busy,
    connect_fixture,  # noqa: F401
    eventually,
    held_anywhere,
    holders,
    redis_of,
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


# -- losses told exactly as a plain lock tells them (issue 19) ---------------------------------


def restart_empty(*gone: RedisServer) -> None:
    for server in gone:
        server.kill()
        server.restart()  # no persistence: it comes back without the members it held


async def forget(lock: aiolock.MultiLock, *gone: RedisServer) -> None:
    """Restart ``gone`` empty and wait until the composite's clients talk to them again (so
    the members' releases reach the new servers and find nothing there, as a plain lock's
    does; a release sent on the dead link is the core's business, issue 19 symptom 10)."""
    restart_empty(*gone)
    answers = await asyncio.gather(*(member.is_locked() for member in lock.members))
    assert answers.count(False) == len(gone)


@pytest.mark.parametrize("kind", KINDS)
async def test_unlock_reports_members_restarted_empty(
    servers: Servers, connect: Connect, kind: str
) -> None:
    """Issue 19, symptom 1: member servers restart empty while the composite is held (the
    30 s watchdog has not renewed since): those members' own releases find nothing, which
    for a plain lock is LockLostError. One such member loses a multi-lock, two of three a
    red lock (fewer than a quorum still held). unlock() raises LockLostError, the other
    members are released all the same, on_lost fires exactly once, and it can be taken
    again. (It used to return normally: the decision was taken before the releases ran.)"""
    srv = servers(3)
    lock = composite(kind, connect(srv, command_timeout=1, reconnect_max_delay=0.1))
    await lock.lock()
    told: list[aiolock.LockLostError] = []
    lock.on_lost(told.append)
    await forget(lock, *(srv[1:2] if kind == "multi" else srv[:2]))
    with pytest.raises(aiolock.LockLostError):
        await lock.unlock()
    await asyncio.sleep(0.1)
    assert len(told) == 1 and isinstance(told[0], aiolock.LockLostError)
    assert await aiolock_fields(srv, NAMES) == []
    assert not lock.statistics().lost and not lock.statistics().held
    assert await lock.try_lock()
    await lock.unlock()


async def test_red_lock_unlock_reports_the_quorum_another_owner_took(
    servers: Servers, connect: Connect
) -> None:
    """The issue's red-lock run: two of A's three masters restart empty and B takes them, a
    quorum, while A still believes it holds the red lock (its renewal has not run). A's
    unlock must not succeed: it raises LockLostError, A's on_lost fires once, B's hold is
    untouched."""
    srv = servers(3)
    config = {"command_timeout": 1, "reconnect_max_delay": 0.1}
    red_a = composite("red", connect(srv, **config))
    red_b = composite("red", connect(srv, **config))
    b_owner = red_b.owner()
    await red_a.lock()
    told: list[aiolock.LockLostError] = []
    red_a.on_lost(told.append)
    await forget(red_a, srv[0], srv[1])
    assert await red_b.try_lock(wait_time=5)
    with pytest.raises(aiolock.LockLostError):
        await red_a.unlock()
    await asyncio.sleep(0.1)
    assert len(told) == 1
    assert red_b.statistics().held
    assert len(await held_anywhere(srv, ["hammer"], b_owner.id)) >= 2
    await red_b.unlock()


async def test_red_lock_unlock_with_one_master_restarted_empty_keeps_its_quorum(
    servers: Servers, connect: Connect
) -> None:
    """The other side of the quorum: one master of three restarted empty leaves two
    confirmed releases, a quorum held to the end; unlock() succeeds, nothing is told."""
    srv = servers(3)
    red = composite("red", connect(srv, command_timeout=1, reconnect_max_delay=0.1))
    await red.lock()
    told: list[aiolock.LockLostError] = []
    red.on_lost(told.append)
    await forget(red, srv[2])
    await red.unlock()
    await asyncio.sleep(0.1)
    assert told == []
    assert await aiolock_fields(srv, NAMES) == []


@pytest.mark.parametrize("kind", KINDS)
async def test_guard_raises_the_loss_its_unlock_finds(
    servers: Servers, connect: Connect, kind: str
) -> None:
    """The body ends normally, but members restarted empty under it (no renewal since): the
    releases at the end find the loss, and the ``async with`` raises LockLostError."""
    srv = servers(3)
    lock = composite(kind, connect(srv, command_timeout=1, reconnect_max_delay=0.1))
    with pytest.raises(aiolock.LockLostError):
        async with lock.guard():
            await forget(lock, *(srv[1:2] if kind == "multi" else srv[:2]))
    assert await aiolock_fields(srv, NAMES) == []


@pytest.mark.parametrize("kind", KINDS)
async def test_guard_cancels_its_body_when_members_restart_empty(
    servers: Servers, connect: Connect, kind: str
) -> None:
    """With a 0.6 s watchdog the renewal finds the members gone: the multi-lock with one,
    the red lock with two of three; the body is cancelled once and LockLostError raised."""
    srv = servers(3)
    config = {"watchdog_timeout": 0.6, "command_timeout": 0.3, "reconnect_max_delay": 0.1}
    lock = composite(kind, connect(srv, **config))
    cancelled = 0
    with pytest.raises(aiolock.LockLostError):
        async with lock.guard():
            restart_empty(*(srv[1:2] if kind == "multi" else srv[:2]))
            try:
                await asyncio.sleep(15)
            except asyncio.CancelledError:
                cancelled += 1
                raise
    assert cancelled == 1
    assert await aiolock_fields(srv, NAMES) == []


async def test_red_lock_guard_keeps_its_body_with_one_master_restarted_empty(
    servers: Servers, connect: Connect
) -> None:
    srv = servers(3)
    config = {"watchdog_timeout": 0.6, "command_timeout": 0.3, "reconnect_max_delay": 0.1}
    red = composite("red", connect(srv, **config))
    async with red.guard():
        restart_empty(srv[0])
        await asyncio.sleep(1.5)  # a few renewals: the one on master 0 finds it gone
        stats = red.statistics()
        assert stats.held and not stats.lost and stats.members_held == 2
    assert await aiolock_fields(srv, NAMES) == []


class Acquirer(Holder):
    """tests/multilock_worker.py ``acquire``: told when to start through its stdin."""

    async def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        await self.proc.stdin.drain()


@pytest.mark.parametrize("how", ["try_lock", "lock", "with"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_member_lost_inside_the_acquisition_is_the_attempts_own_business(
    servers: Servers, connect: Connect, holder: list[Holder], kind: str, how: str
) -> None:
    """Issue 19, symptom 15: the acquiring process is stopped (SIGSTOP) for longer than its
    watchdog (0.6 s) between two grants, so the member it had just taken is lost while the
    next member's try is in flight (that master is paused meanwhile). That caller never held
    the composite: the attempt gives back what it took and goes on, and the lock is taken
    once the busy master frees it; never "was lost; unlock it as often as it was taken"."""
    srv = servers(3)
    lock = composite(kind, connect(srv))
    first = int(lock.members[0].name.rpartition(":")[2]) if kind == "multi" else 0
    others = [i for i in range(3) if i != first]
    # multi-lock: the first member is taken, the next one's try waits on a paused master
    # that then answers "busy"; red lock: one master grants, one is paused (then grants),
    # one is busy, so the round is still open when the grant is lost
    paused = srv[others[0]]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(MULTI_WORKER),
        "acquire",
        kind,
        ",".join(s.url for s in srv),
        "0.6",
        how,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    worker = Acquirer(proc)
    holder.append(worker)
    assert await worker.line() == "ready"
    busy_name = "hammer" if kind == "red" else f"hammer:{others[0]}"
    await busy(srv[others[0]] if kind == "multi" else srv[others[1]], busy_name, 4)
    paused.pause()
    try:
        await worker.go()
        granted = srv[first]
        taken_name = "hammer" if kind == "red" else f"hammer:{first}"
        await eventually(lambda: _held_by_someone(granted, taken_name))
        worker.signal(signal.SIGSTOP)
        await asyncio.sleep(1.0)  # past the worker's lease: its grant expires unrenewed
        worker.signal(signal.SIGCONT)
        await asyncio.sleep(0.3)  # the worker runs again, and finds its grant lost
    finally:
        paused.resume()
    assert await worker.line(within=20) == "held"
    assert await worker.line(within=10) == "unlocked"
    assert await worker.proc.wait() == 0
    assert await aiolock_fields(srv, NAMES) == []


async def _held_by_someone(server: RedisServer, name: str) -> bool:
    return any(field != SOMEONE_ELSE for field in await holders(server, name))


async def test_a_red_lock_round_does_not_count_a_master_lost_before_its_quorum(
    servers: Servers, connect: Connect
) -> None:
    """Symptom 15 inside one red-lock round: master A grants at once, master B's reply is
    held back (B paused), master C is busy. Meanwhile A's member is deleted on A's server
    (an operator's DEL; a restart would do the same) and A's renewal finds it gone. When B
    grants, the round has two grants, a quorum in number, but holds only one master: it is
    not a grant. The round gives back what it took and the next one takes the lock; try_lock
    never returns True for a red lock not held by a quorum."""
    srv = servers(3)
    config = {"watchdog_timeout": 1.5, "command_timeout": 5, "reconnect_max_delay": 0.1}
    clients = connect(srv, **config)
    red = composite("red", clients)
    who = clients[0].new_owner()  # the acquisition runs in a task of its own
    await red.lock(owner=who)  # every connection open
    await red.unlock(owner=who)
    await busy(srv[2], "hammer", 3)
    srv[1].pause()
    try:
        acquiring = asyncio.create_task(red.try_lock(wait_time=10, owner=who))
        await eventually(lambda: _held_by_someone(srv[0], "hammer"))
        async with redis_of(srv[0]) as direct:
            await direct.delete("hammer")
        await eventually(lambda: _any_member_lost(red, who))
    finally:
        srv[1].resume()
    assert await acquiring
    stats = red.statistics(owner=who)
    assert stats.held and not stats.lost and stats.members_held >= 2
    await red.unlock(owner=who)
    assert await aiolock_fields(srv, NAMES) == []


async def _any_member_lost(lock: aiolock.MultiLock, who: aiolock.Owner) -> bool:
    return any(member.lost for member in lock.statistics(owner=who).members)
