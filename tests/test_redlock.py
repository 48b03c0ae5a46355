"""The red lock: a quorum of independent masters taken in parallel, validity, fail fast,
masters killed, paused, blackholed or restarted empty, cancellation at every step."""

from __future__ import annotations

import asyncio
import random
import time

import anyio
import pytest

import aiolock
from aiolock.testing import RedisServer, TcpProxy
from tests.masters import (
    Connect,
    Servers,
    aiolock_fields,
    busy,
    connect_fixture,  # noqa: F401
    eventually,
    held_anywhere,
    holders,
    servers_fixture,  # noqa: F401
)
from tests.test_multilock import run_multi_worker

NAME = "red"


async def nothing_held(srv: list[RedisServer], owner: str) -> bool:
    return await held_anywhere(srv, [NAME], owner) == []


@pytest.mark.parametrize("masters", [3, 5])
async def test_a_quorum_with_one_owner_id_on_every_master(
    servers: Servers, connect: Connect, masters: int
) -> None:
    srv = servers(masters)
    red = aiolock.red_lock(*connect(srv), name=NAME)
    assert red.quorum == masters // 2 + 1
    async with red:
        owner = red.owner().id
        for server in srv:
            assert await holders(server, NAME) == {owner: 1}
        stats = red.statistics()
        assert stats.held and stats.members_held == masters and stats.quorum == red.quorum
        assert stats.renewed and stats.lease_remaining is not None
        async with red:
            assert red.statistics().hold_count == 2
            assert await red.hold_count() == 2
    assert await nothing_held(srv, owner)
    assert not await red.is_locked()


async def test_excludes_other_owners_and_processes(servers: Servers, connect: Connect) -> None:
    srv = servers(3)
    urls = ",".join(s.url for s in srv)
    clients = connect(srv)
    red = aiolock.red_lock(*clients, name="hammer")
    guard = clients[0].redis
    overlaps = 0

    async def local() -> None:
        nonlocal overlaps
        for _ in range(15):
            async with red:
                if await guard.incr("guard") != 1:
                    overlaps += 1
                await asyncio.sleep(0.001)
                await guard.decr("guard")

    results = await asyncio.gather(
        run_multi_worker("hammer", "red", urls, "3", "15"),
        run_multi_worker("hammer", "red", urls, "3", "15"),
        *(local() for _ in range(3)),
    )
    assert results[0] == ["0", "45"] and results[1] == ["0", "45"]
    assert overlaps == 0


async def test_split_votes_resolve(servers: Servers, connect: Connect) -> None:
    """Many contenders on five masters: they split the masters between them (nobody gets a
    quorum), give them back and try again after a random delay; everybody gets through."""
    srv = servers(5)
    reds = [aiolock.red_lock(*connect(srv), name=NAME) for _ in range(3)]
    inside = entered = 0

    async def worker(red: aiolock.RedLock) -> None:
        nonlocal inside, entered
        for _ in range(6):
            async with red:
                inside += 1
                assert inside == 1
                await asyncio.sleep(0.001)
                inside -= 1
                entered += 1

    async with asyncio.timeout(40):
        await asyncio.gather(*(worker(red) for red in reds for _ in range(3)))
    assert entered == 54


async def test_attempts_run_in_parallel(servers: Servers, connect: Connect) -> None:
    """Every master answers 0.3 s late: one after another would take 0.9 s at least."""
    srv = servers(3)
    proxies = [await TcpProxy.for_url(s.url).start() for s in srv]
    try:
        red = aiolock.red_lock(*connect(proxies), name=NAME)
        async with red:  # connections open
            pass
        for proxy in proxies:
            proxy.delay_replies(0.3)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await red.try_lock()
        assert loop.time() - started < 0.8
        assert red.statistics().members_held == 3
        await red.unlock()
    finally:
        for proxy in proxies:
            await proxy.aclose()


async def test_master_killed_before_acquire_quorum_of_the_others(
    servers: Servers, connect: Connect
) -> None:
    srv = servers(5)
    red = aiolock.red_lock(*connect(srv, reconnect_max_delay=0.1), name=NAME)
    srv[0].kill()
    srv[3].kill()
    assert await red.try_lock(wait_time=2)
    assert red.statistics().members_held == 3
    await red.unlock()
    srv[1].kill()  # now 2 of 5: out of reach, and it says so at once
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(aiolock.RedisOperationError, match="quorum"):
        await red.try_lock(wait_time=10)
    assert loop.time() - started < 5
    assert await nothing_held([srv[2], srv[4]], red.owner().id)


