"""Scenario "rwlock" - read throughput of the read-write lock beside the reentrant lock.

N tasks (1, 10, 100) of one client in one process loop ``async with lock: sleep(hold)`` on
one name for a window (after a warm-up): with the read lock they share it, with the lock
(the same work under mutual exclusion) they take turns. Reported: acquisitions/s in the
window, and the ratio read lock / lock measured in the same run. The hold (1 ms) stands for
the reading itself.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiolock

from .runner import LoopName, Row, ScenarioResult, Settings, close_client, ratio, run_on

READ, LOCK = "read lock", "lock"
READERS = (1, 10, 100)
HOLD_S = 0.001


async def _measure(settings: Settings, variant: str, readers: int) -> dict[str, Any]:
    seconds = 0.7 if settings.quick else 2.0
    client = aiolock.from_url(settings.url)
    name = f"bench:rwlock:{variant.replace(' ', '_')}:{readers}"
    lock: aiolock.Lock = (
        client.read_write_lock(name).read_lock() if variant == READ else client.lock(name)
    )
    counts = [0] * readers
    most_inside = inside = 0
    start = end = 0.0

    async def reader(i: int) -> None:
        nonlocal inside, most_inside
        while (now := time.monotonic()) < end:
            async with lock:
                inside += 1
                most_inside = max(most_inside, inside)
                if now >= start:
                    counts[i] += 1
                await asyncio.sleep(HOLD_S)
                inside -= 1

    try:
        await client.redis.ping()
        start = time.monotonic() + settings.warmup
        end = start + seconds
        await asyncio.gather(*(reader(i) for i in range(readers)))
    finally:
        await close_client(client, "rwlock benchmark client")
    total = sum(counts)
    return {
        "readers": readers,
        "window_s": seconds,
        "acquisitions": total,
        "acquisitions_per_s": total / seconds,
        "most_inside_at_once": most_inside,
    }


async def _run(settings: Settings) -> dict[str, Any]:
    return {str(n): {v: await _measure(settings, v, n) for v in (READ, LOCK)} for n in READERS}


def run(settings: Settings, loop: LoopName) -> ScenarioResult:
    data = run_on(loop, _run(settings))
    rows = []
    for n in READERS:
        values: dict[str, float | None] = {
            v: data[str(n)][v]["acquisitions_per_s"] for v in (READ, LOCK)
        }
        rows.append(
            Row(
                "rwlock",
                loop,
                f"read throughput, {n} reader{'s' if n > 1 else ''}",
                "acq/s",
                values,
                {f"{READ}/{LOCK}": ratio(values[READ], values[LOCK])},
                better="higher",
                note=f"one client, hold {HOLD_S * 1000:g} ms" if n == READERS[0] else "",
            )
        )
    return ScenarioResult("rwlock", loop, rows, data)
