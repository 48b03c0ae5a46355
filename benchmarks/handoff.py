"""Scenario 3 - hand-off latency: release in one process -> acquired in another process.

The benchmark process (A) and a worker process (B) play rounds on one lock:

1. A acquires the free lock, then tells B (a line on B's stdin) to acquire it; B starts
   waiting (``t_call``).
2. A holds for a random gap, stamps ``t_release = time.monotonic_ns()`` and releases.
3. B returns from its acquire, stamps ``t_acquired = time.monotonic_ns()``, releases, and sends
   both stamps back. Hand-off = ``t_acquired - t_release`` (CLOCK_MONOTONIC is one clock for
   the whole machine, so stamps of two processes compare directly).

Variants: aiolock; the physical floor (:func:`benchmarks.floor.handoff_variant`: aiolock's
own Lua scripts, the same rounds, no library): "floor" on raw asyncio connections (a
subscribed pub/sub connection and a command connection per process, ``asyncio.Protocol`` +
hiredis) and "floor sync" on blocking sockets (the absolute floor); and redis-py's Lock (polls
every 0.1 s). B also stamps when the unlock message reached it (aiolock: a wrapper around
``Entry.on_message``, see :func:`_stamp_messages`; the floors: in their message handler),
which splits the hand-off into release -> message delivered, and message -> acquired.

The gap is U(5, 15) ms for aiolock and the floors (long enough for B to be subscribed and
waiting) and
U(20, 120) ms for redis-py's Lock, so the release falls at a uniformly random phase of its
0.1 s polling. Rounds in which B had not yet called acquire when A released are counted
and left out. Both sides use a 10 s lease (``lease_time=10`` / ``timeout=10``).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import redis.asyncio as aredis

import aiolock

from . import floor
from .runner import (
    LoopName,
    ParentLink,
    Row,
    ScenarioResult,
    Settings,
    Target,
    WorkerProc,
    close_client,
    loop_label,
    ratio,
    run_on,
    summarize_ms,
)

LEASE_S = 10
GAPS_S = {
    "aiolock": (0.005, 0.015),
    "floor": floor.HANDOFF_GAP_S,
    "floor sync": floor.HANDOFF_GAP_S,
    "redis-py sleep=0.1": (0.020, 0.120),
}
LIBS = {"aiolock": "aiolock", "redis-py sleep=0.1": "redis-py"}
#: the floors' modes (benchmarks/floor.py runs both ends of those)
FLOORS: dict[str, floor.HandoffMode] = {"floor": "asyncio", "floor sync": "sync"}


class _Side:
    """acquire/release of one library for one process (one lock object, reused)."""

    def __init__(self, lib: str, url: str, name: str) -> None:
        self.lib = lib
        self.client: aiolock.AioLock | None = None
        self.redis: aredis.Redis | None = None
        if lib.startswith("aiolock"):
            self.client = aiolock.from_url(url)
            # "aiolock-fair": the fair lock (benchmarks/fair.py), else the reentrant lock
            self.lock = (
                self.client.fair_lock(name) if lib == "aiolock-fair" else self.client.lock(name)
            )
        else:
            self.redis = aredis.Redis.from_url(url)
            self.rlock = self.redis.lock(name, timeout=LEASE_S)  # sleep: its default, 0.1

    async def connect(self) -> None:
        r = self.client.redis if self.client is not None else self.redis
        assert r is not None
        await r.ping()

    async def acquire(self) -> None:
        if self.client is not None:
            await self.lock.lock(lease_time=LEASE_S)
        elif not await self.rlock.acquire():
            raise RuntimeError("redis-py Lock.acquire returned False")

    async def release(self) -> None:
        if self.client is not None:
            await self.lock.unlock()
        else:
            await self.rlock.release()

    async def aclose(self) -> None:
        if self.client is not None:
            await close_client(self.client, "hand-off client")
        if self.redis is not None:
            await self.redis.aclose()


_last_message_ns = [0]


def _stamp_messages() -> None:
    """Record when an unlock message reaches this process's aiolock pub/sub entry (the one
    place a benchmark wraps an internal: ``pubsub.Entry.on_message``, the transport's
    listener interface)."""
    from aiolock import pubsub

    original = pubsub.Entry.on_message

    def on_message(self: pubsub.Entry, data: bytes) -> None:
        _last_message_ns[0] = time.monotonic_ns()
        original(self, data)

    pubsub.Entry.on_message = on_message  # type: ignore[method-assign]


async def worker(params: dict[str, Any], link: ParentLink) -> dict[str, Any]:
    """Process B: acquire when told, report the stamps, release."""
    side = _Side(params["lib"], params["url"], params["name"])
    if params["lib"].startswith("aiolock"):
        _stamp_messages()
    try:
        await side.connect()
        link.send("READY", {"loop": loop_label()})
        while (cmd := await link.recv()) == "WAIT":
            t_call = time.monotonic_ns()
            _last_message_ns[0] = 0
            await side.acquire()
            t_acquired = time.monotonic_ns()
            t_message = _last_message_ns[0]  # before our own release's message can overwrite it
            await side.release()
            link.send("ACQ", [t_call, t_acquired, t_message])
        opened = _pubsub_connections_opened(side.client) if side.client is not None else 0
        return {"pubsub_connections_opened": opened, "last": cmd}
    finally:
        await side.aclose()


def _pubsub_connections_opened(client: aiolock.AioLock) -> int:
    return client.statistics().pubsub_connections_opened


async def _variant(settings: Settings, loop: LoopName, variant: str) -> dict[str, Any]:
    if variant in FLOORS:
        return await floor.handoff_variant(
            settings.url, FLOORS[variant], loop, settings.handoff_rounds_aiolock, GAPS_S[variant]
        )
    lib = LIBS[variant]
    rounds = (
        settings.handoff_rounds_redispy if lib == "redis-py" else settings.handoff_rounds_aiolock
    )
    return await measure(settings, loop, variant, lib, rounds, GAPS_S[variant])


async def measure(
    settings: Settings,
    loop: LoopName,
    variant: str,
    lib: str,
    rounds: int,
    gap_s: tuple[float, float],
) -> dict[str, Any]:
    """``rounds`` hand-offs of library ``lib`` (``aiolock``, ``aiolock-fair``, ``redis-py``)
    from this process to a worker process, the release after a gap drawn from ``gap_s``."""
    name = f"bench:handoff:{lib}"
    lo, hi = gap_s
    rng = random.Random(1234)
    a = _Side(lib, settings.url, name)
    b = await WorkerProc.start(
        {"role": "handoff", "loop": loop, "url": settings.url, "name": name, "lib": lib}
    )
    handoffs: list[int] = []
    to_message: list[int] = []
    message_to_acquired: list[int] = []
    late = 0
    try:
        await a.connect()
        b_loop = await b.expect("READY", 30)
        for _ in range(rounds):
            await a.acquire()
            await b.send("WAIT")
            await asyncio.sleep(rng.uniform(lo, hi))
            t_release = time.monotonic_ns()
            await a.release()
            t_call, t_acquired, t_message = json.loads(await b.expect("ACQ", 30))
            if t_call >= t_release:
                late += 1  # B was not waiting yet: not a hand-off
                continue
            handoffs.append(t_acquired - t_release)
            if t_message > t_release:
                to_message.append(t_message - t_release)
                message_to_acquired.append(t_acquired - t_message)
        await b.send("STOP")
        b_result = json.loads(await b.expect("RESULT", 30))
    finally:
        await b.close()
        await a.aclose()
    return {
        "variant": variant,
        "worker_loop": b_loop,
        "rounds": rounds,
        "not_waiting_rounds": late,
        "gap_s": [lo, hi],
        "handoff_ms": summarize_ms(handoffs),
        "release_to_message_ms": summarize_ms(to_message),
        "message_to_acquired_ms": summarize_ms(message_to_acquired),
        "negative": sum(1 for h in handoffs if h < 0),
        "worker": b_result,
    }


async def _run(settings: Settings, loop: LoopName) -> dict[str, Any]:
    return {v: await _variant(settings, loop, v) for v in GAPS_S}


def run(settings: Settings, loop: LoopName) -> ScenarioResult:
    data = run_on(loop, _run(settings, loop))
    rows: list[Row] = []
    base = "redis-py sleep=0.1"
    for stat in ("p50", "p99", "mean"):
        vals: dict[str, float | None] = {v: d["handoff_ms"][stat] for v, d in data.items()}
        vs_floor = ratio(vals["aiolock"], vals["floor"])
        rows.append(
            Row(
                "handoff",
                loop,
                f"hand-off {stat}",
                "ms",
                vals,
                {
                    "aiolock/floor": vs_floor,
                    "aiolock/floor sync": ratio(vals["aiolock"], vals["floor sync"]),
                    f"aiolock/{base}": ratio(vals["aiolock"], vals[base]),
                },
                [Target("vs floor", vs_floor, "<=", 1.3)] if stat == "p50" else [],
                better="lower",
                log_scale=True,
                note=(
                    "rounds: " + ", ".join(f"{v} {d['handoff_ms']['n']}" for v, d in data.items())
                    if stat == "p50"
                    else ""
                ),
            )
        )
    for key, label in (
        ("release_to_message_ms", "release -> message at waiter p50"),
        ("message_to_acquired_ms", "message -> acquired p50"),
    ):
        split: dict[str, float | None] = {
            v: data[v][key]["p50"] for v in ("aiolock", "floor", "floor sync")
        }
        rows.append(
            Row(
                "handoff",
                loop,
                label,
                "ms",
                split,
                {
                    "aiolock/floor": ratio(split["aiolock"], split["floor"]),
                    "aiolock/floor sync": ratio(split["aiolock"], split["floor sync"]),
                },
                better="lower",
                log_scale=True,
                note="where the hand-off time goes (pub/sub-based variants)",
            )
        )
    return ScenarioResult("handoff", loop, rows, data)
