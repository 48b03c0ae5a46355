"""Scenario 2 - contended: P processes x T tasks on ONE lock, each acquisition holds ~1 ms.

Each task loops: ``t0``; acquire; ``t1``; INCR the guard key (must answer 1: nobody else is
inside), ``asyncio.sleep(hold)``, DECR the guard; ``t2``; release. Timestamps are
``time.monotonic_ns()`` (CLOCK_MONOTONIC, shared by all processes), and the parent sets one
window ``[t_start, t_end)`` for all processes after a warm-up. Reported:

* acquisitions/s: acquisitions with ``t1`` in the window / window length
* busy fraction: the held intervals ``[t1, t2]`` (guard + sleep, i.e. the whole critical
  section) clipped to the window, summed, / window length. 1.0 would mean the lock is never
  free; what is missing is hand-off time
* wait p50/p99/max: ``t1 - t0`` of every acquire call started in the window; calls still
  waiting at the end are let finish (bounded), so long waits are not cut off
* Jain fairness index over all tasks' acquisition counts in the window
* round trips per acquisition: top-level commands in the window by INFO commandstats deltas
  (see ``runner.round_trip_commands``: evalsha, eval, set, subscribe, unsubscribe, hget, ...;
  names also called inside the benchmarked Lua scripts are not counted, since commandstats
  counts script-internal calls too; the guard's INCR/DECR are not counted) / acquisitions.
  Includes the release, failed attempts, and SUBSCRIBE/UNSUBSCRIBE of the pub/sub connection
* overlaps: guard INCRs that did not answer 1. Must be 0.

Variants: aiolock ``async with client.lock(name)`` and redis-py's Lock
``r.lock(name, timeout=10, sleep=S, blocking_timeout=None)`` with S = 0.1 (its default) and
S = 0.001.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from contextlib import AbstractAsyncContextManager
from typing import Any

import redis.asyncio as aredis

import aiolock

from .runner import (
    LoopName,
    ParentLink,
    RoundTrips,
    Row,
    ScenarioResult,
    ServerProbe,
    Settings,
    Snapshot,
    Target,
    WorkerProc,
    close_client,
    jain_index,
    loop_label,
    ratio,
    run_on,
    sleep_until,
    stats_delta,
    summarize_ms,
)

VARIANTS: dict[str, dict[str, Any]] = {
    "aiolock": {"lib": "aiolock"},
    "redis-py sleep=0.1": {"lib": "redis-py", "sleep": 0.1},
    "redis-py sleep=0.001": {"lib": "redis-py", "sleep": 0.001},
}
DRAIN_CAP_S = 10.0


# --------------------------------------------------------------------------------------------
# worker side
# --------------------------------------------------------------------------------------------


async def worker(params: dict[str, Any], link: ParentLink) -> dict[str, Any]:
    """One process of the scenario: ``tasks`` tasks contending for ``name``."""
    url, name, guard = params["url"], params["name"], params["guard"]
    tasks, hold = int(params["tasks"]), float(params["hold"])
    client: aiolock.AioLock | None = None
    r: aredis.Redis
    if params["lib"] == "aiolock":
        client = aiolock.from_url(url)
        assert isinstance(client.redis, aredis.Redis)
        r = client.redis
    else:
        r = aredis.Redis.from_url(url)
    try:
        await r.ping()
        link.send("READY", {"loop": loop_label()})
        t_go, t_start, t_end = (float(x) for x in (await link.recv()).split()[1:4])
        start_ns, end_ns = int(t_start * 1e9), int(t_end * 1e9)
        records: list[list[tuple[int, int, int]]] = [[] for _ in range(tasks)]
        waiting_since = [0] * tasks  # t0 of an acquire call in progress, 0 if none
        overlaps = [0]

        async def critical() -> None:
            if await r.incr(guard) != 1:
                overlaps[0] += 1
            await asyncio.sleep(hold)
            await r.decr(guard)

        def new_lock() -> AbstractAsyncContextManager[object]:
            if client is not None:
                # "fair": the fair lock (benchmarks/fair.py), else the reentrant lock
                if params.get("kind") == "fair":
                    return client.fair_lock(name)
                return client.lock(name)
            return r.lock(name, timeout=10, sleep=float(params["sleep"]), blocking_timeout=None)

        async def body(i: int) -> None:
            lock = new_lock()
            rec = records[i]
            while (t0 := time.monotonic_ns()) < end_ns:
                waiting_since[i] = t0
                async with lock:
                    t1 = time.monotonic_ns()
                    waiting_since[i] = 0
                    await critical()
                    t2 = time.monotonic_ns()
                rec.append((t0, t1, t2))

        await sleep_until(t_go)
        running = [asyncio.ensure_future(body(i)) for i in range(tasks)]
        await sleep_until(t_start)
        cpu0 = time.process_time()
        await sleep_until(t_end)
        cpu1 = time.process_time()
        done, pending = await asyncio.wait(running, timeout=DRAIN_CAP_S)
        drain_end = time.monotonic_ns()
        stuck_state = await _stuck_state(client, r, name) if pending else None
        # acquire calls still waiting after the drain cap: their wait is at least this long
        censored_ns = [drain_end - t0 for t0 in waiting_since if t0 >= start_ns]
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        errors = [repr(t.exception()) for t in done if t.exception() is not None]
        return {
            "records": records,
            "overlaps": overlaps[0],
            "cpu": cpu1 - cpu0,
            "censored": len(censored_ns),
            "censored_ns": censored_ns,
            "errors": errors[:5],
            "stuck_state": stuck_state,
        }
    finally:
        if client is not None:
            await close_client(client, "contended worker client")
        else:
            await r.aclose()


async def _stuck_state(
    client: aiolock.AioLock | None, r: aredis.Redis, name: str
) -> dict[str, Any]:
    """What the server and the client's pub/sub entry look like while tasks are stuck."""
    state: dict[str, Any] = {
        "key_exists": int(await r.exists(name)),
        "key_pttl_ms": int(await r.pttl(name)),
    }
    if client is not None:
        state["client"] = repr(client.statistics())
        state["lock"] = repr(client.lock(name).statistics())
    return state


