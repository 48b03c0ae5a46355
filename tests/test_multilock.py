"""The multi-lock: all or nothing over locks on independent servers, one owner id on every
member, a stable order, leases, losses, cancellation at every step, bad input."""

from __future__ import annotations

import asyncio
import random
import sys
import threading
import time
from asyncio.subprocess import PIPE
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

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
    pttl,
    servers_fixture,  # noqa: F401
)

NAMES = ("a", "b", "c")
MULTI_WORKER = Path(__file__).with_name("multilock_worker.py")


async def run_multi_worker(*args: str, limit: float = 60) -> list[str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(MULTI_WORKER), *args, stdout=PIPE, stderr=PIPE
    )
    try:
        async with asyncio.timeout(limit):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    return out.decode().split()


def three(clients: list[aiolock.AioLock]) -> aiolock.MultiLock:
    """The multi-lock of ``a``, ``b``, ``c``, one on each client."""
    return aiolock.multi_lock(*(c.lock(n) for c, n in zip(clients, NAMES, strict=True)))


async def nothing_held(srv: list[RedisServer], owner: str) -> None:
    assert await held_anywhere(srv, NAMES, owner) == []


async def test_all_or_nothing(servers: Servers, connect: Connect) -> None:
    srv = servers(3)
    clients = connect(srv)
    other = connect(srv[1:2])[0]
    multi = three(clients)
    assert await other.lock("b").try_lock()  # another owner holds the middle member
    owner = multi.owner()
    assert not await multi.try_lock()
    await nothing_held(srv, owner.id)
    assert not multi.statistics().held
    assert not any(any(c.statistics().holds.values()) for c in clients)
    await other.lock("b").unlock()
    assert await multi.try_lock()
    assert multi.statistics().held and multi.statistics().members_held == 3
    await multi.unlock()
    await nothing_held(srv, owner.id)


async def test_reentrant_with_one_owner_id_on_every_server(
    servers: Servers, connect: Connect
) -> None:
    srv = servers(3)
    multi = three(connect(srv))
    async with multi:
        async with multi:
            owner = multi.owner().id
            for server, name in zip(srv, NAMES, strict=True):
                assert await holders(server, name) == {owner: 2}
            assert multi.statistics().hold_count == 2
            assert await multi.hold_count() == 2
        assert await multi.is_held_by_current_task()
        assert await multi.is_locked()
    assert not await multi.is_locked()
    await nothing_held(srv, owner)
    with pytest.raises(aiolock.LockNotOwnedError):
        await multi.unlock()


async def test_members_on_one_client_and_fenced_members(servers: Servers, connect: Connect) -> None:
    (server,) = servers(1)
    (client,) = connect([server])
    multi = aiolock.multi_lock(client.fenced_lock("ledger"), client.lock("account"))
    before = time.time_ns() // 1000
    async with multi:
        stats = multi.statistics()
        assert stats.held and [m.name for m in stats.members] == ["account", "ledger"]
        token = await client.fenced_lock("ledger").get_token()
    # the member took its first token: the server's clock in microseconds at the grant
    assert before <= token <= time.time_ns() // 1000
    assert not await multi.is_locked()


async def test_lease_time_is_each_members_lease(servers: Servers, connect: Connect) -> None:
    srv = servers(3)
    multi = three(connect(srv))
    assert await multi.try_lock(wait_time=1, lease_time=2)
    stats = multi.statistics()
    assert not stats.renewed
    assert stats.lease_remaining is not None and 1.5 < stats.lease_remaining <= 2
    for server, name in zip(srv, NAMES, strict=True):
        assert 1500 < await pttl(server, name) <= 2000
    await multi.unlock()


async def test_starts_over_when_an_early_members_lease_would_run_out(
    servers: Servers, connect: Connect
) -> None:
    """The last member is busy for longer than the lease: the members taken first would
    expire while it waits, so the acquisition releases them and starts over; it succeeds
    once the last member is free, with every member's lease fresh."""
    srv = servers(3)
    clients = connect(srv)
    other = connect(srv[2:])[0]
    assert await other.lock("c").try_lock(lease_time=0.8)
    multi = three(clients)
    assert await multi.try_lock(wait_time=5, lease_time=0.3)
    stats = multi.statistics()
    assert stats.held and stats.lease_remaining is not None and stats.lease_remaining > 0
    for server, name in zip(srv, NAMES, strict=True):
        assert await pttl(server, name) > 0
    await multi.unlock()


async def test_wait_time_bounds_the_whole_acquisition(servers: Servers, connect: Connect) -> None:
    srv = servers(3)
    clients = connect(srv, command_timeout=1)
    other = connect(srv[2:])[0]
    assert await other.lock("c").try_lock()
    multi = three(clients)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert not await multi.try_lock(wait_time=0.3)
    assert loop.time() - started < 0.3 + 1
    await nothing_held(srv, multi.owner().id)


