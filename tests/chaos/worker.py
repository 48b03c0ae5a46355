"""A worker process of the fault campaign: several actors of every type, recording a history.

``python -m tests.chaos.worker SETTINGS.json`` opens one aiolock client per server (through
the orchestrator's fault proxies), runs the actors of :data:`tests.chaos.plan.ACTORS` until
SIGTERM, then lets every actor finish its operation, records each client's statistics, closes
the clients and records what is left. Everything is recorded in the history file named by
the settings (see :mod:`tests.chaos.history`): the orchestrator may SIGSTOP or SIGKILL the
process at any moment.

Each actor loops: choose an object and a style (``try_lock(W)``, ``lock()`` under a hang
guard, ``async with``, ``guard()``; for permits also a permit taken in a child task),
sometimes a lease, sometimes a cancellation of the call after a random delay; hold what was
granted for a random time, recording its lease deadlines as the client knows them and any
loss reported, then release it (sometimes cancelling that too).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiolock
from aiolock import (
    AioLock,
    AioLockError,
    LockLostError,
    LockNotOwnedError,
)
from aiolock.leases import HoldState

from . import plan
from .history import Recorder, now


@dataclass
class Process:
    """What the actors of one process share."""

    rec: Recorder
    clients: dict[str, AioLock]
    config: aiolock.Config
    #: time.monotonic() - loop.time(): the clients' deadlines are loop times
    offset: float
    cids: int = 0
    hids: int = 0

    def cid(self) -> int:
        self.cids += 1
        return self.cids

    def hid(self) -> int:
        self.hids += 1
        return self.hids


# -- what is held ---------------------------------------------------------------------------


class Target(Protocol):
    """One object an actor takes, behind one small interface."""

    kind: str
    obj: str
    #: resources held, their mode (x, s, c) and capacity; member servers and their rule
    res: list[list[str]]
    mode: str
    cap: int
    members: list[str]
    rule: str
    quorum: int
    leases: bool

    def try_bound(self, wait: float) -> float: ...

    async def try_acquire(self, wait: float, lease: float | None) -> Any: ...

    async def acquire(self, lease: float | None) -> Any: ...

    def scope(self, guard: bool, lease: float | None) -> AbstractAsyncContextManager[Any]: ...

    def deadlines(self, handle: Any) -> list[float | None]: ...

    def on_lost(self, handle: Any, callback: Callable[[LockLostError], None]) -> None: ...

    async def release(self, handle: Any) -> None: ...


class LockTarget:
    """A lock, fenced lock, spin lock, fair lock, read lock or write lock."""

    rule = "one"
    quorum = 1
    cap = 1
    leases = True

    def __init__(self, kind: str, lock: aiolock.Lock, server: str, mode: str, ctx: Process) -> None:
        self.kind, self.lock, self.mode, self.ctx = kind, lock, mode, ctx
        self.obj = f"{lock.name}@{server}"
        self.res = [[server, lock.name]]
        self.members = [server]
        self.fenced = isinstance(lock, aiolock.FencedLock)

    def try_bound(self, wait: float) -> float:
        return wait + self.ctx.config.command_timeout

    async def try_acquire(self, wait: float, lease: float | None) -> Any:
        if isinstance(self.lock, aiolock.FencedLock):
            return await self.lock.try_lock_and_get_token(wait, lease)
        return await self.lock.try_lock(wait, lease)

    async def acquire(self, lease: float | None) -> Any:
        if isinstance(self.lock, aiolock.FencedLock):
            return await self.lock.lock_and_get_token(lease)
        await self.lock.lock(lease)
        return True

    @contextlib.asynccontextmanager
    async def scope(self, guard: bool, lease: float | None) -> AsyncIterator[Any]:
        if guard:
            async with self.lock.guard(lease):
                yield self._token()
        else:
            async with self.lock:
                yield self._token()

    def _token(self) -> Any:
        if isinstance(self.lock, aiolock.FencedLock):
            # the hold's token: what lock_and_get_token returns (no public reader in a scope)
            try:
                return self.lock._token(None)
            except LockNotOwnedError:
                return None  # lost already: the guard or the exit says so
        return True

    def deadlines(self, handle: Any) -> list[float | None]:
        stats = self.lock.statistics()
        if not stats.held or stats.lease_remaining is None:
            return [None]
        return [asyncio.get_running_loop().time() + stats.lease_remaining + self.ctx.offset]

    def on_lost(self, handle: Any, callback: Callable[[LockLostError], None]) -> None:
        self.lock.on_lost(callback)

    async def release(self, handle: Any) -> None:
        await self.lock.unlock()


class CompositeTarget:
    """A multi-lock or a red lock."""

    mode = "x"
    cap = 1
    leases = True

    def __init__(self, kind: str, lock: aiolock.MultiLock, servers: list[str], ctx: Process):
        self.kind, self.lock, self.ctx = kind, lock, ctx
        self.members = servers
        self.quorum = lock.quorum
        self.rule = "quorum" if isinstance(lock, aiolock.RedLock) else "all"
        if isinstance(lock, aiolock.RedLock):
            self.obj = f"{lock.name}@red"
            self.res = [["red", lock.name]]
        else:
            self.obj = "+".join(f"{m.name}@{s}" for m, s in zip(lock.members, servers, strict=True))
            self.res = [[s, m.name] for m, s in zip(lock.members, servers, strict=True)]

    def try_bound(self, wait: float) -> float:
        # the multi-lock's members are taken one after the other: W + command_timeout "plus
        # the round trips to the other servers"; the red lock's at once: W + command_timeout
        n = 1 if self.rule == "quorum" else len(self.members)
        return wait + n * self.ctx.config.command_timeout

    async def try_acquire(self, wait: float, lease: float | None) -> Any:
        return await self.lock.try_lock(wait, lease)

    async def acquire(self, lease: float | None) -> Any:
        await self.lock.lock(lease)
        return True

    @contextlib.asynccontextmanager
    async def scope(self, guard: bool, lease: float | None) -> AsyncIterator[Any]:
        if guard:
            async with self.lock.guard(lease):
                yield True
        else:
            async with self.lock:
                yield True

    def deadlines(self, handle: Any) -> list[float | None]:
        base = asyncio.get_running_loop().time() + self.ctx.offset
        stats = self.lock.statistics()
        return [
            None
            if not member.held or member.lease_remaining is None
            else base + member.lease_remaining
            for member in stats.members
        ]

    def on_lost(self, handle: Any, callback: Callable[[LockLostError], None]) -> None:
        self.lock.on_lost(callback)

    async def release(self, handle: Any) -> None:
        await self.lock.unlock()


class PermitTarget:
    """A permit-expirable semaphore's permit."""

    mode = "c"
    rule = "one"
    quorum = 1
    leases = True

    def __init__(
        self, pes: aiolock.PermitExpirableSemaphore, server: str, cap: int, ctx: Process
    ) -> None:
        self.kind, self.pes, self.ctx, self.cap = "permit_semaphore", pes, ctx, cap
        self.obj = f"{pes.name}@{server}"
        self.res = [[server, pes.name]]
        self.members = [server]
        self.client = ctx.clients[server]

    def try_bound(self, wait: float) -> float:
        return wait + self.ctx.config.command_timeout

    async def try_acquire(self, wait: float, lease: float | None) -> Any:
        return await self.pes.try_acquire(wait, lease)

    async def acquire(self, lease: float | None) -> Any:
        return await self.pes.acquire(lease)

    def scope(self, guard: bool, lease: float | None) -> AbstractAsyncContextManager[Any]:
        return self.pes.guard(lease) if guard else self.pes.permit(lease)

    def deadlines(self, handle: Any) -> list[float | None]:
        # no public per-permit lease: the client's own record of the permit's hold
        hold = self.client._runtime.leases.holds.get((self.pes.name, handle))
        if hold is None or hold.state is not HoldState.HELD:
            return [None]
        return [hold.deadline + self.ctx.offset]

    def on_lost(self, handle: Any, callback: Callable[[LockLostError], None]) -> None:
        self.pes.on_lost(handle, callback)

    async def release(self, handle: Any) -> None:
        await self.pes.release(handle)


