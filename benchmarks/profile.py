"""Profile aiolock's hot paths: ``python -m benchmarks.profile [--loop asyncio] [--seconds 3]``.

Three workloads, each profiled with pyinstrument (statistical, whole process) and cProfile
(deterministic, call counts), written to ``benchmarks/results/profile/``:

* ``uncontended``: the scenario-1 cycle, 50 tasks, ``try_lock(lease_time=10)`` + ``unlock()``
* ``raw``: the same Lua scripts by ``Redis.evalsha`` (the floor, for comparison)
* ``contended``: two clients in this process x 25 tasks on one lock, 1 ms holds: the
  hand-off path (pub/sub message -> wake -> retry, and the local wake-up of a releasing client)

cProfile figures are also printed per acquire+release cycle (calls/cycle, us/cycle), which is
what to compare with the raw floor. pyinstrument is an extra dependency
(``pip install pyinstrument``, part of the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import redis.asyncio as aredis

import aiolock
from aiolock import scripts
from aiolock.keys import UNLOCK_MESSAGE, lock_channel

from .runner import RESULTS_DIR, LoopName, close_client, run_on

TASKS = 50


async def _loop_for(seconds: float, tasks: int, body: Callable[[int], Awaitable[None]]) -> int:
    """Run ``tasks`` loops of ``body`` for ``seconds``; return how many bodies completed."""
    count = [0]
    stop = time.monotonic() + seconds

    async def worker(i: int) -> None:
        while time.monotonic() < stop:
            await body(i)
            count[0] += 1

    await asyncio.gather(*(worker(i) for i in range(tasks)))
    return count[0]


async def uncontended(url: str, seconds: float) -> int:
    async with aiolock.from_url(url) as client:

        async def cycle(i: int) -> None:
            lock = client.lock(f"prof:unc:{i}")
            await lock.try_lock(lease_time=10)
            await lock.unlock()

        await _loop_for(0.3, TASKS, cycle)  # warm-up: connections, script cache
        return await _loop_for(seconds, TASKS, cycle)


async def raw(url: str, seconds: float) -> int:
    r = aredis.Redis.from_url(url)
    try:
        acquire = await r.script_load(scripts.LOCK_ACQUIRE.source)
        release = await r.script_load(scripts.LOCK_RELEASE.source)
        prefix = f"{uuid.uuid4()}:"

        async def cycle(i: int) -> None:
            name = f"prof:raw:{i}"
            owner = prefix + name
            await r.evalsha(acquire, 1, name, 10000, owner)
            await r.evalsha(
                release, 2, name, lock_channel(name), UNLOCK_MESSAGE, 10000, owner, 1, "PUBLISH"
            )

        await _loop_for(0.3, TASKS, cycle)
        return await _loop_for(seconds, TASKS, cycle)
    finally:
        await r.aclose()


async def contended(url: str, seconds: float) -> int:
    a, b = aiolock.from_url(url), aiolock.from_url(url)
    try:

        async def cycle(i: int) -> None:
            async with (a if i % 2 else b).lock("prof:contended"):
                await asyncio.sleep(0.001)

        await _loop_for(0.3, TASKS, cycle)
        return await _loop_for(seconds, TASKS, cycle)
    finally:
        await close_client(a)
        await close_client(b)


async def ablation(url: str, seconds: float, rounds: int = 3) -> dict[str, dict[str, float]]:
    """Client CPU per acquire+release cycle, building aiolock's path up from the raw floor.

    Each step adds one layer of what ``try_lock(lease_time=10)`` + ``unlock()`` does, so the
    differences say what each layer costs. Steps run in interleaved slices, 50 tasks each.
    """
    client = aiolock.from_url(url)
    r = aredis.Redis.from_url(url)
    acquire, release = scripts.LOCK_ACQUIRE, scripts.LOCK_RELEASE
    await r.script_load(acquire.source)
    await r.script_load(release.source)
    prefix = f"{uuid.uuid4()}:"

    def args(i: int, step: str) -> tuple[str, str, str]:
        name = f"prof:abl:{step}:{i}"
        return name, lock_channel(name), prefix + name

    async def raw_evalsha(i: int) -> None:
        name, channel, owner = args(i, "raw")
        await r.evalsha(acquire.sha, 1, name, 10000, owner)
        await r.evalsha(release.sha, 2, name, channel, UNLOCK_MESSAGE, 10000, owner, 1, "PUBLISH")

    async def transport(i: int) -> None:  # aiolock's own transport, no lock around it
        name, channel, owner = args(i, "transport")
        rt = client.runtime()
        for script, keys, argv in (
            (acquire, (name,), (10000, owner)),
            (release, (name, channel), (UNLOCK_MESSAGE, 10000, owner, 1, "PUBLISH")),
        ):
            call = await rt.transport.send(script.command(keys, argv), key=name)
            await call.future

    async def full(i: int) -> None:  # the real thing
        lock = client.lock(f"prof:abl:full:{i}")
        await lock.try_lock(lease_time=10)
        await lock.unlock()

    steps: dict[str, Callable[[int], Awaitable[None]]] = {
        "1 raw Redis.evalsha (floor)": raw_evalsha,
        "2 aiolock transport.send": transport,
        "3 full try_lock+unlock": full,
    }
    totals = {k: [0, 0.0, 0.0] for k in steps}  # cycles, cpu, wall
    try:
        for body in steps.values():
            await _loop_for(0.2, TASKS, body)
        for rnd in range(rounds):
            order = list(steps)[rnd % len(steps) :] + list(steps)[: rnd % len(steps)]
            for k in order:
                cpu0, t0 = time.process_time(), time.perf_counter()
                n = await _loop_for(seconds / rounds, TASKS, steps[k])
                totals[k][0] += n
                totals[k][1] += time.process_time() - cpu0
                totals[k][2] += time.perf_counter() - t0
    finally:
        await close_client(client)
        await r.aclose()
    return {
        k: {"cycles_per_s": n / wall, "cpu_us_per_cycle": 1e6 * cpu / n}
        for k, (n, cpu, wall) in totals.items()
    }


WORKLOADS: dict[str, Callable[[str, float], Coroutine[Any, Any, int]]] = {
    "uncontended": uncontended,
    "raw": raw,
    "contended": contended,
}


def profile(name: str, url: str, loop: LoopName, seconds: float, out: Path) -> dict[str, Any]:
    from pyinstrument import Profiler

    def workload(url: str, seconds: float) -> Coroutine[Any, Any, int]:
        return WORKLOADS[name](url, seconds)

    profiler = Profiler(interval=0.001, async_mode="disabled")
    profiler.start()
    t0 = time.process_time()
    cycles = run_on(loop, workload(url, seconds))
    cpu = time.process_time() - t0
    profiler.stop()
    (out / f"profile-{name}-{loop}.txt").write_text(
        profiler.output_text(unicode=False, color=False, show_all=False)
    )
    (out / f"profile-{name}-{loop}.html").write_text(profiler.output_html())

    prof = cProfile.Profile()
    prof.enable()
    cycles_c = run_on(loop, workload(url, seconds))
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(60)
    (out / f"cprofile-{name}-{loop}.txt").write_text(
        f"{cycles_c} cycles under cProfile\n" + buf.getvalue()
    )
    return {
        "cycles": cycles,
        "cycles_per_s": cycles / seconds,
        "cpu_us_per_cycle": 1e6 * cpu / cycles if cycles else None,
        "cprofile_cycles": cycles_c,
        "cprofile_calls_per_cycle": stats.total_calls / cycles_c if cycles_c else None,  # type: ignore[attr-defined]
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile")
    parser.add_argument("--redis", metavar="URL")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--only", choices=list(WORKLOADS), action="append")
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR / "profile")
    parser.add_argument(
        "--ablation", action="store_true", help="only the layer-by-layer CPU cost table"
    )
    args = parser.parse_args(argv)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    server: Any = None
    if args.redis:
        url = args.redis
    else:
        from aiolock.testing import RedisServer

        server = RedisServer().start()
        url = server.url
    try:
        print(f"client CPU per acquire+release cycle, {TASKS} tasks, loop {args.loop}:")
        base: float | None = None
        for step, res in run_on(args.loop, ablation(url, args.seconds * 2)).items():
            us = res["cpu_us_per_cycle"]
            base = us if base is None else base
            print(
                f"  {step:36s} {res['cycles_per_s']:8.0f} cycles/s {us:7.1f} us/cycle "
                f"({us - base:+6.1f} vs floor)"
            )
        if args.ablation:
            return
        for name in args.only or list(WORKLOADS):
            res = profile(name, url, args.loop, args.seconds, args.output_dir)
            print(
                f"{name:12s} {res['cycles_per_s']:9.0f} cycles/s  "
                f"{res['cpu_us_per_cycle']:7.1f} us CPU/cycle (under pyinstrument)  "
                f"{res['cprofile_calls_per_cycle']:6.1f} Python calls/cycle (cProfile)"
            )
        print(f"profiles in {args.output_dir}/profile-*.txt|html, cprofile-*.txt")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
