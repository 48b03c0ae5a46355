"""aiolock on a Sentinel-managed master: every lock type, redis+sentinel:// URLs, and real
failovers while locks are held and waited on.

One LocalSentinel (master, replica, 3 Sentinels; ``down_after`` 2 s) serves the module;
every test starts from ``heal()``. Faults are real: ``SENTINEL FAILOVER`` (the old master
is demoted with REPLICAOF, so links to it get READONLY), kill -9 and SIGSTOP of the master,
SIGSTOP of the replica to keep writes from reaching it, CLIENT KILL of every connection.
Bounds are generous (a loaded 2-core machine) and conditions are polled, never slept for.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.sentinel

import aiolock
from aiolock.leases import HoldState
from aiolock.sentinel import master_from_url
from aiolock.testing import LocalSentinel, RedisServer, find_redis_server_binary
from aiolock.transport import ServerSettings
from aiolock.transport.resolve import SWITCH_CHANNEL, SentinelAddress
from tests.test_lock_family import EXCLUSIVE

pytestmark = pytest.mark.skipif(
    find_redis_server_binary() is None, reason="needs a redis-server binary"
)

#: a client's settings here: renewals every second, a dead link noticed within 2 s
CONFIG: dict[str, Any] = {"command_timeout": 2.0, "watchdog_timeout": 3.0, "ping_interval": 1.0}
#: what a failover may take here, at worst (down_after 2 s + election, on a loaded machine)
FAILOVER_BOUND = 40.0


@pytest.fixture(scope="module")
def shared_setup() -> Iterator[LocalSentinel]:
    with LocalSentinel() as setup:
        yield setup


@pytest.fixture
def setup(shared_setup: LocalSentinel) -> LocalSentinel:
    shared_setup.heal()
    with redis.Redis(*shared_setup.master_address(), socket_timeout=10) as master:
        master.flushall()
        master.execute_command("WAIT", 1, 5000)
    return shared_setup


@pytest.fixture
async def make_client(
    setup: LocalSentinel,
) -> AsyncIterator[Callable[..., aiolock.AioLock]]:
    """Clients of the Sentinel-managed master (redis-py's Sentinel, master_for)."""
    made: list[tuple[aiolock.AioLock, redis.asyncio.sentinel.Sentinel]] = []

    def make(**config: Any) -> aiolock.AioLock:
        sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            setup.sentinel_addresses, socket_timeout=1.0
        )
        client = aiolock.AioLock(
            sentinel.master_for(setup.master_name), config=aiolock.Config(**{**CONFIG, **config})
        )
        made.append((client, sentinel))
        return client

    yield make
    for client, sentinel in made:
        await client.aclose()
        await client.redis.aclose()
        await sentinel.aclose()


def master_redis(setup: LocalSentinel) -> redis.Redis:
    return redis.Redis(*setup.master_address(), socket_timeout=10)


