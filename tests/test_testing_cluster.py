"""LocalCluster: a real Redis Cluster of local redis-server processes.

One cluster serves the whole module (it takes ~2 s to come up); every test starts from
``heal()``, so a test that killed or paused a node leaves nothing broken for the next.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio
import redis.exceptions

from aiolock.testing import LocalCluster, LocalClusterNode, find_redis_server_binary

pytestmark = pytest.mark.skipif(
    find_redis_server_binary() is None, reason="needs a redis-server binary"
)

HANG_GUARD = 30  # seconds; only there so that a bug fails instead of hanging


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[LocalCluster]:
    with LocalCluster() as cluster:
        yield cluster


@pytest.fixture
def cluster(shared_cluster: LocalCluster) -> LocalCluster:
    shared_cluster.heal()
    shared_cluster.flushall()
    return shared_cluster


@pytest.fixture
async def client(cluster: LocalCluster) -> AsyncIterator[redis.asyncio.RedisCluster]:
    client = redis.asyncio.RedisCluster(startup_nodes=cluster.startup_nodes())
    try:
        yield client
    finally:
        await client.aclose()


def other_master(cluster: LocalCluster, than: LocalClusterNode) -> LocalClusterNode:
    return next(node for node in cluster.masters() if node is not than)


def test_starts_three_masters_with_a_replica_each(cluster: LocalCluster) -> None:
    assert len(cluster.nodes) == 6
    assert all(node.is_running and node.node_id for node in cluster.nodes)
    masters = cluster.masters()
    assert len(masters) == 3
    assert {node.role() for node in masters} == {"master"}
    for master in masters:
        (replica,) = cluster.replicas(of=master)
        assert replica.role() == "replica"
    assert len(cluster.replicas()) == 3
    assert cluster.master_for_slot(0) in masters
    assert cluster.master_for_slot(16383) in masters
    for node in cluster.nodes:
        assert "cluster_state:ok" in node.execute("CLUSTER", "INFO")
    assert len(cluster.startup_nodes()) == 6
    assert cluster.node_at(cluster.nodes[4].port) is cluster.nodes[4]


async def test_writes_through_redis_cluster(
    cluster: LocalCluster, client: redis.asyncio.RedisCluster
) -> None:
    keys = [f"key:{i}" for i in range(30)]
    for key in keys:
        await client.set(key, key)
    assert len({cluster.master_for_key(key).port for key in keys}) == 3  # spread over them
    for key in keys:
        assert cluster.master_for_key(key).execute("GET", key) == key
    async with redis.asyncio.RedisCluster.from_url(cluster.url) as by_url:
        assert await by_url.get("key:7") == b"key:7"


async def test_kill_a_master_and_its_replica_is_promoted(
    cluster: LocalCluster, client: redis.asyncio.RedisCluster
) -> None:
    await client.set("survivor", "yes")
    master = cluster.master_for_key("survivor")
    (replica,) = cluster.replicas(of=master)
    assert master.execute("WAIT", 1, 5000) == 1  # the replica has the write

    cluster.kill(master)
    assert not master.is_running
    async with asyncio.timeout(HANG_GUARD):
        promoted = await asyncio.to_thread(cluster.wait_for_failover_of, master)
    assert promoted is replica
    assert replica.role() == "master"
    assert cluster.master_for_key("survivor") is replica
    assert master not in cluster.masters()
    assert await client.get("survivor") == b"yes"  # the client finds the new master

    await asyncio.to_thread(cluster.restart, master)  # rejoins, as the new master's replica
    assert master.role() == "replica"
    assert cluster.replicas(of=replica) == [master]


def test_manual_failover(cluster: LocalCluster) -> None:
    replica = cluster.replicas()[0]
    master = next(node for node in cluster.masters() if cluster.replicas(of=node) == [replica])
    cluster.failover(replica)
    assert replica.role() == "master"
    assert master.role() == "replica"
    assert cluster.replicas(of=replica) == [master]


async def test_migrate_a_slot_with_its_keys(
    cluster: LocalCluster, client: redis.asyncio.RedisCluster
) -> None:
    keys = [f"{{moving}}:{i}" for i in range(250)]  # more than one MIGRATE batch
    slot = cluster.key_slot(keys[0])
    for key in keys:
        await client.set(key, key)
    source = cluster.master_for_slot(slot)
    target = other_master(cluster, source)

    await asyncio.to_thread(cluster.migrate_slot, slot, target)
    assert cluster.master_for_slot(slot) is target
    assert target.execute("CLUSTER", "COUNTKEYSINSLOT", slot) == 250
    assert source.execute("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    with pytest.raises(redis.exceptions.MovedError) as moved:
        source.execute("GET", keys[0])
    assert (moved.value.slot_id, moved.value.port) == (slot, target.port)
    assert await client.get(keys[100]) == keys[100].encode()  # follows MOVED


async def test_a_slot_left_migrating_answers_ask(
    cluster: LocalCluster, client: redis.asyncio.RedisCluster
) -> None:
    await client.set("{half}:moved", "m")
    await client.set("{half}:stayed", "s")
    slot = cluster.key_slot("{half}")
    source = cluster.master_for_slot(slot)
    target = other_master(cluster, source)

    assert cluster.begin_slot_migration(slot, target, keys=["{half}:moved"]) is source
    assert cluster.master_for_slot(slot) is source  # still the source's until finished
    assert source.execute("GET", "{half}:stayed") == "s"
    with pytest.raises(redis.exceptions.AskError) as ask:
        source.execute("GET", "{half}:moved")
    assert (ask.value.slot_id, ask.value.host, ask.value.port) == (slot, "127.0.0.1", target.port)
    assert await client.get("{half}:moved") == b"m"  # follows ASK
    assert await client.get("{half}:stayed") == b"s"

    cluster.finish_slot_migration(slot)
    assert cluster.master_for_slot(slot) is target
    assert target.execute("CLUSTER", "COUNTKEYSINSLOT", slot) == 2


def test_pause_and_resume_a_node(cluster: LocalCluster) -> None:
    replica = cluster.replicas()[0]
    cluster.pause(replica)
    assert replica.is_paused
    assert not replica.server.ping(timeout=0.2)
    cluster.resume(replica)
    assert replica.server.ping()
    cluster.wait_until_healthy()


def test_bad_arguments(cluster: LocalCluster) -> None:
    with pytest.raises(ValueError):
        LocalCluster(masters=0)
    with pytest.raises(ValueError):
        cluster.master_for_slot(16384)
    with pytest.raises(KeyError):
        cluster.node_at(1)
    master = cluster.master_for_slot(5)
    with pytest.raises(ValueError, match="already served"):
        cluster.begin_slot_migration(5, master)
    other = other_master(cluster, master)
    with pytest.raises(ValueError, match="not in slot"):
        cluster.begin_slot_migration(5, other, keys=["not-in-slot-5"])
    assert cluster.master_for_slot(5) is master  # nothing was started
    with pytest.raises(KeyError):
        cluster.finish_slot_migration(5)


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def test_stop_leaves_no_process_and_no_directory() -> None:
    with LocalCluster(masters=1, replicas_per_master=1) as cluster:
        pids = [node.pid for node in cluster.nodes]
        dirs = [node.server.data_dir for node in cluster.nodes]
        assert cluster.master_for_slot(16383) is cluster.nodes[0]
    assert all(pid is not None and _gone(pid) for pid in pids)
    assert all(path is not None and not path.exists() for path in dirs)
    assert not any(node.is_running for node in cluster.nodes)
    cluster.stop()  # idempotent


def test_a_node_that_cannot_start_stops_the_others() -> None:
    cluster = LocalCluster(masters=1, replicas_per_master=0, extra_args=["--no-such-option", "1"])
    with pytest.raises(RuntimeError, match="no-such-option"):
        cluster.start()
    assert not any(node.is_running for node in cluster.nodes)