# --------------------------------------------------------------------------------------------
# parent side
# --------------------------------------------------------------------------------------------


async def _variant(settings: Settings, loop: LoopName, variant: str) -> dict[str, Any]:
    return await measure(settings, loop, variant, VARIANTS[variant])


async def measure(
    settings: Settings, loop: LoopName, variant: str, lib_params: dict[str, Any]
) -> dict[str, Any]:
    """One variant: ``lib_params`` say which library and lock (``lib``, ``sleep``, ``kind``)."""
    name = f"bench:contended:{variant.replace(' ', '_')}"
    params = {
        "role": "contended",
        "loop": loop,
        "url": settings.url,
        "name": name,
        "guard": f"{name}:guard",
        "tasks": settings.contended_tasks,
        "hold": settings.contended_hold,
        **lib_params,
    }
    probe = ServerProbe(settings.url)
    workers: list[WorkerProc] = []
    try:
        probe.client.delete(name, params["guard"])
        workers = [await WorkerProc.start(params) for _ in range(settings.contended_processes)]
        loops = [await w.expect("READY", 30) for w in workers]
        t_go = time.monotonic() + 0.05
        t_start = t_go + settings.warmup
        t_end = t_start + settings.contended_seconds
        for w in workers:
            await w.send(f"GO {t_go} {t_start} {t_end}")
        await sleep_until(t_start)
        before = Snapshot.take(probe)
        await sleep_until(t_end)
        after = Snapshot.take(probe)
        results = [
            await w.expect("RESULT", DRAIN_CAP_S + settings.contended_seconds + 30) for w in workers
        ]
    finally:
        for w in workers:
            await w.close()
        probe.close()

    import json

    parsed = [json.loads(r) for r in results]
    start_ns, end_ns = int(t_start * 1e9), int(t_end * 1e9)
    window_ns = end_ns - start_ns
    counts: list[int] = []
    waits: list[int] = []
    busy_ns = 0
    acquisitions = 0
    for proc in parsed:
        for rec in proc["records"]:
            n = 0
            for t0, t1, t2 in rec:
                if start_ns <= t0 < end_ns:
                    waits.append(t1 - t0)
                if start_ns <= t1 < end_ns:
                    n += 1
                busy_ns += max(0, min(t2, end_ns) - max(t1, start_ns))
            counts.append(n)
            acquisitions += n
        waits.extend(proc["censored_ns"])
    delta = stats_delta(before.commands, after.commands)
    rt = RoundTrips.from_delta(delta)
    wait = summarize_ms(waits)
    return {
        "variant": variant,
        "order_violations": order_violations(parsed, start_ns, end_ns),
        "worker_loops": loops,
        "window_s": window_ns / 1e9,
        "acquisitions": acquisitions,
        "acquisitions_per_s": acquisitions / (window_ns / 1e9),
        "busy_fraction": busy_ns / window_ns,
        "wait_ms": wait,
        "jain": jain_index(counts),
        "per_task_counts": counts,
        "round_trips": rt.counted,
        "round_trips_per_acquisition": rt.counted / acquisitions if acquisitions else None,
        "setup_commands": rt.setup,
        "commands": delta,
        "overlaps": sum(p["overlaps"] for p in parsed),
        "censored_waits": sum(p["censored"] for p in parsed),
        "client_cpu_s": sum(p["cpu"] for p in parsed),
        "client_cpu_us_per_acquisition": 1e6 * sum(p["cpu"] for p in parsed) / acquisitions
        if acquisitions
        else None,
        "server_cpu_s": after.server_cpu - before.server_cpu,
        "worker_errors": [e for p in parsed for e in p["errors"]],
        "close_hangs": [h for p in parsed for h in p.get("close_hangs", [])],
        "stuck_states": [p["stuck_state"] for p in parsed if p.get("stuck_state")],
    }


