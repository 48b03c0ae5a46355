"""Memory per parked waiter, attributed to where it is allocated.

``python -m benchmarks.diagnostics.waiter_memory [--waiters N] [--names M] [--top K]
[--frames F] [--redis URL] [--json]``

The same measurement as the scale scenario's (``benchmarks/scale.py``): a second client holds
M names (``lease_time=60``), then N tasks each wait for one of them with ``lock(lease_time=60)``
on a client made by ``aiolock.from_url``; tracemalloc (Python heap) from before the waiters are
spawned to when all of them are parked, / N. Then the K allocation sites (grouped by traceback
of F frames; F=1: by line) that keep the most bytes per waiter, and the waiters are cancelled
and the client checked for leftovers.

To compare two checkouts in one run, run it from each with that checkout's package first on
``sys.path`` (``PYTHONPATH=/path/to/checkout``); it prints the ``aiolock`` it imported.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import linecache
import os
import time
import tracemalloc
from typing import Any

import aiolock
from aiolock.testing import RedisServer

HOLD_LEASE_S = 60


async def _until(pred: Any, within: float) -> None:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > within:
            raise TimeoutError("waiters did not all park")
        await asyncio.sleep(0.02)


def _site(frames: tracemalloc.Traceback) -> str:
    """The innermost frames of an allocation site, relative to the package or stdlib."""
    parts = []
    for frame in frames:
        path = frame.filename
        for cut in ("/aiolock/", "/asyncio/", "/python3."):
            if cut in path:
                path = path[path.index(cut) + 1 :]
                break
        line = linecache.getline(frame.filename, frame.lineno).strip()
        parts.append(f"{path}:{frame.lineno} {line[:60]}")
    return " <- ".join(parts)


async def measure(url: str, waiters: int, names: int, frames: int) -> dict[str, Any]:
    per_name = waiters // names
    keys = [f"bench:waitmem:{i}" for i in range(names)]
    holders = aiolock.from_url(url)
    client = aiolock.from_url(url)
    out: dict[str, Any] = {"aiolock": os.path.dirname(aiolock.__file__)}
    try:
        for c in (client, holders):  # open the connections before measuring
            warm = c.lock("bench:waitmem:warm-up")
            await warm.lock(lease_time=1)
            await warm.unlock()
        go = asyncio.Event()
        held = 0

        async def hold(name: str) -> None:
            nonlocal held
            lock = holders.lock(name)
            await lock.lock(lease_time=HOLD_LEASE_S)
            held += 1
            await go.wait()
            await lock.unlock()

        hold_tasks = [asyncio.ensure_future(hold(k)) for k in keys]
        await _until(lambda: held == names, 60)

        async def wait_only(name: str) -> None:
            await client.lock(name).lock(lease_time=HOLD_LEASE_S)

        gc.collect()
        tracemalloc.start(frames)
        try:
            before = tracemalloc.take_snapshot()
            base = tracemalloc.get_traced_memory()[0]
            tasks = [asyncio.ensure_future(wait_only(k)) for k in keys for _ in range(per_name)]
            await _until(lambda: client.statistics().tasks_waiting == len(tasks), 120)
            gc.collect()
            traced = tracemalloc.get_traced_memory()[0] - base
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        n = len(tasks)
        out["waiters"] = n
        out["bytes_per_waiter"] = traced / n
        filters = [tracemalloc.Filter(False, tracemalloc.__file__)]
        diff = after.filter_traces(filters).compare_to(before.filter_traces(filters), "traceback")
        out["sites"] = [
            (d.size_diff / n, d.count_diff / n, _site(d.traceback))
            for d in sorted(diff, key=lambda d: -d.size_diff)
            if d.size_diff
        ]
        for t in tasks:
            t.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0.2)
        stats = client.statistics()
        out["after_cancel"] = {
            "not_cancelled": sum(1 for r in results if not isinstance(r, asyncio.CancelledError)),
            "channels_left": stats.subscriptions,
            "holds_left": sum(stats.holds.values()),
            "waiting_left": stats.tasks_waiting,
        }
        go.set()
        await asyncio.gather(*hold_tasks)
    finally:
        await client.aclose()
        await holders.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiters", type=int, default=10_000)
    parser.add_argument("--names", type=int, default=1_000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--frames", type=int, default=1)
    parser.add_argument("--redis", default=None)
    parser.add_argument("--json", action="store_true", help="one JSON line, no table")
    args = parser.parse_args()
    if args.redis is None:
        with RedisServer() as server:
            out = asyncio.run(measure(server.url, args.waiters, args.names, args.frames))
    else:
        out = asyncio.run(measure(args.redis, args.waiters, args.names, args.frames))
    if args.json:
        out["sites"] = out["sites"][: args.top]
        print(json.dumps(out))
        return
    print(f"aiolock from {out['aiolock']}")
    print(f"{out['waiters']} waiters: {out['bytes_per_waiter']:.0f} B per waiter")
    print(f"after cancelling them all: {out['after_cancel']}")
    print(f"{'B/waiter':>9} {'blocks':>7}  site")
    for size, count, site in out["sites"][: args.top]:
        print(f"{size:9.1f} {count:7.2f}  {site}")
    rest = sum(s for s, _, _ in out["sites"][args.top :])
    print(f"{rest:9.1f} {'':7}  (the rest)")


if __name__ == "__main__":
    main()
