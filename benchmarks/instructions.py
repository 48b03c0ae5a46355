"""Instructions per uncontended acquire+release cycle, counted by callgrind (load-independent).

``python -m benchmarks.instructions [--cycles N] [--tasks 50] [--loop asyncio|uvloop]
[--variant NAME ...] [--redis URL] [--json PATH]``

Each variant's workload runs in a child process under ``valgrind --tool=callgrind``: a client
is opened, ``tasks`` tasks on distinct names do a warm-up of a few cycles each, then the
measured cycles, then the client closes. It runs twice, with ``N/5`` and ``N`` cycles; the
difference of the two instruction totals over the difference of the cycles is the cost of one
cycle, with start-up, imports, connects, warm-up and shutdown cancelled out. Only the client
process is counted: the Redis server (a private ``aiolock.testing.RedisServer`` unless
``--redis``) runs outside valgrind. Instruction counts do not move with the machine's load,
so figures of two runs (or of two branches) compare directly.

Variants (the workload of ``uncontended.py``, one cycle = acquire + release of a name):

* ``floor``: :class:`benchmarks.floor.UncontendedFloor`, the same Lua scripts over one raw
  asyncio connection: the least any client can do
* ``aiolock``: ``lock.try_lock(lease_time=10)`` + ``lock.unlock()`` on a client made as users
  make it (``aiolock.from_url(url)``: metrics on, OpenTelemetry's API with no SDK set up
  when opentelemetry-api is installed)
* ``aiolock metrics=False``: the same without metrics
* ``aiolock metrics=False, gc off``: the same with the garbage collector disabled in the
  child (what the young collections cost is the difference)
* ``aiolock watchdog``: the default client, ``try_lock()`` without a lease (the watchdog
  registers each hold; it renews none of them, the cycles are far shorter than its period)
* ``aiolock otel sdk``: metrics recorded into OpenTelemetry's SDK (an in-memory reader), when
  opentelemetry-sdk is installed
* ``redis-py``: ``redis.asyncio.lock.Lock`` (``acquire(blocking=False)`` + ``release()``)

The table gives instructions per cycle, the ratio to the floor, and an attribution read off
the ablations (metrics, garbage collection), plus young garbage collections per 1,000 cycles
(counted in the child with ``gc.callbacks``). ``--calls`` adds the functions aiolock's cycle
calls most (cProfile call counts per cycle, outside valgrind; call counts are deterministic).
Without valgrind the command says so and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .runner import LoopName, run_on

Cycle = Callable[[str], Awaitable[bool]]
Closer = Callable[[], Awaitable[None]]
LEASE_S = 10
#: warm-up cycles per task, run before the measured ones in every child
WARMUP_PER_TASK = 4

VARIANTS = (
    "floor",
    "aiolock",
    "aiolock metrics=False",
    "aiolock metrics=False, gc off",
    "aiolock watchdog",
    "aiolock otel sdk",
    "redis-py",
)


# --------------------------------------------------------------------------------------------
# the workload (run in the child)
# --------------------------------------------------------------------------------------------


async def _open(variant: str, url: str) -> tuple[Cycle, Closer]:
    if variant == "floor":
        from .floor import UncontendedFloor

        floor = await UncontendedFloor.open(url)

        async def close_floor() -> None:
            floor.close()

        return floor.cycle, close_floor
    if variant == "redis-py":
        import redis.asyncio as aredis

        rpy = aredis.Redis.from_url(url)

        async def redispy_cycle(name: str) -> bool:
            lk = rpy.lock(name, timeout=LEASE_S)
            if not await lk.acquire(blocking=False):
                return False
            await lk.release()
            return True

        return redispy_cycle, rpy.aclose
    if variant.startswith("aiolock"):
        import aiolock

        metrics: Any = True
        if "metrics=False" in variant:
            metrics = False
        elif variant == "aiolock otel sdk":
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader

            metrics = aiolock.Metrics(MeterProvider(metric_readers=[InMemoryMetricReader()]))
        client = aiolock.from_url(url, metrics=metrics)
        lease = None if variant == "aiolock watchdog" else LEASE_S

        async def aiolock_cycle(name: str) -> bool:
            lock = client.lock(name)
            if not await lock.try_lock(lease_time=lease):
                return False
            await lock.unlock()
            return True

        return aiolock_cycle, client.aclose
    raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")


async def _rounds(cycle: Cycle, names: list[str], per_task: int) -> None:
    async def one(name: str) -> None:
        for _ in range(per_task):
            if not await cycle(name):
                raise RuntimeError(f"{name} was not free: the workload is not uncontended")

    await asyncio.gather(*(one(name) for name in names))


class Marks:
    """Callgrind client requests (``valgrind/callgrind.h``) through a tiny C library built on
    first use: the child switches instrumentation on after its start-up and dumps the
    counts after each measured phase. Unavailable (no C compiler or no header): None."""

    SOURCE = """
    #include <valgrind/callgrind.h>
    void mark_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
    void mark_dump(void) { CALLGRIND_DUMP_STATS; }
    void mark_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
    """

    def __init__(self, library: str) -> None:
        import ctypes

        lib = ctypes.CDLL(library)
        self.start, self.dump, self.stop = lib.mark_start, lib.mark_dump, lib.mark_stop

    @classmethod
    def build(cls, into: Path) -> Path | None:
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            return None
        source, library = into / "marks.c", into / "marks.so"
        source.write_text(cls.SOURCE)
        built = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(source)],
            capture_output=True,
            check=False,
        )
        return library if built.returncode == 0 else None


async def workload(
    variant: str,
    url: str,
    tasks: int,
    phases: Sequence[int],
    profile: cProfile.Profile | None = None,
    marks: Marks | None = None,
) -> dict[str, Any]:
    """Open, warm up, run each phase of ``phases`` cycles (``n // tasks`` per task), close.
    With ``marks``, callgrind counts from the end of the warm-up and dumps after each phase.
    Returns the cycles and the young collections of each phase."""
    if "gc off" in variant:
        gc.disable()
    cycle, close = await _open(variant, url)
    # (the process id: a variant and its --baseline twin run at once on one server)
    names = [f"bench:instr:{variant}:{os.getpid()}:{i}" for i in range(tasks)]
    young = [0]
    out: dict[str, Any] = {"cycles": [], "young_collections": []}

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 0:
            young[0] += 1

    try:
        await _rounds(cycle, names, WARMUP_PER_TASK)
        gc.callbacks.append(count)
        if marks is not None:
            marks.start()
        if profile is not None:
            profile.enable()
        try:
            for cycles in phases:
                young[0] = 0
                await _rounds(cycle, names, cycles // tasks)
                if marks is not None:
                    marks.dump()
                out["cycles"].append(tasks * (cycles // tasks))
                out["young_collections"].append(young[0])
        finally:
            if profile is not None:
                profile.disable()
            if marks is not None:
                marks.stop()
            gc.callbacks.remove(count)
    finally:
        await close()
    return out


# --------------------------------------------------------------------------------------------
# the parent: callgrind runs and the table
# --------------------------------------------------------------------------------------------


@dataclass
class Figure:
    variant: str
    per_cycle: float  # instructions
    young_per_1000: float
    runs: list[tuple[int, int]]  # (cycles, instructions) of each child


def _total_instructions(out_file: Path) -> int:
    for line in out_file.read_text().splitlines():
        match = re.match(r"(?:summary|totals):\s*(\d+)", line)
        if match:
            return int(match.group(1))
    raise RuntimeError(f"no instruction total in {out_file}")


ROOT = Path(__file__).resolve().parent.parent


def _callgrind(
    variant: str,
    url: str,
    tasks: int,
    phases: Sequence[int],
    loop: LoopName,
    aiolock_from: Path | None,
    marks: Path | None,
) -> tuple[list[int], dict[str, Any]]:
    """One child under callgrind: the instructions of each phase (with ``marks``; without,
    one phase and the whole process's total) and what its workload returned.
    ``aiolock_from``: a directory whose ``aiolock`` package the child imports instead."""
    with tempfile.TemporaryDirectory(prefix="aiolock-instr-") as tmp:
        out_file = Path(tmp) / "callgrind.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out_file}",
            *(["--instr-atstart=no"] if marks is not None else []),
            sys.executable,
            "-m",
            "benchmarks.instructions",
            "--child",
            variant,
            "--redis",
            url,
            "--tasks",
            str(tasks),
            "--phases",
            ",".join(map(str, phases)),
            "--loop",
            loop,
        ]
        path = [str(ROOT)] if aiolock_from is None else [str(aiolock_from), str(ROOT)]
        env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=os.pathsep.join(path))
        if marks is not None:
            env["AIOLOCK_CALLGRIND_MARKS"] = str(marks)
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=tmp,  # not the checkout: its aiolock must not shadow ``aiolock_from``
            env=env,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{variant} under callgrind failed:\n{proc.stderr[-3000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        if marks is None:
            return [_total_instructions(out_file)], result
        dumps = [Path(f"{out_file}.{i + 1}") for i in range(len(phases))]
        return [_total_instructions(dump) for dump in dumps], result


def measure(
    variant: str,
    url: str,
    tasks: int,
    cycles: int,
    loop: LoopName,
    aiolock_from: Path | None = None,
    label: str | None = None,
    marks: Path | None = None,
) -> Figure:
    """Instructions per cycle of ``variant``: phases of ``cycles / 5`` and ``cycles``, in
    one child with ``marks``, else in two (then start-up cancels out in the difference)."""
    small = max(tasks, (cycles // 5) // tasks * tasks)
    large = max(small + tasks, cycles // tasks * tasks)
    runs: list[tuple[int, int]] = []
    young: list[int] = []
    if marks is not None:
        counts, result = _callgrind(variant, url, tasks, (small, large), loop, aiolock_from, marks)
        runs = list(zip(result["cycles"], counts, strict=True))
        young = result["young_collections"]
    else:
        for n in (small, large):
            counts, result = _callgrind(variant, url, tasks, (n,), loop, aiolock_from, None)
            runs.append((result["cycles"][0], counts[0]))
            young.append(result["young_collections"][0])
    (c1, i1), (c2, i2) = runs
    per_1000 = 1000 * (young[1] - young[0]) / (c2 - c1)
    return Figure(label or variant, (i2 - i1) / (c2 - c1), per_1000, runs)


def available_variants() -> list[str]:
    out = list(VARIANTS)
    try:
        import opentelemetry.sdk.metrics  # noqa: F401
    except ImportError:
        out.remove("aiolock otel sdk")
    return out


def call_counts(url: str, tasks: int, cycles: int, loop: LoopName, top: int = 15) -> list[str]:
    """The functions aiolock's default cycle calls most: cProfile call counts per cycle."""
    profile = cProfile.Profile()
    result = run_on(loop, workload("aiolock", url, tasks, (cycles,), profile))
    stats = pstats.Stats(profile)
    rows = sorted(
        ((calls, func) for func, (_, calls, *_rest) in stats.stats.items()),  # type: ignore[attr-defined]
        reverse=True,
    )
    total = sum(calls for calls, _ in rows)
    cycles = result["cycles"][0]
    lines = [f"python-level calls per cycle: {total / cycles:.1f} (top {top})"]
    for calls, (path, line, name) in rows[:top]:
        where = f"{Path(path).name}:{line}" if line else path
        lines.append(f"  {calls / cycles:6.2f}  {name}  ({where})")
    return lines


#: (what, variant with it, variant without it)
ABLATIONS = (
    ("metrics as users get them (default - metrics=False)", "aiolock", "aiolock metrics=False"),
    ("metrics into the OTel SDK (sdk - default)", "aiolock otel sdk", "aiolock"),
    ("watchdog lease (watchdog - default)", "aiolock watchdog", "aiolock"),
    (
        "garbage collection (metrics=False - gc off)",
        "aiolock metrics=False",
        "aiolock metrics=False, gc off",
    ),
    ("the rest above the floor (gc off - floor)", "aiolock metrics=False, gc off", "floor"),
)


def table(figures: dict[str, Figure], suffixes: Sequence[str] = ("",)) -> list[str]:
    """The figures, with ratios to the floor; an attribution per suffix (e.g. `` @main``)."""
    floor = figures.get("floor")
    lines = [f"{'variant':<40} {'instr/cycle':>12} {'vs floor':>9} {'young gc/1k':>12}"]
    for fig in figures.values():
        vs = f"{fig.per_cycle / floor.per_cycle:.2f}x" if floor else "-"
        lines.append(
            f"{fig.variant:<40} {fig.per_cycle:>12,.0f} {vs:>9} {fig.young_per_1000:>12.1f}"
        )
    for suffix in suffixes:
        attribution: list[tuple[str, float]] = []
        for label, more, less in ABLATIONS:
            more, less = more + suffix, less if less == "floor" else less + suffix
            if more in figures and less in figures:
                attribution.append((label, figures[more].per_cycle - figures[less].per_cycle))
        if attribution:
            lines.append("")
            lines.append(f"attribution{suffix} (instructions per cycle, from the ablations)")
            for label, value in attribution:
                lines.append(f"  {label:<58} {value:>10,.0f}")
    return lines


def _export(rev: str, into: Path) -> Path:
    """``aiolock/`` of git revision ``rev`` of this checkout, exported under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "aiolock"], capture_output=True, check=True
    )
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__)
    parser.add_argument("--redis", metavar="URL", help="use this server instead of starting one")
    parser.add_argument("--cycles", type=int, default=2500, help="cycles of the larger run")
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--variant", action="append", help="only these (repeatable)")
    parser.add_argument("--calls", action="store_true", help="add cProfile call counts")
    parser.add_argument("--json", metavar="PATH", help="write the figures here too")
    parser.add_argument("--jobs", type=int, default=2, help="children run at once")
    parser.add_argument(
        "--baseline",
        metavar="REV",
        action="append",
        help="also measure the aiolock variants on aiolock/ of this git revision (e.g. main)",
    )
    parser.add_argument(
        "--no-marks",
        action="store_true",
        help="count whole processes (two per variant) instead of marking the measured phases",
    )
    parser.add_argument("--child", metavar="VARIANT", help=argparse.SUPPRESS)
    parser.add_argument("--phases", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        library = os.environ.get("AIOLOCK_CALLGRIND_MARKS")
        marks = Marks(library) if library else None
        phases = [int(n) for n in args.phases.split(",")]
        result = run_on(
            args.loop, workload(args.child, args.redis, args.tasks, phases, marks=marks)
        )
        print(json.dumps(result))
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: instruction counts need valgrind --tool=callgrind")
        return 2
    variants = args.variant or available_variants()
    server: Any = None
    if args.redis:
        url = args.redis
    else:
        from aiolock.testing import RedisServer

        server = RedisServer()
        server.start()
        url = server.url
    try:
        from concurrent.futures import ThreadPoolExecutor

        t0 = time.monotonic()
        with (
            tempfile.TemporaryDirectory(prefix="aiolock-baseline-") as tmp,
            ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool,
        ):
            # a copy of the checkout's aiolock: edits made while this runs do not leak in
            marks_lib = None if args.no_marks else Marks.build(Path(tmp))
            current = Path(tmp) / "current"
            shutil.copytree(ROOT / "aiolock", current / "aiolock")
            jobs: list[tuple[str, Path, str]] = [(v, current, v) for v in variants]
            suffixes = [""]
            for i, rev in enumerate(args.baseline or ()):
                base = _export(rev, Path(tmp) / f"baseline{i}")
                suffix = f" @{rev}"
                suffixes.append(suffix)
                jobs += [(v, base, v + suffix) for v in variants if v.startswith("aiolock")]
            futures = {
                label: pool.submit(
                    measure, v, url, args.tasks, args.cycles, args.loop, src, label, marks_lib
                )
                for v, src, label in jobs
            }
            figures = {label: f.result() for label, f in futures.items()}
        load = "/".join(f"{x:.2f}" for x in os.getloadavg())
        runs = next(iter(figures.values())).runs
        print(
            f"instructions per uncontended acquire+release cycle (callgrind, client process "
            f"only), {args.tasks} tasks, {args.loop}, runs of {runs[0][0]} and {runs[1][0]} "
            f"cycles; {time.monotonic() - t0:.0f} s, load average {load}"
        )
        for line in table(figures, suffixes):
            print(line)
        if args.calls:
            print("")
            for line in call_counts(url, args.tasks, args.cycles, args.loop):
                print(line)
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        v: {
                            "instructions_per_cycle": f.per_cycle,
                            "young_collections_per_1000": f.young_per_1000,
                            "runs": f.runs,
                        }
                        for v, f in figures.items()
                    },
                    indent=2,
                )
            )
        return 0
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
