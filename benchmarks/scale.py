"""Scenario 4 - scale: many waiters on many names in one process, and many watchdog holds.

Waiters (default 10,000 tasks on 1,000 names, 10 per name). A second client holds every name
(``lease_time=60``). aiolock clients are made by ``aiolock.from_url`` (defaults). redis-py's
Lock gets a ``BlockingConnectionPool(max_connections=100)``: 10,000 tasks calling at once
need more connections than redis-py's default pool allows (100, after which it raises
``MaxConnectionsError``).

* memory per waiter: ``tracemalloc`` (Python heap) from before the waiters are spawned to
  when all of them wait, / N. Side by side with the floor
  (:func:`benchmarks.floor.parked_waiter_memory`: N waiter tasks of the floor design, a future
  per waiter in a dict keyed by channel, parked on names held by another connection) and with
  N bare tasks waiting on an ``asyncio.Event`` each. The traced pass is then cancelled (every
  waiter cancelled while waiting) and the client checked for leftovers: channels, holds,
  server-side subscriptions.
* pub/sub connections: ``CLIENT LIST TYPE pubsub`` while all N wait (and the client's own
  ``pubsub.connections_opened``)
* time for all to get the lock once: a second, untraced pass; once all N wait the holders
  release, and each waiter takes the lock, stamps the time and releases it (so the names'
  10 waiters take it in turn). Side by side with redis-py's Lock (sleep 0.1) in the same
  setup, capped at ``scale_baseline_cap`` seconds.
* round trips per acquisition during that release phase (as in the contended scenario).

Watchdog holds: N locks taken without
``lease_time`` on a client with ``watchdog_timeout=3`` (renewal every 1 s), watched for
``max(3 periods, timeout + 1 period)`` so that every lease would have run out without renewal.
Reported: renewal commands/s (top-level commands by commandstats; reference N / period, one
renewal per lock per period), CPU of this process during the watch (fraction of one core,
``time.process_time``), and whether every key is still there with a positive PTTL.
"""

from __future__ import annotations

import asyncio
import gc
import resource
import time
import tracemalloc
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
    ServerProbe,
    Settings,
    Snapshot,
    Target,
    close_client,
    ratio,
    run_on,
    stats_delta,
    summarize_ms,
    watchdog_available,
)

POOL_SIZE = 100
HOLD_LEASE_S = 60


def _redis(url: str) -> aredis.Redis:
    pool = aredis.BlockingConnectionPool.from_url(url, max_connections=POOL_SIZE, timeout=None)
    return aredis.Redis(connection_pool=pool)


async def _fill_pool(r: aredis.Redis) -> None:
    """Open every connection of the pool now, so pool growth is not counted per waiter."""
    await asyncio.gather(*(r.ping() for _ in range(POOL_SIZE)))


async def _until(pred: Callable[[], bool], within: float, what: str) -> float:
    """Poll ``pred`` every 20 ms; return the seconds it took; raise after ``within`` s."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > within:
            raise TimeoutError(f"{what}: not reached in {within:g} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


# -- aiolock internals: the only places this scenario reads them; replace after the core rewrite


def _waiting(client: aiolock.AioLock) -> int:
    """How many waiters are parked in ``client`` now."""
    return client.statistics().tasks_waiting


def _leftovers(client: aiolock.AioLock) -> dict[str, int]:
    """What a client still keeps once all its waiters were cancelled (all 0 when clean)."""
    stats = client.statistics()
    return {
        "channels_left": stats.subscriptions,
        "holds_left": sum(stats.holds.values()),
        "waiting_left": stats.tasks_waiting,
    }


def _pubsub_state(client: aiolock.AioLock) -> dict[str, int]:
    """Pub/sub connections the client ever opened, and channels subscribed now."""
    stats = client.statistics()
    return {
        "pubsub_connections_opened": stats.pubsub_connections_opened,
        "channels_subscribed": stats.subscriptions,
    }


class _Holders:
    """One task per name holding it until :meth:`release`, on a lock library of choice."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.held = 0
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, names: list[str], hold: Callable[[str], Awaitable[None]]) -> None:
        self.tasks = [asyncio.ensure_future(hold(n)) for n in names]

    async def all_held(self, within: float = 60) -> None:
        await _until(lambda: self.held == len(self.tasks), within, "holders")

    async def finish(self) -> None:
        self.go.set()
        await asyncio.gather(*self.tasks)