async def eventually(check: Callable[[], Awaitable[bool] | bool], within: float, what: str) -> None:
    """Poll ``check`` until it is true (fails after ``within`` seconds)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + within
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if loop.time() > until:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(0.05)


# -- every type, through Sentinel ------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(EXCLUSIVE))
async def test_every_exclusive_type_works_through_sentinel(
    make_client: Callable[..., aiolock.AioLock], kind: str
) -> None:
    one, two = make_client(), make_client()
    first, second = EXCLUSIVE[kind](one, "s:excl"), EXCLUSIVE[kind](two, "s:excl")
    assert await first.try_lock()
    assert not await second.try_lock(0.05)

    async def waiter() -> bool:
        if not await second.try_lock(20):
            return False
        await second.unlock()
        return True

    waiting = asyncio.create_task(waiter())
    await eventually(lambda: two.statistics().tasks_waiting == 1, 20, "the waiter parks")
    await first.unlock()
    assert await asyncio.wait_for(waiting, 30)
    assert not await first.is_locked()


async def test_shared_types_work_through_sentinel(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    client = make_client()
    rw = client.read_write_lock("s:rw")
    async with rw.read_lock(), rw.read_lock():
        assert not await make_client().read_write_lock("s:rw").write_lock().try_lock(0)
    semaphore = client.semaphore("s:sem")
    assert await semaphore.try_set_permits(2)
    assert await semaphore.try_acquire(2, 1)
    assert not await semaphore.try_acquire(1, 0.05)
    await semaphore.release(2)
    latch = client.countdown_latch("s:latch")
    assert await latch.try_set_count(1)
    waiting = asyncio.create_task(make_client().countdown_latch("s:latch").wait(20))
    await asyncio.sleep(0.1)
    await latch.count_down()
    assert await asyncio.wait_for(waiting, 30)


async def test_from_url_makes_a_sentinel_client(setup: LocalSentinel) -> None:
    hosts = ",".join(f"{host}:{port}" for host, port in setup.sentinel_addresses)
    async with aiolock.from_url(
        f"redis+sentinel://{hosts}/{setup.master_name}/2", **CONFIG
    ) as client:
        async with client.lock("s:url"):
            with master_redis(setup) as master:
                master.select(2)
                assert master.exists("s:url")
    assert client.closed


def test_sentinel_url_parsing() -> None:
    redis_client, sentinel = master_from_url(
        "redis+sentinel://u:p%40ss@127.0.0.1,[::1]:26380/svc/3?sentinel_password=sp", timeout=1
    )
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinel.sentinels] == [
        26379,
        26380,
    ]
    assert sentinel.sentinels[0].connection_pool.connection_kwargs["password"] == "sp"
    kwargs = redis_client.connection_pool.connection_kwargs
    assert (kwargs["db"], kwargs["username"], kwargs["password"]) == (3, "u", "p@ss")
    for bad in (
        "redis+sentinel://127.0.0.1:26379/",
        "redis+sentinel://127.0.0.1:x/svc",
        "redis+sentinel://127.0.0.1/svc/notadb",
        "redis+sentinel://127.0.0.1/svc?nope=1",
        "redis://127.0.0.1/svc",
    ):
        with pytest.raises(ValueError):
            master_from_url(bad, timeout=1)


async def test_a_replica_client_is_refused(setup: LocalSentinel) -> None:
    sentinel = redis.asyncio.sentinel.Sentinel(setup.sentinel_addresses)  # type: ignore[no-untyped-call]
    replica = sentinel.slave_for(setup.master_name)
    with pytest.raises(TypeError, match="master_for"):
        aiolock.AioLock(replica)
    await replica.aclose()
    await sentinel.aclose()


# -- failovers -------------------------------------------------------------------------------


async def test_a_failover_with_50_waiters(
    setup: LocalSentinel, make_client: Callable[..., aiolock.AioLock]
) -> None:
    """SENTINEL FAILOVER while one task holds a lock and 50 wait for it: the old master is
    demoted (its links answer READONLY, the pub/sub link moves), the hold survives (it was
    replicated), and every waiter gets the lock in turn, one at a time, on the new master."""
    holder_client, waiter_client = make_client(), make_client()
    lock = holder_client.lock("s:fo")
    await lock.lock()
    inside = 0
    served = 0

    async def waiter() -> None:
        nonlocal inside, served
        mine = waiter_client.lock("s:fo")
        assert await mine.try_lock(FAILOVER_BOUND + 60)
        inside += 1
        assert inside == 1
        await asyncio.sleep(0)
        inside -= 1
        served += 1
        await mine.unlock()

    waiters = [asyncio.create_task(waiter()) for _ in range(50)]
    await eventually(lambda: waiter_client.statistics().tasks_waiting >= 1, 30, "waiters park")
    old = setup.master()
    new = await asyncio.to_thread(setup.failover)
    assert new is not old
    # The hold was replicated: it is still this task's, on the new master, and renewed there.
    assert await lock.is_held_by_current_task()
    await lock.unlock()
    async with asyncio.timeout(FAILOVER_BOUND + 60):
        await asyncio.gather(*waiters)
    assert served == 50
    assert holder_client.statistics().holds["lost"] == 0
    async with holder_client.fair_lock("s:fo:after"):
        with master_redis(setup) as master:
            assert master.exists("s:fo:after")


def _keep_writes_from_the_replica(setup: LocalSentinel) -> tuple[RedisServer, RedisServer]:
    """SIGSTOP the replica and cut its replication link: writes from now on reach the master
    only (the replica cannot reconnect while it is stopped)."""
    master = setup.master()
    (replica,) = setup.replicas()
    replica.pause()
    with master_redis(setup) as client:
        client.execute_command("CLIENT", "KILL", "TYPE", "replica")
    return master, replica


async def test_master_killed_holders_told_waiters_bounded(
    setup: LocalSentinel, make_client: Callable[..., aiolock.AioLock]
) -> None:
    """kill -9 of the master with holds that never reached the replica, which is then
    promoted: every holder is told its hold is lost (the watchdog finds it gone on the new
    master), no waiter waits past its wait_time (+ command_timeout), and new acquires
    work on the promoted replica."""
    holders_client, waiters_client = make_client(), make_client()
    master, replica = _keep_writes_from_the_replica(setup)
    lost: list[str] = []
    release = asyncio.Event()

    async def holder(i: int) -> None:
        lock = holders_client.lock(f"s:kill:{i}")
        await lock.lock()
        lock.on_lost(lambda error: lost.append(error.name))
        await release.wait()
        with contextlib.suppress(aiolock.LockNotOwnedError):
            await lock.unlock()

    holders = [asyncio.create_task(holder(i)) for i in range(10)]
    await eventually(
        lambda: holders_client.statistics().holds["held"] == 10, 20, "every holder holds"
    )
    wait_time = 25.0
    loop = asyncio.get_running_loop()

    async def waiter(i: int) -> float:
        started = loop.time()
        lock = waiters_client.lock(f"s:kill:{i % 10}")
        try:
            if await lock.try_lock(wait_time):
                await lock.unlock()
        except aiolock.RedisOperationError:
            pass  # allowed: told at once that Redis failed; a hang is what is not
        return loop.time() - started

    waiters = [asyncio.create_task(waiter(i)) for i in range(30)]
    await eventually(lambda: waiters_client.statistics().tasks_waiting >= 10, 20, "waiters park")
    master.kill()
    replica.resume()
    new = await asyncio.to_thread(setup.wait_for_new_master, master, timeout=FAILOVER_BOUND)
    assert new is replica
    # The holds were never replicated: each holder is told (renewal finds them gone).
    await eventually(lambda: len(lost) == 10, 30, f"every holder told (told: {sorted(lost)})")
    spent = await asyncio.gather(*waiters)
    assert max(spent) <= wait_time + CONFIG["command_timeout"] + 5
    release.set()
    await asyncio.gather(*holders)
    async with make_client().lock("s:kill:0"):
        with redis.Redis(*new.address) as client:
            assert client.exists("s:kill:0")


async def test_fencing_tokens_grow_across_a_failover_to_a_replica_behind(
    setup: LocalSentinel, make_client: Callable[..., aiolock.AioLock]
) -> None:
    """kill -9 of the master after three fencing tokens that never reached the replica,
    which is then promoted with the older counter: the next token is above all six (it was
    the fourth again, a token handed out twice). Before the cut, the replica's counter is
    the master's (the script's SET from the clock is replicated as a SET, not re-run)."""
    name = "s:fenced"
    key = f"redisson_lock_token:{{{name}}}"
    client = make_client()
    tokens = []
    for _ in range(3):
        tokens.append(await client.fenced_lock(name).lock_and_get_token())
        await client.fenced_lock(name).unlock()
    with master_redis(setup) as master_link:
        assert master_link.execute_command("WAIT", 1, 10_000) == 1
        replicated = master_link.get(key)
    with redis.Redis(*setup.replica_addresses()[0], socket_timeout=10) as replica_link:
        assert replica_link.get(key) == replicated == str(tokens[-1]).encode()
    master, replica = _keep_writes_from_the_replica(setup)
    for _ in range(3):
        tokens.append(await client.fenced_lock(name).lock_and_get_token())
        await client.fenced_lock(name).unlock()
    master.kill()
    replica.resume()
    new = await asyncio.to_thread(setup.wait_for_new_master, master, timeout=FAILOVER_BOUND)
    assert new is replica
    with redis.Redis(*new.address, socket_timeout=10) as new_link:
        assert new_link.get(key) == str(tokens[2]).encode()  # it missed the last three
    token = await make_client().fenced_lock(name).try_lock_and_get_token(wait_time=20)
    assert token is not None
    assert token > max(tokens), (token, tokens)
    assert tokens == sorted(set(tokens))


async def test_a_paused_master_comes_back_as_a_replica(
    setup: LocalSentinel, make_client: Callable[..., aiolock.AioLock]
) -> None:
    """SIGSTOP of the master (holds not replicated): the Sentinels fail over while it is
    frozen; it comes back still saying it is a master, holding the holds, until the
    Sentinels demote it. Its holders learn their holds are gone, the clients' links move to
    the new master, and a waiter gets the lock there."""
    client, other = make_client(), make_client()
    master, replica = _keep_writes_from_the_replica(setup)
    lock = client.lock("s:pause")
    await lock.lock()
    lost = asyncio.Event()
    lock.on_lost(lambda _: lost.set())
    got = asyncio.Event()
    done = asyncio.Event()

    async def waiter() -> bool:
        mine = other.lock("s:pause")
        if not await mine.try_lock(60):
            return False
        got.set()
        await done.wait()
        await mine.unlock()
        return True

    waiting = asyncio.create_task(waiter())
    await eventually(lambda: other.statistics().tasks_waiting == 1, 20, "the waiter parks")
    master.pause()
    replica.resume()
    try:
        new = await asyncio.to_thread(
            setup.wait_for_new_master, master, demote_old_master=False, timeout=FAILOVER_BOUND
        )
    finally:
        master.resume()  # a master again, with the stale hold, until the Sentinels see it
    assert new is replica
    async with asyncio.timeout(30):
        await lost.wait()
    async with asyncio.timeout(60):
        await got.wait()
    # Links that lived through the freeze may reach the thawed old master, which says it is
    # a master until the Sentinels demote it (at most ~1 s for aiolock to notice): a hold
    # taken there does not survive, and its holder is told. Either way, nothing hangs.
    direct = redis.Redis(*new.address)

    def settled() -> bool:
        (hold,) = other.holds_of("s:pause")
        return hold.state is HoldState.LOST or bool(direct.exists("s:pause"))

    await eventually(settled, 30, "the waiter's hold is on the new master, or reported lost")
    direct.close()
    done.set()
    with contextlib.suppress(aiolock.LockNotOwnedError):
        await asyncio.wait_for(waiting, 30)
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.unlock()
    async with make_client().lock(
        "s:pause",
    ) as fresh:
        assert await fresh.is_locked()
        with redis.Redis(*setup.master_address()) as now:
            assert now.exists("s:pause")


async def test_client_kill_of_every_connection(
    setup: LocalSentinel, make_client: Callable[..., aiolock.AioLock]
) -> None:
    """CLIENT KILL of every normal and pub/sub connection on the master while a lock is held
    and waited on: the holder keeps its hold, the waiter re-checks and gets it on release."""
    client, other = make_client(), make_client()
    lock = client.lock("s:ck")
    await lock.lock()
    got = asyncio.Event()

    async def waiter() -> bool:
        mine = other.lock("s:ck")
        if not await mine.try_lock(30):
            return False
        got.set()
        assert await mine.is_held_by_current_task()
        await mine.unlock()
        return True

    waiting = asyncio.create_task(waiter())
    await eventually(lambda: other.statistics().tasks_waiting == 1, 20, "the waiter parks")
    with master_redis(setup) as master:
        master.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        master.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    await eventually(
        lambda: other.statistics().pubsub_connections_opened >= 2, 20, "pub/sub reconnects"
    )
    assert await lock.is_held_by_current_task()
    await lock.unlock()
    assert await asyncio.wait_for(waiting, 40)
    assert other.statistics().holds["lost"] == 0


async def test_replica_acks_through_sentinel(
    setup: LocalSentinel, make_client: Callable[..., aiolock.AioLock]
) -> None:
    """replica_acks on a Sentinel-managed master: acknowledged with the replica running; with
    it frozen, the acquire fails with ReplicationError and nothing is held."""
    client = make_client(replica_acks=1, replica_ack_timeout=0.5)
    async with client.fenced_lock("s:acks"):
        with redis.Redis(*setup.replica_addresses()[0]) as replica:
            assert replica.exists("s:acks")
    (replica_server,) = setup.replicas()
    replica_server.pause()
    try:
        with pytest.raises(aiolock.ReplicationError):
            await client.lock("s:acks").try_lock(1)
        with master_redis(setup) as master:
            assert not master.exists("s:acks")
    finally:
        replica_server.resume()
    async with client.lock("s:acks"):
        pass


# -- the master moves under holds: re-checked at once, deposed grants never reported --------

#: renewals every 30 s, leases of 90 s: a loss told within TOLD of the switch was told by
#: the re-check at the switch, not by a renewal or the end of a lease
SLOW: dict[str, Any] = {"watchdog_timeout": 90.0}
TOLD = 15.0


def _diverge(setup: LocalSentinel, *names: str) -> None:
    """Delete ``names`` on the replica only, as if their writes had never reached it (Redis
    replicates asynchronously); everything else stays in sync."""
    with master_redis(setup) as master:
        assert master.execute_command("WAIT", 1, 10000) == 1
    (replica,) = setup.replicas()
    with redis.Redis(*replica.address, socket_timeout=10) as direct:
        direct.config_set("replica-read-only", "no")
        try:
            assert direct.delete(*names) == len(names)
        finally:
            direct.config_set("replica-read-only", "yes")


@pytest.mark.parametrize("events", [True, False], ids=["switch-events", "checked-every-second"])
async def test_holds_missing_on_the_new_master_are_lost_at_the_switch(
    setup: LocalSentinel,
    make_client: Callable[..., aiolock.AioLock],
    monkeypatch: pytest.MonkeyPatch,
    events: bool,
) -> None:
    """SENTINEL FAILOVER to a replica that lacks three of a client's holds (their writes
    never reached it): each is told lost as soon as the client learns of the switch (every
    hold is re-checked on the new master at once), not at its next renewal (30 s) or the
    end of its lease (90 s): on_lost runs, guard() cancels its body, unlock() raises
    LockLostError. Holds the replica has survive: one renewed on the new master, one with
    a lease_time checked there without lengthening its lease. The same when the Sentinels'
    events cannot be heard (the client learns of the switch by asking every second)."""
    if not events:  # a stand-in for Sentinels whose pub/sub cannot be reached
        monkeypatch.setattr(SentinelAddress, "listen", lambda self, on_switch, config: None)
    client = make_client(**SLOW)
    kept, renewed = client.lock("s:kept"), client.lock("s:gone")
    leased, kept_leased = client.lock("s:gone:leased"), client.lock("s:kept:leased")
    await kept.lock()
    await kept_leased.lock(lease_time=90)
    leased_by = asyncio.get_running_loop().time()  # its TTL was set before this
    await renewed.lock()
    await leased.lock(lease_time=90)
    lost: list[str] = []
    renewed.on_lost(lambda _: lost.append("renewed"))
    leased.on_lost(lambda _: lost.append("leased"))
    guarded = asyncio.Event()
    cancelled: list[aiolock.LockLostError] = []

    async def guard() -> None:
        try:
            async with client.lock("s:gone:guarded").guard():
                guarded.set()
                await asyncio.sleep(3600)
        except aiolock.LockLostError as error:
            cancelled.append(error)

    guarding = asyncio.create_task(guard())
    await guarded.wait()
    await asyncio.to_thread(_diverge, setup, "s:gone", "s:gone:leased", "s:gone:guarded")
    old = setup.master()
    new = await asyncio.to_thread(setup.failover)
    assert new is not old
    await eventually(
        lambda: sorted(lost) == ["leased", "renewed"] and bool(cancelled),
        TOLD,
        f"the missing holds told lost (told: {sorted(lost)}, guard cancelled: {cancelled})",
    )
    await asyncio.wait_for(guarding, 10)
    for lock in (renewed, leased):
        with pytest.raises(aiolock.LockLostError):
            await lock.unlock()
    assert await kept.is_held_by_current_task()
    assert await kept_leased.is_held_by_current_task()
    with redis.Redis(*new.address) as direct:
        assert direct.pttl("s:kept") > 60_000  # renewed there
        since = asyncio.get_running_loop().time() - leased_by
        assert 0 < direct.pttl("s:kept:leased") <= 90_000 - since * 1000 + 5  # not lengthened
    await kept.unlock()
    await kept_leased.unlock()
    assert client.statistics().holds["held"] == 0
    assert client.statistics().server_changes >= 1


async def test_a_grant_from_the_deposed_master_is_not_reported(
    setup: LocalSentinel, make_client: Callable[..., aiolock.AioLock]
) -> None:
    """Two holders, the way issue 19 found them: client A's acquire reaches the master just
    as it freezes; the Sentinels fail over; client B takes the lock on the new master; then
    the old master thaws, still a master until the Sentinels demote it, and grants A the
    acquire it had read. That grant came from a master deposed after the acquire was sent:
    A is not told it holds the lock (it gives it back and waits on the new master, until B
    releases)."""
    a = make_client(command_timeout=20.0)
    b = make_client()
    warm = a.lock("s:two:warm")
    assert await warm.try_lock()  # A's command link is open, to the master
    await warm.unlock()
    master = setup.master()
    a_held = asyncio.Event()
    a_done = asyncio.Event()

    async def take() -> bool:
        lock = a.lock("s:two")
        if not await lock.try_lock(FAILOVER_BOUND + 90):
            return False
        a_held.set()
        await a_done.wait()
        await lock.unlock()
        return True

    master.pause()
    try:
        taking = asyncio.create_task(take())
        await asyncio.sleep(0.2)  # written to the frozen master
        new = await asyncio.to_thread(
            setup.wait_for_new_master, master, demote_old_master=False, timeout=FAILOVER_BOUND
        )
        assert new is not master
        b_lock = b.lock("s:two")
        assert await b_lock.try_lock(FAILOVER_BOUND)
    finally:
        master.resume()  # it reads A's acquire and, a master still, grants it
    await eventually(
        lambda: a_held.is_set() or taking.done() or a.statistics().tasks_waiting == 1,
        FAILOVER_BOUND,
        "A's acquire settled: waiting on the new master (or, wrongly, holding)",
    )
    assert not a_held.is_set(), "A was told it holds the lock that B holds"
    await b_lock.unlock()
    async with asyncio.timeout(30):
        await a_held.wait()
    with redis.Redis(*new.address) as direct:
        assert direct.exists("s:two")
    a_done.set()
    assert await asyncio.wait_for(taking, 30)


async def test_min_replicas_to_write_stops_grants_on_a_master_cut_off(
    setup: LocalSentinel, make_client: Callable[..., aiolock.AioLock]
) -> None:
    """What docs/sentinel.md says ``min-replicas-to-write`` adds: a master that has heard
    from no replica for ``min-replicas-max-lag`` s (its replica frozen here; cut off by a
    partition in the case it guards against) refuses writes, so it stops granting locks
    (RedisOperationError naming NOREPLICAS, nothing taken) instead of granting what a new
    master would never see."""
    client = make_client()
    (replica,) = setup.replicas()
    with master_redis(setup) as master:
        master.config_set("min-replicas-max-lag", 1)
        master.config_set("min-replicas-to-write", 1)
        replica.pause()
        try:
            names = (f"s:minrep:{index}" for index in itertools.count())
            refused: list[str] = []

            async def refuses() -> bool:
                lock = client.lock(name := next(names))
                try:
                    taken = await lock.try_lock()
                except aiolock.RedisOperationError as error:
                    assert "NOREPLICAS" in str(error)
                    refused.append(name)
                    return True
                if taken:  # not refused yet; its release may be
                    with contextlib.suppress(aiolock.RedisOperationError):
                        await lock.unlock()
                return False

            await eventually(refuses, 20, "the master refuses to grant")
            assert not master.exists(refused[0])
        finally:
            replica.resume()
            master.config_set("min-replicas-to-write", 0)
            master.config_set("min-replicas-max-lag", 10)


async def test_the_sentinels_switch_events_are_followed(setup: LocalSentinel) -> None:
    """The resolver subscribes to +switch-master on every Sentinel and reports each switch
    of its service (old and new address) as it happens; until the Sentinel redis-py asks
    first names the new master too, a connect goes to the new one, not back to the old."""
    sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        setup.sentinel_addresses, socket_timeout=1.0
    )
    master_client = sentinel.master_for(setup.master_name)
    resolver = SentinelAddress(master_client.connection_pool)
    switches: list[tuple[str, str]] = []
    try:
        resolver.listen(lambda old, new: switches.append((old, new)), aiolock.Config())
        await eventually(lambda: resolver.subscribed == 3, 20, "subscribed on every Sentinel")
        old = "{}:{}".format(*setup.master_address())
        new = "{}:{}".format(*(await asyncio.to_thread(setup.failover)).address)
        await eventually(lambda: (old, new) in switches, 20, f"the switch told ({switches})")
        assert resolver.switches >= 1
        assert (await resolver.resolve(ServerSettings(), soon())).address == new

        async def named() -> bool:
            host, port = await master_client.connection_pool.get_master_address()
            return f"{host}:{port}" == new

        await eventually(named, 20, "redis-py's Sentinel names the new master")
        # An event about another service is not ours; one naming the master the Sentinels
        # (still) name as the old one makes a connect go where the event said.
        as_event = new.replace(":", " ")  # <ip> <port>
        resolver._message(SWITCH_CHANNEL, f"other {as_event} 127.0.0.1 1".encode())
        assert (await resolver.resolve(ServerSettings(), soon())).address == new
        resolver._message(SWITCH_CHANNEL, f"{setup.master_name} {as_event} 127.0.0.1 1".encode())
        assert (await resolver.resolve(ServerSettings(), soon())).address == "127.0.0.1:1"
    finally:
        await resolver.aclose()
        await master_client.aclose()
        await sentinel.aclose()
    assert resolver.subscribed == 0


def soon() -> float:
    """A deadline 10 s from now (loop time)."""
    return asyncio.get_running_loop().time() + 10
