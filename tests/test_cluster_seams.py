"""Where a cluster meets the rest: a ``redis://`` URL on a cluster-enabled server, names whose
keys would straddle hash slots, a slot that moves under an unlock, and a database that does
not exist. Real servers throughout: a one-shard cluster (one node holding every slot, as
managed services offer), the session's LocalCluster with MIGRATING/IMPORTING slots, and a
plain server with its 16 databases.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import aiolock
from aiolock import default as default_client
from aiolock import keys
from aiolock.testing import LocalCluster, RedisServer, external_redis_url
from aiolock.transport import StandaloneTransport
from aiolock.transport.cluster import ClusterTransport

HANG_GUARD = 60  # seconds; only there so that a bug fails instead of hanging


async def eventually(check: Callable[[], bool], within: float = 30) -> None:
    async with asyncio.timeout(within):
        while True:
            if check():
                return
            await asyncio.sleep(0.02)


# -- a redis:// URL on a cluster-enabled server (one shard) -------------------------------------


@contextlib.contextmanager
def one_node_cluster(config: str | None = None) -> Iterator[RedisServer]:
    """A Redis Cluster of one node that serves every slot: it answers CROSSSLOT to a script
    whose keys are in different slots, as every cluster does."""
    if external_redis_url() is not None:
        pytest.skip("needs its own redis-server")
    server = RedisServer(cluster=True, config=config)
    server.start()
    try:
        with redis.Redis.from_url(server.url, protocol=2) as node:
            node.execute_command("CLUSTER", "ADDSLOTS", *range(16384))
            deadline = time.monotonic() + 10
            while b"cluster_state:ok" not in node.execute_command("CLUSTER", "INFO"):
                assert time.monotonic() < deadline, "the one-node cluster did not come up"
                time.sleep(0.05)
        yield server
    finally:
        server.stop()


@pytest.fixture
def one_shard() -> Iterator[RedisServer]:
    with one_node_cluster() as server:
        yield server


def two_slots() -> tuple[str, str]:
    """Two lock names in different hash slots."""
    assert keys.key_slot("seam:a") != keys.key_slot("seam:b")
    return "seam:a", "seam:b"


def record(lost: list[str], name: str) -> Callable[[aiolock.LockLostError], None]:
    return lambda error: lost.append(name)


def dbsize(server: RedisServer) -> int:
    with redis.Redis.from_url(server.url, protocol=2) as node:
        return int(node.dbsize())


async def test_a_redis_url_on_a_cluster_enabled_server_is_refused_before_any_lock(
    one_shard: RedisServer,
) -> None:
    """The symptom: a watchdog batch of two locks in two slots answered CROSSSLOT and both
    healthy holds were reported lost. Now the first connect sees the cluster (HELLO's
    ``mode``) and refuses with the URL to use; nothing is written."""
    async with aiolock.from_url(one_shard.url) as client:
        name, other = two_slots()
        async with asyncio.timeout(HANG_GUARD):
            with pytest.raises(aiolock.RedisUnavailableError, match=r"redis\+cluster://") as info:
                await client.lock(name).try_lock()
            assert "cluster" in str(info.value)
            with pytest.raises(aiolock.RedisUnavailableError, match=r"redis\+cluster://"):
                await client.lock(other).lock()
            with pytest.raises(aiolock.RedisUnavailableError, match=r"redis\+cluster://"):
                await client.semaphore("s").try_set_permits(1)
        assert client.statistics().holds["held"] == 0
    # a redis.asyncio.Redis handed in is the same thing
    plain = redis.asyncio.Redis.from_url(one_shard.url)
    try:
        async with aiolock.AioLock(plain) as client:
            with pytest.raises(aiolock.RedisUnavailableError, match=r"RedisCluster"):
                await client.lock(name).try_lock()
    finally:
        await plain.aclose()
    assert dbsize(one_shard) == 0


async def test_a_redis_url_on_a_sentinel_is_refused_with_the_url_to_use() -> None:
    if external_redis_url() is not None:
        pytest.skip("needs its own redis-server")
    config = "sentinel monitor m 127.0.0.1 1 1\n"
    with RedisServer(["--sentinel"], config=config) as sentinel:
        async with aiolock.from_url(sentinel.url) as client:
            async with asyncio.timeout(HANG_GUARD):
                with pytest.raises(aiolock.RedisUnavailableError, match=r"redis\+sentinel://"):
                    await client.lock("x").try_lock()


async def test_the_cluster_url_on_one_shard_keeps_every_hold(one_shard: RedisServer) -> None:
    """What the refusal points to works: holds in two slots stay renewed (per slot)."""
    url = "redis+cluster://" + one_shard.url.removeprefix("redis://")
    async with aiolock.from_url(url, watchdog_timeout=1.5) as client:
        assert isinstance(client.runtime().transport, ClusterTransport)
        lost: list[str] = []
        held = [client.lock(name) for name in two_slots()]
        for lock in held:
            await lock.lock()
            lock.on_lost(record(lost, lock.name))
        await asyncio.sleep(3 * 0.5 + 0.5)  # three renewal periods
        assert lost == []
        assert client.statistics().holds["held"] == 2
        for lock in held:
            await lock.unlock()
    assert dbsize(one_shard) == 0


async def test_a_watchdog_batch_never_mixes_slots_where_the_mode_is_hidden() -> None:
    """A cluster node that cannot be asked its mode (HELLO renamed away here; Redis < 6, or a
    proxy in front of a cluster, cannot say either): its single-object scripts work, and the
    first renewal batch the server refuses (CROSSSLOT: nothing ran) is split per slot and
    sent again at once; later batches keep to one slot. No hold is lost."""
    with one_node_cluster(config='rename-command HELLO ""\n') as server:
        async with aiolock.from_url(server.url, watchdog_timeout=1.5) as client:
            transport = client.runtime().transport
            assert isinstance(transport, StandaloneTransport)
            lost: list[str] = []
            held = [client.lock(name) for name in two_slots()]
            owner = client.new_owner()
            for lock in held:
                await lock.lock(owner=owner)
                lock.on_lost(record(lost, lock.name), owner=owner)
            calls = client.statistics().renewal_calls
            await asyncio.sleep(3 * 0.5 + 0.5)  # three renewal periods
            assert lost == []
            assert client.statistics().holds["held"] == 2
            assert transport.batch_key("seam:a") != transport.batch_key("seam:b")
            assert client.statistics().renewal_calls - calls >= 4  # per slot, each period
            for lock in held:
                await lock.unlock(owner=owner)
        assert dbsize(server) == 0


async def test_a_standalone_server_still_renews_many_slots_in_one_batch(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    """The other side: a plain server takes a batch across slots, and gets one."""
    client = make_client(watchdog_timeout=1.5)
    owner = client.new_owner()
    held = [client.lock(f"batch:{i}") for i in range(20)]
    for lock in held:
        await lock.lock(owner=owner)
    calls = client.statistics().renewal_calls
    await asyncio.sleep(2 * 0.5 + 0.3)
    assert client.statistics().holds["held"] == 20
    renewals = client.statistics().renewal_calls - calls
    assert 1 <= renewals < 20, renewals  # batched, not one call per slot
    transport = client.runtime().transport
    assert transport.batch_key("batch:1") == transport.batch_key("batch:2")
    for lock in held:
        await lock.unlock(owner=owner)


# -- names whose keys and channels would straddle slots ------------------------------------------

#: names where the ``{name}`` wrapping of Redisson's layout puts side keys in another slot
STRADDLING = ["a}b", "}a", "a}", "a}}b", "x:a}b{", "a{b", "{}a", "x{}y"]


@pytest.fixture
async def offline() -> AsyncIterator[aiolock.AioLock]:
    """A client on a port where nothing listens: any Redis call would fail."""
    async with aiolock.from_url("redis://127.0.0.1:1/0") as client:
        yield client


def factories(client: aiolock.AioLock) -> dict[str, Callable[[str], Any]]:
    return {
        "lock": client.lock,
        "fenced_lock": client.fenced_lock,
        "fair_lock": client.fair_lock,
        "read_write_lock": client.read_write_lock,
        "semaphore": client.semaphore,
        "permit_expirable_semaphore": client.permit_expirable_semaphore,
        "countdown_latch": client.countdown_latch,
        "red_lock": lambda name: aiolock.red_lock(client, client, client, name=name),
        "alock": lambda name: aiolock.alock(name),
    }


@pytest.mark.parametrize("name", STRADDLING)
async def test_a_name_whose_keys_would_straddle_slots_is_refused_for_every_type(
    offline: aiolock.AioLock, name: str
) -> None:
    aiolock.configure(offline)
    try:
        for kind, make in factories(offline).items():
            with pytest.raises(ValueError, match="cluster slot") as info:
                make(name)
            assert repr(name) in str(info.value), kind
    finally:
        default_client._configured = None
    assert offline.statistics().links_opened == 0


def every_key_and_channel(name: str) -> list[str]:
    """Every key and channel the types make of ``name`` (owner ids and client ids have no
    braces; the latch channel is apart, see the test below)."""
    owner, client_id = "6e3d30b7-83b1-433a-9335-5e8b9916d3ac:7", "6e3d30b7"
    return [
        keys.lock_channel(name),
        keys.token_key(name),
        keys.fair_queue_key(name),
        keys.fair_timeout_key(name),
        f"{keys.lock_channel(name)}:{owner}",  # a fair lock waiter's own channel
        keys.rwlock_channel(name),
        keys.rwlock_timeout_prefix(name, owner) + ":3",
        keys.rwlock_timeout_prefix(name, owner + ":write") + ":1",
        keys.semaphore_channel(name),
        keys.permit_timeouts_key(name),
        keys.requests_key(name, client_id),
    ]


def test_a_name_is_accepted_exactly_when_every_key_and_channel_shares_its_slot() -> None:
    """The rule is the same-slot rule itself, over many names made of the characters that
    matter (braces), so no name slips through and none is refused for nothing."""
    rng = random.Random(19)
    names = {"".join(rng.choice("ab{}:") for _ in range(rng.randint(1, 7))) for _ in range(5000)}
    accepted = refused = 0
    for name in sorted(names):
        slot = keys.key_slot(name)
        fits = all(keys.key_slot(key) == slot for key in every_key_and_channel(name))
        try:
            keys.check_name(name)
        except ValueError:
            refused += 1
            assert not fits, name
        else:
            accepted += 1
            assert fits, name
    assert accepted > 500 and refused > 500, (accepted, refused)


def test_the_latch_channel_of_a_tagged_name_is_published_classically() -> None:
    """Redisson wraps a latch's name in literal braces even when it has a tag (``{t}x`` gives
    ``...__{{t}x}``, tag ``{t``): such a channel is not among the latch scripts' keys and is
    published with classic PUBLISH (tests/test_latch.py). Without braces it is in the slot."""
    assert keys.same_slot(keys.latch_channel("plain"), "plain")
    assert not keys.same_slot(keys.latch_channel("{t}x"), "{t}x")


@pytest.fixture
async def cluster_clients(
    healthy_cluster: LocalCluster,
) -> AsyncIterator[Callable[..., aiolock.AioLock]]:
    made: list[aiolock.AioLock] = []

    def make(**config: Any) -> aiolock.AioLock:
        rc = redis.asyncio.RedisCluster(startup_nodes=healthy_cluster.startup_nodes())
        made.append(aiolock.AioLock(rc, config=aiolock.Config(**config)))
        made[-1]._owns_redis = True
        return made[-1]

    yield make
    for client in made:
        await client.aclose()


async def test_every_type_of_a_tagged_name_keeps_to_its_slot_on_a_cluster(
    healthy_cluster: LocalCluster, cluster_clients: Callable[..., aiolock.AioLock]
) -> None:
    """Names with a tag of their own (``pre{tag}post``) and without, waited on so that the
    per-waiter channels, read-hold timeout keys and permit side keys are all used: no
    CROSSSLOT anywhere. ``a}b`` is refused before anything is sent."""
    a, b = cluster_clients(), cluster_clients()
    with pytest.raises(ValueError, match="cluster slot"):
        a.lock("a}b")
    with pytest.raises(ValueError, match="cluster slot"):
        a.fair_lock("a}b")
    assert a.statistics().links_opened == 0
    for name in ("pre{tag}post", "plain:name"):

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

        await handed_over(a.lock(name), b.lock(name))
        await handed_over(a.fenced_lock(name + "f"), b.fenced_lock(name + "f"))
        await handed_over(a.fair_lock(name + "q"), b.fair_lock(name + "q"))
        await handed_over(
            a.read_write_lock(name + "rw").write_lock(), b.read_write_lock(name + "rw").write_lock()
        )
        async with a.read_write_lock(name + "rw").read_lock():
            async with a.read_write_lock(name + "rw").read_lock():  # two read holds
                pass
        permits = a.permit_expirable_semaphore(name + "p")
        assert await permits.try_set_permits(1)
        permit = await permits.acquire()
        other = asyncio.create_task(b.permit_expirable_semaphore(name + "p").try_acquire(30))
        await eventually(lambda: b.statistics().tasks_waiting == 1)
        await permits.release(permit)
        got = await other
        assert got is not None
        await b.permit_expirable_semaphore(name + "p").release(got)
        latch = a.countdown_latch(name + "l")
        assert await latch.try_set_count(1)
        opened = asyncio.create_task(b.countdown_latch(name + "l").wait(HANG_GUARD))
        await eventually(lambda: b.statistics().tasks_waiting == 1)
        await latch.count_down()
        assert await opened


# -- an unlock across a slot migration ----------------------------------------------------------


async def test_an_unlock_across_a_slot_migration_follows_it_to_the_end(
    healthy_cluster: LocalCluster, cluster_clients: Callable[..., aiolock.AioLock]
) -> None:
    """The symptom: a migration that ended 1.8 s after the unlock started (command_timeout
    3 s) made the unlock raise "MOVED" at 3.03 s: a try-again backoff slept past the
    command's time, and the MOVED that came back then was returned instead of followed."""
    cluster = healthy_cluster
    name = "seam:migrating"
    slot = cluster.key_slot(name)
    source = cluster.master_for_slot(slot)
    target = next(node for node in cluster.masters() if node is not source)
    client = cluster_clients(command_timeout=3)
    lock = client.lock(name)
    owner = client.new_owner()
    await lock.lock(owner=owner)
    # The lock's key moves, the slot stays the source's: the release (lock key and channel)
    # gets ASK there and TRYAGAIN on the target (its channel key is not stored) until the end.
    cluster.begin_slot_migration(slot, target, keys=[name])
    unlocking = asyncio.create_task(lock.unlock(owner=owner))
    await asyncio.sleep(1.8)
    assert not unlocking.done()
    await asyncio.to_thread(cluster.finish_slot_migration, slot)
    async with asyncio.timeout(HANG_GUARD):
        await unlocking
    assert target.execute("EXISTS", name) == 0
    assert not await lock.is_locked()