async def _aiolock_waiters(settings: Settings, names: list[str]) -> dict[str, Any]:
    n = settings.scale_waiters
    per_name = n // len(names)
    holders_client = aiolock.from_url(settings.url)
    client = aiolock.from_url(settings.url)
    probe = ServerProbe(settings.url)
    out: dict[str, Any] = {}
    try:
        for c in (client, holders_client):  # open the client's connections before measuring
            warm = c.lock("bench:scale:warm-up")
            await warm.lock(lease_time=1)
            await warm.unlock()

        # -- holders ------------------------------------------------------------------------
        def holders() -> _Holders:
            h = _Holders()

            async def hold(name: str) -> None:
                lock = holders_client.lock(name)
                await lock.lock(lease_time=HOLD_LEASE_S)
                h.held += 1
                await h.go.wait()
                await lock.unlock()

            h.start(names, hold)
            return h

        hs = holders()
        await hs.all_held()

        # -- pass 1: memory, then cancel everything ------------------------------------------
        async def wait_only(name: str) -> None:
            await client.lock(name).lock(lease_time=HOLD_LEASE_S)

        gc.collect()
        tracemalloc.start()
        try:  # a failure must not leave tracemalloc on: it slows every later scenario
            base = tracemalloc.get_traced_memory()[0]
            t0 = time.monotonic()
            waiters = [
                asyncio.ensure_future(wait_only(nm)) for nm in names for _ in range(per_name)
            ]
            setup_s = await _until(lambda: _waiting(client) == len(waiters), 120, "waiters")
            gc.collect()
            traced = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        out["traced_setup_s"] = time.monotonic() - t0
        out["memory_per_waiter_bytes"] = traced / len(waiters)
        for w in waiters:
            w.cancel()
        cancelled = await asyncio.gather(*waiters, return_exceptions=True)
        await asyncio.sleep(0.2)  # let the UNSUBSCRIBEs go out and be confirmed
        subs = [int(c.get("sub", 0)) for c in probe.client.client_list(_type="pubsub")]
        out["after_cancel"] = {
            "not_cancelled": sum(1 for c in cancelled if not isinstance(c, asyncio.CancelledError)),
            **_leftovers(client),
            "server_subscriptions_left": sum(subs),
        }
        del waiters, cancelled

        # -- pass 2: time for all to take the lock once ------------------------------------
        acquired_at: list[float] = []

        async def take_once(name: str) -> None:
            lock = client.lock(name)
            await lock.lock(lease_time=HOLD_LEASE_S)
            acquired_at.append(time.monotonic())
            await lock.unlock()

        t0 = time.monotonic()
        waiters = [asyncio.ensure_future(take_once(nm)) for nm in names for _ in range(per_name)]
        setup_s = await _until(lambda: _waiting(client) == len(waiters), 120, "waiters")
        out["setup_s"] = setup_s
        out["pubsub_clients"] = probe.pubsub_clients()
        out.update(_pubsub_state(client))
        before = Snapshot.take(probe)
        t_release = time.monotonic()
        release = asyncio.ensure_future(hs.finish())
        await asyncio.gather(*waiters)
        t_done = time.monotonic()
        await release
        after = Snapshot.take(probe)
        delta = stats_delta(before.commands, after.commands)
        rt = RoundTrips.from_delta(delta)
        out["all_acquired_s"] = t_done - t_release
        out["acquired_ms"] = summarize_ms(int((t - t_release) * 1e9) for t in acquired_at)
        out["acquisitions"] = len(acquired_at)
        out["round_trips_per_acquisition"] = rt.counted / len(acquired_at)
        out["commands"] = delta
        out["client_cpu_s"] = after.process_cpu - before.process_cpu
    finally:
        await close_client(client, "scale waiters client")
        await close_client(holders_client, "scale holders client")
        probe.close()
    return out


