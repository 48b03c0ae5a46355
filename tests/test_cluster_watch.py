"""A Redis Cluster's topology changes under held locks: a master killed and its replica
promoted, a master restarted empty (another ``run_id``), a slot migrated whole or halfway.

Only the holds in the slots that changed are checked again, at once, on the master that
serves them now: a hold missing there is lost now (``on_lost`` runs, ``guard()`` cancels its
body, ``unlock()`` raises LockLostError), one present there goes on; holds in other slots
(on other masters, or on the same master in another slot) are not checked, and replies
about them are not distrusted. A grant that comes from a master deposed after the acquire
was sent is no grant. Waiters in the changed slots re-check.

Real servers and real faults on the session's LocalCluster. Watchdog timeouts are long here
(a renewal every 30 s), so that a loss told at a renewal comes too late for the bounds below
(TOLD), and PTTLs tell which holds were checked: a check renews a watchdog hold, and a hold
with a ``lease_time`` is checked without lengthening its lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis.asyncio
from redis.asyncio.cluster import ClusterNode

import aiolock
from aiolock.testing import LocalCluster, LocalClusterNode

#: renewals every 30 s, a lease_time of 90 s: what is told within TOLD was not told by them
SLOW: dict[str, Any] = {"watchdog_timeout": 90.0, "command_timeout": 5.0}
LEASE = 90_000
TOLD = 10.0
#: what a failover may take here, at worst (node timeout 2 s + election, a loaded machine)
FAILOVER_BOUND = 40.0


async def eventually(check: Callable[[], bool], within: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    until = loop.time() + within
    while not check():
        if loop.time() > until:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(0.02)


def names_on(cluster: LocalCluster, node: LocalClusterNode, count: int, prefix: str) -> list[str]:
    """``count`` lock names in different slots that ``node`` serves."""
    found: list[str] = []
    slots: set[int] = set()
    index = 0
    while len(found) < count:
        name = f"{prefix}:{index}"
        slot = cluster.key_slot(name)
        if slot not in slots and cluster.master_for_slot(slot) is node:
            found.append(name)
            slots.add(slot)
        index += 1
    return found


@pytest.fixture
async def clients(healthy_cluster: LocalCluster) -> AsyncIterator[Callable[..., aiolock.AioLock]]:
    """aiolock clients on the cluster, each on its own RedisCluster (``startup`` to name the
    nodes it first asks; default every running one)."""
    made: list[aiolock.AioLock] = []

    def make(startup: list[LocalClusterNode] | None = None, **config: Any) -> aiolock.AioLock:
        nodes = (
            healthy_cluster.startup_nodes()
            if startup is None
            else [ClusterNode(node.host, node.port) for node in startup]
        )
        rc = redis.asyncio.RedisCluster(startup_nodes=nodes)
        made.append(aiolock.AioLock(rc, config=aiolock.Config(**config)))
        made[-1]._owns_redis = True
        return made[-1]

    yield make
    for client in made:
        await client.aclose()


def pttl(cluster: LocalCluster, name: str) -> int:
    return int(cluster.master_for_key(name).execute("PTTL", name))


@contextmanager
def no_automatic_failover(replicas: list[LocalClusterNode]) -> Iterator[None]:
    """The replicas do not take over a master that fails (a restart stays a restart)."""
    for replica in replicas:
        replica.execute("CONFIG", "SET", "cluster-replica-no-failover", "yes")
    try:
        yield
    finally:
        for replica in replicas:
            if replica.is_running:
                replica.execute("CONFIG", "SET", "cluster-replica-no-failover", "no")


class Told:
    """What on_lost said, and the bodies guard() cancelled."""

    def __init__(self) -> None:
        self.lost: set[str] = set()
        self.cancelled: list[aiolock.LockLostError] = []
        self.guarding: list[asyncio.Task[None]] = []

    def watch(self, lock: aiolock.Lock, owner: aiolock.Owner | None = None) -> None:
        lock.on_lost(lambda error: self.lost.add(lock.name), owner=owner)

    async def guard(self, client: aiolock.AioLock, name: str) -> None:
        """A body under ``client.lock(name).guard()``, parked until it is cancelled."""
        entered = asyncio.Event()

        async def body() -> None:
            try:
                async with client.lock(name).guard():
                    entered.set()
                    await asyncio.sleep(3600)
            except aiolock.LockLostError as error:
                self.cancelled.append(error)

        self.guarding.append(asyncio.create_task(body()))
        await entered.wait()


async def park_waiter(
    client: aiolock.AioLock, name: str
) -> tuple[asyncio.Task[bool], aiolock.Owner]:
    """Another client's acquire of ``name``, waiting (its holder's lease is 90 s)."""
    owner = client.new_owner()
    waiting = client.statistics().tasks_waiting
    task = asyncio.create_task(client.lock(name).try_lock(wait_time=60, owner=owner))
    await eventually(
        lambda: client.statistics().tasks_waiting == waiting + 1, 10, f"a waiter on {name}"
    )
    return task, owner


async def test_a_failover_checks_the_holds_of_its_slots_at_once(
    healthy_cluster: LocalCluster, clients: Callable[..., aiolock.AioLock]
) -> None:
    """kill -9 of a master whose replica lacks some of a client's holds (their writes never
    reached it): once the replica took over, each missing hold is told lost within TOLD
    (not at its renewal 30 s after it was taken, or the end of its 90 s lease): on_lost runs,
    guard() cancels its body, unlock() raises LockLostError, and another client's waiter
    gets the lock. The holds the replica has go on: the renewed one was checked there
    (renewed), the leased one checked without lengthening its lease. A hold on another
    master is not checked (its TTL was not touched), and tasks taking and releasing locks on
    the other masters all the while see no error (no reply about them is distrusted)."""
    cluster = healthy_cluster
    victim, elsewhere = cluster.masters()[:2]
    (replica,) = cluster.replicas(of=victim)
    gone, gone_leased, gone_guarded, kept, kept_leased = names_on(cluster, victim, 5, "fo")
    (far,) = names_on(cluster, elsewhere, 1, "fo:far")
    busy_names = [
        name for node in cluster.masters()[1:] for name in names_on(cluster, node, 2, "fo:busy")
    ]
    client, other = clients(**SLOW), clients(**SLOW)
    loop = asyncio.get_running_loop()
    told = Told()
    locks = {name: client.lock(name) for name in (gone, gone_leased, kept, kept_leased, far)}
    await locks[gone].lock()
    await locks[gone_leased].lock(lease_time=90)
    await told.guard(client, gone_guarded)
    # the replica loses these writes (as if replication lagged); later ones reach it
    replica.execute("CONFIG", "SET", "replica-read-only", "no")
    try:
        replica.execute("FLUSHALL")
    finally:
        replica.execute("CONFIG", "SET", "replica-read-only", "yes")
    await locks[kept].lock()
    await locks[kept_leased].lock(lease_time=90)
    leased_by = loop.time()  # its TTL was set before this
    await locks[far].lock()
    far_by = loop.time()
    await asyncio.to_thread(cluster.wait_until_healthy)  # the replica has the later writes
    for lock in locks.values():
        told.watch(lock)
    waiter, waiter_owner = await park_waiter(other, gone)

    stop = asyncio.Event()

    async def busy(name: str) -> int:
        cycles = 0
        lock = client.lock(name)
        while not stop.is_set():
            await lock.lock()
            await lock.unlock()
            cycles += 1
        return cycles

    busy_tasks = [asyncio.create_task(busy(name)) for name in busy_names]
    cluster.kill(victim)
    promoted = await asyncio.to_thread(cluster.wait_for_failover_of, victim, timeout=FAILOVER_BOUND)
    assert promoted is replica
    await eventually(
        lambda: told.lost == {gone, gone_leased} and bool(told.cancelled),
        TOLD,
        f"the missing holds told lost (told: {sorted(told.lost)}, guard: {told.cancelled})",
    )
    assert await asyncio.wait_for(waiter, TOLD)  # woken to re-check on the promoted replica
    stop.set()
    cycles = await asyncio.gather(*busy_tasks)  # none raised
    assert all(cycles), cycles
    await asyncio.wait_for(asyncio.gather(*told.guarding), 10)
    for name in (gone, gone_leased):
        with pytest.raises(aiolock.LockLostError, match="the server changed"):
            await locks[name].unlock()
    # what the replica had goes on: checked there, the renewed one renewed
    assert await locks[kept].is_held_by_current_task()
    assert await locks[kept_leased].is_held_by_current_task()
    far_left, kept_left = pttl(cluster, far), pttl(cluster, kept)
    assert far_left <= LEASE - (loop.time() - far_by) * 1000 + 50, far_left  # not touched
    assert kept_left > far_left + 1000, (kept_left, far_left)  # renewed after the failover
    leased_left = pttl(cluster, kept_leased)
    assert 0 < leased_left <= LEASE - (loop.time() - leased_by) * 1000 + 50  # not lengthened
    assert told.lost == {gone, gone_leased}
    for name in (kept, kept_leased, far):
        await locks[name].unlock()
    await other.lock(gone).unlock(owner=waiter_owner)
    assert client.statistics().holds["held"] == 0
    assert client.statistics().server_changes >= 1


async def test_a_master_restarted_empty_tells_the_holds_of_its_slots_at_once(
    healthy_cluster: LocalCluster, clients: Callable[..., aiolock.AioLock]
) -> None:
    """kill -9 of a master and a restart before any failover (its replica may not take
    over): it comes back empty, with another run_id, serving the same slots. Nothing else is
    sent, yet its holds are told lost within TOLD (the command link is opened again at once
    while something is held, and finds another run_id); another client's waiter gets the
    lock. A hold on another master is neither lost nor checked."""
    cluster = healthy_cluster
    victim, elsewhere = cluster.masters()[:2]
    renewed_name, leased_name = names_on(cluster, victim, 2, "rs")
    (far_name,) = names_on(cluster, elsewhere, 1, "rs:far")
    client, other = clients(**SLOW), clients(**SLOW)
    loop = asyncio.get_running_loop()
    told = Told()
    renewed, leased, far = (client.lock(n) for n in (renewed_name, leased_name, far_name))
    await renewed.lock()
    await leased.lock(lease_time=90)
    await far.lock()
    far_by = loop.time()
    for lock in (renewed, leased, far):
        told.watch(lock)
    await told.guard(client, names_on(cluster, victim, 3, "rs")[2])
    waiter, waiter_owner = await park_waiter(other, renewed_name)
    with no_automatic_failover(cluster.replicas(of=victim)):
        cluster.kill(victim)
        await asyncio.to_thread(cluster.restart, victim)
    assert cluster.master_for_key(renewed_name) is victim  # restarted, not failed over
    # empty, or already told lost, or taken again by the waiter (its re-check after its
    # pub/sub connection to the victim was reset can come before the hold is told lost)
    keys = victim.execute("DBSIZE")
    assert keys == 0 or told.lost or (keys == 1 and victim.execute("EXISTS", renewed_name) == 1)
    await eventually(
        lambda: told.lost == {renewed_name, leased_name} and bool(told.cancelled),
        TOLD,
        f"the wiped holds told lost (told: {sorted(told.lost)}, guard: {told.cancelled})",
    )
    assert await asyncio.wait_for(waiter, TOLD)
    await asyncio.wait_for(asyncio.gather(*told.guarding), 10)
    for lock in (renewed, leased):
        with pytest.raises(aiolock.LockLostError, match="restarted"):
            await lock.unlock()
    assert await far.is_held_by_current_task()
    far_left = pttl(cluster, far_name)
    assert far_left <= LEASE - (loop.time() - far_by) * 1000 + 50, far_left  # not touched
    assert told.lost == {renewed_name, leased_name}
    await far.unlock()
    await other.lock(renewed_name).unlock(owner=waiter_owner)
    async with client.lock(renewed_name):  # the client works on the restarted node
        assert victim.execute("EXISTS", renewed_name) == 1
    assert client.statistics().server_changes >= 1


@pytest.mark.parametrize("halfway", [False, True], ids=["whole", "halfway"])
async def test_a_slot_migration_checks_the_holds_of_that_slot(
    healthy_cluster: LocalCluster, clients: Callable[..., aiolock.AioLock], halfway: bool
) -> None:
    """A slot moves to another master (whole; or halfway first, the key of one hold moved
    and another lock taken on the target through ASK, then to the end). Once it is served
    by the target, its holds are checked there at once: the one removed behind the
    holder's back (deleted on the source) is told lost within TOLD, and another client's
    waiter on it gets it (no unlock message ever comes, and with classic pub/sub, as here,
    its subscription stays valid: it is woken because its slot changed); the others go on,
    renewed by the check. A hold in another slot of the same source master is not
    checked."""
    cluster = healthy_cluster
    tag = "{watch-migration}"
    kept_name, gone_name, new_name = f"{tag}kept", f"{tag}gone", f"{tag}new"
    slot = cluster.key_slot(kept_name)
    source = cluster.master_for_slot(slot)
    target = next(node for node in cluster.masters() if node is not source)
    (far_name,) = names_on(cluster, source, 1, "mig:far")
    assert cluster.key_slot(far_name) != slot
    # classic pub/sub: a migration does not end a subscription (sharded pub/sub moves it)
    client, other = clients(sharded_pubsub=False, **SLOW), clients(sharded_pubsub=False, **SLOW)
    loop = asyncio.get_running_loop()
    told = Told()
    kept, gone, far = (client.lock(n) for n in (kept_name, gone_name, far_name))
    for lock in (kept, gone, far):
        await lock.lock()
        told.watch(lock)
    far_by = loop.time()
    waiter, waiter_owner = await park_waiter(other, gone_name)
    await asyncio.sleep(2)  # so that a check shows in the TTLs
    assert source.execute("DEL", gone_name) == 1
    new = client.lock(new_name)
    if halfway:
        cluster.begin_slot_migration(slot, target, keys=[kept_name])
        await new.lock()  # ASK: taken on the target
        assert target.execute("CLUSTER", "COUNTKEYSINSLOT", slot) == 2
        await asyncio.sleep(0.5)
        assert told.lost == set()  # nothing changed owner yet
        await asyncio.to_thread(cluster.finish_slot_migration, slot)
    else:
        await asyncio.to_thread(cluster.migrate_slot, slot, target)
        await new.lock()
    await eventually(
        lambda: told.lost == {gone_name},
        TOLD,
        f"the hold missing on the target told lost (told: {sorted(told.lost)})",
    )
    assert await asyncio.wait_for(waiter, TOLD)  # woken to re-check on the target
    with pytest.raises(aiolock.LockLostError, match="moved from"):
        await gone.unlock()
    for lock in (kept, new, far):
        assert await lock.is_held_by_current_task()
    far_left, kept_left = pttl(cluster, far_name), pttl(cluster, kept_name)
    assert far_left <= LEASE - (loop.time() - far_by) * 1000 + 50, far_left  # not touched
    assert kept_left > far_left + 1000, (kept_left, far_left)  # checked (renewed) there
    assert cluster.master_for_key(kept_name) is target
    for lock in (kept, new, far):
        await lock.unlock()
    await other.lock(gone_name).unlock(owner=waiter_owner)
    assert told.lost == {gone_name}
    assert client.statistics().server_changes >= 1


async def test_a_grant_from_a_master_deposed_meanwhile_is_not_reported(
    healthy_cluster: LocalCluster, clients: Callable[..., aiolock.AioLock]
) -> None:
    """Two holders, the way issue 19 found them with Sentinel: client A's acquire reaches a
    master just as it freezes (SIGSTOP); its replica takes over; client B takes the lock
    there; then the old master thaws and, still a master until it hears of the failover,
    may grant A the acquire it had read. That reply comes from a master deposed after the
    acquire was sent (A's client learns of the failover from the slot map, which it reloads
    every second while a command is in flight): A is not told it holds the lock. It waits
    on the new master until B releases."""
    cluster = healthy_cluster
    victim = cluster.masters()[0]
    (name,) = names_on(cluster, victim, 1, "deposed")
    a = clients(command_timeout=20.0)
    warm = a.lock(names_on(cluster, victim, 2, "deposed")[1])
    assert await warm.try_lock()  # A's command link to the master is open
    await warm.unlock()
    a_held = asyncio.Event()
    a_done = asyncio.Event()

    async def take() -> bool:
        lock = a.lock(name)
        if not await lock.try_lock(wait_time=FAILOVER_BOUND + 60):
            return False
        a_held.set()
        await a_done.wait()
        await lock.unlock()
        return True

    cluster.pause(victim)
    try:
        taking = asyncio.create_task(take())
        await asyncio.sleep(0.2)  # written to the frozen master
        promoted = await asyncio.to_thread(
            cluster.wait_for_failover_of, victim, timeout=FAILOVER_BOUND
        )
        live = [node for node in cluster.nodes if node is not victim and node.is_running]
        b = clients(startup=live)
        b_lock = b.lock(name)
        assert await b_lock.try_lock(wait_time=FAILOVER_BOUND)
        # A's client reloads the slot map while its acquire is in flight: give it the time
        # (without that, a thawed master's grant cannot be told from a good one)
        with_changes = 0
        for _ in range(100):
            with_changes = a.statistics().server_changes
            if with_changes:
                break
            await asyncio.sleep(0.1)
    finally:
        cluster.resume(victim)  # it reads A's acquire and, a master still, may grant it
    await eventually(
        lambda: a_held.is_set() or taking.done() or a.statistics().tasks_waiting == 1,
        FAILOVER_BOUND,
        "A's acquire settled: waiting on the new master (or, wrongly, holding)",
    )
    assert not a_held.is_set(), "A was told it holds the lock that B holds"
    assert with_changes >= 1  # A's client learned of the failover before the thaw
    await b_lock.unlock()
    async with asyncio.timeout(30):
        await a_held.wait()
    assert promoted.execute("EXISTS", name) == 1
    a_done.set()
    assert await asyncio.wait_for(taking, 30)