@pytest.mark.parametrize("fault", ["kill", "pause"])
async def test_keeps_its_quorum_with_two_of_three_and_is_lost_at_one(
    servers: Servers, connect: Connect, fault: str
) -> None:
    srv = servers(3)
    clients = connect(srv, watchdog_timeout=0.6, command_timeout=0.3, cleanup_timeout=1)
    red = aiolock.red_lock(*clients, name=NAME)
    await red.lock()
    owner = red.owner().id
    lost = asyncio.Event()
    red.on_lost(lambda error: lost.set())

    def fail(server: RedisServer) -> None:
        server.kill() if fault == "kill" else server.pause()

    fail(srv[0])
    await eventually(lambda: _members_held(red, 2))
    await asyncio.sleep(0.7)  # past another lease: still held by the two others
    stats = red.statistics()
    assert stats.held and not stats.lost and not lost.is_set()
    fail(srv[1])
    async with asyncio.timeout(5):
        await lost.wait()
    stats = red.statistics()
    assert stats.lost and not stats.held and stats.members_held == 1
    with pytest.raises(aiolock.LockLostError):
        await red.unlock()
    assert await nothing_held(srv[2:], owner)


async def _members_held(red: aiolock.RedLock, count: int) -> bool:
    return red.statistics().members_held == count


async def test_paused_master_during_acquire(servers: Servers, connect: Connect) -> None:
    """One master paused (SIGSTOP): the quorum of the two others is enough, at once.
    Two paused: try_lock(wait_time=W) returns within W + command_timeout."""
    srv = servers(3)
    red = aiolock.red_lock(*connect(srv, command_timeout=0.5, cleanup_timeout=0.5), name=NAME)
    async with red:  # connections open
        pass
    owner = red.owner().id
    loop = asyncio.get_running_loop()
    srv[0].pause()
    started = loop.time()
    assert await red.try_lock(wait_time=5)
    assert loop.time() - started < 0.5
    assert red.statistics().members_held == 2
    await red.unlock()
    srv[1].pause()
    for wait in (0, 0.8):
        started = loop.time()
        try:
            taken = await red.try_lock(wait_time=wait)
        except aiolock.RedisOperationError:
            taken = False
        assert not taken
        assert loop.time() - started < wait + 0.5 + 0.3  # W + command_timeout, and slack
    assert await nothing_held(srv[2:], owner)
    srv[0].resume()
    srv[1].resume()
    await eventually(lambda: nothing_held(srv, owner))  # what ran late was given back


async def test_a_blackholed_master_is_not_waited_for(servers: Servers, connect: Connect) -> None:
    srv = servers(3)
    proxies = [await TcpProxy.for_url(s.url).start() for s in srv]
    try:
        red = aiolock.red_lock(*connect(proxies, command_timeout=0.5), name=NAME)
        async with red:
            pass
        proxies[1].blackhole_replies()
        for _ in range(5):
            async with asyncio.timeout(0.4):
                await red.lock()
            assert red.statistics().members_held == 2
            await red.unlock()
        proxies[1].pass_through()
        proxies[1].reset_connections()
        await eventually(lambda: nothing_held(srv, red.owner().id))
        assert await red.try_lock(wait_time=2)
        await red.unlock()
    finally:
        for proxy in proxies:
            await proxy.aclose()


async def test_fails_fast_when_a_quorum_is_held_by_others(
    servers: Servers, connect: Connect
) -> None:
    srv = servers(3)
    red = aiolock.red_lock(*connect(srv), name=NAME)
    for server in srv[:2]:
        await busy(server, NAME, 30)
    assert not await red.try_lock()  # one round, no wait
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert not await red.try_lock(wait_time=0.3)
    assert 0.3 <= loop.time() - started < 2
    assert await nothing_held(srv, red.owner().id)


async def test_no_validity_left_is_no_lock(servers: Servers, connect: Connect) -> None:
    """validity = lease - elapsed - (lease x drift_factor + 2 ms): when the clock drift
    allowed for eats the lease, a quorum is no lock; every master taken is given back."""
    srv = servers(3)
    clients = connect(srv)
    greedy = aiolock.red_lock(*clients, name=NAME, drift_factor=0.99)
    assert not await greedy.try_lock(wait_time=0.1, lease_time=0.1)
    assert await aiolock_fields(srv, [NAME]) == []
    red = aiolock.red_lock(*clients, name=NAME)
    assert await red.try_lock(lease_time=1)
    stats = red.statistics()
    assert not stats.renewed and stats.lease_remaining is not None
    assert stats.lease_remaining <= 1 - 0.01  # the core's own drift margin on each member
    await red.unlock()