async def test_no_deadlock_between_multi_locks_given_in_opposite_orders(
    servers: Servers, connect: Connect
) -> None:
    srv = servers(3)
    first, second = connect(srv), connect(srv)
    forward = three(first)
    pairs = list(zip(second, NAMES, strict=True))
    backward = aiolock.multi_lock(*(c.lock(n) for c, n in reversed(pairs)))
    inside = entered = 0

    async def worker(multi: aiolock.MultiLock) -> None:
        nonlocal inside, entered
        for _ in range(8):
            async with multi:
                inside += 1
                assert inside == 1
                await asyncio.sleep(0.001)
                inside -= 1
                entered += 1

    async with asyncio.timeout(30):
        await asyncio.gather(*(worker(m) for m in (forward, backward) for _ in range(4)))
    assert entered == 64


async def test_excludes_other_processes(servers: Servers, connect: Connect) -> None:
    srv = servers(3)
    urls = ",".join(s.url for s in srv)
    clients = connect(srv)
    multi = aiolock.multi_lock(*(c.lock(f"hammer:{i}") for i, c in enumerate(clients)))
    guard = clients[0].redis
    overlaps = 0

    async def local() -> None:
        nonlocal overlaps
        for _ in range(15):
            async with multi:
                if await guard.incr("guard") != 1:
                    overlaps += 1
                await asyncio.sleep(0.001)
                await guard.decr("guard")

    results = await asyncio.gather(
        run_multi_worker("hammer", "multi", urls, "3", "15"),
        run_multi_worker("hammer", "multi", urls, "3", "15"),
        local(),
        local(),
    )
    assert results[0] == ["0", "45"] and results[1] == ["0", "45"]
    assert overlaps == 0


# -- servers failing ---------------------------------------------------------------------------


async def test_server_killed_before_acquire_fails_cleanly(
    servers: Servers, connect: Connect
) -> None:
    srv = servers(3)
    multi = three(connect(srv, command_timeout=0.5, reconnect_max_delay=0.1))
    owner = multi.owner().id
    srv[2].kill()
    with pytest.raises(aiolock.RedisOperationError):
        await multi.try_lock(wait_time=1)
    await nothing_held(srv, owner)
    assert not multi.statistics().held


async def test_server_paused_during_acquire_fails_within_the_bound(
    servers: Servers, connect: Connect
) -> None:
    srv = servers(3)
    multi = three(connect(srv, command_timeout=0.5, cleanup_timeout=0.5))
    owner = multi.owner().id
    async with multi:  # connections open
        pass
    srv[1].pause()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(aiolock.RedisOperationError):
        await multi.try_lock(wait_time=0.5)
    assert loop.time() - started < 0.5 + 0.5 + 0.5  # W + command_timeout, and slack
    await nothing_held([srv[0], srv[2]], owner)
    srv[1].resume()  # the attempt queued on b runs now; the core gives it back
    await eventually(lambda: _nothing(srv, owner))


@pytest.mark.parametrize("fault", ["kill", "pause"])
async def test_server_lost_while_held_loses_the_multi_lock(
    servers: Servers, connect: Connect, fault: str
) -> None:
    """Member ``b``'s server dies (kill -9) or stops (SIGSTOP) while held: b's lease runs out
    unrenewed, the multi-lock is reported lost, and unlock releases a and c and says so."""
    srv = servers(3)
    multi = three(
        connect(
            srv,
            watchdog_timeout=0.6,
            command_timeout=0.3,
            cleanup_timeout=1,
            reconnect_max_delay=0.1,
        )
    )
    owner = multi.owner().id
    await multi.lock()
    lost = asyncio.Event()
    errors: list[aiolock.LockLostError] = []

    def on_lost(error: aiolock.LockLostError) -> None:
        errors.append(error)
        lost.set()

    multi.on_lost(on_lost)
    srv[1].kill() if fault == "kill" else srv[1].pause()
    async with asyncio.timeout(5):
        await lost.wait()
    assert isinstance(errors[0], aiolock.LockLostError)
    stats = multi.statistics()
    assert stats.lost and not stats.held and stats.members_held == 2
    with pytest.raises(aiolock.LockLostError):
        await multi.unlock()
    assert await held_anywhere([srv[0], srv[2]], NAMES, owner) == []
    assert not multi.statistics().lost  # every count unlocked: usable again
    if fault == "pause":
        srv[1].resume()
    else:
        srv[1].restart()
    assert await multi.try_lock(wait_time=5)
    await multi.unlock()


