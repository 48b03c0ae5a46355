"""A hold taken again while the owner's previous hold of the same lock is still being given
back in the background (issue 19, symptom 3).

The owner's operations on one lock take turns on one hold record, background work included
(a release or an undo whose caller left, a lost hold's cleanup). When an acquire queues
behind such work, the grant it gets starts a new generation on that same record; nothing of
the generation before may leak into it. Before the fix the old generation's renewal
registration did: the watchdog took the new hold for one it already renewed, never renewed
it, and the hold ``lock()`` had just returned expired after one lease (``unlock()`` then
raised LockLostError, "no renewal was confirmed in time").

Every case runs on every type the watchdog renews, through a proxy delaying replies (so the
background work is still under way when the next call starts), and ends the same way: the
new hold is renewed past several leases and its unlock frees the lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio

import aiolock
from aiolock.testing import TcpProxy

Kind = Callable[[aiolock.AioLock, str], aiolock.Lock]

KINDS: dict[str, Kind] = {
    "lock": lambda client, name: client.lock(name),
    "fenced_lock": lambda client, name: client.fenced_lock(name),
    "spin_lock": lambda client, name: client.spin_lock(name),
    "fair_lock": lambda client, name: client.fair_lock(name),
    "read_lock": lambda client, name: client.read_write_lock(name).read_lock(),
    "write_lock": lambda client, name: client.read_write_lock(name).write_lock(),
}

#: how late every reply comes while the first operations run: far longer than the callers
#: wait (cancelled after CANCEL_AFTER, then waiting for the background at most CLEANUP)
DELAY = 0.3
CANCEL_AFTER = 0.05
CLEANUP = 0.05
LEASE = 1.0  # watchdog_timeout: renewed every third of it


@pytest.fixture
async def client(proxy: TcpProxy) -> AsyncIterator[aiolock.AioLock]:
    async with aiolock.from_url(
        proxy.url, watchdog_timeout=LEASE, cleanup_timeout=CLEANUP
    ) as lock_client:
        async with lock_client.lock("warm-up"):  # open the connections before faults start
            pass
        yield lock_client


@pytest.fixture(params=sorted(KINDS))
def kind(request: pytest.FixtureRequest) -> Kind:
    return KINDS[request.param]


async def _cancelled(call: Awaitable[object]) -> None:
    """Run ``call`` under ``asyncio.timeout(CANCEL_AFTER)``, which must cut it short."""
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(CANCEL_AFTER):
            await call


async def _cancelled_unlock(lock: aiolock.Lock, proxy: TcpProxy, others: aiolock.Lock) -> None:
    await lock.lock()
    proxy.delay_replies(DELAY)
    await _cancelled(lock.unlock())
    assert lock.statistics().state == "releasing"  # the release goes on in the background


async def _cancelled_acquire(lock: aiolock.Lock, proxy: TcpProxy, others: aiolock.Lock) -> None:
    proxy.delay_replies(DELAY)
    await _cancelled(lock.lock())  # its grant is given back in the background


async def _two_cancelled_unlocks(lock: aiolock.Lock, proxy: TcpProxy, others: aiolock.Lock) -> None:
    await lock.lock()
    await lock.lock()
    proxy.delay_replies(DELAY)
    await _cancelled(lock.unlock())  # one count released in the background
    await _cancelled(lock.unlock())  # the last, queued behind it, in the background too
    assert lock.statistics().state == "held"  # (neither has ended yet)


async def _lost_then_unlocked(lock: aiolock.Lock, proxy: TcpProxy, others: aiolock.Lock) -> None:
    """The hold is force-unlocked by another client; the watchdog finds it gone, and the
    lost hold's cleanup is still under way when the owner's unlock reports the loss."""
    await lock.lock()
    proxy.delay_replies(DELAY)
    assert await others.force_unlock()
    async with asyncio.timeout(5):
        while not lock.statistics().lost:  # noqa: ASYNC110 (no event to wait on)
            await asyncio.sleep(0.01)
    with pytest.raises(aiolock.LockLostError):
        await lock.unlock()  # waits for the cleanup at most cleanup_timeout: not enough


BEFORE = {
    "cancelled unlock": _cancelled_unlock,
    "cancelled acquire": _cancelled_acquire,
    "two cancelled unlocks of a reentrant hold": _two_cancelled_unlocks,
    "a loss whose cleanup outlasts the unlock": _lost_then_unlocked,
}


@pytest.mark.parametrize("before", sorted(BEFORE))
async def test_a_hold_taken_behind_background_work_is_renewed(
    client: aiolock.AioLock,
    proxy: TcpProxy,
    redis_client: redis.asyncio.Redis,
    make_client: Callable[..., aiolock.AioLock],
    kind: Kind,
    before: str,
) -> None:
    """The race: the owner's previous operation on the lock goes on in the background (its
    caller was cancelled, or its cleanup outlasted cleanup_timeout) when ``lock()`` is
    called; the acquire waits for it and is granted on the same hold record. The grant
    must be renewed by the watchdog like any other."""
    lock = kind(client, "generations")
    await BEFORE[before](lock, proxy, kind(make_client(), "generations"))
    assert client.statistics().holds["held"] + client.statistics().holds["releasing"] <= 1
    await lock.lock()  # queued behind the background work, then granted
    proxy.pass_through()
    stats = lock.statistics()
    assert (stats.held, stats.hold_count, stats.renewed) == (True, 1, True)
    assert client.statistics().renewals == 1  # the watchdog renews it
    await asyncio.sleep(LEASE * 1.5)  # past its first lease: only a renewal keeps it
    assert lock.statistics().held
    assert await lock.is_held_by_current_task()
    await lock.unlock()  # LockLostError ("no renewal was confirmed in time") before the fix
    assert not await lock.is_locked()
    assert client.statistics().renewals == 0
    assert not any(client.statistics().holds.values())
    left = await redis_client.keys("*")
    assert not [k for k in left if b"redisson_lock_token" not in k and b"aiolock_requests" not in k]


async def test_an_unlock_queued_behind_a_background_release_is_never_dropped(
    client: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """The race: an unlock finds the owner's previous release still running in the
    background and queues behind it; that takes longer than cleanup_timeout. The unlock
    raises RedisTimeoutError in time, and its release goes on in the background, as a
    release not confirmed in time always does. Before the fix the queued release gave up
    with its caller: the owner kept a count it had unlocked, renewed forever."""
    lock = client.lock("queued-unlock")
    await lock.lock()
    await lock.lock()
    proxy.delay_replies(DELAY)
    await _cancelled(lock.unlock())  # the first count, in the background
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(aiolock.RedisTimeoutError, match="cleanup_timeout"):
        await lock.unlock()
    assert loop.time() - started <= CLEANUP + 0.25  # its bound (generous: no speed asserted)
    async with asyncio.timeout(5):
        while await redis_client.exists("queued-unlock"):  # noqa: ASYNC110 (server state)
            await asyncio.sleep(0.01)
    async with asyncio.timeout(5):
        while any(client.statistics().holds.values()):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert client.statistics().renewals == 0
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.unlock()  # both counts were released


async def test_on_lost_callbacks_of_a_released_hold_do_not_carry_over(
    client: aiolock.AioLock, proxy: TcpProxy, make_client: Callable[..., aiolock.AioLock]
) -> None:
    """The race: a callback registered on a hold released in the background stayed on the
    hold's record, and ran when the owner's next hold, taken on that record, was lost."""
    lock = client.lock("callbacks")
    told: list[str] = []
    await lock.lock()
    lock.on_lost(lambda error: told.append("first"))
    proxy.delay_replies(DELAY)
    await _cancelled(lock.unlock())  # released (in the background): never lost
    await lock.lock()
    proxy.pass_through()
    lock.on_lost(lambda error: told.append("second"))
    assert await make_client().lock("callbacks").force_unlock()
    async with asyncio.timeout(5):  # the watchdog finds it gone
        while not told:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # a second callback due would have run by now
    assert told == ["second"]
    with pytest.raises(aiolock.LockLostError):
        await lock.unlock()
