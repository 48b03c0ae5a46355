"""Scenario "semaphores" - the semaphores beside the lock, in one run.

1. Cycles per second, one process, 50 tasks (as ``uncontended.py``), each on a name of its
   own, the variants taking turns in interleaved slices:

   * ``lock``: ``client.lock(name).try_lock(lease_time=10)`` + ``unlock()`` (the baseline)
   * ``semaphore``: ``client.semaphore(name).try_acquire()`` + ``release()``, one permit per
     name (set up first)
   * ``semaphore shared``: the same on ONE semaphore of 50 permits shared by the 50 tasks
   * ``permit semaphore``: ``client.permit_expirable_semaphore(name).try_acquire(
     lease_time=10)`` + ``release(permit)``, one permit per name

2. Hand-off: the holder releases in this process, a waiter in a worker process
   (``benchmarks._worker``, role ``semaphore-handoff``) takes it; hand-off = the waiter's
   stamp - the releaser's stamp (CLOCK_MONOTONIC is one clock for the machine). Variants:
   ``lock``, ``semaphore`` and ``permit semaphore`` of one permit; the same rounds and gaps
   as ``handoff.py`` (U(5, 15) ms), 10 s leases.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aredis

import aiolock

from .runner import (
    LoopName,
    ParentLink,
    RoundTrips,
    Row,
    ScenarioResult,
    Settings,
    WorkerProc,
    close_client,
    loop_label,
    parse_commandstats,
    ratio,
    run_on,
    stats_delta,
    summarize_ms,
)

Cycle = Callable[[int], Awaitable[bool]]
LEASE_S = 10
GAP_S = (0.005, 0.015)
CYCLE_VARIANTS = ("lock", "semaphore", "semaphore shared", "permit semaphore")
HANDOFF_VARIANTS = ("lock", "semaphore", "permit semaphore")


async def _server_counters(r: aredis.Redis) -> tuple[dict[str, int], float]:
    stats = parse_commandstats(await r.info("commandstats"))
    cpu = await r.info("cpu")
    return stats, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


async def _timed(
    cycle: Cycle, tasks: int, warmup: float, seconds: float, probe: aredis.Redis
) -> dict[str, Any]:
    counts = [0] * tasks
    failures = [0]
    stop = asyncio.Event()

    async def worker(i: int) -> None:
        while not stop.is_set():
            if await cycle(i):
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
    delta = stats_delta(cmd0, cmd1)
    delta["info"] = delta.get("info", 0) - 2
    return {
        "cycles": c1 - c0,
        "seconds": t1 - t0,
        "client_cpu": cpu1 - cpu0,
        "server_cpu": srv1 - srv0,
        "failures": failures[0],
        "round_trips": RoundTrips.from_delta(delta).counted,
    }


async def _cycles(settings: Settings) -> dict[str, Any]:
    tasks = settings.uncontended_tasks
    client = aiolock.from_url(settings.url)
    probe = aredis.Redis.from_url(settings.url, decode_responses=True)
    try:
        shared = client.semaphore("bench:sem:shared")
        await shared.try_set_permits(tasks)
        for i in range(tasks):
            await client.semaphore(f"bench:sem:{i}").try_set_permits(1)
            await client.permit_expirable_semaphore(f"bench:pes:{i}").try_set_permits(1)

        async def lock_cycle(i: int) -> bool:
            lock = client.lock(f"bench:lock:{i}")
            if not await lock.try_lock(lease_time=LEASE_S):
                return False
            await lock.unlock()
            return True

        async def semaphore_cycle(i: int) -> bool:
            sem = client.semaphore(f"bench:sem:{i}")
            if not await sem.try_acquire():
                return False
            await sem.release()
            return True

        async def shared_cycle(i: int) -> bool:
            if not await shared.try_acquire():
                return False
            await shared.release()
            return True

        async def permit_cycle(i: int) -> bool:
            pes = client.permit_expirable_semaphore(f"bench:pes:{i}")
            permit = await pes.try_acquire(lease_time=LEASE_S)
            if permit is None:
                return False
            await pes.release(permit)
            return True

        variants: dict[str, Cycle] = {
            "lock": lock_cycle,
            "semaphore": semaphore_cycle,
            "semaphore shared": shared_cycle,
            "permit semaphore": permit_cycle,
        }
        names = list(variants)
        rounds = settings.uncontended_rounds
        slice_s = settings.uncontended_seconds / rounds
        per_round: dict[str, list[dict[str, Any]]] = {v: [] for v in names}
        for rnd in range(rounds):
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            for variant in order:
                warmup = settings.warmup if rnd == 0 else settings.warmup / 2
                per_round[variant].append(
                    await _timed(variants[variant], tasks, warmup, slice_s, probe)
                )
        out: dict[str, Any] = {}
        for variant, results in per_round.items():
            cycles = sum(r["cycles"] for r in results)
            seconds = sum(r["seconds"] for r in results)
            out[variant] = {
                "cycles": cycles,
                "seconds": seconds,
                "cycles_per_s": cycles / seconds if seconds else 0.0,
                "per_round_cycles_per_s": [r["cycles"] / r["seconds"] for r in results],
                "client_cpu_us_per_cycle": (
                    1e6 * sum(r["client_cpu"] for r in results) / cycles if cycles else None
                ),
                "server_cpu_us_per_cycle": (
                    1e6 * sum(r["server_cpu"] for r in results) / cycles if cycles else None
                ),
                "round_trips_per_cycle": (
                    sum(r["round_trips"] for r in results) / cycles if cycles else None
                ),
                "failures": sum(r["failures"] for r in results),
            }
        return out
    finally:
        await close_client(client, "semaphores client")
        await probe.aclose()


# -- hand-off -------------------------------------------------------------------------------


class _Side:
    """Take and give back one variant's object (a lock, or a semaphore of one permit)."""

    def __init__(self, variant: str, url: str, name: str) -> None:
        self.variant = variant
        self.client = aiolock.from_url(url)
        self.name = name
        self.permit: str | None = None

    async def prepare(self) -> None:
        if self.variant == "semaphore":
            await self.client.semaphore(self.name).try_set_permits(1)
        elif self.variant == "permit semaphore":
            await self.client.permit_expirable_semaphore(self.name).try_set_permits(1)

    async def acquire(self) -> None:
        if self.variant == "lock":
            await self.client.lock(self.name).lock(lease_time=LEASE_S)
        elif self.variant == "semaphore":
            await self.client.semaphore(self.name).acquire()
        else:
            pes = self.client.permit_expirable_semaphore(self.name)
            self.permit = await pes.acquire(lease_time=LEASE_S)

    async def release(self) -> None:
        if self.variant == "lock":
            await self.client.lock(self.name).unlock()
        elif self.variant == "semaphore":
            await self.client.semaphore(self.name).release()
        else:
            assert self.permit is not None
            await self.client.permit_expirable_semaphore(self.name).release(self.permit)

    async def aclose(self) -> None:
        await close_client(self.client, "hand-off client")


