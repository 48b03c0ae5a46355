"""Scenario 1 - uncontended: acquire+release cycles per second, one process, N tasks on
distinct names.

Variants, all on the same server in the same run, each on its own ``redis.asyncio.Redis``
(default connection pool, so each ends up with one connection per task):

* ``aiolock``: ``lock = client.lock(name); await lock.try_lock(lease_time=10); await lock.unlock()``
  on a client without metrics (``metrics=False``)
* ``aiolock-otel``: the same, recording metrics into OpenTelemetry's SDK (a ``MeterProvider``
  with an in-memory reader, so what is measured is the recording, not an export); when
  opentelemetry-sdk is installed
* ``aiolock-otel-api``: the same with the default ``metrics=True`` and no SDK set up: what
  an application that has opentelemetry-api installed but exports nothing pays
* ``aiolock-watchdog``: the same without ``lease_time`` (watchdog lease), once
  the watchdog exists
* ``floor``: the physical floor (:class:`benchmarks.floor.UncontendedFloor`): aiolock's
  acquire/release Lua scripts by EVALSHA, pipelined from all tasks over ONE raw asyncio
  connection (``asyncio.Protocol`` + hiredis, futures resolved straight from data_received)
* ``redis-py evalsha``: the same scripts by ``Redis.evalsha`` (SCRIPT LOADed first) on a
  ``redis.asyncio.Redis``: not a floor, redis-py's per-command machinery around the scripts
* ``redis-py``: ``redis.asyncio.lock.Lock`` (``r.lock(name, timeout=10)``: SET NX PX + Lua release)

The measured time is cut into ``rounds`` slices and the variants take turns (rotating the
order), so a burst of load from something else on the machine hits every variant alike.
Besides cycles/s it records client CPU per cycle (``time.process_time``; less noisy than
throughput on a shared machine), server CPU per cycle and round trips per cycle.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aredis

import aiolock

from . import floor
from .runner import (
    LoopName,
    RoundTrips,
    Row,
    ScenarioResult,
    Settings,
    Target,
    close_client,
    parse_commandstats,
    ratio,
    run_on,
    stats_delta,
    watchdog_available,
)

Cycle = Callable[[str], Awaitable[bool]]
LEASE_S = 10


async def _server_counters(r: aredis.Redis) -> tuple[dict[str, int], float]:
    stats = parse_commandstats(await r.info("commandstats"))
    cpu = await r.info("cpu")
    return stats, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


async def _timed(
    variant: str, cycle: Cycle, tasks: int, warmup: float, seconds: float, probe: aredis.Redis
) -> dict[str, Any]:
    """Run ``tasks`` loops of ``cycle`` for warm-up + ``seconds``; count what happened."""
    counts = [0] * tasks
    failures = [0]
    stop = asyncio.Event()

    async def worker(i: int) -> None:
        name = f"bench:unc:{variant}:{i}"
        while not stop.is_set():
            if await cycle(name):
                counts[i] += 1
            else:
                failures[0] += 1

    workers = [asyncio.ensure_future(worker(i)) for i in range(tasks)]
    try:
        await asyncio.sleep(warmup)
        cmd0, srv0 = await _server_counters(probe)
        c0, t0, cpu0 = sum(counts), time.perf_counter(), time.process_time()
        await asyncio.sleep(seconds)
        c1, t1, cpu1 = sum(counts), time.perf_counter(), time.process_time()
        cmd1, srv1 = await _server_counters(probe)
    finally:
        stop.set()
        await asyncio.gather(*workers)
    cycles = c1 - c0
    delta = stats_delta(cmd0, cmd1)
    delta["info"] = delta.get("info", 0) - 2  # our own two INFO calls
    rt = RoundTrips.from_delta(delta)
    return {
        "cycles": cycles,
        "seconds": t1 - t0,
        "client_cpu": cpu1 - cpu0,
        "server_cpu": srv1 - srv0,
        "failures": failures[0],
        "round_trips": rt.counted,
        "setup_commands": rt.setup,
        "commands": delta,
    }


def _sdk_metrics() -> aiolock.Metrics | None:
    """Metrics recorded into OpenTelemetry's SDK, or None without opentelemetry-sdk."""
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    except ImportError:
        return None
    return aiolock.Metrics(MeterProvider(metric_readers=[InMemoryMetricReader()]))


