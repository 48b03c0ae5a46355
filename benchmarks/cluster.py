"""Scenario "cluster" - aiolock on a Redis Cluster beside one Redis server, in one run.

A private ``LocalCluster`` (3 masters + 3 replicas) and a private ``RedisServer`` are
started for the scenario (``aiolock.testing``; ``--redis`` is not used: it needs its own
cluster), with one aiolock client each; the cluster client uses the pub/sub mode Redisson
would choose (sharded on Redis 7).

* uncontended: acquire+release cycles/s, ``uncontended_tasks`` tasks on distinct names,
  leases of 10 s (no watchdog), the two deployments taking turns in interleaved slices;
* hand-off: one holder, one waiter in another client of the same process; from the
  holder's ``unlock()`` to the waiter's ``lock()`` returning (release script, PUBLISH or
  SPUBLISH, the waiter's next attempt);
* spread: one acquire+release for each of 10,000 lock names (2,000 with ``--quick``), and
  each master's share of the script calls (``INFO commandstats``): the hash slots spread
  names evenly, so each share should be within 10% of a third.

What a 2-core machine can and cannot show: the three masters, their replicas, the client
and the rest of the machine share two cores, so the cluster cannot be faster here than one
server; what it can show is the client-side cost of routing (slot computation, one link per
master, redirects none in steady state) and that the load spreads evenly. With a core per
master (and the client not the bottleneck: several client processes), uncontended
throughput scales with the number of masters, as each lock's commands touch one master
only; hand-off latency stays one server's (a hand-off involves one slot's master).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio

import aiolock
from aiolock.testing import LocalCluster, RedisServer

from .runner import (
    LoopName,
    Row,
    ScenarioResult,
    Settings,
    Target,
    close_client,
    parse_commandstats,
    ratio,
    run_on,
    summarize_ms,
)

SINGLE, CLUSTER = "one server", "cluster, 3 masters"
RATIO = f"{CLUSTER}/{SINGLE}"
SPREAD_TOLERANCE = 0.10
LEASE = 10.0


async def _throughput(
    clients: dict[str, aiolock.AioLock], tasks: int, warmup: float, seconds: float, rounds: int
) -> dict[str, float]:
    """Cycles/s of each client, in interleaved slices of ``seconds / rounds`` each."""
    cycles = dict.fromkeys(clients, 0)
    spent = dict.fromkeys(clients, 0.0)
    cpu = dict.fromkeys(clients, 0.0)

    async def slice_of(variant: str, length: float) -> tuple[int, float, float]:
        client = clients[variant]
        count = 0
        stop = False

        async def worker(i: int) -> None:
            nonlocal count
            lock = client.lock(f"bench:cluster:{variant}:{i}")
            while not stop:
                await lock.lock(LEASE)
                await lock.unlock()
                count += 1

        workers = [asyncio.ensure_future(worker(i)) for i in range(tasks)]
        try:
            started, cpu0 = time.perf_counter(), time.process_time()
            await asyncio.sleep(length)
            done, ended, cpu1 = count, time.perf_counter(), time.process_time()
        finally:
            stop = True
            await asyncio.gather(*workers)
        return done, ended - started, cpu1 - cpu0

    for variant in clients:
        await slice_of(variant, warmup)
    for _ in range(rounds):
        for variant in clients:
            done, took, used = await slice_of(variant, seconds / rounds)
            cycles[variant] += done
            spent[variant] += took
            cpu[variant] += used
    return {
        **{variant: cycles[variant] / spent[variant] for variant in clients},
        **{f"{variant} client cpu us": 1e6 * cpu[variant] / cycles[variant] for variant in clients},
    }


async def _handoff(holder: aiolock.AioLock, waiter: aiolock.AioLock, rounds: int) -> list[int]:
    """Nanoseconds from the holder's unlock() to the waiter's lock() returning."""
    samples: list[int] = []
    name = "bench:cluster:handoff"
    for _ in range(rounds):
        lock = holder.lock(name)
        await lock.lock(LEASE)
        got: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def wait(got: asyncio.Future[int] = got) -> None:
            other = waiter.lock(name)
            await other.lock(LEASE)
            got.set_result(time.perf_counter_ns())
            await other.unlock()

        task = asyncio.ensure_future(wait())
        while waiter.statistics().tasks_waiting == 0:  # noqa: ASYNC110 (a statistic)
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.002)
        released = time.perf_counter_ns()
        await lock.unlock()
        samples.append(await got - released)
        await task
    return samples


async def _spread(client: aiolock.AioLock, cluster: LocalCluster, names: int) -> dict[str, Any]:
    masters = cluster.masters()
    for node in masters:
        node.execute("CONFIG", "RESETSTAT")
    queue = iter(range(names))

    async def worker() -> None:
        for i in queue:
            lock = client.lock(f"bench:cluster:spread:{i}")
            await lock.lock(LEASE)
            await lock.unlock()

    await asyncio.gather(*(worker() for _ in range(50)))
    calls: dict[str, int] = {}
    for node in masters:
        stats = parse_commandstats(node.execute("INFO", "commandstats"))
        calls[f"{node.host}:{node.port}"] = stats.get("evalsha", 0) + stats.get("eval", 0)
    total = sum(calls.values())
    even = total / len(calls)
    return {
        "names": names,
        "script_calls": calls,
        "shares": {node: n / total for node, n in calls.items()},
        "max_deviation_from_even": max(abs(n - even) / even for n in calls.values()),
    }


async def _run(settings: Settings, loop: LoopName) -> dict[str, Any]:
    server = RedisServer()
    cluster = LocalCluster()
    made: list[aiolock.AioLock] = []
    await asyncio.to_thread(server.start)
    await asyncio.to_thread(cluster.start)
    try:

        def on_cluster() -> aiolock.AioLock:
            rc = redis.asyncio.RedisCluster(startup_nodes=cluster.startup_nodes())
            client = aiolock.AioLock(rc)
            client._owns_redis = True
            made.append(client)
            return client

        def on_server() -> aiolock.AioLock:
            made.append(aiolock.from_url(server.url))
            return made[-1]

        clients = {SINGLE: on_server(), CLUSTER: on_cluster()}
        throughput = await _throughput(
            clients,
            settings.uncontended_tasks,
            settings.warmup,
            settings.uncontended_seconds,
            settings.uncontended_rounds,
        )
        rounds = settings.handoff_rounds_aiolock
        handoff = {
            SINGLE: summarize_ms(await _handoff(clients[SINGLE], on_server(), rounds)),
            CLUSTER: summarize_ms(await _handoff(clients[CLUSTER], on_cluster(), rounds)),
        }
        spread = await _spread(clients[CLUSTER], cluster, 2_000 if settings.quick else 10_000)
        transport = clients[CLUSTER].runtime().transport
        redirects = getattr(transport, "redirects", None)
        sharded = getattr(transport, "sharded", None)
    finally:
        for client in made:
            await close_client(client)
        await asyncio.to_thread(cluster.stop)
        await asyncio.to_thread(server.stop)
    return {
        "uncontended_cycles_per_s": throughput,
        "handoff_ms": handoff,
        "spread": spread,
        "redirects_followed": redirects,
        "sharded_pubsub": sharded,
    }


def run(settings: Settings, loop: LoopName) -> ScenarioResult:
    data = run_on(loop, _run(settings, loop))
    rows: list[Row] = []
    both = (SINGLE, CLUSTER)

    def add(
        metric: str, unit: str, values: dict[str, float | None], better: Any, note: str
    ) -> None:
        rows.append(
            Row(
                "cluster",
                loop,
                metric,
                unit,
                values,
                {RATIO: ratio(values[CLUSTER], values[SINGLE])},
                better=better,
                note=note,
            )
        )

    cycles = data["uncontended_cycles_per_s"]
    add(
        "uncontended cycles/s",
        "cycles/s",
        {v: cycles[v] for v in both},
        "higher",
        f"{settings.uncontended_tasks} tasks, distinct names, lease {LEASE:g} s; 2 cores: "
        "no scaling can show",
    )
    add(
        "client CPU per cycle",
        "us",
        {v: cycles[f"{v} client cpu us"] for v in both},
        "lower",
        "this process's CPU time per acquire+release (the servers' is not counted)",
    )
    hand = data["handoff_ms"]
    for stat in ("p50", "p99"):
        add(
            f"hand-off {stat}",
            "ms",
            {v: hand[v][stat] for v in both},
            "lower",
            "unlock() in one client -> lock() returns in another (same process)"
            if stat == "p50"
            else "",
        )
    spread = data["spread"]
    deviation = spread["max_deviation_from_even"]
    rows.append(
        Row(
            "cluster",
            loop,
            f"script calls per master, {spread['names']:,} names",
            "%",
            {
                f"master {i}": 100 * share
                for i, share in enumerate(spread["shares"].values(), start=1)
            },
            targets=[
                Target(
                    "each master within 10% of an even share",
                    100 * deviation,
                    "<=",
                    100 * SPREAD_TOLERANCE,
                )
            ],
            note=f"largest deviation from even: {100 * deviation:.1f}%",
        )
    )
    return ScenarioResult("cluster", loop, rows, data)
