"""The orchestrator of a fault campaign: servers, proxies, worker processes, faults, checks.

:func:`run_campaign` starts four private Redis servers (:data:`tests.chaos.plan.SERVERS`),
a :class:`~aiolock.testing.TcpProxy` in front of each, and worker processes
(:mod:`tests.chaos.worker`) whose clients connect through the proxies. For ``duration``
seconds it injects faults chosen by a seeded random generator (the seed is printed, and the
same seed makes the same choices; the interleavings of real processes still differ from run
to run), at most ``concurrent_faults`` at once and one per target. Then it heals everything,
stops the workers (each finishes its operation, records its clients' statistics, closes
them), waits for what killed processes left to expire, looks at what is left on the servers
and hands every history to :func:`tests.chaos.checker.check`.

Faults (``kind``: what it does to its target):

===================  =========================================================================
proc_kill            SIGKILL a worker process (a new one takes its place shortly after)
proc_stop            SIGSTOP a worker for 0.05-3 s (past its leases, sometimes), then SIGCONT
server_restart       SIGKILL a server and start it again at once, empty (s0-s2)
server_kill          SIGKILL a server, keep it down 0.3-2.5 s, start it again empty (s0-s2)
server_pause         SIGSTOP a server for 0.05-2 s
client_kill          CLIENT KILL TYPE normal (every command link)
client_kill_pubsub   CLIENT KILL TYPE pubsub (every subscription link)
client_pause         CLIENT PAUSE 50-1500 ms (ALL or WRITE)
oom                  CONFIG SET maxmemory 1 (noeviction: writes refused) for 0.2-2.5 s
delay_replies        the proxy delays every reply by 20-600 ms, for 0.3-3 s
delay_requests       the proxy delays every request by 20-600 ms, for 0.3-3 s
blackhole_replies    the proxy swallows every reply, for 0.1-2.5 s (past the leases, sometimes)
blackhole_requests   the proxy swallows every request, for 0.1-2.5 s
drop_replies         the proxy drops the next 1-3 replies (links fall out of step)
late_requests        the proxy holds requests 20-400 ms, resets the clients, and delivers the
                     held requests 50-800 ms later, after the clients gave up on them
reset_connections    the proxy resets every connection, both sides
sentinel_failover    (``--sentinel``) SENTINEL FAILOVER of the Sentinel-managed master; the
                     deposed master stays writable until the Sentinels demote it
sentinel_kill_master (``--sentinel``) kill -9 the master; the replica is promoted
===================  =========================================================================

Every client also cancels some of its own calls at random (see the worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio

import aiolock
from aiolock.testing import LocalSentinel, RedisServer, TcpProxy
from aiolock.testing._process import start_process

from . import plan
from .checker import Limits, Report, check
from .history import Event, Recorder, now, read_events

ROOT = Path(__file__).resolve().parents[2]

#: every fault kind and its weight in the random mix
FAULTS: dict[str, float] = {
    "proc_kill": 6,
    "proc_stop": 8,
    "server_restart": 5,
    "server_kill": 3,
    "server_pause": 4,
    "client_kill": 4,
    "client_kill_pubsub": 4,
    "client_pause": 4,
    "oom": 4,
    "delay_replies": 6,
    "delay_requests": 4,
    "blackhole_replies": 5,
    "blackhole_requests": 3,
    "drop_replies": 5,
    "late_requests": 5,
    "reset_connections": 4,
}
#: the faults of the Sentinel deployment (with ``Settings.sentinel``)
SENTINEL_FAULTS: dict[str, float] = {"sentinel_failover": 3, "sentinel_kill_master": 1}
_PROCESS_FAULTS = ("proc_kill", "proc_stop")
_WIPES = ("server_restart", "server_kill")


@dataclass
class Settings:
    seed: int
    #: seconds of faults
    duration: float
    workers: int = 4
    #: seconds between two fault injections (a random value in this range)
    fault_gap: tuple[float, float] = (0.15, 0.8)
    concurrent_faults: int = 3
    faults: dict[str, float] = field(default_factory=lambda: dict(FAULTS))
    #: where the histories go (a temporary directory, removed after, by default)
    out: Path | None = None
    #: seconds past a bound a call may end before it counts as past it
    tolerance: float = 0.0
    #: seconds between healing everything and stopping the workers
    quiet: float = 1.5
    #: also a Sentinel-managed master and its replica, with lock actors on it and failovers
    #: (``SENTINEL FAILOVER``, kill -9 of the master) in the mix
    sentinel: bool = False
    log: Callable[[str], None] = field(default=lambda line: print(line, flush=True))


@dataclass
class Slot:
    """One worker process place: its current generation."""

    index: int
    gen: int = -1
    proc: subprocess.Popen[bytes] | None = None
    history: Path | None = None
    busy: bool = False


class Orchestrator:
    def __init__(self, settings: Settings, out: Path) -> None:
        self.settings = settings
        self.out = out
        self.rng = random.Random(settings.seed)
        self.rec = Recorder(out / "orchestrator.jsonl")
        self.servers: dict[str, RedisServer] = {}
        self.proxies: dict[str, TcpProxy] = {}
        self.sentinel: LocalSentinel | None = None
        self.slots = [Slot(i) for i in range(settings.workers)]
        self.busy: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.histories: list[Path] = []

    # -- setting up ---------------------------------------------------------------------------

    async def start(self) -> None:
        for name in plan.SERVERS:
            self.servers[name] = RedisServer()
        await asyncio.gather(*(asyncio.to_thread(s.start) for s in self.servers.values()))
        for name, server in self.servers.items():
            self.proxies[name] = await TcpProxy.for_url(server.url).start()
        for name in plan.SERVERS:
            await self.seed(name)
        if self.settings.sentinel:
            self.sentinel = LocalSentinel()
            await asyncio.to_thread(self.sentinel.start)
        for slot in self.slots:
            self.spawn(slot)
        await asyncio.gather(*(self.wait_ready(slot) for slot in self.slots))

    async def seed(self, server: str) -> None:
        """The counts the campaign sets up (again, after the server lost them)."""
        if server == "s0":
            await self.control(server, "SET", plan.PERMITS, plan.PERMITS_CAP, "NX")
        if server == "s3":
            await self.control(server, "SET", plan.SEMAPHORE, plan.SEMAPHORE_CAP, "NX")

    async def control(self, server: str, *args: Any) -> Any:
        """One command on a server's own port (not through its proxy), on a fresh link."""
        host, port = self.servers[server].address
        client = redis.asyncio.Redis(host=host, port=port, socket_timeout=5)
        try:
            return await client.execute_command(*args)  # type: ignore[no-untyped-call]
        finally:
            await client.aclose()

    def spawn(self, slot: Slot) -> None:
        slot.gen += 1
        slot.history = self.out / f"worker-{slot.index}-{slot.gen}.jsonl"
        self.histories.append(slot.history)
        urls = {name: proxy.url for name, proxy in self.proxies.items()}
        if self.sentinel is not None:
            hosts = ",".join(f"{h}:{p}" for h, p in self.sentinel.sentinel_addresses)
            urls["sn"] = f"redis+sentinel://{hosts}/{self.sentinel.master_name}"
        settings = {
            "worker": slot.index,
            "gen": slot.gen,
            "seed": f"{self.settings.seed}:{slot.index}:{slot.gen}",
            "history": str(slot.history),
            "urls": urls,
        }
        path = self.out / f"worker-{slot.index}-{slot.gen}.json"
        path.write_text(json.dumps(settings))
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        with (self.out / f"worker-{slot.index}-{slot.gen}.err").open("ab") as err:
            slot.proc = start_process(
                [sys.executable, "-m", "tests.chaos.worker", str(path)],
                cwd=str(ROOT),
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        self.rec.write(
            {"e": "proc", "pid": slot.proc.pid, "worker": slot.index, "gen": slot.gen, "t": now()}
        )

    async def wait_ready(self, slot: Slot, within: float = 60.0) -> None:
        assert slot.history is not None and slot.proc is not None
        deadline = now() + within
        while now() < deadline:
            if slot.history.exists() and any(e["e"] == "ready" for e in read_events(slot.history)):
                return
            if slot.proc.poll() is not None:
                raise RuntimeError(f"worker {slot.index} exited: see {slot.history}.err")
            await asyncio.sleep(0.05)
        raise RuntimeError(f"worker {slot.index} not ready within {within} s")

    # -- faults -------------------------------------------------------------------------------

    async def inject(self, until: float) -> None:
        faults = dict(self.settings.faults)
        if self.sentinel is not None:
            faults = {**SENTINEL_FAULTS, **faults}
        kinds = list(faults)
        weights = [faults[k] for k in kinds]
        while now() < until:
            await asyncio.sleep(self.rng.uniform(*self.settings.fault_gap))
            self.tasks = {t for t in self.tasks if not t.done()}
            if len(self.tasks) >= self.settings.concurrent_faults:
                continue
            kind = self.rng.choices(kinds, weights)[0]
            target = self.pick_target(kind)
            if target is None:
                continue
            self.busy.add(target)
            task = asyncio.create_task(self.fault(kind, target))
            self.tasks.add(task)

    def pick_target(self, kind: str) -> str | None:
        if kind in SENTINEL_FAULTS:
            return None if "sn" in self.busy or self.sentinel is None else "sn"
        if kind == "sabotage":
            return None if "s0" in self.busy else "s0"
        if kind in _PROCESS_FAULTS:
            free = [f"w{s.index}" for s in self.slots if f"w{s.index}" not in self.busy]
        elif kind in _WIPES:
            free = [s for s in plan.WIPEABLE if s not in self.busy]
        else:
            free = [s for s in plan.SERVERS if s not in self.busy]
        return self.rng.choice(free) if free else None

    async def fault(self, kind: str, target: str) -> None:
        rng = random.Random(self.rng.random())
        t0 = now()
        detail: dict[str, Any] = {}
        try:
            await getattr(self, f"fault_{kind}")(target, rng, detail)
        except asyncio.CancelledError:
            detail["cut short"] = True
        except Exception as exc:  # a fault that could not be injected is recorded, not fatal
            detail["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            self.busy.discard(target)
            self.rec.write(
                {
                    "e": "fault",
                    "kind": kind,
                    "target": target,
                    "t0": t0,
                    "t1": now(),
                    "detail": detail,
                }
            )

    def slot(self, target: str) -> Slot:
        return self.slots[int(target[1:])]

    async def fault_proc_kill(
        self, target: str, rng: random.Random, detail: dict[str, Any]
    ) -> None:
        slot = self.slot(target)
        proc = slot.proc
        if proc is None or proc.poll() is not None:
            return
        proc.kill()
        self.rec.write({"e": "kill", "pid": proc.pid, "t": now()})
        detail["pid"] = proc.pid
        rc = await asyncio.to_thread(proc.wait)
        self.rec.write({"e": "exit", "pid": proc.pid, "t": now(), "rc": rc})
        await asyncio.sleep(rng.uniform(0.1, 1.0))
        self.spawn(slot)

    async def fault_proc_stop(
        self, target: str, rng: random.Random, detail: dict[str, Any]
    ) -> None:
        proc = self.slot(target).proc
        if proc is None or proc.poll() is not None:
            return
        seconds = rng.choice([rng.uniform(0.05, 0.6), rng.uniform(0.6, 3.0)])
        detail.update(pid=proc.pid, seconds=round(seconds, 3))
        proc.send_signal(signal.SIGSTOP)
        t0 = now()
        try:
            await asyncio.sleep(seconds)
        finally:
            proc.send_signal(signal.SIGCONT)
            self.rec.write({"e": "stop", "pid": proc.pid, "t0": t0, "t1": now()})

    async def wipe(self, target: str, down: float) -> None:
        server = self.servers[target]
        if server.is_paused:
            server.resume()
        await asyncio.to_thread(server.kill)
        self.rec.write({"e": "wipe", "server": target, "t": now()})
        try:
            await asyncio.sleep(down)
        finally:
            await asyncio.to_thread(server.restart)
            await self.seed(target)

    async def fault_server_restart(
        self, target: str, rng: random.Random, detail: dict[str, Any]
    ) -> None:
        await self.wipe(target, 0)

    async def fault_server_kill(
        self, target: str, rng: random.Random, detail: dict[str, Any]
    ) -> None:
        down = rng.uniform(0.3, 2.5)
        detail["down"] = round(down, 3)
        await self.wipe(target, down)

    async def fault_server_pause(
        self, target: str, rng: random.Random, detail: dict[str, Any]
    ) -> None:
        server = self.servers[target]
        seconds = rng.uniform(0.05, 2.0)
        detail["seconds"] = round(seconds, 3)
        server.pause()
        try:
            await asyncio.sleep(seconds)
        finally:
            server.resume()

    async def fault_client_kill(
        self, target: str, rng: random.Random, detail: dict[str, Any]
    ) -> None:
        detail["killed"] = await self.control(target, "CLIENT", "KILL", "TYPE", "normal")

    async def fault_client_kill_pubsub(
        self, target: str, rng: random.Random, detail: dict[str, Any]
    ) -> None:
        detail["killed"] = await self.control(target, "CLIENT", "KILL", "TYPE", "pubsub")

    async def fault_client_pause(
        self, target: str, rng: random.Random, detail: dict[str, Any]
    ) -> None:
        ms = rng.randint(50, 1500)
        mode = rng.choice(["ALL", "WRITE"])
        detail.update(ms=ms, mode=mode)
        await self.control(target, "CLIENT", "PAUSE", ms, mode)
        await asyncio.sleep(ms / 1000)

    async def fault_oom(self, target: str, rng: random.Random, detail: dict[str, Any]) -> None:
        seconds = rng.uniform(0.2, 2.5)
        detail["seconds"] = round(seconds, 3)
        await self.control(target, "CONFIG", "SET", "maxmemory", "1")
        try:
            await asyncio.sleep(seconds)
        finally:
            await self.control(target, "CONFIG", "SET", "maxmemory", "0")

    async def _proxy_for(
        self, target: str, seconds: float, apply: Callable[[TcpProxy], None]
    ) -> None:
        proxy = self.proxies[target]
        apply(proxy)
        try:
            await asyncio.sleep(seconds)
        finally:
            proxy.pass_through()

    async def fault_delay_replies(
        self, target: str, rng: random.Random, detail: dict[str, Any]
    ) -> None:
        delay, seconds = rng.uniform(0.02, 0.6), rng.uniform(0.3, 3.0)
        detail.update(delay=round(delay, 3), seconds=round(seconds, 3))
        await self._proxy_for(target, seconds, lambda p: p.delay_replies(delay))

    async def fault_delay_requests(
        self, target: str, rng: random.Random, detail: dict[str, Any]
    ) -> None:
        delay, seconds = rng.uniform(0.02, 0.6), rng.uniform(0.3, 3.0)
        detail.update(delay=round(delay, 3), seconds=round(seconds, 3))
        await self._proxy_for(target, seconds, lambda p: p.delay_requests(delay))

    async def fault_blackhole_replies(
        self, target: str, rng: random.Random, detail: dict[str, Any]
    ) -> None:
        seconds = rng.uniform(0.1, 2.5)
        detail["seconds"] = round(seconds, 3)
        await self._proxy_for(target, seconds, TcpProxy.blackhole_replies)

    async def fault_blackhole_requests(
        self, target: str, rng: random.Random, detail: dict[str, Any]
    ) -> None:
        seconds = rng.uniform(0.1, 2.5)
        detail["seconds"] = round(seconds, 3)
        await self._proxy_for(target, seconds, TcpProxy.blackhole_requests)

    async def fault_drop_replies(
        self, target: str, rng: random.Random, detail: dict[str, Any]
    ) -> None:
        n = rng.randint(1, 3)
        detail["n"] = n
        await self._proxy_for(target, rng.uniform(0.2, 1.0), lambda p: p.drop_replies(n))

    async def fault_late_requests(
        self, target: str, rng: random.Random, detail: dict[str, Any]
    ) -> None:
        proxy = self.proxies[target]
        hold, late = rng.uniform(0.02, 0.4), rng.uniform(0.05, 0.8)
        detail.update(hold=round(hold, 3), late=round(late, 3))
        proxy.hold_requests()
        try:
            await asyncio.sleep(hold)
            detail["held"] = proxy.held_requests
            detail["reset"] = proxy.reset_client_side()
            await asyncio.sleep(late)
        finally:
            proxy.pass_through()
            detail["delivered"] = await proxy.release_held_requests()

    async def fault_sabotage(self, target: str, rng: random.Random, detail: dict[str, Any]) -> None:
        """Not a fault of the mix: the checker's own test. Delete every lock on the server
        behind its holders' backs, as a broken lock would, and record nothing of it (the
        "fault" event names the kind only): the checker must see the overlaps it causes."""
        keys = [k.decode() for k in await self.control(target, "KEYS", "*")]
        locks = [k for k in keys if k in (*plan.LOCKS, plan.FENCED, plan.SPIN, plan.RW)]
        if locks:
            await self.control(target, "DEL", *locks)
        detail["deleted"] = locks

    async def fault_sentinel_failover(
        self, target: str, rng: random.Random, detail: dict[str, Any]
    ) -> None:
        """``SENTINEL FAILOVER``; the deposed master stays writable until the Sentinels make
        it a replica (seconds): what was written to it meanwhile is lost."""
        assert self.sentinel is not None
        self.rec.write({"e": "failover", "server": target, "t": now()})
        new = await asyncio.to_thread(self.sentinel.failover, demote_old_master=False)
        detail["new master"] = new.port

    async def fault_sentinel_kill_master(
        self, target: str, rng: random.Random, detail: dict[str, Any]
    ) -> None:
        """kill -9 the master; the Sentinels promote the replica; the old master comes
        back, empty, as its replica."""
        assert self.sentinel is not None
        old = await asyncio.to_thread(self.sentinel.kill_master)
        self.rec.write({"e": "failover", "server": target, "t": now()})
        new = await asyncio.to_thread(self.sentinel.wait_for_new_master)
        detail["new master"] = new.port
        await asyncio.to_thread(self.sentinel.restart, old)

    async def fault_reset_connections(
        self, target: str, rng: random.Random, detail: dict[str, Any]
    ) -> None:
        self.proxies[target].reset_connections()

    # -- ending -------------------------------------------------------------------------------

    async def heal(self) -> None:
        """Cancel the faults under way (each heals what it did) and make sure all is well."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for name, server in self.servers.items():
            if server.is_paused:
                server.resume()
            if not server.is_running:
                await asyncio.to_thread(server.restart)
                await self.seed(name)
            await self.control(name, "CONFIG", "SET", "maxmemory", "0")
            with contextlib.suppress(redis.ResponseError):
                await self.control(name, "CLIENT", "UNPAUSE")
        for proxy in self.proxies.values():
            proxy.pass_through()
            await proxy.release_held_requests()
        if self.sentinel is not None:
            await asyncio.to_thread(self.sentinel.heal)

    async def stop_workers(self, within: float = 30.0) -> None:
        live = [s.proc for s in self.slots if s.proc is not None and s.proc.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)

        async def wait(proc: subprocess.Popen[bytes]) -> None:
            try:
                rc = await asyncio.wait_for(asyncio.to_thread(proc.wait), within)
            except TimeoutError:
                self.rec.write(
                    {
                        "e": "leftover",
                        "what": "worker did not stop",
                        "detail": f"pid {proc.pid} still running {within} s after SIGTERM (killed)",
                    }
                )
                proc.kill()
                rc = await asyncio.to_thread(proc.wait)
            self.rec.write({"e": "exit", "pid": proc.pid, "t": now(), "rc": rc})

        await asyncio.gather(*(wait(p) for p in live))

    async def leftovers(self, settle: float) -> None:
        """What the campaign left on the servers, once what dead processes held expired."""
        deadline = now() + settle
        for name in plan.SERVERS:
            while True:
                left = await self.unexpected_keys(name)
                clients = await self.foreign_clients(name)
                if (not left and not clients) or now() >= deadline:
                    break
                await asyncio.sleep(0.2)
            if left:
                self.rec.write({"e": "leftover", "what": f"keys on {name}", "detail": left})
            if clients:
                self.rec.write(
                    {"e": "leftover", "what": f"connections to {name}", "detail": clients}
                )
            channels = await self.control(name, "PUBSUB", "CHANNELS")
            if channels:
                self.rec.write(
                    {
                        "e": "leftover",
                        "what": f"channels on {name}",
                        "detail": sorted(map(repr, channels)),
                    }
                )
        if self.sentinel is not None:
            master = await asyncio.to_thread(self.sentinel.master)
            self.servers["sn"] = master  # for the key listing below, then forgotten
            try:
                while (left := await self.unexpected_keys("sn")) and now() < deadline:  # noqa: ASYNC110
                    await asyncio.sleep(0.2)  # until what dead processes held expired
                if left:
                    self.rec.write({"e": "leftover", "what": "keys on sn", "detail": left})
            finally:
                del self.servers["sn"]
        # the permit-expirable semaphore: every permit back, once the expired are returned
        async with aiolock.from_url(self.servers["s0"].url, metrics=False) as client:
            pes = client.permit_expirable_semaphore(plan.PERMITS)
            while (available := await pes.available_permits()) != plan.PERMITS_CAP:
                if now() >= deadline:
                    self.rec.write(
                        {
                            "e": "leftover",
                            "what": f"permits of {plan.PERMITS}",
                            "detail": f"{available} of {plan.PERMITS_CAP} available "
                            "after every holder ended",
                        }
                    )
                    break
                await asyncio.sleep(0.2)
        value = await self.control("s3", "GET", plan.SEMAPHORE)
        self.rec.write(
            {
                "e": "semaphore",
                "name": f"{plan.SEMAPHORE}@s3",
                "available": int(value or 0),
                "cap": plan.SEMAPHORE_CAP,
            }
        )

    async def unexpected_keys(self, server: str) -> dict[str, str]:
        kept = plan.KEPT.get(server, set())
        found: dict[str, str] = {}
        for raw in await self.control(server, "KEYS", "*"):
            key = raw.decode()
            if key in kept:
                continue
            ttl = int(await self.control(server, "PTTL", key))
            if ":aiolock_requests:" in key and ttl > 0:
                continue  # request latches expire by themselves (aiolock.requests)
            found[key] = f"{(await self.control(server, 'TYPE', key)).decode()}, pttl {ttl}"
        return found

    async def foreign_clients(self, server: str) -> list[str]:
        listing = (await self.control(server, "CLIENT", "LIST")).decode()
        lines = [line for line in listing.splitlines() if line and "cmd=client" not in line]
        return lines

    async def close(self) -> None:
        for proxy in self.proxies.values():
            await proxy.aclose()
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.kill()
                await asyncio.to_thread(slot.proc.wait)
        await asyncio.gather(
            *(asyncio.to_thread(s.stop) for s in self.servers.values()), return_exceptions=True
        )
        if self.sentinel is not None:
            await asyncio.to_thread(self.sentinel.stop)
        self.rec.close()


async def run_campaign(settings: Settings) -> Report:
    """Run one campaign and judge it (see the module docstring)."""
    log = settings.log
    temporary = settings.out is None
    if settings.out is None:
        out = Path(tempfile.mkdtemp(prefix="aiolock-chaos-"))
    else:
        out = settings.out
        out.mkdir(parents=True, exist_ok=True)
    log(
        f"chaos: seed {settings.seed}, {settings.duration:.0f} s, {settings.workers} workers, "
        f"histories in {out}"
    )
    orchestrator = Orchestrator(settings, out)
    try:
        await orchestrator.start()
        started = now()
        await orchestrator.inject(started + settings.duration)
        await orchestrator.heal()
        await asyncio.sleep(settings.quiet)
        await orchestrator.stop_workers()
        await orchestrator.leftovers(settle=max(plan.CLIENT["watchdog_timeout"], 2.0) + 3.0)
    finally:
        await orchestrator.close()
    report = judge(out, settings)
    if temporary:
        if report.violations:
            report.figures["histories"] = str(out)
            log(f"chaos: violations found; the histories are kept in {out}")
        else:
            shutil.rmtree(out, ignore_errors=True)
    return report


def judge(out: Path, settings: Settings) -> Report:
    """Check the histories a campaign left in ``out``."""
    workers: dict[int, list[Event]] = {}
    for path in sorted(out.glob("worker-*.jsonl")):
        events = read_events(path)
        if events and events[0]["e"] == "start":
            workers[events[0]["pid"]] = events
    orchestrator_events = read_events(out / "orchestrator.jsonl")
    limits = Limits(
        command_timeout=plan.CLIENT["command_timeout"],
        cleanup_timeout=plan.CLIENT["cleanup_timeout"],
        tolerance=settings.tolerance,
    )
    return check(
        workers,
        orchestrator_events,
        limits,
        figures={
            "seed": settings.seed,
            "duration": settings.duration,
            "processes": len(workers),
            "faults": dict(Counter(e["kind"] for e in orchestrator_events if e["e"] == "fault")),
        },
    )


def run(settings: Settings) -> Report:
    return asyncio.run(run_campaign(settings))


__all__ = ["FAULTS", "Settings", "judge", "run", "run_campaign"]