async def _run(settings: Settings) -> dict[str, Any]:
    url = settings.url
    client = aiolock.from_url(url, metrics=False)
    sdk_metrics = _sdk_metrics()
    otel_client = aiolock.from_url(url, metrics=sdk_metrics) if sdk_metrics else None
    api_client = aiolock.from_url(url, metrics=True)
    raw = aredis.Redis.from_url(url)
    floor_client = await floor.UncontendedFloor.open(url)
    rpy = aredis.Redis.from_url(url)
    probe = aredis.Redis.from_url(url, decode_responses=True)
    try:
        acquire_sha = await raw.script_load(floor.ACQUIRE.source)
        release_sha = await raw.script_load(floor.RELEASE.source)
        assert acquire_sha == floor.ACQUIRE.sha.decode()
        assert release_sha == floor.RELEASE.sha.decode()
        raw_owner_prefix = f"{uuid.uuid4()}:"

        def aiolock_cycle_on(on: aiolock.AioLock) -> Cycle:
            async def cycle(name: str) -> bool:
                lock = on.lock(name)
                if not await lock.try_lock(lease_time=LEASE_S):
                    return False
                await lock.unlock()
                return True

            return cycle

        aiolock_cycle = aiolock_cycle_on(client)

        async def aiolock_watchdog_cycle(name: str) -> bool:
            lock = client.lock(name)
            if not await lock.try_lock():
                return False
            await lock.unlock()
            return True

        async def raw_cycle(name: str) -> bool:
            owner = raw_owner_prefix + name  # one owner per task, as aiolock's task ids
            ttl = await raw.evalsha(acquire_sha, 1, name, LEASE_S * 1000, owner)
            if ttl is not None:
                return False
            await raw.evalsha(
                release_sha, 2, name, floor.channel_of(name), floor.UNLOCK_MESSAGE, LEASE_S * 1000,
                owner, 1, "PUBLISH",
            )  # fmt: skip
            return True

        async def redispy_cycle(name: str) -> bool:
            lk = rpy.lock(name, timeout=LEASE_S)
            if not await lk.acquire(blocking=False):
                return False
            await lk.release()
            return True

        variants: dict[str, Cycle] = {"aiolock": aiolock_cycle}
        if watchdog_available():
            variants["aiolock-watchdog"] = aiolock_watchdog_cycle
        if otel_client is not None:
            variants["aiolock-otel"] = aiolock_cycle_on(otel_client)
        if api_client.metrics is not None:  # opentelemetry-api is installed
            variants["aiolock-otel-api"] = aiolock_cycle_on(api_client)
        variants["floor"] = floor_client.cycle
        variants["redis-py evalsha"] = raw_cycle
        variants["redis-py"] = redispy_cycle

        names = list(variants)
        slice_s = settings.uncontended_seconds / settings.uncontended_rounds
        per_round: dict[str, list[dict[str, Any]]] = {v: [] for v in names}
        for rnd in range(settings.uncontended_rounds):
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            for variant in order:
                per_round[variant].append(
                    await _timed(
                        variant,
                        variants[variant],
                        settings.uncontended_tasks,
                        settings.warmup if rnd == 0 else settings.warmup / 2,
                        slice_s,
                        probe,
                    )
                )
        out: dict[str, Any] = {}
        for variant, rounds in per_round.items():
            cycles = sum(r["cycles"] for r in rounds)
            seconds = sum(r["seconds"] for r in rounds)
            commands: dict[str, int] = {}
            for r in rounds:
                for k, n in r["commands"].items():
                    commands[k] = commands.get(k, 0) + n
            out[variant] = {
                "cycles": cycles,
                "seconds": seconds,
                "cycles_per_s": cycles / seconds if seconds else 0.0,
                "per_round_cycles_per_s": [r["cycles"] / r["seconds"] for r in rounds],
                "client_cpu_us_per_cycle": 1e6 * sum(r["client_cpu"] for r in rounds) / cycles
                if cycles
                else None,
                "server_cpu_us_per_cycle": 1e6 * sum(r["server_cpu"] for r in rounds) / cycles
                if cycles
                else None,
                "round_trips_per_cycle": sum(r["round_trips"] for r in rounds) / cycles
                if cycles
                else None,
                "failures": sum(r["failures"] for r in rounds),
                "commands": commands,
            }
        return out
    finally:
        await close_client(client, "uncontended client")
        if otel_client is not None:
            await close_client(otel_client, "uncontended client (otel)")
        await close_client(api_client, "uncontended client (otel api)")
        await raw.aclose()
        floor_client.close()
        await rpy.aclose()
        await probe.aclose()


