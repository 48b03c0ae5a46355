"""Scenario 5 - composite locks: a multi-lock of 3 locks and a red lock of 3 masters against
one lock, and the red lock's parallel acquire against taking the same 3 locks one after
another.

Three private ``redis-server`` processes are started for the scenario (``aiolock.testing``;
``--redis`` is not used here: the scenario needs three independent servers), with one
aiolock client per server. Every variant runs in the same run, on the same servers:

* throughput - acquire+release cycles/s, ``tasks`` tasks on distinct names, watchdog leases
  (the default), the variants taking turns in interleaved slices:

  * ``lock``: ``client.lock(name)`` on the first server (the baseline);
  * ``multi-lock, 1 server``: ``multi_lock`` of 3 locks on that one server (one client);
  * ``multi-lock, 3 servers``: ``multi_lock`` of one lock on each server (taken in order);
  * ``red lock, 3 masters``: ``red_lock`` over the 3 clients (taken in parallel).

* acquire latency - one task, uncontended, the acquire alone timed (release not counted):
  ``lock``; ``3 locks one after another`` (the red lock's three member locks taken by
  ``try_lock`` in turn for one owner: a sequential red lock); ``multi-lock, 3 servers``; and
  ``red lock, 3 masters`` (parallel). On loopback a round trip costs ~0.1 ms, so it is run a
  second time with every reply delayed by 1 ms through one ``aiolock.testing.TcpProxy`` per
  server (a stand-in for a network), where parallel vs sequential shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiolock
from aiolock.testing import RedisServer, TcpProxy

from .runner import (
    LoopName,
    Row,
    ScenarioResult,
    Settings,
    close_client,
    ratio,
    run_on,
    summarize_ms,
)

Cycle = Callable[[str], Awaitable[None]]
SERVERS = 3
#: the reply delay of the "network" latency run (seconds)
NETWORK_DELAY = 0.001


async def _throughput(
    variant: str, cycle: Cycle, tasks: int, warmup: float, seconds: float
) -> dict[str, Any]:
    counts = [0] * tasks
    stop = asyncio.Event()

    async def worker(i: int) -> None:
        name = f"bench:composite:{variant}:{i}"
        while not stop.is_set():
            await cycle(name)
            counts[i] += 1

    workers = [asyncio.ensure_future(worker(i)) for i in range(tasks)]
    try:
        await asyncio.sleep(warmup)
        c0, t0, cpu0 = sum(counts), time.perf_counter(), time.process_time()
        await asyncio.sleep(seconds)
        c1, t1, cpu1 = sum(counts), time.perf_counter(), time.process_time()
    finally:
        stop.set()
        await asyncio.gather(*workers)
    return {"cycles": c1 - c0, "seconds": t1 - t0, "client_cpu": cpu1 - cpu0}


async def _latency(
    acquire: Callable[[], Awaitable[Callable[[], Awaitable[None]]]], rounds: int
) -> list[int]:
    """Time ``acquire()`` alone, ``rounds`` times (it returns the release to call)."""
    samples: list[int] = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        release = await acquire()
        samples.append(time.perf_counter_ns() - t0)
        await release()
    return samples


@contextlib.asynccontextmanager
async def _clients(urls: list[str]) -> AsyncIterator[list[aiolock.AioLock]]:
    clients = [aiolock.from_url(url) for url in urls]
    try:
        yield clients
    finally:
        for client in clients:
            await close_client(client, "composite client")


async def _latencies(urls: list[str], rounds: int, prefix: str) -> dict[str, list[int]]:
    async with _clients(urls) as clients:
        first = clients[0]
        red = aiolock.red_lock(*clients, name=f"bench:composite:{prefix}:red")
        multi = aiolock.multi_lock(
            *(c.lock(f"bench:composite:{prefix}:multi:{i}") for i, c in enumerate(clients))
        )
        members = [c.lock(f"bench:composite:{prefix}:seq") for c in clients]
        owners = [c.new_owner() for c in clients]  # a client takes only its own owners

        async def lock() -> Callable[[], Awaitable[None]]:
            single = first.lock(f"bench:composite:{prefix}:lock")
            await single.lock()
            return single.unlock

        async def sequential() -> Callable[[], Awaitable[None]]:
            for member, owner in zip(members, owners, strict=True):
                assert await member.try_lock(owner=owner)

            async def release() -> None:
                await asyncio.gather(
                    *(m.unlock(owner=o) for m, o in zip(members, owners, strict=True))
                )

            return release

        async def multi_lock() -> Callable[[], Awaitable[None]]:
            await multi.lock()
            return multi.unlock

        async def red_lock() -> Callable[[], Awaitable[None]]:
            await red.lock()
            return red.unlock

        variants = {
            "lock": lock,
            "3 locks one after another": sequential,
            "multi-lock, 3 servers": multi_lock,
            "red lock, 3 masters (parallel)": red_lock,
        }
        for acquire in variants.values():  # connections open, scripts loaded
            await _latency(acquire, 5)
        samples: dict[str, list[int]] = {name: [] for name in variants}
        for _ in range(5):  # interleaved
            for name, acquire in variants.items():
                samples[name] += await _latency(acquire, max(1, rounds // 5))
        return samples


async def _run(settings: Settings) -> dict[str, Any]:
    servers = [RedisServer().start() for _ in range(SERVERS)]
    try:
        urls = [server.url for server in servers]
        out: dict[str, Any] = {"servers": [s.version for s in servers][:1]}
        async with _clients(urls) as clients:
            first = clients[0]

            async def lock_cycle(name: str) -> None:
                lock = first.lock(name)
                await lock.lock()
                await lock.unlock()

            async def multi_one_cycle(name: str) -> None:
                multi = aiolock.multi_lock(*(first.lock(f"{name}:{i}") for i in range(SERVERS)))
                await multi.lock()
                await multi.unlock()

            async def multi_cycle(name: str) -> None:
                multi = aiolock.multi_lock(*(c.lock(name) for c in clients))
                await multi.lock()
                await multi.unlock()

            async def red_cycle(name: str) -> None:
                red = aiolock.red_lock(*clients, name=name)
                await red.lock()
                await red.unlock()

            variants: dict[str, Cycle] = {
                "lock": lock_cycle,
                "multi-lock, 1 server": multi_one_cycle,
                "multi-lock, 3 servers": multi_cycle,
                "red lock, 3 masters": red_cycle,
            }
            names = list(variants)
            rounds = settings.uncontended_rounds
            slice_s = settings.uncontended_seconds / rounds
            per_round: dict[str, list[dict[str, Any]]] = {v: [] for v in names}
            for rnd in range(rounds):
                order = names[rnd % len(names) :] + names[: rnd % len(names)]
                for variant in order:
                    per_round[variant].append(
                        await _throughput(
                            variant,
                            variants[variant],
                            settings.uncontended_tasks,
                            settings.warmup if rnd == 0 else settings.warmup / 2,
                            slice_s,
                        )
                    )
            throughput: dict[str, Any] = {}
            for variant, results in per_round.items():
                cycles = sum(r["cycles"] for r in results)
                seconds = sum(r["seconds"] for r in results)
                throughput[variant] = {
                    "cycles_per_s": cycles / seconds if seconds else 0.0,
                    "per_round_cycles_per_s": [r["cycles"] / r["seconds"] for r in results],
                    "client_cpu_us_per_cycle": 1e6 * sum(r["client_cpu"] for r in results) / cycles
                    if cycles
                    else None,
                }
            out["throughput"] = throughput
        rounds = 60 if settings.quick else 200
        out["latency_loopback"] = {
            k: summarize_ms(v) for k, v in (await _latencies(urls, rounds, "lo")).items()
        }
        proxies = [await TcpProxy.for_url(url).start() for url in urls]
        try:
            for proxy in proxies:
                proxy.delay_replies(NETWORK_DELAY)
            delayed = await _latencies([p.url for p in proxies], rounds // 2, "net")
            out["latency_delayed"] = {k: summarize_ms(v) for k, v in delayed.items()}
        finally:
            for proxy in proxies:
                await proxy.aclose()
        return out
    finally:
        for server in servers:
            server.stop()


def run(settings: Settings, loop: LoopName) -> ScenarioResult:
    data = run_on(loop, _run(settings))
    rows: list[Row] = []
    rate = {k: v["cycles_per_s"] for k, v in data["throughput"].items()}
    rows.append(
        Row(
            "composite",
            loop,
            "acquire+release cycles/s",
            "cycles/s",
            rate,
            {
                "multi-lock 1 server/lock": ratio(rate["multi-lock, 1 server"], rate["lock"]),
                "multi-lock 3 servers/lock": ratio(rate["multi-lock, 3 servers"], rate["lock"]),
                "red lock/lock": ratio(rate["red lock, 3 masters"], rate["lock"]),
            },
            better="higher",
            note=(
                f"{settings.uncontended_tasks} tasks, distinct names, watchdog leases, 3 "
                f"redis-servers, {settings.uncontended_seconds:g} s in "
                f"{settings.uncontended_rounds} interleaved slices"
            ),
        )
    )
    cpu = {k: v["client_cpu_us_per_cycle"] for k, v in data["throughput"].items()}
    rows.append(
        Row(
            "composite",
            loop,
            "client CPU per cycle",
            "us",
            cpu,
            {
                "multi-lock 3 servers/lock": ratio(cpu["multi-lock, 3 servers"], cpu["lock"]),
                "red lock/lock": ratio(cpu["red lock, 3 masters"], cpu["lock"]),
            },
            better="lower",
        )
    )
    for key, label in (
        ("latency_loopback", "acquire latency p50, loopback"),
        ("latency_delayed", f"acquire latency p50, replies +{NETWORK_DELAY * 1000:g} ms"),
    ):
        p50 = {k: v["p50"] for k, v in data[key].items()}
        rows.append(
            Row(
                "composite",
                loop,
                label,
                "ms",
                p50,
                {
                    "parallel/sequential": ratio(
                        p50["red lock, 3 masters (parallel)"], p50["3 locks one after another"]
                    ),
                    "red lock/lock": ratio(p50["red lock, 3 masters (parallel)"], p50["lock"]),
                },
                better="lower",
                note="one task, uncontended, the acquire alone; p90 and p99 in the JSON",
            )
        )
    return ScenarioResult("composite", loop, rows, data)
