"""What every scenario shares: settings, event loops, Redis introspection, statistics, worker
processes and the result records (rows with their baselines, ratios and targets).

Times that cross processes use ``time.monotonic()`` / ``time.monotonic_ns()``: on Linux both are
CLOCK_MONOTONIC, one clock for every process of the machine, so a release stamped in one
process and an acquisition stamped in another are directly comparable.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import math
import os
import platform
import re
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, TypeVar

import redis

T = TypeVar("T")
LoopName = Literal["asyncio", "uvloop"]
LOOPS: tuple[LoopName, ...] = ("asyncio", "uvloop")
REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"


# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """How long and how big each scenario runs (``--quick`` shrinks everything)."""

    url: str
    quick: bool = False
    warmup: float = 0.5
    # 1. uncontended: `rounds` interleaved slices per variant, `uncontended_seconds` in total
    uncontended_tasks: int = 50
    uncontended_seconds: float = 3.0
    uncontended_rounds: int = 3
    # 2. contended: 2 processes x 25 tasks on one lock
    contended_processes: int = 2
    contended_tasks: int = 25
    contended_seconds: float = 5.0
    contended_hold: float = 0.001
    # 3. hand-off: rounds per library
    handoff_rounds_aiolock: int = 200
    handoff_rounds_redispy: int = 40
    # 4. scale
    scale_waiters: int = 10_000
    scale_names: int = 1_000
    scale_baseline_cap: float = 20.0
    watchdog_locks: int = 10_000
    watchdog_timeout: float = 3.0
    watchdog_periods: int = 3

    @classmethod
    def for_run(cls, url: str, quick: bool) -> Settings:
        if not quick:
            return cls(url=url)
        return cls(
            url=url,
            quick=True,
            warmup=0.3,
            uncontended_seconds=1.0,
            uncontended_rounds=2,
            contended_seconds=1.5,
            handoff_rounds_aiolock=50,
            handoff_rounds_redispy=10,
            scale_waiters=2_000,
            scale_names=200,
            scale_baseline_cap=8.0,
            watchdog_locks=2_000,
        )


# --------------------------------------------------------------------------------------------
# Event loops
# --------------------------------------------------------------------------------------------


def run_on(loop: LoopName, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh event loop of the given kind."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def loop_label() -> str:
    """The class of the running loop, for the record (``_UnixSelectorEventLoop``, ``Loop``)."""
    loop = asyncio.get_running_loop()
    return f"{type(loop).__module__}.{type(loop).__qualname__}"


async def sleep_until(deadline: float) -> None:
    """Sleep until ``time.monotonic()`` reaches ``deadline``."""
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


#: aiolock clients whose ``aclose()`` did not finish within :data:`CLOSE_TIMEOUT_S` in this process
CLOSE_HANGS: list[str] = []
CLOSE_TIMEOUT_S = 3.0


async def close_client(client: Any, what: str = "aiolock client") -> None:
    """``await client.aclose()``, bounded: a hang is recorded in :data:`CLOSE_HANGS` (and shows
    in the report) instead of stalling the run; the loop's shutdown cancels what is left."""
    closing = asyncio.ensure_future(client.aclose())
    done, _ = await asyncio.wait({closing}, timeout=CLOSE_TIMEOUT_S)
    if not done:
        CLOSE_HANGS.append(f"{what}: aclose() did not return within {CLOSE_TIMEOUT_S:g} s")
        closing.cancel()
    elif closing.exception() is not None:
        CLOSE_HANGS.append(f"{what}: aclose() raised {closing.exception()!r}")


def watchdog_available() -> bool:
    """True once aiolock has a watchdog (watchdog leases can then be measured)."""
    return importlib.util.find_spec("aiolock.leases") is not None


# --------------------------------------------------------------------------------------------
# Redis introspection
# --------------------------------------------------------------------------------------------

_SCRIPT_CALL = re.compile(r"""redis\.p?call\(\s*['"]([A-Za-z_|]+)['"]""")

#: Commands that aiolock's or redis-py's lock code sends as top-level commands. A name that
#: one of the benchmarked Lua scripts also calls is dropped (see :func:`round_trip_commands`),
#: because INFO commandstats counts calls made inside scripts under the command's own name.
#: PING is not among them: aiolock's link ends each batch of commands with a marker PING that
#: rides in the same write (no round trip of its own; see aiolock/transport/link.py).
CLIENT_COMMANDS = frozenset(
    {
        "evalsha",
        "eval",
        "evalsha_ro",
        "eval_ro",
        "fcall",
        "set",
        "get",
        "del",
        "exists",
        "hexists",
        "hget",
        "pttl",
        "pexpire",
        "publish",
        "subscribe",
        "unsubscribe",
        "ssubscribe",
        "sunsubscribe",
        "psubscribe",
        "punsubscribe",
        "script|load",
        "script|exists",
    }
)
#: Sent once per new connection; reported apart from the per-acquisition round trips.
SETUP_COMMANDS = frozenset({"client|setinfo", "hello", "select", "auth", "client|setname"})


