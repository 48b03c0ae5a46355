"""An owner takes a lock again while its previous release is still settled in the background
(found by the fault campaign, ``tests/chaos``: two holders of one lock).

An ``unlock()`` whose reply does not come within ``cleanup_timeout`` (the server paused for
writes, down, or a request held up on the way) raises, and its release is settled in the
background, in the owner's turn on the hold. The same task's next ``lock()`` queues for that
turn. Before the fix it could come out of the turn with the old generation still on the
server, under the same owner id:

* the background settlement, finding the release unconfirmed, marked the hold lost and
  queued its cleanup (remove the owner's counts) for the turn *behind* the ``lock()``
  already waiting there; the ``lock()`` re-entered the old, never-released hold (count 2),
  and the cleanup then removed both: the lock free on the server, held (and "renewed") here;
* a release that could not be fenced made later holds write a fresh owner id
  (``Leases.taint``), but the ``lock()`` waiting on the same hold record wrote the old one
  again, which the late release then matched and deleted.

Whatever the order of events, the hold ``lock()`` returns must be a real, renewed, exclusive
hold once every background settlement has ended; the cases run on every lock type of the
shared loop, with real faults (CLIENT PAUSE WRITE, a proxy that holds a request and delivers
it after its client was reset, a server killed and restarted empty), and on a red lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio

import aiolock
from aiolock.testing import RedisServer, TcpProxy, acl_user
from tests.masters import (
    Connect,
    Servers,
    connect_fixture,  # noqa: F401
    holders,
    servers_fixture,  # noqa: F401
)

#: (the lock, another client's lock that the first one excludes); a reader excludes writers
Kind = Callable[[aiolock.AioLock, str], aiolock.Lock]
KINDS: dict[str, tuple[Kind, Kind]] = {
    "lock": (lambda c, n: c.lock(n), lambda c, n: c.lock(n)),
    "fenced_lock": (lambda c, n: c.fenced_lock(n), lambda c, n: c.fenced_lock(n)),
    "spin_lock": (lambda c, n: c.spin_lock(n), lambda c, n: c.spin_lock(n)),
    "fair_lock": (lambda c, n: c.fair_lock(n), lambda c, n: c.fair_lock(n)),
    "read_lock": (
        lambda c, n: c.read_write_lock(n).read_lock(),
        lambda c, n: c.read_write_lock(n).write_lock(),
    ),
    "write_lock": (
        lambda c, n: c.read_write_lock(n).write_lock(),
        lambda c, n: c.read_write_lock(n).write_lock(),
    ),
}

NAME = "relock"
#: the campaign's timeouts: a release not confirmed within a second is left to the background
CONFIG = {"command_timeout": 0.5, "cleanup_timeout": 1.0, "watchdog_timeout": 1.5}


@pytest.fixture(params=sorted(KINDS))
def kind(request: pytest.FixtureRequest) -> tuple[Kind, Kind]:
    return KINDS[request.param]


@pytest.fixture
async def control(fresh_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(fresh_server.url)
    try:
        yield client
    finally:
        await client.aclose()


async def settled(client: aiolock.AioLock, within: float = 10) -> None:
    """Wait until the client has no background work left (a settlement, a cleanup)."""
    async with asyncio.timeout(within):
        while client.statistics().background_tasks:  # noqa: ASYNC110 (no event to wait on)
            await asyncio.sleep(0.01)


async def assert_exclusive(
    client: aiolock.AioLock,
    lock: aiolock.Lock,
    other: aiolock.Lock,
    owner: aiolock.Owner | None = None,
) -> None:
    """The hold ``lock()`` just returned is real, renewed and exclusive, now and once every
    background settlement of the owner's earlier hold has ended; its unlock frees the lock."""
    stats = lock.statistics(owner=owner)
    assert (stats.held, stats.hold_count, stats.renewed) == (True, 1, True)
    await settled(client)
    stats = lock.statistics(owner=owner)
    assert (stats.held, stats.lost, stats.hold_count) == (True, False, 1)
    assert await lock.hold_count(owner=owner) == 1  # on the server, under the id it writes
    assert not await other.try_lock()  # another client is still kept out
    await asyncio.sleep(CONFIG["watchdog_timeout"])  # past one lease: renewed, not expired
    assert lock.statistics(owner=owner).held
    await lock.unlock(owner=owner)  # LockLostError before the fix (when it said held)
    assert await other.try_lock()
    await other.unlock()


async def test_a_relock_behind_a_release_left_to_the_background_under_client_pause(
    fresh_server: RedisServer,
    control: redis.asyncio.Redis,
    make_client: Callable[..., aiolock.AioLock],
    kind: tuple[Kind, Kind],
) -> None:
    """The race: ``unlock()`` under ``CLIENT PAUSE WRITE`` gives up after cleanup_timeout
    (its release sent twice: the first link dropped and fenced, the second unanswered) and
    the release goes on in the background; ``lock()`` queues for the owner's turn behind
    it. The settlement then found the release unconfirmed, lost the hold and queued its
    cleanup behind the ``lock()``: the ``lock()`` re-entered the old hold (count 2) once the
    pause ended, and the cleanup deleted it while ``lock()`` said held and renewed."""
    mine, theirs = kind
    client = make_client(fresh_server.url, **CONFIG)
    lock, other = mine(client, NAME), theirs(make_client(fresh_server.url), NAME)
    await lock.lock()
    await control.client_pause(1100, all=False)  # CLIENT PAUSE 1100 WRITE
    with pytest.raises(aiolock.RedisOperationError):
        await lock.unlock()  # not confirmed within cleanup_timeout
    await lock.lock()  # waits for the settlement, then a real hold
    await assert_exclusive(client, lock, other)