async def test_a_slot_migration_that_outlasts_the_command_says_so(
    healthy_cluster: LocalCluster, cluster_clients: Callable[..., aiolock.AioLock]
) -> None:
    """When the slot is still moving once command_timeout has run out, the error says that
    (the slot, that it was moving, how often the command was sent, that it did not run),
    not only the last redirect ("ASK 4302 127.0.0.1:7001")."""
    cluster = healthy_cluster
    name = "seam:stuck"
    slot = cluster.key_slot(name)
    source = cluster.master_for_slot(slot)
    target = next(node for node in cluster.masters() if node is not source)
    client = cluster_clients(command_timeout=1)
    lock = client.lock(name)
    await lock.lock(lease_time=30)
    cluster.begin_slot_migration(slot, target, keys=[name])
    try:
        async with asyncio.timeout(HANG_GUARD):
            with pytest.raises(aiolock.RedisOperationError) as info:
                await lock.unlock()
    finally:
        await asyncio.to_thread(cluster.finish_slot_migration, slot)
    message = str(info.value)
    assert f"slot {slot}" in message, message
    assert "command_timeout" in message, message
    assert "did not run" in message, message


# -- a database that does not exist ---------------------------------------------------------------


def no_such_db(url: str) -> str:
    base = url.rstrip("/")
    if base.count("/") > 2:
        base = base.rsplit("/", 1)[0]
    return base + "/99"