async def test_guard_cancels_the_body_when_a_member_is_lost(
    servers: Servers, connect: Connect
) -> None:
    srv = servers(3)
    clients = connect(srv, watchdog_timeout=0.6, command_timeout=0.3)
    multi = three(clients)
    with pytest.raises(aiolock.LockLostError):
        async with multi.guard():
            await clients[0].lock("a").force_unlock()  # taken from under us
            await asyncio.sleep(5)
    await nothing_held(srv, multi.owner().id)


# -- cancellation ------------------------------------------------------------------------------


async def test_cancellation_at_every_step_leaves_nothing_held(
    servers: Servers, connect: Connect
) -> None:
    """Cancelled after a random delay, with replies delayed a little and member b sometimes
    held by someone else: either the multi-lock was taken (and is then unlocked), or no
    member is held anywhere, on the servers or in the clients."""
    srv = servers(3)
    proxies = [await TcpProxy.for_url(s.url).start() for s in srv]
    try:
        for proxy in proxies:
            proxy.delay_replies(0.001)
        clients = connect(proxies)
        multi = three(clients)
        rnd = random.Random(13)
        outcomes = {"taken": 0, "cancelled": 0}
        for round_ in range(80):
            owner = clients[0].new_owner()
            contended = round_ % 3 == 0
            if contended:
                await busy(srv[1], "b", 0.02)
            task = asyncio.create_task(multi.try_lock(wait_time=0.05, owner=owner))
            await asyncio.sleep(rnd.uniform(0, 0.012))
            task.cancel()
            try:
                taken = await task
            except asyncio.CancelledError:
                outcomes["cancelled"] += 1
                taken = False
            if taken:
                outcomes["taken"] += 1
                await multi.unlock(owner=owner)
            assert await aiolock_fields(srv, NAMES) == [], round_
            assert multi.statistics(owner=owner).members_held == 0
            for client in clients:
                assert not any(client.statistics().holds.values()), round_
        assert outcomes["cancelled"] > 10
    finally:
        for proxy in proxies:
            await proxy.aclose()


async def test_anyio_cancel_scope_at_random_moments(servers: Servers, connect: Connect) -> None:
    """anyio cancels again and again until the scope is left: cleanup must be shielded."""
    srv = servers(3)
    clients = connect(srv)
    multi = three(clients)
    rnd = random.Random(7)
    for round_ in range(40):
        owner = clients[0].new_owner()
        if round_ % 2:
            await busy(srv[2], "c", 0.01)
        taken = False
        with anyio.move_on_after(rnd.uniform(0, 0.004)):
            await multi.lock(owner=owner)
            taken = True
        if taken:
            await multi.unlock(owner=owner)
        assert await aiolock_fields(srv, NAMES) == [], round_