async def test_a_release_delivered_late_cannot_match_the_next_hold(
    fresh_server: RedisServer,
    make_client: Callable[..., aiolock.AioLock],
    kind: tuple[Kind, Kind],
) -> None:
    """The race: the release's request is held up on the way (its client reset, the request
    kept and delivered later) and cannot be fenced (this user may not CLIENT KILL), so the
    owner is to write a fresh owner id from now on (``Leases.taint``); the ``lock()`` queued
    on the same hold record wrote the old id anyway, and the release, delivered after that,
    found the count it expected (1) and deleted the new hold."""
    mine, theirs = kind
    # Redis 6.2 cannot take a subcommand away: no CLIENT but the subcommands aiolock needs
    rules = ("~*", "&*", "+@all", "-client", "+client|info", "+client|setname", "+client|id")
    with acl_user(fresh_server.url, "no-kill", *rules) as url:
        async with TcpProxy.for_url(url) as proxy:
            client = make_client(proxy.url, **CONFIG)
            lock, other = mine(client, NAME), theirs(make_client(fresh_server.url), NAME)
            owner = client.new_owner()  # the unlock runs in a task of its own
            await lock.lock(owner=owner)
            proxy.hold_requests()
            unlock = asyncio.create_task(lock.unlock(owner=owner))
            async with asyncio.timeout(5):
                await proxy.wait_for_held_requests()  # the release is in the proxy
            proxy.reset_client_side()  # the link drops; the release stays held
            with pytest.raises(aiolock.AioLockError):
                await unlock
            await lock.lock(owner=owner)
            assert await proxy.release_held_requests()  # the old release runs now (and a PING)
            await assert_exclusive(client, lock, other, owner)


async def test_a_relock_behind_a_release_whose_server_restarted(
    fresh_server: RedisServer,
    make_client: Callable[..., aiolock.AioLock],
    kind: tuple[Kind, Kind],
) -> None:
    """The race: the server stops answering (SIGSTOP) while ``unlock()`` waits, the unlock
    gives up and leaves its release to the background, then the server is killed and
    restarted empty; the release's link drops, the hold is lost and its cleanup queued
    behind the ``lock()`` already waiting for the turn, which took the lock on the new
    server and was then removed by that cleanup (the chaos campaign's plain lock overlap)."""
    mine, theirs = kind
    client = make_client(fresh_server.url, **CONFIG)
    lock, other = mine(client, NAME), theirs(make_client(fresh_server.url), NAME)
    owner = client.new_owner()  # the lock() runs in a task of its own
    await lock.lock(owner=owner)
    fresh_server.pause()
    with pytest.raises(aiolock.RedisOperationError):
        await lock.unlock(owner=owner)
    relock = asyncio.create_task(lock.lock(owner=owner))  # queued behind the release
    await asyncio.sleep(0.05)
    fresh_server.kill()
    fresh_server.restart()
    async with asyncio.timeout(10):
        await relock
    await assert_exclusive(client, lock, other, owner)


async def test_a_red_lock_member_relocked_behind_a_background_release(
    servers: Servers, connect: Connect
) -> None:
    """The race, on a red lock: one master is paused for writes while the red lock is
    unlocked; that member's release is left to the background, and the red lock is taken
    again at once while another client holds the third master's lock, so the quorum needs
    the paused member again: the red lock waits for it and takes it once its turn comes.
    That member's cleanup then removed its new hold, and another owner could hold a quorum
    at the same time (the campaign's red lock overlaps, right after a CLIENT PAUSE ended)."""
    srv = servers(3)
    mine = connect(srv, **CONFIG)
    others = connect(srv)
    red = aiolock.red_lock(*mine, name=NAME)
    await red.lock()
    paused = redis.asyncio.Redis.from_url(srv[0].url)
    try:
        await paused.client_pause(1100, all=False)  # CLIENT PAUSE 1100 WRITE
    finally:
        await paused.aclose()
    # The two other members' releases make a quorum: the red lock was held to the end. The
    # paused member's release is left to the background after cleanup_timeout.
    await red.unlock()
    blocker = others[2].lock(NAME)
    await blocker.lock()
    await red.lock()  # the quorum: the first two masters, the paused one once it may
    for client in mine:
        await settled(client)
    assert red.statistics().held
    who = red.owner()
    # (a member's client refuses the red lock's owner for direct calls: it is another
    # client's; the red lock's own statistics and the servers tell)
    assert sum(1 for member in red.statistics().members if member.held) == 2
    for index in (0, 1):
        # each member the red lock needs is held by its owner on its server, by no one else
        assert await holders(srv[index], NAME) == {who.id: 1}
        assert not await others[index].lock(NAME).try_lock()
    await blocker.unlock()
    rival = aiolock.red_lock(*others, name=NAME)
    assert not await rival.try_lock()  # no quorum for another owner
    await red.unlock()
    assert await rival.try_lock()
    await rival.unlock()
    for server in srv:
        assert await holders(server, NAME) == {}