async def _floor_memory(settings: Settings, names: list[str]) -> float:
    """Bytes per bare task waiting on an asyncio.Event: the least a waiter can cost."""
    per_name = settings.scale_waiters // len(names)
    events = {nm: asyncio.Event() for nm in names}
    started = [0]

    async def wait_only(name: str) -> None:
        started[0] += 1
        await events[name].wait()

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tasks = [asyncio.ensure_future(wait_only(nm)) for nm in names for _ in range(per_name)]
    await _until(lambda: started[0] == len(tasks), 60, "floor tasks")
    await asyncio.sleep(0)
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    for e in events.values():
        e.set()
    await asyncio.gather(*tasks)
    return traced / len(tasks)


async def _redispy_waiters(settings: Settings, names: list[str]) -> dict[str, Any]:
    per_name = settings.scale_waiters // len(names)
    holders_r = _redis(settings.url)
    r = _redis(settings.url)
    probe = ServerProbe(settings.url)
    out: dict[str, Any] = {}
    try:
        await _fill_pool(r)
        await _fill_pool(holders_r)
        hs = _Holders()

        async def hold(name: str) -> None:
            lk = holders_r.lock(name, timeout=HOLD_LEASE_S)
            await lk.acquire()
            hs.held += 1
            await hs.go.wait()
            await lk.release()

        hs.start(names, hold)
        await hs.all_held()
        acquired_at: list[float] = []
        started = [0]

        async def take_once(name: str) -> None:
            lk = r.lock(name, timeout=HOLD_LEASE_S, sleep=0.1, blocking_timeout=None)
            started[0] += 1
            await lk.acquire()
            acquired_at.append(time.monotonic())
            await lk.release()

        set0 = probe.commandstats().get("set", 0)
        waiters = [asyncio.ensure_future(take_once(nm)) for nm in names for _ in range(per_name)]
        # every waiter has made its first (failed) SET
        await _until(lambda: started[0] == len(waiters), 120, "redis-py waiters started")
        await _until(
            lambda: probe.commandstats().get("set", 0) - set0 >= len(waiters),
            120,
            "redis-py waiters' first SET",
        )
        out["pubsub_clients"] = probe.pubsub_clients()
        before = Snapshot.take(probe)
        t_release = time.monotonic()
        release = asyncio.ensure_future(hs.finish())
        _, pending = await asyncio.wait(waiters, timeout=settings.scale_baseline_cap)
        t_done = time.monotonic()
        after = Snapshot.take(probe)
        for w in pending:
            w.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await release
        out["capped"] = bool(pending)
        out["all_acquired_s"] = (t_done - t_release) if not pending else None
        out["acquisitions"] = len(acquired_at)
        out["acquired_ms"] = summarize_ms(int((t - t_release) * 1e9) for t in acquired_at)
        delta = stats_delta(before.commands, after.commands)
        rt = RoundTrips.from_delta(delta)
        out["round_trips_per_acquisition"] = rt.counted / len(acquired_at) if acquired_at else None
        out["commands"] = delta
        out["client_cpu_s"] = after.process_cpu - before.process_cpu
    finally:
        await r.aclose()
        await holders_r.aclose()
        # leftovers of capped waiters (cancelled mid-acquire) must not leak into later runs
        probe.flush()
        probe.close()
    return out