async def handoff_worker(params: dict[str, Any], link: ParentLink) -> dict[str, Any]:
    """The waiting side: acquire when told, report the stamps, release."""
    side = _Side(params["variant"], params["url"], params["name"])
    try:
        await side.client.redis.ping()
        link.send("READY", {"loop": loop_label()})
        while (cmd := await link.recv()) == "WAIT":
            t_call = time.monotonic_ns()
            await side.acquire()
            t_acquired = time.monotonic_ns()
            await side.release()
            link.send("ACQ", [t_call, t_acquired])
        return {"last": cmd}
    finally:
        await side.aclose()


async def _handoff(settings: Settings, loop: LoopName, variant: str) -> dict[str, Any]:
    name = f"bench:sem-handoff:{variant.replace(' ', '-')}"
    rng = random.Random(1234)
    a = _Side(variant, settings.url, name)
    b = await WorkerProc.start(
        {"role": "semaphore-handoff", "loop": loop, "url": settings.url, "name": name,
         "variant": variant}
    )  # fmt: skip
    handoffs: list[int] = []
    late = 0
    try:
        await a.prepare()
        await b.expect("READY", 30)
        for _ in range(settings.handoff_rounds_aiolock):
            await a.acquire()
            await b.send("WAIT")
            await asyncio.sleep(rng.uniform(*GAP_S))
            t_release = time.monotonic_ns()
            await a.release()
            t_call, t_acquired = json.loads(await b.expect("ACQ", 30))
            if t_call >= t_release:
                late += 1
                continue
            handoffs.append(t_acquired - t_release)
        await b.send("STOP")
        await b.expect("RESULT", 30)
    finally:
        await b.close()
        await a.aclose()
    return {"handoff_ms": summarize_ms(handoffs), "not_waiting_rounds": late}


async def _run(settings: Settings, loop: LoopName) -> dict[str, Any]:
    cycles = await _cycles(settings)
    handoff = {v: await _handoff(settings, loop, v) for v in HANDOFF_VARIANTS}
    return {"cycles": cycles, "handoff": handoff}


def run(settings: Settings, loop: LoopName) -> ScenarioResult:
    data = run_on(loop, _run(settings, loop))
    cycles, handoff = data["cycles"], data["handoff"]
    rows: list[Row] = []

    def vs_lock(values: dict[str, float | None]) -> dict[str, float | None]:
        return {f"{v}/lock": ratio(values[v], values["lock"]) for v in values if v != "lock"}

    rate: dict[str, float | None] = {v: cycles[v]["cycles_per_s"] for v in CYCLE_VARIANTS}
    rows.append(
        Row(
            "semaphores",
            loop,
            "acquire+release cycles/s",
            "cycles/s",
            rate,
            vs_lock(rate),
            better="higher",
            note=(
                f"{settings.uncontended_tasks} tasks, a name each (shared: one semaphore of "
                f"{settings.uncontended_tasks} permits), {settings.uncontended_seconds:g} s in "
                f"{settings.uncontended_rounds} interleaved slices"
            ),
        )
    )
    cpu: dict[str, float | None] = {v: cycles[v]["client_cpu_us_per_cycle"] for v in CYCLE_VARIANTS}
    rows.append(
        Row("semaphores", loop, "client CPU per cycle", "us", cpu, vs_lock(cpu), better="lower")
    )
    trips: dict[str, float | None] = {v: cycles[v]["round_trips_per_cycle"] for v in CYCLE_VARIANTS}
    rows.append(
        Row("semaphores", loop, "round trips per cycle", "", trips, vs_lock(trips), better="lower")
    )
    for stat in ("p50", "p99", "mean"):
        values: dict[str, float | None] = {
            v: handoff[v]["handoff_ms"][stat] for v in HANDOFF_VARIANTS
        }
        rows.append(
            Row(
                "semaphores",
                loop,
                f"hand-off {stat}",
                "ms",
                values,
                vs_lock(values),
                better="lower",
                log_scale=True,
                note=(
                    "release in this process -> acquired in another; rounds: "
                    + ", ".join(f"{v} {handoff[v]['handoff_ms']['n']}" for v in HANDOFF_VARIANTS)
                    if stat == "p50"
                    else ""
                ),
            )
        )
    return ScenarioResult("semaphores", loop, rows, data)