def run(settings: Settings, loop: LoopName) -> ScenarioResult:
    data = run_on(loop, _run(settings))
    rows: list[Row] = []
    variants = list(data)

    def values(key: str) -> dict[str, float | None]:
        return {v: data[v][key] for v in variants}

    rate = values("cycles_per_s")
    ratios = {
        "aiolock/floor": ratio(rate["aiolock"], rate["floor"]),
        "aiolock/redis-py": ratio(rate["aiolock"], rate["redis-py"]),
        "aiolock/redis-py evalsha": ratio(rate["aiolock"], rate["redis-py evalsha"]),
    }
    if "aiolock-watchdog" in rate:
        ratios["aiolock-watchdog/floor"] = ratio(rate["aiolock-watchdog"], rate["floor"])
    for metrics_variant in ("aiolock-otel", "aiolock-otel-api"):
        if metrics_variant in rate:  # the cost of metrics, in the same run
            ratios[f"{metrics_variant}/aiolock"] = ratio(rate[metrics_variant], rate["aiolock"])
    rows.append(
        Row(
            "uncontended",
            loop,
            "acquire+release cycles/s",
            "cycles/s",
            rate,
            ratios,
            [
                Target("vs floor", ratios["aiolock/floor"], ">=", 0.6),
                Target("vs redis-py", ratios["aiolock/redis-py"], ">=", 2.5),
            ],
            better="higher",
            note=(
                f"{settings.uncontended_tasks} tasks, distinct names, "
                f"{settings.uncontended_seconds:g} s in {settings.uncontended_rounds} "
                "interleaved slices"
                + ("" if "aiolock-watchdog" in rate else "; watchdog variant: not yet available")
            ),
        )
    )
    cpu = values("client_cpu_us_per_cycle")
    cpu_vs_floor = ratio(cpu["aiolock"], cpu["floor"])
    rows.append(
        Row(
            "uncontended",
            loop,
            "client CPU per cycle",
            "us",
            cpu,
            {
                "aiolock/floor": cpu_vs_floor,
                "aiolock/redis-py": ratio(cpu["aiolock"], cpu["redis-py"]),
            },
            [Target("vs floor", cpu_vs_floor, "<=", 2.0)],
            better="lower",
            note="time.process_time of the benchmark process / cycles",
        )
    )
    srv = values("server_cpu_us_per_cycle")
    rows.append(
        Row(
            "uncontended",
            loop,
            "server CPU per cycle",
            "us",
            srv,
            {"aiolock/floor": ratio(srv["aiolock"], srv["floor"])},
            better="lower",
            note="redis-server used_cpu_user+sys / cycles",
        )
    )
    rt = values("round_trips_per_cycle")
    rows.append(
        Row(
            "uncontended",
            loop,
            "round trips per cycle",
            "commands",
            rt,
            {"aiolock/floor": ratio(rt["aiolock"], rt["floor"])},
            better="lower",
            note="top-level commands by INFO commandstats (2.0 = one acquire + one release)",
        )
    )
    return ScenarioResult("uncontended", loop, rows, data)