def script_commands(sources: Iterable[str]) -> frozenset[str]:
    """The command names that ``redis.call``/``redis.pcall`` use in the given Lua sources."""
    names: set[str] = set()
    for source in sources:
        names.update(m.lower() for m in _SCRIPT_CALL.findall(source))
    return frozenset(names)


def benchmarked_script_sources() -> list[str]:
    """Lua of every script the round-trip scenarios run (contended, fair, scale): aiolock's
    lock and fair lock scripts, and redis-py's Lock's. (Other types' scripts call SET inside,
    which would drop redis-py's top-level SET from the count.)"""
    from redis.asyncio.lock import Lock as RedisPyLock

    from aiolock import scripts

    sources = [
        script.source
        for name, script in vars(scripts).items()
        if isinstance(script, scripts.Script) and name.startswith(("LOCK_", "FAIR_LOCK_"))
    ]
    sources += [
        RedisPyLock.LUA_RELEASE_SCRIPT,
        RedisPyLock.LUA_EXTEND_SCRIPT,
        RedisPyLock.LUA_REACQUIRE_SCRIPT,
    ]
    return sources


def round_trip_commands() -> tuple[frozenset[str], frozenset[str]]:
    """(counted command names, excluded ambiguous names)."""
    # the lock scripts publish with the command they are given (redis.call(ARGV[n], ...), as
    # Redisson's do), which the source scan cannot see
    internal = script_commands(benchmarked_script_sources()) | {"publish", "spublish"}
    return CLIENT_COMMANDS - internal, CLIENT_COMMANDS & internal


def parse_commandstats(info: Mapping[str, Any]) -> dict[str, int]:
    """``INFO commandstats`` (as parsed by redis-py) -> {command: calls}."""
    calls: dict[str, int] = {}
    for key, value in info.items():
        if key.startswith("cmdstat_") and isinstance(value, Mapping):
            calls[key.removeprefix("cmdstat_")] = int(value.get("calls", 0))
    return calls


def stats_delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    delta = {name: after[name] - before.get(name, 0) for name in after}
    return {name: n for name, n in sorted(delta.items()) if n}


@dataclass
class RoundTrips:
    """Top-level commands sent by lock clients in a window, by INFO commandstats deltas."""

    counted: int
    setup: int
    by_command: dict[str, int]

    @classmethod
    def from_delta(cls, delta: Mapping[str, int]) -> RoundTrips:
        counted_names, _ = round_trip_commands()
        counted = sum(n for name, n in delta.items() if name in counted_names)
        setup = sum(n for name, n in delta.items() if name in SETUP_COMMANDS)
        return cls(counted, setup, dict(delta))


class ServerProbe:
    """A plain synchronous Redis client for snapshots the benchmark itself takes."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True)

    def close(self) -> None:
        self.client.close()

    def commandstats(self) -> dict[str, int]:
        return parse_commandstats(self.client.info("commandstats"))

    def cpu_seconds(self) -> float:
        """Server CPU (user + sys) since start."""
        info = self.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def version(self) -> str:
        return str(self.client.info("server")["redis_version"])

    def pubsub_clients(self) -> int:
        return len(self.client.client_list(_type="pubsub"))

    def flush(self) -> None:
        """Delete the benchmark's keys (``bench:*``), never anything else of the database."""
        batch: list[str] = []
        for key in self.client.scan_iter(match="bench:*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                self.client.delete(*batch)
                batch.clear()
        if batch:
            self.client.delete(*batch)


@dataclass
class Snapshot:
    """Server counters and this process's CPU at one instant."""

    at: float
    commands: dict[str, int]
    server_cpu: float
    process_cpu: float

    @classmethod
    def take(cls, probe: ServerProbe) -> Snapshot:
        return cls(time.monotonic(), probe.commandstats(), probe.cpu_seconds(), time.process_time())


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 100] of an ascending sequence."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo] * (1 - frac) + sorted_values[hi] * frac)


def summarize_ms(values_ns: Iterable[int]) -> dict[str, float]:
    """n, mean, p50, p90, p99, max of nanosecond samples, in milliseconds."""
    ms = sorted(v / 1e6 for v in values_ns)
    if not ms:
        return {"n": 0, "mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan,
                "max": math.nan}  # fmt: skip
    return {
        "n": len(ms),
        "mean": sum(ms) / len(ms),
        "p50": percentile(ms, 50),
        "p90": percentile(ms, 90),
        "p99": percentile(ms, 99),
        "max": ms[-1],
    }


