"""Races around an owner's turn on a hold: operations queued behind each other, the
background cleanup of a lost hold, grants that arrive after their own lease. Each test
names its race; the multi-lock and red lock hit them when they release a member and take it
again at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiolock
from aiolock.testing import TcpProxy


async def test_an_operation_waiting_for_the_turn_keeps_the_hold_known(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock]
) -> None:
    """The race: one acquire of an explicit owner gives up (its wait ran out) and ends its
    turn while a second acquire of the same owner waits for that turn. If the first one's
    end forgot the hold, the second took the lock on a hold nobody knew: try_lock said False
    while the server held the lock and the watchdog renewed it forever."""
    other = make_client()
    assert await other.lock("turn").try_lock(lease_time=0.3)
    owner = client.new_owner()
    lock = client.lock("turn")
    first = asyncio.create_task(lock.try_lock(0.1, owner=owner))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(lock.try_lock(5, owner=owner))
    assert not await first
    assert await second
    assert lock.statistics(owner=owner).held
    await lock.unlock(owner=owner)
    assert not await lock.is_locked()
    assert client.statistics().renewals == 0


async def test_a_grant_after_its_lease_leaves_no_stale_count(proxy: TcpProxy) -> None:
    """The reply of an acquire arrives after the lease it asked for ran out: try_lock says
    False and the grant is removed from the server; the owner has nothing to unlock (it was
    never told it held anything), so its next try_lock works at once."""
    async with aiolock.from_url(proxy.url) as client:
        lock = client.lock("late-grant")
        async with lock:  # connections open
            pass
        proxy.delay_replies(0.05)
        assert not await lock.try_lock(lease_time=0.02)
        proxy.pass_through()
        assert not lock.statistics().lost
        assert await lock.try_lock(lease_time=5)
        await lock.unlock()
        assert not any(client.statistics().holds.values())


async def test_a_late_grant_is_removed_before_the_next_try(proxy: TcpProxy) -> None:
    """The race: the first grant of an acquire arrives after its lease, the acquire tries
    again in the same turn and gets a grant in time; the late grant's removal must not run
    after that and purge the new hold (try_lock True, the lock free on the server)."""
    async with aiolock.from_url(proxy.url) as client:
        lock = client.lock("late-then-in-time")
        async with lock:  # connections open
            pass
        owner = client.new_owner()
        proxy.delay_replies(0.08)
        task = asyncio.create_task(lock.try_lock(wait_time=2, lease_time=0.06, owner=owner))
        await asyncio.sleep(0.1)
        proxy.pass_through()
        taken = await task
        await asyncio.sleep(0.01)  # a removal still queued would have run by now
        assert taken == lock.statistics(owner=owner).held
        assert taken == (await lock.hold_count(owner=owner) == 1)
        if taken:
            await lock.unlock(owner=owner)
        assert not any(client.statistics().holds.values())


async def test_a_lost_holds_cleanup_is_not_overtaken_by_the_next_acquire(
    client: aiolock.AioLock,
) -> None:
    """The race: a lease runs out, the owner unlocks (LockLostError) and takes the lock
    again at once. The lost hold's cleanup (remove the owner's counts from the server) is a
    task that queued for the hold's turn only once it ran; the new acquire took the turn
    first, and the cleanup then removed the new hold: held here, free on the server. The
    cleanup now claims the turn when the hold is lost, and the unlock that uses up the last
    lost count waits for it (so the try_lock right after it finds the turn free)."""
    lock = client.lock("overtaken")
    for _ in range(5):
        assert await lock.try_lock(lease_time=0.03)
        await asyncio.sleep(0.04)
        try:
            await lock.unlock()
        except aiolock.LockLostError:
            pass
        assert await lock.try_lock(lease_time=5)
        await asyncio.sleep(0.02)  # a cleanup that came late would have run by now
        assert lock.statistics().held
        assert await lock.hold_count() == 1
        await lock.unlock()
