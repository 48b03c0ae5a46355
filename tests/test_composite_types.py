"""Multi-locks and red locks over every lock type of the core: fair locks, read and write
locks, fenced locks, one owner id across them, sharing where the member shares, and
cancellation that leaves no hold nor any fair-queue place behind."""

from __future__ import annotations

import asyncio
import random

import pytest

import aiolock
from aiolock.keys import fair_queue_key, fair_timeout_key
from aiolock.testing import RedisServer
from tests.masters import (
    Connect,
    Servers,
    aiolock_fields,
    busy,
    connect_fixture,  # noqa: F401
    eventually,
    holders,
    redis_of,
    servers_fixture,  # noqa: F401
)


def mixed(clients: list[aiolock.AioLock]) -> aiolock.MultiLock:
    """A fair lock, a write lock, a read lock and a fenced lock on three servers."""
    first, second, third = clients
    return aiolock.multi_lock(
        first.fair_lock("fair"),
        second.read_write_lock("doc").write_lock(),
        third.read_write_lock("catalog").read_lock(),
        third.fenced_lock("ledger"),
    )


async def test_every_lock_type_under_one_owner(servers: Servers, connect: Connect) -> None:
    srv = servers(3)
    multi = mixed(connect(srv))
    async with multi:
        owner = multi.owner().id
        assert multi.statistics().members_held == 4
        assert (await holders(srv[0], "fair")) == {owner: 1}
        assert (await holders(srv[1], "doc"))[f"{owner}:write"] == 1
        assert (await holders(srv[2], "catalog"))[owner] == 1
        assert (await holders(srv[2], "ledger")) == {owner: 1}
        async with multi:  # reentrant, every type
            assert await multi.hold_count() == 2
    assert not await multi.is_locked()
    assert await aiolock_fields(srv, ["fair", "doc", "catalog", "ledger"]) == []


async def test_exclusive_members_exclude_shared_members_share(
    servers: Servers, connect: Connect
) -> None:
    srv = servers(3)
    mine = mixed(connect(srv))
    their_clients = connect(srv)
    theirs, them = mixed(their_clients), their_clients[0].new_owner()
    readers = aiolock.multi_lock(connect(srv[2:])[0].read_write_lock("catalog").read_lock())
    async with mine:
        assert not await theirs.try_lock(wait_time=0.1, owner=them)  # fair and write: taken
        assert await readers.try_lock()  # the read member is shared
        await readers.unlock()
        waiting = asyncio.create_task(theirs.try_lock(wait_time=5, owner=them))
        await asyncio.sleep(0.05)
        assert not waiting.done()
    assert await waiting
    assert theirs.statistics(owner=them).members_held == 4
    await theirs.unlock(owner=them)
    assert await aiolock_fields(srv, ["fair", "doc", "catalog", "ledger"]) == []


async def test_red_lock_of_write_locks(servers: Servers, connect: Connect) -> None:
    srv = servers(3)
    writers = aiolock.red_lock(*(c.read_write_lock("doc").write_lock() for c in connect(srv)))
    readers = aiolock.red_lock(*(c.read_write_lock("doc").read_lock() for c in connect(srv)))
    async with writers:
        assert writers.statistics().members_held == 3
        assert not await readers.try_lock(wait_time=0.1)
    assert await readers.try_lock()
    assert not await writers.try_lock(wait_time=0.1)
    await readers.unlock()


@pytest.mark.parametrize("kind", ["multi", "red"])
async def test_cancellation_leaves_no_hold_and_no_place_in_line(
    servers: Servers, connect: Connect, kind: str
) -> None:
    """Members are fair locks (a waiter has a place in the queue) and write locks; every
    acquisition is cancelled at a random moment, with a member sometimes held by another
    owner: no hold remains, and no place in a fair queue once the dust settles."""
    srv = servers(3)
    clients = connect(srv)
    if kind == "multi":
        lock = aiolock.multi_lock(
            clients[0].fair_lock("fair"),
            clients[1].read_write_lock("doc").write_lock(),
            clients[2].fair_lock("fair"),
        )
    else:
        lock = aiolock.red_lock(*(c.fair_lock("fair") for c in clients))
    rnd = random.Random(17)
    for round_ in range(60):
        owner = clients[0].new_owner()
        if round_ % 3 == 0:
            await busy(srv[round_ % 2 * 2], "fair", 0.02)
        task = asyncio.create_task(lock.try_lock(wait_time=0.05, owner=owner))
        await asyncio.sleep(rnd.uniform(0, 0.01))
        task.cancel()
        try:
            taken = await task
        except asyncio.CancelledError:
            taken = False
        if taken:
            await lock.unlock(owner=owner)
        assert await aiolock_fields(srv, ["fair", "doc"]) == [], round_
    await eventually(lambda: _no_line(srv))


async def _no_line(srv: list[RedisServer]) -> bool:
    for server in srv:
        async with redis_of(server) as r:
            if await r.exists(fair_queue_key("fair"), fair_timeout_key("fair")):
                return False
    return True