async def test_a_master_restarted_empty_gives_the_lock_to_two_owners(
    servers: Servers, connect: Connect
) -> None:
    """The classic objection to Redlock. A holds masters 1 and 2 (master 3 was down when it
    took the lock). Master 2 crashes and restarts empty (no persistence); master 3 is back.
    B takes masters 2 and 3: a quorum. A and B both hold the red lock on the servers. A is
    told as soon as its client is connected to master 2 again (at once, since it holds
    something there) and finds another run_id there: its member is lost, and with it the
    quorum (before issue 19, only A's next renewal told it, and nothing with a lease_time);
    but between the restart and that reconnect, A still believes it holds the lock."""
    srv = servers(3)
    config = {"watchdog_timeout": 1.5, "command_timeout": 0.3, "reconnect_max_delay": 0.1}
    clients_a, clients_b = connect(srv, **config), connect(srv, **config)
    red_a = aiolock.red_lock(*clients_a, name=NAME)
    red_b = aiolock.red_lock(*clients_b, name=NAME)
    a, b = clients_a[0].new_owner(), clients_b[0].new_owner()
    for red, owner in ((red_a, a), (red_b, b)):  # connections open
        await red.lock(owner=owner)
        await red.unlock(owner=owner)
    srv[2].pause()
    assert await red_a.try_lock(wait_time=1, owner=a)
    assert red_a.statistics(owner=a).members_held == 2
    srv[2].resume()
    srv[1].kill()
    srv[1].restart()  # empty
    lost = asyncio.Event()
    red_a.on_lost(lambda error: lost.set(), owner=a)
    assert red_a.statistics(owner=a).held  # nothing told A yet
    assert await red_b.try_lock(wait_time=2, owner=b)  # two holders on the servers
    async with asyncio.timeout(5):
        await lost.wait()
    assert not red_a.statistics(owner=a).held and red_b.statistics(owner=b).held
    with pytest.raises(aiolock.LockLostError):
        await red_a.unlock(owner=a)
    await red_b.unlock(owner=b)


async def test_cancellation_at_every_step_leaves_nothing_held(
    servers: Servers, connect: Connect
) -> None:
    srv = servers(3)
    proxies = [await TcpProxy.for_url(s.url).start() for s in srv]
    try:
        for proxy, delay in zip(proxies, (0.0005, 0.001, 0.003), strict=True):
            proxy.delay_replies(delay)
        clients = connect(proxies)
        red = aiolock.red_lock(*clients, name=NAME)
        rnd = random.Random(11)
        cancelled = 0
        for round_ in range(80):
            owner = clients[0].new_owner()
            if round_ % 3 == 0:
                await busy(srv[round_ % 2], NAME, 0.02)
            task = asyncio.create_task(red.try_lock(wait_time=0.05, owner=owner))
            await asyncio.sleep(rnd.uniform(0, 0.012))
            task.cancel()
            try:
                taken = await task
            except asyncio.CancelledError:
                cancelled += 1
                taken = False
            if taken:
                await red.unlock(owner=owner)
            assert await aiolock_fields(srv, [NAME]) == [], round_
            for client in clients:
                assert not any(client.statistics().holds.values()), round_
        assert cancelled > 10
    finally:
        for proxy in proxies:
            await proxy.aclose()


async def test_anyio_cancel_scope_at_random_moments(servers: Servers, connect: Connect) -> None:
    srv = servers(3)
    clients = connect(srv)
    red = aiolock.red_lock(*clients, name=NAME)
    rnd = random.Random(5)
    for round_ in range(40):
        owner = clients[0].new_owner()
        if round_ % 2:
            await busy(srv[0], NAME, 0.01)
            await busy(srv[1], NAME, 0.01)
        taken = False
        with anyio.move_on_after(rnd.uniform(0, 0.004)):
            await red.lock(owner=owner)
            taken = True
        if taken:
            await red.unlock(owner=owner)
        assert await aiolock_fields(srv, [NAME]) == [], round_


async def test_red_lock_of_fenced_locks(servers: Servers, connect: Connect) -> None:
    """A red lock over fenced locks: each master hands out its own token; they are not one
    sequence (each master's first token is its own clock's reading, a later one its own
    counter's next)."""
    srv = servers(3)
    clients = connect(srv)
    red = aiolock.red_lock(*(c.fenced_lock(NAME) for c in clients))
    assert red.name == NAME
    before = time.time_ns() // 1000
    async with red:
        tokens = [await c.fenced_lock(NAME).get_token() for c in clients]
    after = time.time_ns() // 1000
    assert all(before <= token <= after for token in tokens), tokens


async def test_bad_input(servers: Servers, connect: Connect) -> None:
    srv = servers(2)
    first, second = connect(srv)
    (twin,) = connect(srv[:1])
    with pytest.raises(TypeError, match="name="):
        aiolock.red_lock(first, second)
    with pytest.raises(ValueError):
        aiolock.red_lock(first, second, name="")
    with pytest.raises(ValueError, match="at least one"):
        aiolock.red_lock()
    with pytest.raises(TypeError, match="either"):
        aiolock.red_lock(first, second.lock("x"))
    with pytest.raises(ValueError, match="same lock"):
        aiolock.red_lock(first, twin, name="x")
    with pytest.raises(ValueError, match="same lock"):
        aiolock.red_lock(first, first, name="x")
    with pytest.raises(ValueError, match="same server"):
        aiolock.red_lock(first.lock("x"), first.lock("y"))
    with pytest.raises(ValueError):
        aiolock.red_lock(first, second, name="x", drift_factor=1.5)
    with pytest.raises(TypeError):
        aiolock.red_lock(first, second, name="x", drift_factor="0.01")  # type: ignore[arg-type]
    red = aiolock.red_lock(first, second, name="x")
    assert red.quorum == 2
    with pytest.raises(aiolock.LockNotOwnedError):
        await red.unlock()