def order_violations(
    parsed: list[dict[str, Any]], start_ns: int, end_ns: int, slack_ns: int = 1_000_000
) -> dict[str, Any]:
    """Grants (in the window) that overtook a request made at least ``slack_ns`` earlier and
    still waiting: first come, first served would have served that one first. Requests that
    started within ``slack_ns`` of each other race to the server and are not counted."""
    acquisitions = sorted(
        (t1, t0)
        for proc in parsed
        for rec in proc["records"]
        for t0, t1, _ in rec
        if start_ns <= t0 < end_ns
    )
    violations = 0
    earliest_later = None  # the earliest request among grants after this one
    for _t1, t0 in reversed(acquisitions):
        if earliest_later is not None and earliest_later < t0 - slack_ns:
            violations += 1
        earliest_later = t0 if earliest_later is None else min(earliest_later, t0)
    grants = len(acquisitions)
    return {
        "grants": grants,
        "violations": violations,
        "fraction": violations / grants if grants else None,
        "slack_ms": slack_ns / 1e6,
    }


async def _run(settings: Settings, loop: LoopName) -> dict[str, Any]:
    return {v: await _variant(settings, loop, v) for v in VARIANTS}


def run(settings: Settings, loop: LoopName) -> ScenarioResult:
    data = run_on(loop, _run(settings, loop))
    names = list(data)
    a = data["aiolock"]

    def values(get: Any) -> dict[str, float | None]:
        return {v: get(data[v]) for v in names}

    def ratios(vals: dict[str, float | None]) -> dict[str, float | None]:
        return {f"aiolock/{v}": ratio(vals["aiolock"], vals[v]) for v in names if v != "aiolock"}

    note = (
        f"{settings.contended_processes} processes x {settings.contended_tasks} tasks, one "
        f"lock, hold {settings.contended_hold * 1000:g} ms, {settings.contended_seconds:g} s"
    )
    rows: list[Row] = []

    def add(
        metric: str,
        unit: str,
        get: Any,
        better: Any,
        targets: list[Target] | None = None,
        log_scale: bool = False,
        note_: str = "",
    ) -> None:
        vals = values(get)
        rows.append(
            Row(
                "contended",
                loop,
                metric,
                unit,
                vals,
                ratios(vals),
                targets or [],
                better=better,
                note=note_,
                log_scale=log_scale,
            )
        )

    add("acquisitions/s", "acq/s", lambda d: d["acquisitions_per_s"], "higher", note_=note)
    add(
        "busy fraction",
        "",
        lambda d: d["busy_fraction"],
        "higher",
        [Target("busy", a["busy_fraction"], ">=", 0.6)],
        note_="sum of held time in window / window",
    )
    add("wait p50", "ms", lambda d: d["wait_ms"]["p50"], "lower", log_scale=True)
    add(
        "wait p99",
        "ms",
        lambda d: d["wait_ms"]["p99"],
        "lower",
        [Target("p99 ms", a["wait_ms"]["p99"], "<=", 500)],
        log_scale=True,
    )
    add("wait max", "ms", lambda d: d["wait_ms"]["max"], "lower", log_scale=True)
    add(
        "round trips per acquisition",
        "commands",
        lambda d: d["round_trips_per_acquisition"],
        "lower",
        [Target("round trips", a["round_trips_per_acquisition"], "<=", 4)],
        log_scale=True,
        note_="commands sent incl. release, failed tries, (UN)SUBSCRIBE; aiolock pipelines "
        "its commands, so its network round trips can be fewer",
    )
    add("Jain fairness", "", lambda d: d["jain"], "higher", note_="over tasks' acquisitions")
    add(
        "client CPU per acquisition",
        "us",
        lambda d: d["client_cpu_us_per_acquisition"],
        "lower",
        log_scale=True,
        note_="both worker processes",
    )
    overlaps = values(lambda d: d["overlaps"])
    rows.append(
        Row(
            "contended",
            loop,
            "overlaps (guard)",
            "",
            overlaps,
            {},
            [
                Target(
                    "overlaps, all variants", float(sum(v or 0 for v in overlaps.values())), "==", 0
                )
            ],
            better="lower",
            note="guard INCR answered > 1: must be 0 for every variant",
        )
    )
    return ScenarioResult("contended", loop, rows, data)
