"""The read-write lock: readers together, writers alone, downgrade, a reader asking for the
write lock, read holds renewed and lost like any hold, and the lease of the hash.

The write lock also runs the behaviour suite of every exclusive lock
(tests/test_lock_family.py); Redisson interop is in tests/test_interop.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio

import aiolock
from tests.peers import Peers


async def eventually(check: Callable[[], Awaitable[object]], within: float = 10) -> None:
    """Poll state on the server (no event to wait on there) until ``check`` is true."""
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def _true(value: bool) -> bool:
    return value


async def script_calls(redis_client: redis.asyncio.Redis) -> int:
    stats = await redis_client.info("commandstats")
    return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("evalsha", "eval"))


def timeout_key(name: str, owner: str, hold: int) -> str:
    return f"{{{name}}}:{owner}:rwlock_timeout:{hold}"


class Holders:
    """Tasks that take a lock, say so, and hold it until let go."""

    def __init__(self) -> None:
        self.inside: set[int] = set()
        self.entered: list[int] = []
        self.let_go: dict[int, asyncio.Event] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}

    def start(self, index: int, lock: aiolock.Lock) -> None:
        self.let_go[index] = asyncio.Event()
        self.tasks[index] = asyncio.create_task(self._run(index, lock))

    async def _run(self, index: int, lock: aiolock.Lock) -> None:
        async with lock:
            self.inside.add(index)
            self.entered.append(index)
            try:
                await self.let_go[index].wait()
            finally:
                self.inside.discard(index)

    async def release(self, *indexes: int) -> None:
        for index in indexes:
            self.let_go[index].set()
        await asyncio.gather(*(self.tasks[i] for i in indexes))


# -- sharing and excluding -----------------------------------------------------------------------


async def test_readers_share_while_a_writer_waits_then_the_writer_gets_it(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock]
) -> None:
    rw = client.read_write_lock("shared")
    other = make_client().read_write_lock("shared")
    holders = Holders()
    for i in range(3):
        holders.start(i, (rw, other)[i % 2].read_lock())
    await eventually(lambda: _true(holders.inside == {0, 1, 2}))
    holders.start(10, rw.write_lock())
    await asyncio.sleep(0.1)
    assert 10 not in holders.inside
    # a new reader still comes in while the writer waits (Redisson's rule; see docs/locks.md)
    holders.start(3, other.read_lock())
    await eventually(lambda: _true(3 in holders.inside))
    await holders.release(0, 1, 2)
    assert 10 not in holders.inside
    await holders.release(3)
    await eventually(lambda: _true(holders.inside == {10}))
    assert await rw.mode() == "write"
    await holders.release(10)
    assert await rw.mode() is None


async def test_a_writer_excludes_readers_and_its_unlock_lets_them_all_in(
    client: aiolock.AioLock,
    make_client: Callable[..., aiolock.AioLock],
    redis_client: redis.asyncio.Redis,
) -> None:
    rw = client.read_write_lock("exclusive")
    writer = rw.write_lock()
    assert await writer.try_lock(lease_time=30)
    others = [make_client().read_write_lock("exclusive") for _ in range(2)]
    holders = Holders()
    for i in range(6):
        holders.start(i, others[i % 2].read_lock())
    await asyncio.sleep(0.2)
    assert not holders.inside
    assert not await asyncio.create_task(rw.write_lock().try_lock())
    before = await script_calls(redis_client)
    await writer.unlock()  # publishes "1": every waiting reader re-checks at once
    await eventually(lambda: _true(len(holders.inside) == 6), within=5)
    assert await script_calls(redis_client) - before <= 1 + 6
    await holders.release(*range(6))
    assert not await redis_client.keys("*")


async def test_readers_and_writers_of_many_clients_never_overlap(
    client: aiolock.AioLock,
    make_client: Callable[..., aiolock.AioLock],
    redis_client: redis.asyncio.Redis,
) -> None:
    """3 clients x (4 readers + 1 writer), 10 rounds each: a writer is always alone, readers
    only ever share with readers, and readers did overlap."""
    readers = writers = most_readers = 0
    name = "hammer"

    async def reader(lock: aiolock.ReadLock) -> None:
        nonlocal readers, most_readers
        for _ in range(10):
            async with lock:
                assert writers == 0
                readers += 1
                most_readers = max(most_readers, readers)
                await asyncio.sleep(0.002)
                readers -= 1

    async def writer(lock: aiolock.WriteLock) -> None:
        nonlocal writers
        for _ in range(10):
            async with lock:
                assert writers == 0 and readers == 0
                writers += 1
                await asyncio.sleep(0.002)
                writers -= 1

    clients = [client, make_client(), make_client()]
    tasks = []
    for each in clients:
        rw = each.read_write_lock(name)
        tasks += [reader(rw.read_lock()) for _ in range(4)] + [writer(rw.write_lock())]
    async with asyncio.timeout(30):
        await asyncio.gather(*tasks)
    assert most_readers > 1
    assert not await redis_client.keys("*")


# -- downgrade, upgrade ----------------------------------------------------------------------------


async def test_downgrade_keeps_reading_and_wakes_waiting_readers(
    client: aiolock.AioLock,
    make_client: Callable[..., aiolock.AioLock],
    redis_client: redis.asyncio.Redis,
) -> None:
    """The writer takes the read lock, then unlocks the write lock: it keeps reading, and the
    readers waiting for the writer come in at once (Redisson's downgrade publishes nothing:
    they wait until their timer, up to the lease)."""
    rw = client.read_write_lock("downgrade")
    write, read = rw.write_lock(), rw.read_lock()
    await write.lock()  # watchdog lease: 30 s
    await read.lock()
    others = Holders()
    other = make_client().read_write_lock("downgrade")
    for i in range(3):
        others.start(i, other.read_lock())
    await asyncio.sleep(0.2)
    assert not others.inside
    downgraded = time.monotonic()
    await write.unlock()
    await eventually(lambda: _true(len(others.inside) == 3))
    assert time.monotonic() - downgraded < 5
    assert await rw.mode() == "read"
    assert read.statistics().held and not write.statistics().held
    assert not await asyncio.create_task(other.write_lock().try_lock())
    await read.unlock()
    await others.release(0, 1, 2)
    assert not await redis_client.keys("*")


async def test_a_reader_asking_for_the_write_lock_is_refused_at_once(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    rw = client.read_write_lock("upgrade")
    async with rw.read_lock():
        before = await script_calls(redis_client)
        for call in (rw.write_lock().lock(), rw.write_lock().try_lock(wait_time=5)):
            with pytest.raises(aiolock.LockUsageError, match="read lock"):
                await call
        assert await script_calls(redis_client) == before  # refused before any Redis call
        assert rw.write_lock().statistics().state is None
    assert not await redis_client.exists("upgrade")


async def test_a_reader_unknown_to_this_client_is_refused_by_the_server(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    """The owner's read hold is on the server only (say, its client restarted with the same
    id): the write script sees it and refuses instead of waiting for it."""
    rw = client.read_write_lock("upgrade-remote")
    owner = client.new_owner()
    await redis_client.hset("upgrade-remote", mapping={"mode": "read", owner.id: 1})
    await redis_client.pexpire("upgrade-remote", 30_000)
    started = time.monotonic()
    with pytest.raises(aiolock.LockUsageError):
        await rw.write_lock().try_lock(wait_time=5, owner=owner)
    assert time.monotonic() - started < 4  # refused at once, not after waiting wait_time
    assert not any(client.statistics().holds.values())


async def test_a_writer_may_read_and_reenter_both(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    rw = client.read_write_lock("reentrant")
    read, write = rw.read_lock(), rw.write_lock()
    async with write, write, read, read:
        assert await write.hold_count() == 2
        assert await read.hold_count() == 2
        assert write.statistics().owner.endswith(":write")
        assert await read.is_locked() and await write.is_locked()
    assert not await redis_client.keys("*")


# -- leases ----------------------------------------------------------------------------------------


async def test_read_holds_are_renewed_by_the_watchdog(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    client = make_client(watchdog_timeout=0.6)
    read = client.read_write_lock("renewed").read_lock()
    await read.lock()
    await read.lock()  # two holds: two timeout keys
    owner = read.statistics().owner
    await asyncio.sleep(1.5)  # 2.5 leases
    stats = read.statistics()
    assert stats.held and stats.renewed and not stats.lost
    for hold in (1, 2):
        assert await redis_client.pttl(timeout_key("renewed", owner, hold)) > 0
    assert await redis_client.pttl("renewed") > 0
    await read.unlock()
    await read.unlock()
    assert not await redis_client.keys("*")


async def test_the_lease_of_the_hash_is_the_longest_remaining_read_hold(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    read = client.read_write_lock("leases").read_lock()
    owner = client.new_owner()
    assert await read.try_lock(lease_time=10)
    assert await read.try_lock(lease_time=2, owner=owner)
    assert 9_000 < await redis_client.pttl("leases") <= 10_000
    await read.unlock()  # the 10 s hold ends: the 2 s one is what is left
    assert 1_000 < await redis_client.pttl("leases") <= 2_000
    await read.unlock(owner=owner)
    assert not await redis_client.keys("*")


async def test_a_lost_read_hold_is_reported(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    client = make_client(watchdog_timeout=0.6)
    read = client.read_write_lock("lost").read_lock()
    lost: list[aiolock.LockLostError] = []
    with pytest.raises(aiolock.LockLostError):
        async with read.guard():
            read.on_lost(lost.append)
            await redis_client.delete("lost")  # e.g. a force unlock by an operator
            await asyncio.sleep(5)
    assert len(lost) == 1
    assert lost[0].name == "lost"


async def test_expired_readers_do_not_keep_the_lock(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, peers: Peers
) -> None:
    """A reader process dies (kill -9) holding a 0.5 s read lease while another reader holds
    a long one: the lock's TTL follows the live hold, and once that one goes, the dead
    reader's field does not keep the lock: a writer gets it."""
    peer = await peers.start("aiolock")
    await peer.send("r", "read-lock", "dead-reader", 0, 500)
    await peers.expect(peer, "r", "acquired")
    peer.proc.kill()
    read = client.read_write_lock("dead-reader").read_lock()
    assert await read.try_lock(lease_time=30)
    await asyncio.sleep(0.6)  # the dead reader's hold expired (its field is still there)
    await read.unlock()
    assert not await redis_client.exists("dead-reader")
    assert await client.read_write_lock("dead-reader").write_lock().try_lock(lease_time=5)