async def _watchdog_holds(settings: Settings) -> dict[str, Any]:
    n = settings.watchdog_locks
    timeout = settings.watchdog_timeout
    period = timeout / 3
    window = max(settings.watchdog_periods * period, timeout + period)
    client = aiolock.from_url(settings.url, watchdog_timeout=timeout)
    probe = ServerProbe(settings.url)
    names = [f"bench:scale:wd:{i}" for i in range(n)]
    release = asyncio.Event()
    held = [0]
    errors: list[str] = []

    async def hold(name: str) -> None:
        lock = client.lock(name)
        await lock.lock()
        held[0] += 1
        await release.wait()
        try:
            await lock.unlock()
        except aiolock.LockError as exc:
            errors.append(repr(exc))

    try:
        t0 = time.monotonic()
        tasks = [asyncio.ensure_future(hold(nm)) for nm in names]
        await _until(lambda: held[0] == n, 120, "watchdog holds")
        acquire_s = time.monotonic() - t0
        before = Snapshot.take(probe)
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.sleep(window)
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        after = Snapshot.take(probe)
        pipe = probe.client.pipeline(transaction=False)
        for nm in names:
            pipe.pttl(nm)
        pttls = [int(x) for x in pipe.execute()]
        release.set()
        t1 = time.monotonic()
        await asyncio.gather(*tasks)
        release_s = time.monotonic() - t1
    finally:
        await close_client(client, "scale watchdog client")
        probe.close()
    delta = stats_delta(before.commands, after.commands)
    rt = RoundTrips.from_delta(delta)
    seconds = after.at - before.at
    return {
        "locks": n,
        "watchdog_timeout_s": timeout,
        "window_s": seconds,
        "acquire_all_s": acquire_s,
        "renew_commands_per_s": rt.counted / seconds,
        "reference_commands_per_s": n / period,
        "commands": delta,
        "cpu_fraction": (after.process_cpu - before.process_cpu) / seconds,
        "rusage_user_s": ru1.ru_utime - ru0.ru_utime,
        "rusage_sys_s": ru1.ru_stime - ru0.ru_stime,
        "all_held": all(p > 0 for p in pttls),
        "held_count": sum(1 for p in pttls if p > 0),
        "min_pttl_ms": min(pttls) if pttls else None,
        "release_all_s": release_s,
        "unlock_errors": errors[:5],
        "unlock_error_count": len(errors),
    }


async def _run(settings: Settings) -> dict[str, Any]:
    names = [f"bench:scale:{i}" for i in range(settings.scale_names)]
    data: dict[str, Any] = {
        "waiters": settings.scale_waiters,
        "names": settings.scale_names,
        "aiolock": await _aiolock_waiters(settings, names),
        "floor": await floor.parked_waiter_memory(
            settings.url,
            [f"bench:scale:floor:{i}" for i in range(settings.scale_names)],
            settings.scale_waiters // settings.scale_names,
        ),
        "floor_memory_per_waiter_bytes": await _floor_memory(settings, names),
        "redis-py": await _redispy_waiters(settings, names),
    }
    if watchdog_available():
        try:
            data["watchdog"] = await _watchdog_holds(settings)
        except Exception as exc:  # report, do not lose the rest of the run
            data["watchdog"] = {"error": repr(exc)}
    else:
        data["watchdog"] = {"status": "not yet available (aiolock/watchdog.py missing)"}
    return data