class SemaphoreTarget:
    """A plain semaphore's permit: no lease, no owner on the server."""

    mode = "c"
    rule = "none"
    quorum = 1
    leases = False

    def __init__(self, sem: aiolock.Semaphore, server: str, cap: int, ctx: Process) -> None:
        self.kind, self.sem, self.ctx, self.cap = "semaphore", sem, ctx, cap
        self.obj = f"{sem.name}@{server}"
        self.res = [[server, sem.name]]
        self.members = [server]

    def try_bound(self, wait: float) -> float:
        return wait + self.ctx.config.command_timeout

    async def try_acquire(self, wait: float, lease: float | None) -> Any:
        return await self.sem.try_acquire(1, wait)

    async def acquire(self, lease: float | None) -> Any:
        await self.sem.acquire()
        return True

    @contextlib.asynccontextmanager
    async def scope(self, guard: bool, lease: float | None) -> AsyncIterator[Any]:
        async with self.sem:
            yield True

    def deadlines(self, handle: Any) -> list[float | None]:
        return [math.inf]

    def on_lost(self, handle: Any, callback: Callable[[LockLostError], None]) -> None:
        pass  # plain permits are never lost

    async def release(self, handle: Any) -> None:
        await self.sem.release()


# -- recording calls ------------------------------------------------------------------------


