"""Scenario "latch" - a countdown latch releasing 1,000 waiters across processes.

4 worker processes (``benchmarks._worker``, role ``latch-wait``) park 250 waiter tasks each
on a closed latch; when all are parked, this process stamps ``t0`` and makes the last
``count_down()``. Each waiter stamps when it runs again; the figure is the time from ``t0``
to the LAST waiter running, in any process (CLOCK_MONOTONIC is one clock for the machine),
and to the first. Rounds are repeated; each re-arms the latch.

Variants:

* ``aiolock``: ``client.countdown_latch(name)``: ``try_set_count(1)``, the waiters'
  ``wait()``, ``count_down()``. A woken waiter reads the count again before it returns
  (as Redisson's ``await()`` does), so 1,000 GETs follow the message.
* ``floor``: what any client must at least do: one subscribed raw connection per process
  (``benchmarks.floor.PubSubConnection``), the waiters parked on futures resolved by the
  message straight from ``data_received``, and a bare ``PUBLISH`` instead of the count-down.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiolock

from . import floor
from .runner import (
    LoopName,
    ParentLink,
    Row,
    ScenarioResult,
    Settings,
    WorkerProc,
    close_client,
    loop_label,
    ratio,
    run_on,
    summarize_ms,
)

PROCESSES = 4
WAITERS = 1000
VARIANTS = ("aiolock", "floor")


def _channel(name: str) -> str:
    return "redisson_countdownlatch__channel__{" + name + "}"


async def worker(params: dict[str, Any], link: ParentLink) -> dict[str, Any]:
    """Park ``waiters`` tasks when told (ARM), report when all are parked, then report the
    stamps of their running again."""
    name, count, variant = params["name"], params["waiters"], params["variant"]
    client: aiolock.AioLock | None = None
    conn: floor.PubSubConnection | None = None
    parked: list[asyncio.Future[None]] = []

    def on_message(channel: bytes, data: bytes) -> None:
        for future in parked:
            if not future.done():
                future.set_result(None)

    if variant == "aiolock":
        client = aiolock.from_url(params["url"])
        await client.redis.ping()
    else:
        endpoint = floor.Endpoint.from_url(params["url"])
        conn = await floor._connect(endpoint, lambda: floor.PubSubConnection(on_message))
        assert conn is not None
        await conn.call("SUBSCRIBE", _channel(name))
    try:
        link.send("READY", {"loop": loop_label()})
        stamps: list[int] = []

        async def wait_aiolock() -> None:
            assert client is not None
            assert await client.countdown_latch(name).wait(60)
            stamps.append(time.monotonic_ns())

        async def wait_floor(future: asyncio.Future[None]) -> None:
            await future
            stamps.append(time.monotonic_ns())

        while (cmd := await link.recv()) == "ARM":
            stamps.clear()

            if client is not None:
                latch = client.countdown_latch(name)
                tasks = [asyncio.create_task(wait_aiolock()) for _ in range(count)]
                while latch.statistics().tasks_waiting < count:  # noqa: ASYNC110
                    await asyncio.sleep(0.002)
            else:
                loop = asyncio.get_running_loop()
                parked[:] = [loop.create_future() for _ in range(count)]
                tasks = [asyncio.create_task(wait_floor(f)) for f in parked]
                await asyncio.sleep(0.01)  # every task is awaiting its future
            link.send("PARKED")
            await asyncio.gather(*tasks)
            link.send("OPEN", [min(stamps), max(stamps)])
        return {"last": cmd}
    finally:
        if client is not None:
            await close_client(client, "latch waiter client")
        if conn is not None:
            conn.close()


async def _variant(settings: Settings, loop: LoopName, variant: str) -> dict[str, Any]:
    name = f"bench:latch:{variant}"
    rounds = 2 if settings.quick else 5
    per_process = WAITERS // PROCESSES
    client = aiolock.from_url(settings.url)
    latch = client.countdown_latch(name)
    raw = await floor._connect(floor.Endpoint.from_url(settings.url), floor.CommandConnection)
    params = {
        "role": "latch-wait",
        "loop": loop,
        "url": settings.url,
        "name": name,
        "waiters": per_process,
        "variant": variant,
    }
    procs = [await WorkerProc.start(params) for _ in range(PROCESSES)]
    last: list[int] = []
    first: list[int] = []
    try:
        for proc in procs:
            await proc.expect("READY", 30)
        for _ in range(rounds):
            if variant == "aiolock":
                assert await latch.try_set_count(1)
            for proc in procs:
                await proc.send("ARM")
            for proc in procs:
                await proc.expect("PARKED", 60)
            t0 = time.monotonic_ns()
            if variant == "aiolock":
                await latch.count_down()
            else:
                await raw.call("PUBLISH", _channel(name), "0")
            stamps = [json.loads(await proc.expect("OPEN", 60)) for proc in procs]
            first.append(min(s[0] for s in stamps) - t0)
            last.append(max(s[1] for s in stamps) - t0)
        for proc in procs:
            await proc.send("STOP")
            await proc.expect("RESULT", 30)
    finally:
        for proc in procs:
            await proc.close()
        raw.close()
        await close_client(client, "latch client")
    return {
        "waiters": per_process * PROCESSES,
        "processes": PROCESSES,
        "rounds": rounds,
        "last_waiter_ms": summarize_ms(last),
        "first_waiter_ms": summarize_ms(first),
    }


async def _run(settings: Settings, loop: LoopName) -> dict[str, Any]:
    return {v: await _variant(settings, loop, v) for v in VARIANTS}


def run(settings: Settings, loop: LoopName) -> ScenarioResult:
    data = run_on(loop, _run(settings, loop))
    rows: list[Row] = []
    for key, label in (
        ("last_waiter_ms", "last count_down -> last waiter running"),
        ("first_waiter_ms", "last count_down -> first waiter running"),
    ):
        for stat in ("p50", "max"):
            values: dict[str, float | None] = {v: data[v][key][stat] for v in VARIANTS}
            rows.append(
                Row(
                    "latch",
                    loop,
                    f"{label} {stat}",
                    "ms",
                    values,
                    {"aiolock/floor": ratio(values["aiolock"], values["floor"])},
                    better="lower",
                    log_scale=True,
                    note=(
                        f"{WAITERS} waiters in {PROCESSES} processes, "
                        f"{data['aiolock']['rounds']} rounds"
                        if key == "last_waiter_ms" and stat == "p50"
                        else ""
                    ),
                )
            )
    return ScenarioResult("latch", loop, rows, data)