def jain_index(counts: Sequence[float]) -> float:
    """Jain's fairness index: 1.0 when all equal, 1/n when one task gets everything."""
    total = sum(counts)
    squares = sum(c * c for c in counts)
    if not counts or squares == 0:
        return math.nan
    return total * total / (len(counts) * squares)


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass
class Target:
    """A goal for one figure: ``value op threshold``."""

    label: str
    value: float | None
    op: Literal[">=", "<=", "=="]
    threshold: float

    @property
    def met(self) -> bool | None:
        if self.value is None or math.isnan(self.value):
            return None
        if self.op == ">=":
            return self.value >= self.threshold
        if self.op == "<=":
            return self.value <= self.threshold
        return self.value == self.threshold

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "met": self.met}


@dataclass
class Row:
    """One figure of one scenario on one loop: aiolock's value beside its baselines'."""

    scenario: str
    loop: str
    metric: str
    unit: str
    values: dict[str, float | None]
    ratios: dict[str, float | None] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    better: Literal["higher", "lower", ""] = ""
    note: str = ""
    log_scale: bool = False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["targets"] = [t.to_json() for t in self.targets]
        return data


@dataclass
class ScenarioResult:
    """Everything a scenario measured on one loop."""

    scenario: str
    loop: str
    rows: list[Row]
    details: dict[str, Any]
    seconds: float = 0.0
    loadavg_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    loadavg_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    error: str | None = None


def environment(probe: ServerProbe, url: str, loops: Sequence[str]) -> dict[str, Any]:
    """What the run ran on, printed and stored with the figures."""

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    import aiolock

    return {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
        "redis_server": probe.version(),
        "redis_url": url,
        "redis_py": redis.__version__,
        "hiredis": version("hiredis"),
        "uvloop": version("uvloop"),
        "aiolock": aiolock.__version__,
        "watchdog_available": watchdog_available(),
        "loops": list(loops),
        "round_trip_commands": sorted(round_trip_commands()[0]),
        "round_trip_excluded": sorted(round_trip_commands()[1]),
    }


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_json_default, allow_nan=True) + "\n")
    tmp.replace(path)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, tuple | set | frozenset):
        return list(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


# --------------------------------------------------------------------------------------------
# Worker processes (line protocol over stdin/stdout)
# --------------------------------------------------------------------------------------------


class WorkerProc:
    """A ``python -m benchmarks._worker`` child; the parent talks to it in lines."""

    def __init__(self, proc: asyncio.subprocess.Process, stderr_path: Path) -> None:
        self.proc = proc
        self.stderr_path = stderr_path

    @classmethod
    async def start(cls, params: Mapping[str, Any]) -> WorkerProc:
        fd, name = tempfile.mkstemp(prefix="aiolock-bench-worker-", suffix=".log")
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "benchmarks._worker",
                json.dumps(dict(params)),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=fd,
                cwd=str(REPO_ROOT),
                limit=1 << 26,  # RESULT lines carry every timestamp
            )
        finally:
            os.close(fd)
        return cls(proc, Path(name))

    def stderr_tail(self, chars: int = 2000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    async def expect(self, tag: str, within: float) -> str:
        """Read lines until one starts with ``tag``; return the rest of that line."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + within
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"worker sent no {tag} in {within:g} s\n{self.stderr_tail()}")
            try:
                raw = await asyncio.wait_for(self.proc.stdout.readline(), left)
            except TimeoutError:
                raise TimeoutError(
                    f"worker sent no {tag} in {within:g} s\n{self.stderr_tail()}"
                ) from None
            if not raw:
                await self.proc.wait()
                raise RuntimeError(
                    f"worker exited ({self.proc.returncode}) before {tag}\n{self.stderr_tail()}"
                )
            line = raw.decode().rstrip("\n")
            if line.startswith(tag):
                return line[len(tag) :].strip()

    async def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def close(self, within: float = 10.0) -> None:
        """Wait for the worker to exit; kill it if it does not."""
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), within)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        with contextlib.suppress(OSError):
            self.stderr_path.unlink()


class ParentLink:
    """The worker's side of the line protocol: commands on stdin, replies on stdout."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    @classmethod
    async def open(cls) -> ParentLink:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        return cls(reader)

    async def recv(self) -> str:
        raw = await self._reader.readline()
        if not raw:
            raise EOFError("parent closed the pipe")
        return raw.decode().rstrip("\n")

    @staticmethod
    def send(tag: str, payload: Any = None) -> None:
        line = tag if payload is None else f"{tag} {json.dumps(payload)}"
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