def outcome(exc: BaseException) -> str:
    """How a call that raised ``exc`` is recorded."""
    if isinstance(exc, LockLostError):
        return "lost"
    if isinstance(exc, LockNotOwnedError):
        return "notowned"
    if isinstance(exc, AioLockError):
        return f"err:{type(exc).__name__}"
    return f"bug:{type(exc).__name__}: {exc}"


@dataclass
class Held:
    hid: int
    target: Target
    handle: Any
    lost: bool = False
    last: list[float | None] = field(default_factory=list)


class Actor:
    """One task doing operations of one type, forever (until the process stops)."""

    def __init__(
        self, ctx: Process, kind: str, rng: random.Random, targets: Sequence[Target]
    ) -> None:
        self.ctx, self.kind, self.rng, self.targets = ctx, kind, rng, targets
        self.index = 0  # set by make_actors: the actor's number in its process

    # -- the loop ----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.iteration()
            except Exception as exc:  # recorded; the actor goes on
                self.ctx.rec.write(
                    {
                        "e": "inv",
                        "c": (c := self.ctx.cid()),
                        "op": "actor",
                        "o": self.kind,
                        "t": now(),
                    }
                )
                self.ctx.rec.write({"e": "ret", "c": c, "t": now(), "out": outcome(exc)})
            await asyncio.sleep(self.rng.uniform(0, 0.03))

    async def iteration(self) -> None:
        rng = self.rng
        target = rng.choice(self.targets)
        lease = rng.uniform(0.3, 2.0) if target.leases and rng.random() < 0.2 else None
        style = rng.choices(["try", "lock", "with", "guard", "child"], [60, 12, 12, 10, 6])[0]
        if style == "child" and not isinstance(target, PermitTarget):
            style = "try"
        if style == "guard" and isinstance(target, SemaphoreTarget):
            style = "with"
        if style in ("with", "guard"):
            await self.scoped(target, style == "guard", lease)
            return
        if style == "try":
            wait = rng.choice([0.0, rng.uniform(0, 0.3), rng.uniform(0.3, 1.5)])
            cid, t1, out, handle = await self.call(
                "try_lock",
                target,
                lambda: target.try_acquire(wait, lease),
                bound=target.try_bound(wait),
                cancel_after=self.maybe_cancel(0.12, 0.4),
                w=wait,
                l=lease,
            )
        elif style == "lock":
            cid, t1, out, handle = await self.call(
                "lock",
                target,
                lambda: target.acquire(lease),
                bound=None,
                cancel_after=rng.uniform(0.3, 4.0),  # a hang guard, often a cancellation
                l=lease,
            )
        else:  # a permit taken in a child task, then used and given back by this one
            assert isinstance(target, PermitTarget)
            wait = rng.uniform(0, 0.5)

            async def in_child() -> Any:
                return await asyncio.create_task(target.try_acquire(wait, lease))

            cid, t1, out, handle = await self.call(
                "try_lock_child", target, in_child, bound=target.try_bound(wait), w=wait, l=lease
            )
        if out != "granted":
            return
        held = self.granted(target, cid, t1, handle)
        await self.work(held)
        await self.call(
            "unlock",
            target,
            lambda: target.release(handle),
            bound=self.ctx.config.cleanup_timeout,
            cancel_after=self.maybe_cancel(0.1, 0.15),
            hid=held.hid,
        )

    def maybe_cancel(self, probability: float, within: float) -> float | None:
        return self.rng.uniform(0, within) if self.rng.random() < probability else None

    async def call(
        self,
        op: str,
        target: Target,
        factory: Callable[[], Awaitable[Any]],
        *,
        bound: float | None,
        cancel_after: float | None = None,
        hid: int | None = None,
        **extra: Any,
    ) -> tuple[int, float, str, Any]:
        """Run one call, recorded: its id, return time, outcome and value."""
        rec = self.ctx.rec
        cid = self.ctx.cid()
        t0 = now()
        event: dict[str, Any] = {
            "e": "inv",
            "c": cid,
            "op": op,
            "o": target.obj,
            "k": target.kind,
            "t": t0,
            "b": bound,
            "a": self.index,
        }
        if cancel_after is not None:
            event["x"] = t0 + cancel_after
        if hid is not None:
            event["h"] = hid
        event.update({k: v for k, v in extra.items() if v is not None})
        rec.write(event)
        value: Any = None
        why = None
        timeout: asyncio.Timeout | None = None
        try:
            if cancel_after is None:
                value = await factory()
            else:
                async with asyncio.timeout(cancel_after) as timeout:
                    value = await factory()
        except (Exception, asyncio.CancelledError) as exc:
            if (
                timeout is not None
                and timeout.expired()
                and type(exc) is TimeoutError  # asyncio.timeout's, not a LockTimeout
            ):
                out = "cancelled"
            elif isinstance(exc, asyncio.CancelledError):
                raise
            else:
                out = outcome(exc)
                why = str(exc)[:300]
        else:
            if timeout is not None and timeout.expired():
                out = "bug:CancelledErrorSwallowed"  # cancelled, yet it returned
            elif hid is not None:
                out = "ok"
            else:
                out = "busy" if value is None or value is False else "granted"
        t1 = now()
        ret: dict[str, Any] = {"e": "ret", "c": cid, "t": t1, "out": out}
        if why is not None:
            ret["why"] = why
        rec.write(ret)
        return cid, t1, out, value

    # -- holding -----------------------------------------------------------------------------

    def granted(self, target: Target, cid: int, t: float, handle: Any) -> Held:
        held = Held(self.ctx.hid(), target, handle)
        event: dict[str, Any] = {
            "e": "hold",
            "h": held.hid,
            "c": cid,
            "k": target.kind,
            "o": target.obj,
            "t": t,
            "res": target.res,
            "mode": target.mode,
            "cap": target.cap,
            "members": target.members,
            "rule": target.rule,
            "q": target.quorum,
        }
        if isinstance(handle, int) and not isinstance(handle, bool):
            event["tok"] = handle
        self.ctx.rec.write(event)
        rec = self.ctx.rec

        def lost(error: LockLostError) -> None:
            held.lost = True
            rec.write({"e": "lost", "h": held.hid, "t": now(), "why": str(error)})

        try:
            target.on_lost(handle, lost)
        except Exception as exc:
            rec.write({"e": "onlost", "h": held.hid, "t": now(), "err": outcome(exc)})
        # stamped with the grant's time: the event loop has not run since the grant was
        # learnt, so the client's deadlines are still those it had then (a SIGSTOP landing
        # in between must not make the hold look valid until the process runs again)
        self.sample(held, at=t)
        return held

    def sample(self, held: Held, at: float | None = None) -> None:
        """Record the hold's lease deadlines now (``at``: the time they stand for) if they
        changed."""
        seen = now() if at is None else at
        if not held.target.leases:
            if not held.last:
                held.last = [None]
                self.ctx.rec.write({"e": "lease", "h": held.hid, "t": seen, "d": [None]})
            return
        deadlines = held.target.deadlines(held.handle)
        if deadlines != held.last:
            held.last = deadlines
            self.ctx.rec.write({"e": "lease", "h": held.hid, "t": seen, "d": deadlines})

    async def work(self, held: Held) -> None:
        rng = self.rng
        duration = rng.choices(
            [rng.uniform(0, 0.15), rng.uniform(0.15, 0.6), rng.uniform(0.6, 2.5)], [60, 30, 10]
        )[0]
        end = now() + duration
        while not held.lost and (left := end - now()) > 0:
            self.sample(held)
            await asyncio.sleep(min(rng.uniform(0.005, 0.025), left))
        self.sample(held)

    async def scoped(self, target: Target, guard: bool, lease: float | None) -> None:
        """``async with`` (or a guard): the enter is ``lock()``, under a hang guard."""
        rec, ctx = self.ctx.rec, self.ctx
        cid = ctx.cid()
        t0 = now()
        hang_guard = self.rng.uniform(0.3, 4.0)
        op = "guard" if guard else "with"
        rec.write(
            {
                "e": "inv",
                "c": cid,
                "op": f"{op}_enter",
                "o": target.obj,
                "k": target.kind,
                "t": t0,
                "b": None,
                "x": t0 + hang_guard,
                "a": self.index,
            }
        )
        exit_cid: int | None = None
        entered = False
        timeout: asyncio.Timeout | None = None
        try:
            async with asyncio.timeout(hang_guard) as timeout:
                async with target.scope(guard, lease) as handle:
                    timeout.reschedule(None)
                    entered = True
                    t1 = now()
                    rec.write({"e": "ret", "c": cid, "t": t1, "out": "granted"})
                    held = self.granted(target, cid, t1, handle)
                    try:
                        await self.work(held)
                    finally:
                        exit_cid = ctx.cid()
                        rec.write(
                            {
                                "e": "inv",
                                "c": exit_cid,
                                "op": f"{op}_exit",
                                "o": target.obj,
                                "k": target.kind,
                                "t": now(),
                                "b": ctx.config.cleanup_timeout,
                                "h": held.hid,
                                "a": self.index,
                            }
                        )
        except (Exception, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            why = str(exc)[:300]
            if not entered:
                expired = timeout is not None and timeout.expired() and type(exc) is TimeoutError
                out = "cancelled" if expired else outcome(exc)
                rec.write({"e": "ret", "c": cid, "t": now(), "out": out, "why": why})
            elif exit_cid is not None:
                rec.write({"e": "ret", "c": exit_cid, "t": now(), "out": outcome(exc), "why": why})
            else:
                raise
        else:
            assert exit_cid is not None
            rec.write({"e": "ret", "c": exit_cid, "t": now(), "out": "ok"})


class LatchActor(Actor):
    """Closes the latch, counts it down, waits for it to open."""

    def __init__(self, ctx: Process, rng: random.Random, latch: aiolock.CountDownLatch, obj: str):
        super().__init__(ctx, "latch", rng, [])
        self.latch, self.obj = latch, obj

    async def iteration(self) -> None:
        rng, latch = self.rng, self.latch
        role = rng.choices(["set", "down", "wait"], [20, 45, 35])[0]
        rec, ctx = self.ctx.rec, self.ctx
        cid = ctx.cid()
        t0 = now()
        cancel = self.maybe_cancel(0.08, 0.3)
        bound: float | None = None
        timeout_s = rng.uniform(0, 1.0)
        if role == "wait":
            bound = timeout_s + ctx.config.command_timeout
        event: dict[str, Any] = {
            "e": "inv",
            "c": cid,
            "op": f"latch_{role}",
            "o": self.obj,
            "k": "latch",
            "t": t0,
            "b": bound,
        }
        if cancel is not None:
            event["x"] = t0 + cancel
        rec.write(event)
        timeout: asyncio.Timeout | None = None
        try:
            async with asyncio.timeout(cancel) as timeout:
                if role == "set":
                    out = "set" if await latch.try_set_count(rng.randint(1, 3)) else "not_set"
                elif role == "down":
                    out = f"count:{await latch.count_down()}"
                else:
                    out = "open" if await latch.wait(timeout_s) else "closed"
        except Exception as exc:
            expired = timeout is not None and timeout.expired() and type(exc) is TimeoutError
            out = "cancelled" if expired else outcome(exc)
            event["why"] = str(exc)[:300]
        rec.write({"e": "ret", "c": cid, "t": now(), "out": out, "why": event.get("why")})


# -- the process ----------------------------------------------------------------------------


class BackgroundWatch(set[asyncio.Task[Any]]):
    """A client's set of background tasks (``AioLock._background``) that records when it
    becomes busy and when it is empty again: a latch write whose caller left (cancelled,
    or told its outcome is unknown) is finished by such a task, so it lands before the
    client is next seen idle (see ``check_latch``)."""

    def __init__(self, rec: Recorder, server: str) -> None:
        super().__init__()
        self.rec, self.server = rec, server
        rec.write({"e": "bg", "s": server, "busy": False, "t": now()})

    def add(self, task: asyncio.Task[Any]) -> None:
        if not self:
            self.rec.write({"e": "bg", "s": self.server, "busy": True, "t": now()})
        super().add(task)

    def discard(self, task: object) -> None:
        had = bool(self)
        super().discard(task)
        if had and not self:
            self.rec.write({"e": "bg", "s": self.server, "busy": False, "t": now()})


async def lag_monitor(rec: Recorder, threshold: float = 0.002, tick: float = 0.01) -> None:
    """Record the intervals the event loop ran late (or the process was stopped)."""
    while True:
        due = now() + tick
        await asyncio.sleep(tick)
        late = now() - due
        if late > threshold:
            rec.write({"e": "stall", "t0": due, "t1": due + late})


def make_actors(ctx: Process, seed: int) -> list[Actor]:
    clients = ctx.clients
    c0 = clients["s0"]
    actors: list[Actor] = []
    for kind, count in plan.ACTORS.items():
        for index in range(count):
            rng = random.Random(f"{seed}:{kind}:{index}")
            targets: Sequence[Target]
            if kind == "lock":
                targets = [LockTarget(kind, c0.lock(n), "s0", "x", ctx) for n in plan.LOCKS]
            elif kind == "fenced_lock":
                targets = [LockTarget(kind, c0.fenced_lock(plan.FENCED), "s0", "x", ctx)]
            elif kind == "spin_lock":
                targets = [LockTarget(kind, c0.spin_lock(plan.SPIN), "s0", "x", ctx)]
            elif kind == "fair_lock":
                fair = c0.fair_lock(plan.FAIR, wait_allowance=plan.FAIR_ALLOWANCE)
                targets = [LockTarget(kind, fair, "s0", "x", ctx)]
            elif kind == "read_write_lock":
                rw = c0.read_write_lock(plan.RW)
                targets = [LockTarget("read_lock", rw.read_lock(), "s0", "s", ctx)] * 3 + [
                    LockTarget("write_lock", rw.write_lock(), "s0", "x", ctx)
                ]
            elif kind == "permit_semaphore":
                pes = c0.permit_expirable_semaphore(plan.PERMITS)
                targets = [PermitTarget(pes, "s0", plan.PERMITS_CAP, ctx)]
            elif kind == "semaphore":
                sem = clients["s3"].semaphore(plan.SEMAPHORE)
                targets = [SemaphoreTarget(sem, "s3", plan.SEMAPHORE_CAP, ctx)]
            elif kind == "multi_lock":
                multi = aiolock.multi_lock(*(clients[s].lock(n) for s, n in plan.MULTI))
                # members are sorted by server address: name the servers in that order
                by_name = {n: s for s, n in plan.MULTI}
                servers = [by_name[m.name] for m in multi.members]
                targets = [CompositeTarget(kind, multi, servers, ctx)]
            elif kind == "red_lock":
                red = aiolock.red_lock(*(clients[s] for s in plan.RED_SERVERS), name=plan.RED)
                servers = [_server_of(ctx, m) for m in red.members]
                targets = [CompositeTarget(kind, red, servers, ctx)]
            elif kind == "latch":
                latch = clients["s3"].countdown_latch(plan.LATCH)
                actors.append(LatchActor(ctx, rng, latch, f"{plan.LATCH}@s3"))
                continue
            else:
                raise ValueError(f"unknown actor type {kind!r}")
            actors.append(Actor(ctx, kind, rng, targets))
    if "sn" in clients:
        for index in range(plan.SENTINEL_ACTORS):
            rng = random.Random(f"{seed}:sentinel:{index}")
            sn = clients["sn"]
            targets = [LockTarget("lock", sn.lock(n), "sn", "x", ctx) for n in plan.SENTINEL_LOCKS]
            actors.append(Actor(ctx, "sentinel_lock", rng, targets))
    for index, actor in enumerate(actors):
        actor.index = index
    return actors


def _server_of(ctx: Process, lock: Any) -> str:
    for server, client in ctx.clients.items():
        if lock.runtime is client.unchecked_runtime:
            return server
    raise LookupError(lock)


async def main(settings: dict[str, Any]) -> None:
    rec = Recorder(Path(settings["history"]))
    loop = asyncio.get_running_loop()
    rec.write(
        {
            "e": "start",
            "pid": os.getpid(),
            "worker": settings["worker"],
            "gen": settings["gen"],
            "t": now(),
        }
    )
    config = aiolock.Config(**plan.CLIENT)  # type: ignore[arg-type]  # float fields only
    clients = {
        server: aiolock.from_url(url, metrics=False, **plan.CLIENT)  # type: ignore[arg-type]
        for server, url in settings["urls"].items()
    }
    # the latch's client: when its writes left to the background are done (see BackgroundWatch)
    clients["s3"]._background = BackgroundWatch(rec, "s3")
    ctx = Process(rec, clients, config, offset=now() - loop.time())
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    lag = asyncio.create_task(lag_monitor(rec))
    actors = make_actors(ctx, settings["seed"])
    rec.write({"e": "ready", "t": now()})
    tasks = [
        asyncio.create_task(actor.run(stop), name=f"actor-{i}") for i, actor in enumerate(actors)
    ]
    await asyncio.wait(tasks)
    for task in tasks:
        task.result()  # an actor that died is a bug of this harness: fail loudly
    # every operation has returned: give background work (a cancelled release finishing) its
    # cleanup_timeout to end, then nothing may be left but idle connections
    settle_until = now() + config.cleanup_timeout + 1.0
    while now() < settle_until and any(_busy(c) for c in clients.values()):  # noqa: ASYNC110
        await asyncio.sleep(0.05)  # polling the clients' statistics: nothing to wait on
    for server, client in clients.items():
        rec.write(
            {"e": "stats", "phase": "idle", "server": server, "stats": asdict(client.statistics())}
        )
    for server, client in clients.items():
        cid = ctx.cid()
        rec.write(
            {
                "e": "inv",
                "c": cid,
                "op": "aclose",
                "o": server,
                "k": "client",
                "t": now(),
                "b": config.cleanup_timeout,
            }
        )
        try:
            await client.aclose()
            out = "ok"
        except Exception as exc:
            out = outcome(exc)
        rec.write({"e": "ret", "c": cid, "t": now(), "out": out})
        rec.write(
            {
                "e": "stats",
                "phase": "closed",
                "server": server,
                "stats": asdict(client.statistics()),
            }
        )
    lag.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await lag
    left_until = now() + config.cleanup_timeout
    while now() < left_until and _other_tasks():  # noqa: ASYNC110 (tasks of the library)
        await asyncio.sleep(0.02)
    others = _other_tasks()
    rec.write({"e": "tasks", "n": len(others), "names": sorted(repr(t.get_coro()) for t in others)})
    rec.write({"e": "end", "t": now()})
    rec.close()


def _busy(client: AioLock) -> bool:
    stats = client.statistics()
    return bool(
        stats.background_tasks
        or stats.commands_in_flight
        or stats.renewals
        or stats.subscriptions
        or stats.tasks_waiting
    )


def _other_tasks() -> set[asyncio.Task[Any]]:
    current = asyncio.current_task()
    return {task for task in asyncio.all_tasks() if task is not current}


if __name__ == "__main__":
    asyncio.run(main(json.loads(Path(sys.argv[1]).read_text())))