async def test_a_task_that_ends_holding_it_releases_every_member(
    servers: Servers, connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    srv = servers(3)
    multi = three(connect(srv))

    async def forgetful() -> str:
        await multi.lock()
        return multi.owner().id

    owner = await asyncio.create_task(forgetful())
    await eventually(lambda: _nothing(srv, owner))
    assert "ended holding" in caplog.text


async def _nothing(srv: list[RedisServer], owner: str) -> bool:
    return await held_anywhere(srv, NAMES, owner) == []


async def test_explicit_owner_passes_between_tasks(servers: Servers, connect: Connect) -> None:
    srv = servers(3)
    clients = connect(srv)
    multi = three(clients)
    owner = clients[1].new_owner()
    await asyncio.create_task(multi.lock(owner=owner))
    assert multi.statistics(owner=owner).held
    assert not multi.statistics().held  # not the current task's
    for server, name in zip(srv, NAMES, strict=True):
        assert await holders(server, name) == {owner.id: 1}
    await asyncio.create_task(multi.unlock(owner=owner))
    await nothing_held(srv, owner.id)


async def test_a_member_held_directly_by_the_task_is_refused(
    servers: Servers, connect: Connect
) -> None:
    """The task's multi-lock owner is not the task's own owner, so taking a member the task
    holds itself would wait for itself: refused at once. With one explicit owner for both,
    it re-enters."""
    srv = servers(3)
    clients = connect(srv)
    multi = three(clients)
    async with clients[1].lock("b"):
        with pytest.raises(aiolock.LockUsageError):
            await multi.try_lock(wait_time=5)
    owner = clients[1].new_owner()  # the client of the direct hold's
    await clients[1].lock("b").lock(owner=owner)
    assert await multi.try_lock(owner=owner)
    assert await holders(srv[1], "b") == {owner.id: 2}
    await multi.unlock(owner=owner)
    await clients[1].lock("b").unlock(owner=owner)
    await nothing_held(srv, owner.id)


async def test_nested_multi_locks_under_different_owners_are_refused(
    servers: Servers, connect: Connect
) -> None:
    """A task's multi-lock owner is per client of the first member: two multi-locks sharing
    member y, whose first members are on different clients, have different owners; the
    second would wait for the first: refused at once."""
    srv = sorted(servers(3), key=lambda s: f"{s.host}:{s.port}")
    first, middle, last = connect(srv)
    outer = aiolock.multi_lock(first.lock("x"), middle.lock("y"))
    inner = aiolock.multi_lock(middle.lock("y"), last.lock("z"))
    same_first = aiolock.multi_lock(first.lock("w"), middle.lock("y"))
    assert outer.owner().id != inner.owner().id and outer.owner().id == same_first.owner().id
    async with outer:
        with pytest.raises(aiolock.LockUsageError, match="another multi-lock"):
            await inner.try_lock(wait_time=5)
        async with same_first:  # the same owner: y is re-entered
            assert await holders(srv[1], "y") == {outer.owner().id: 2}
    assert await inner.try_lock()
    await inner.unlock()


# -- bad input -------------------------------------------------------------------------------


async def test_bad_input_fails_before_any_redis_call(servers: Servers, connect: Connect) -> None:
    srv = servers(2)
    first, second = connect(srv)
    with pytest.raises(ValueError, match="at least one"):
        aiolock.multi_lock()
    with pytest.raises(ValueError, match="same lock"):
        aiolock.multi_lock(first.lock("x"), first.lock("x"))
    (twin,) = connect(srv[:1])
    with pytest.raises(ValueError, match="same lock"):
        aiolock.multi_lock(first.lock("x"), twin.lock("x"))
    with pytest.raises(TypeError):
        aiolock.multi_lock("x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        aiolock.multi_lock(first)  # type: ignore[arg-type]
    multi = aiolock.multi_lock(first.lock("x"), second.lock("x"))
    with pytest.raises(ValueError):
        await multi.try_lock(wait_time=-1)
    with pytest.raises(ValueError):
        await multi.try_lock(lease_time=0)
    with pytest.raises(TypeError):
        await multi.try_lock(owner="me")  # type: ignore[arg-type]
    with pytest.raises(aiolock.LockNotOwnedError):
        await multi.unlock()
    with pytest.raises(aiolock.LockNotOwnedError):
        multi.on_lost(lambda error: None)
    (closed,) = connect(srv[1:])
    await closed.aclose()
    with pytest.raises(aiolock.ClientClosedError):
        await aiolock.multi_lock(first.lock("y"), closed.lock("y")).try_lock()
    assert await held_anywhere(srv, ["x", "y"], multi.owner().id) == []


async def test_members_on_another_event_loop_are_refused(
    servers: Servers, connect: Connect
) -> None:
    srv = servers(2)
    (here,) = connect(srv[:1])
    elsewhere = aiolock.from_url(srv[1].url)
    other_loop = asyncio.new_event_loop()

    def on_the_other_loop(coro: Coroutine[Any, Any, Any]) -> None:
        thread = threading.Thread(target=other_loop.run_until_complete, args=(coro,))
        thread.start()
        thread.join()

    async def use() -> None:
        assert await elsewhere.lock("warm").try_lock()
        await elsewhere.lock("warm").unlock()

    on_the_other_loop(use())
    try:
        multi = aiolock.multi_lock(here.lock("x"), elsewhere.lock("x"))
        with pytest.raises(aiolock.WrongEventLoopError):
            await multi.try_lock()
        assert await held_anywhere(srv, ["x"], multi.owner().id) == []
    finally:
        on_the_other_loop(elsewhere.aclose())
        other_loop.close()


async def test_an_owner_of_no_member_client_is_refused(servers: Servers, connect: Connect) -> None:
    """A composite hands its owner to every member's client, so the owner must belong to one
    of them: another client's is refused (ValueError, before any I/O), and so is a
    member's owner used directly on another client (attack finding A1)."""
    srv = servers(3)
    clients = connect(srv)
    (stranger,) = connect(srv[:1])
    multi = three(clients)
    foreign = stranger.new_owner()
    with pytest.raises(ValueError, match=foreign.id):
        await multi.try_lock(owner=foreign)
    with pytest.raises(ValueError, match=foreign.id):
        multi.statistics(owner=foreign)
    with pytest.raises(ValueError, match=foreign.id):
        await multi.unlock(owner=foreign)
    await nothing_held(srv, foreign.id)
    owner = clients[2].new_owner()
    assert await multi.try_lock(owner=owner)
    with pytest.raises(ValueError, match="another aiolock client"):
        await stranger.lock("a").try_lock(owner=owner)  # its member on another client
    with pytest.raises(ValueError, match="another aiolock client"):
        await stranger.lock("a").try_lock(owner=multi.owner())  # the task's, of a member's
    await multi.unlock(owner=owner)
    await nothing_held(srv, owner.id)