# -- force unlock, state, input ------------------------------------------------------------------


async def test_force_unlock_acts_on_its_own_mode_only(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    rw = client.read_write_lock("forced")
    async with rw.write_lock():
        assert not await rw.read_lock().force_unlock()
        assert await redis_client.exists("forced")
    holder = client.new_owner()
    assert await rw.read_lock().try_lock(lease_time=30, owner=holder)
    assert not await rw.write_lock().force_unlock()
    assert await rw.read_lock().force_unlock()
    assert not await redis_client.exists("forced")
    assert rw.read_lock().statistics(owner=holder).lost
    with pytest.raises(aiolock.LockLostError):
        await rw.read_lock().unlock(owner=holder)


async def test_is_locked_and_mode(client: aiolock.AioLock) -> None:
    rw = client.read_write_lock("state")
    read, write = rw.read_lock(), rw.write_lock()
    assert (await rw.mode(), await read.is_locked(), await write.is_locked()) == (
        None,
        False,
        False,
    )
    async with read:
        assert (await rw.mode(), await read.is_locked(), await write.is_locked()) == (
            "read",
            True,
            False,
        )
    async with write:
        assert (await rw.mode(), await read.is_locked(), await write.is_locked()) == (
            "write",
            False,
            True,
        )
        async with read:
            assert await read.is_locked()
    assert repr(rw) == "<aiolock.ReadWriteLock 'state'>"


def test_bad_names(client: aiolock.AioLock) -> None:
    with pytest.raises(TypeError):
        client.read_write_lock(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        client.read_write_lock("a{b")
    rw = client.read_write_lock("ok")
    assert rw.read_lock() is rw.read_lock() and rw.write_lock() is rw.write_lock()