async def test_a_database_that_does_not_exist_gets_the_servers_own_error(redis_url: str) -> None:
    url = no_such_db(redis_url)
    async with aiolock.from_url(url) as client:
        async with asyncio.timeout(HANG_GUARD):
            with pytest.raises(aiolock.RedisUnavailableError) as info:
                await client.lock("x").try_lock()
    message = str(info.value)
    assert "SELECT 99" in message and "DB index is out of range" in message, message
    assert "sequence item" not in message


async def test_a_refusal_fails_every_call_at_once_not_after_the_backoff(redis_url: str) -> None:
    """Waiting cannot change a refused SELECT (nor AUTH, nor a cluster node): every call
    fails at once with the server's error. Before, each retry of each call waited out the
    reconnect backoff (here 1 to 2 s with jitter, within command_timeout): 3 calls of 4
    attempts took 9 s or more."""
    url = no_such_db(redis_url)
    async with aiolock.from_url(
        url, reconnect_delay=2.0, reconnect_max_delay=2.0, command_timeout=10.0
    ) as client:
        async with asyncio.timeout(4):  # far more than a refusal takes, far below 9 s
            for call in (
                client.lock("x").try_lock,
                client.lock("y").lock,
                client.semaphore("s").acquire,
            ):
                with pytest.raises(aiolock.RedisUnavailableError, match="DB index is out"):
                    await call()


async def test_configure_with_a_database_that_does_not_exist(redis_url: str) -> None:
    aiolock.configure(no_such_db(redis_url))
    try:
        async with asyncio.timeout(HANG_GUARD):
            with pytest.raises(aiolock.RedisUnavailableError, match="DB index is out of range"):
                async with aiolock.alock("x", wait_time=1):
                    pass
    finally:
        client = default_client.default_client()
        await client.aclose()
        default_client._configured = None
        default_client._per_loop.clear()


@pytest.mark.parametrize("command", [["inspect"], ["unlock", "--force", "x", "--yes"]])
def test_the_cli_with_a_database_that_does_not_exist(redis_url: str, command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "aiolock", *command, "--url", no_such_db(redis_url)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert done.returncode == 2, done
    assert "DB index is out of range" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