def run(settings: Settings, loop: LoopName) -> ScenarioResult:
    data = run_on(loop, _run(settings))
    a, rp = data["aiolock"], data["redis-py"]
    n = data["waiters"]
    rows: list[Row] = []
    mem: dict[str, float | None] = {
        "aiolock": a["memory_per_waiter_bytes"] / 1024,
        "floor": data["floor"]["bytes_per_waiter"] / 1024,
        "bare task": data["floor_memory_per_waiter_bytes"] / 1024,
    }
    rows.append(
        Row(
            "scale",
            loop,
            "memory per waiter",
            "KiB",
            mem,
            {
                "aiolock/floor": ratio(mem["aiolock"], mem["floor"]),
                "aiolock/bare task": ratio(mem["aiolock"], mem["bare task"]),
            },
            [Target("KiB per waiter", mem["aiolock"], "<=", 1.5)],
            better="lower",
            note=f"tracemalloc, {n} waiters on {data['names']} names",
        )
    )
    rows.append(
        Row(
            "scale",
            loop,
            "pub/sub connections",
            "conns",
            {"aiolock": a["pubsub_clients"], "redis-py sleep=0.1": rp["pubsub_clients"]},
            {},
            [Target("connections", a["pubsub_clients"], "<=", 1)],
            better="lower",
            note=f"CLIENT LIST TYPE pubsub with {n} waiting; "
            f"{a['channels_subscribed']} channels on it",
        )
    )
    t_all: dict[str, float | None] = {
        "aiolock": a["all_acquired_s"],
        "redis-py sleep=0.1": rp["all_acquired_s"],
    }
    rows.append(
        Row(
            "scale",
            loop,
            "all waiters acquired once",
            "s",
            t_all,
            {"aiolock/redis-py sleep=0.1": ratio(t_all["aiolock"], t_all["redis-py sleep=0.1"])},
            better="lower",
            log_scale=True,
            note=(
                f"after holders release; redis-py capped at {settings.scale_baseline_cap:g} s: "
                f"{rp['acquisitions']}/{n} acquired"
                if rp["capped"]
                else "after holders release"
            ),
        )
    )
    rt: dict[str, float | None] = {
        "aiolock": a["round_trips_per_acquisition"],
        "redis-py sleep=0.1": rp["round_trips_per_acquisition"],
    }
    rows.append(
        Row(
            "scale",
            loop,
            "round trips per acquisition",
            "commands",
            rt,
            {"aiolock/redis-py sleep=0.1": ratio(rt["aiolock"], rt["redis-py sleep=0.1"])},
            better="lower",
            log_scale=True,
            note="during the release phase",
        )
    )
    leftovers = a["after_cancel"]
    left = sum(
        leftovers[k]
        for k in ("channels_left", "holds_left", "server_subscriptions_left", "waiting_left")
    )
    rows.append(
        Row(
            "scale",
            loop,
            "leftovers after cancelling all waiters",
            "",
            {"aiolock": left},
            {},
            [Target("leftovers", left, "==", 0)],
            better="lower",
            note=", ".join(f"{k}={v}" for k, v in leftovers.items()),
        )
    )
    wd = data["watchdog"]
    if "renew_commands_per_s" in wd:
        rows.append(
            Row(
                "scale",
                loop,
                "watchdog renew commands/s",
                "cmd/s",
                {
                    "aiolock": wd["renew_commands_per_s"],
                    "1 per lock per period": wd["reference_commands_per_s"],
                },
                {
                    "aiolock/1 per lock per period": ratio(
                        wd["renew_commands_per_s"], wd["reference_commands_per_s"]
                    )
                },
                better="lower",
                log_scale=True,
                note=f"{wd['locks']} holds, watchdog_timeout={wd['watchdog_timeout_s']:g} s, "
                f"{wd['window_s']:.1f} s watched",
            )
        )
        rows.append(
            Row(
                "scale",
                loop,
                "watchdog CPU (fraction of a core)",
                "",
                {"aiolock": wd["cpu_fraction"]},
                better="lower",
                note="time.process_time over the watch",
            )
        )
        rows.append(
            Row(
                "scale",
                loop,
                "watchdog: locks still held",
                "locks",
                {"aiolock": wd["held_count"]},
                {},
                [Target("held", wd["held_count"], "==", wd["locks"])],
                better="higher",
                note=f"min PTTL {wd['min_pttl_ms']} ms",
            )
        )
    else:
        rows.append(
            Row(
                "scale",
                loop,
                "watchdog holds",
                "",
                {"aiolock": None},
                note=str(wd.get("status") or wd.get("error")),
            )
        )
    return ScenarioResult("scale", loop, rows, data)
