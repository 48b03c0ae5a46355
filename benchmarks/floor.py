"""The physical floor: the least any client can do to run aiolock's lock protocol.

Nothing here uses aiolock's code, only the text of its Lua scripts (read by path from
``aiolock/scripts/*.lua``, without importing the package) and, for ``python -m
benchmarks.floor``, ``aiolock.testing.RedisServer`` to start a server. So the floors keep
working, and keep meaning the same thing, while aiolock's core is rewritten.

The floor design, shared by every floor below:

* :class:`CommandConnection`: one TCP connection, an ``asyncio.Protocol`` with a
  ``hiredis.Reader``. ``call()`` packs the command with ``hiredis.pack_command`` (encoded before
  anything is queued), writes it and returns a future; ``data_received`` resolves the futures
  in FIFO order. No Task, shield, timeout or timer per command: callers just await the future.
* :class:`PubSubConnection`: the same for a subscribed connection; messages go to a callback
  straight from ``data_received``.
* :class:`FloorLock`: the lock protocol on top: the acquire script (``lock_acquire.lua``) by
  EVALSHA, the release script (``lock_release.lua``, which PUBLISHes ``0`` on
  ``redisson_lock__channel:{name}`` on the last release), and waiting = a future per waiter in
  a deque, in a dict keyed by channel; an unlock message wakes the first waiter of its channel,
  which runs the acquire script again.

What the floors leave out, on purpose (a library needs them, their cost is what aiolock may
spend above the floor): bounding each wait by the holder's TTL (a timer), cancellation safety
(an acquire cancelled in flight may leave a hold), reconnects, lost-reply resolution,
NOSCRIPT fallback (the scripts are SCRIPT LOADed once at connect), renewal.

The floors:

1. uncontended: :class:`UncontendedFloor` - N tasks on distinct names pipelining acquire +
   release over ONE connection (``uncontended.py`` runs its ``cycle`` like aiolock's).
2. hand-off: :func:`handoff_variant` - a holder in this process, a waiter in a worker process
   (``benchmarks._worker``, role ``floor-handoff``), the same rounds as ``handoff.py``; mode
   ``asyncio`` (:class:`AsyncSide`: FloorLock, a subscribed pub/sub connection and a command
   connection per process) or ``sync`` (:class:`SyncSide`: blocking sockets, the absolute
   floor).
3. memory per parked waiter: :func:`parked_waiter_memory` - N waiter tasks parked on held
   names, tracemalloc from before they are spawned to when all are parked, as ``scale.py``
   measures aiolock's.

``python -m benchmarks.floor [--quick] [--redis URL] [--loop asyncio|uvloop]`` prints the three
floors alone (a private redis-server unless ``--redis``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import importlib.util
import json
import os
import random
import socket
import time
import tracemalloc
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, cast
from urllib.parse import unquote, urlsplit

import hiredis

from .runner import LoopName, ParentLink, WorkerProc, loop_label, run_on, summarize_ms

# --------------------------------------------------------------------------------------------
# The lock protocol: scripts, names, encoding
# --------------------------------------------------------------------------------------------


def scripts_dir() -> Path:
    """``aiolock/scripts`` of the installed aiolock, found without importing the package."""
    spec = importlib.util.find_spec("aiolock")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("aiolock is not installed: its Lua scripts are the floors' protocol")
    return Path(next(iter(spec.submodule_search_locations))) / "scripts"


@dataclass(frozen=True, slots=True)
class LuaScript:
    name: str
    source: bytes
    sha: bytes  # hex digest, as EVALSHA takes it


def lua_script(name: str) -> LuaScript:
    source = (scripts_dir() / f"{name}.lua").read_bytes()
    return LuaScript(name, source, hashlib.sha1(source).hexdigest().encode())


ACQUIRE = lua_script("lock_acquire")
RELEASE = lua_script("lock_release")
CHANNEL_PREFIX = "redisson_lock__channel"
UNLOCK_MESSAGE = b"0"
LEASE_MS = 10_000


def channel_of(name: str) -> str:
    """Redisson's layout: ``prefix:{name}``, or ``prefix:name`` if the name has a hash tag."""
    if "{" in name:
        return f"{CHANNEL_PREFIX}:{name}"
    return f"{CHANNEL_PREFIX}:{{{name}}}"


#: ``hiredis.pack_command``, typed for any number of arguments (its stub says a 1-tuple)
pack: Callable[[tuple[Any, ...]], bytes] = hiredis.pack_command


class FloorError(Exception):
    """An error reply, or the connection was lost."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where to connect, from a ``redis://[[user]:password@]host[:port][/db]`` URL."""

    host: str
    port: int
    db: int = 0
    username: str | None = None
    password: str | None = None

    @classmethod
    def from_url(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme != "redis":
            raise ValueError(f"the floors speak plain TCP (redis://), not {parts.scheme}://")
        return cls(
            parts.hostname or "127.0.0.1",
            parts.port or 6379,
            int(parts.path.lstrip("/") or 0),
            unquote(parts.username) if parts.username else None,
            unquote(parts.password) if parts.password is not None else None,
        )

    def handshake(self) -> list[tuple[str | int, ...]]:
        """AUTH and SELECT, as needed, for a new connection."""
        commands: list[tuple[str | int, ...]] = []
        if self.password is not None:
            if self.username:
                commands.append(("AUTH", self.username, self.password))
            else:
                commands.append(("AUTH", self.password))
        if self.db:
            commands.append(("SELECT", self.db))
        return commands


# --------------------------------------------------------------------------------------------
# asyncio connections
# --------------------------------------------------------------------------------------------


class CommandConnection(asyncio.Protocol):
    """Pipelined commands on one connection; replies resolve futures FIFO in data_received."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._reader = hiredis.Reader()
        self._pending: deque[asyncio.Future[Any]] = deque()
        self._transport: asyncio.Transport | None = None
        self._lost: FloorError | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        pending = self._pending
        reply = reader.gets()
        while reply is not False:
            fut = pending.popleft()
            if not fut.done():  # a caller that was cancelled no longer wants it
                if type(reply) is hiredis.ReplyError:
                    fut.set_exception(FloorError(str(reply)))
                else:
                    fut.set_result(reply)
            reply = reader.gets()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = FloorError(f"connection lost ({exc!r})")
        while self._pending:
            fut = self._pending.popleft()
            if not fut.done():
                fut.set_exception(self._lost)

    def call(self, *args: Any) -> asyncio.Future[Any]:
        """Send one command; the future gets its reply (an error reply: FloorError)."""
        data = pack(args)  # encode first: a bad argument fails alone, nothing is queued
        if self._lost is not None or self._transport is None:
            raise self._lost or FloorError("not connected")
        fut = self._loop.create_future()
        self._transport.write(data)
        self._pending.append(fut)
        return fut

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class PubSubConnection(CommandConnection):
    """A subscribed connection: ``message`` pushes go to ``on_message(channel, data)`` from
    data_received; every other reply (AUTH, SELECT, a SUBSCRIBE confirmation, an error) resolves
    the next pending future, so send one channel per SUBSCRIBE."""

    def __init__(self, on_message: Callable[[bytes, bytes], None]) -> None:
        super().__init__()
        self._on_message = on_message

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        reply = reader.gets()
        while reply is not False:
            if type(reply) is list and reply[0] == b"message":
                self._on_message(reply[1], reply[2])
            else:
                fut = self._pending.popleft()
                if not fut.done():
                    if type(reply) is hiredis.ReplyError:
                        fut.set_exception(FloorError(str(reply)))
                    else:
                        fut.set_result(reply)
            reply = reader.gets()


async def _connect(endpoint: Endpoint, factory: Callable[[], CommandConnection]) -> Any:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(factory, endpoint.host, endpoint.port)
    for command in endpoint.handshake():
        await conn.call(*command)
    return conn


# --------------------------------------------------------------------------------------------
# The floor lock client
# --------------------------------------------------------------------------------------------


class _Channel:
    """The parked waiters of one channel, and its SUBSCRIBE confirmation."""

    __slots__ = ("subscribed", "waiters")

    def __init__(self, subscribed: asyncio.Future[Any]) -> None:
        self.subscribed = subscribed
        self.waiters: deque[asyncio.Future[None]] = deque()


def _wake_one(waiters: deque[asyncio.Future[None]]) -> None:
    while waiters:
        fut = waiters.popleft()
        if not fut.done():
            fut.set_result(None)
            return


class FloorLock:
    """The lock protocol with nothing around it: one command connection, and (after
    :meth:`open_pubsub`) one pub/sub connection for every channel. Keys, channels and owner ids
    are passed in already encoded (a library would cache them per lock / per task)."""

    def __init__(self, endpoint: Endpoint, commands: CommandConnection, lease_ms: int) -> None:
        self.endpoint = endpoint
        self.call = commands.call
        self._commands = commands
        self._lease = str(lease_ms).encode()
        self._pubsub: PubSubConnection | None = None
        self.channels: dict[bytes, _Channel] = {}
        self.parked = 0  # waiters awaiting their future now
        self.last_message_ns = 0  # CLOCK_MONOTONIC of the last unlock message

    @classmethod
    async def open(cls, url: str, lease_ms: int = LEASE_MS) -> FloorLock:
        endpoint = Endpoint.from_url(url)
        commands: CommandConnection = await _connect(endpoint, CommandConnection)
        for script in (ACQUIRE, RELEASE):  # EVALSHA below never meets NOSCRIPT
            sha = await commands.call(b"SCRIPT", b"LOAD", script.source)
            if sha != script.sha:
                raise FloorError(f"SCRIPT LOAD {script.name}: sha {sha!r} != {script.sha!r}")
        return cls(endpoint, commands, lease_ms)

    async def open_pubsub(self) -> None:
        if self._pubsub is None:
            self._pubsub = await _connect(self.endpoint, lambda: PubSubConnection(self._message))

    def _message(self, channel: bytes, data: bytes) -> None:
        self.last_message_ns = time.monotonic_ns()
        entry = self.channels.get(channel)
        if entry is not None:
            _wake_one(entry.waiters)

    async def try_lock(self, key: bytes, owner: bytes) -> bool:
        return await self.call(b"EVALSHA", ACQUIRE.sha, b"1", key, self._lease, owner) is None

    async def unlock(self, key: bytes, channel: bytes, owner: bytes) -> bool:
        """True if ``owner`` held it (the last release deletes the key and publishes)."""
        reply = await self.call(
            b"EVALSHA",
            RELEASE.sha,
            b"2",
            key,
            channel,
            UNLOCK_MESSAGE,
            self._lease,
            owner,
            b"1",
            b"PUBLISH",
        )
        return reply is not None

    async def subscribe(self, channel: bytes) -> _Channel:
        """The channel's entry, subscribed (SUBSCRIBE sent by the first caller, kept for good)."""
        entry = self.channels.get(channel)
        if entry is None:
            assert self._pubsub is not None, "open_pubsub() first"
            entry = _Channel(self._pubsub.call(b"SUBSCRIBE", channel))
            self.channels[channel] = entry
        if not entry.subscribed.done():
            await asyncio.shield(entry.subscribed)  # shared: one waiter's cancel is not all's
        return entry

    async def lock(self, key: bytes, channel: bytes, owner: bytes) -> None:
        """Acquire, waiting for unlock messages on ``channel`` (subscribed on first use, kept)."""
        entry = self.channels.get(channel)
        if entry is None or not entry.subscribed.done():
            entry = await self.subscribe(channel)
        waiters = entry.waiters
        call = self.call
        lease = self._lease
        while True:
            # parked before the script runs: a message arriving meanwhile is not lost
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            waiters.append(fut)
            try:
                if await call(b"EVALSHA", ACQUIRE.sha, b"1", key, lease, owner) is None:
                    if fut.done():
                        _wake_one(waiters)  # it took a wake-up meanwhile: pass it on
                    else:
                        waiters.remove(fut)
                    return
                self.parked += 1
                try:
                    await fut
                finally:
                    self.parked -= 1
            finally:
                fut.cancel()  # no-op once resolved; drops it from later wake-ups otherwise

    def close(self) -> None:
        self._commands.close()
        if self._pubsub is not None:
            self._pubsub.close()


# --------------------------------------------------------------------------------------------
# 1. uncontended
# --------------------------------------------------------------------------------------------


class UncontendedFloor:
    """``cycle(name)``: acquire + release on one pipelined connection; owner = one per name
    (one task per name, as aiolock's per-task owner ids), encodings cached per name."""

    def __init__(self, client: FloorLock) -> None:
        self.client = client
        self._prefix = f"{uuid.uuid4()}:"
        self._names: dict[str, tuple[bytes, bytes, bytes]] = {}
        self._lease = str(LEASE_MS).encode()

    @classmethod
    async def open(cls, url: str) -> UncontendedFloor:
        return cls(await FloorLock.open(url))

    async def cycle(self, name: str) -> bool:
        enc = self._names.get(name)
        if enc is None:
            enc = (name.encode(), channel_of(name).encode(), (self._prefix + name).encode())
            self._names[name] = enc
        key, channel, owner = enc
        call = self.client.call
        if await call(b"EVALSHA", ACQUIRE.sha, b"1", key, self._lease, owner) is not None:
            return False
        await call(
            b"EVALSHA",
            RELEASE.sha,
            b"2",
            key,
            channel,
            UNLOCK_MESSAGE,
            self._lease,
            owner,
            b"1",
            b"PUBLISH",
        )
        return True

    def close(self) -> None:
        self.client.close()


async def measure_uncontended(
    url: str, tasks: int = 50, seconds: float = 2.0, warmup: float = 0.5
) -> dict[str, Any]:
    """Standalone: cycles/s and client CPU (time.process_time) per cycle of the floor."""
    floor = await UncontendedFloor.open(url)
    counts = [0] * tasks
    stop = False

    async def worker(i: int) -> None:
        name = f"bench:floor:unc:{i}"
        while not stop:
            if await floor.cycle(name):
                counts[i] += 1

    workers = [asyncio.ensure_future(worker(i)) for i in range(tasks)]
    try:
        await asyncio.sleep(warmup)
        c0, t0, cpu0 = sum(counts), time.perf_counter(), time.process_time()
        await asyncio.sleep(seconds)
        c1, t1, cpu1 = sum(counts), time.perf_counter(), time.process_time()
    finally:
        stop = True
        await asyncio.gather(*workers)
        floor.close()
    cycles = c1 - c0
    return {
        "cycles": cycles,
        "cycles_per_s": cycles / (t1 - t0),
        "client_cpu_us_per_cycle": 1e6 * (cpu1 - cpu0) / cycles if cycles else None,
    }


# --------------------------------------------------------------------------------------------
# 2. hand-off
# --------------------------------------------------------------------------------------------

HandoffMode = Literal["asyncio", "sync"]
HANDOFF_GAP_S = (0.005, 0.015)


class HandoffSide(Protocol):
    """One process's end of a hand-off: one lock, one owner."""

    last_message_ns: int

    async def acquire(self) -> None: ...
    async def release(self) -> None: ...
    async def aclose(self) -> None: ...


def _owner() -> bytes:
    return f"{uuid.uuid4()}:1".encode()


class AsyncSide:
    """The asyncio floor: a FloorLock, its pub/sub connection subscribed for good at connect."""

    def __init__(self, client: FloorLock, name: str) -> None:
        self.client = client
        self.key = name.encode()
        self.channel = channel_of(name).encode()
        self.owner = _owner()

    @classmethod
    async def open(cls, url: str, name: str) -> AsyncSide:
        side = cls(await FloorLock.open(url), name)
        await side.client.open_pubsub()
        await side.client.subscribe(side.channel)
        return side

    @property
    def last_message_ns(self) -> int:
        return self.client.last_message_ns

    @last_message_ns.setter
    def last_message_ns(self, value: int) -> None:
        self.client.last_message_ns = value

    async def acquire(self) -> None:
        await self.client.lock(self.key, self.channel, self.owner)

    async def release(self) -> None:
        if not await self.client.unlock(self.key, self.channel, self.owner):
            raise FloorError("release: not held")

    async def aclose(self) -> None:
        self.client.close()


class _BlockingConnection:
    """A blocking socket with a hiredis reader."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.sock = socket.create_connection((endpoint.host, endpoint.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()
        for command in endpoint.handshake():
            self.call(*command)

    def read(self) -> Any:
        reader = self.reader
        reply = reader.gets()
        while reply is False:
            data = self.sock.recv(65536)
            if not data:
                raise FloorError("connection closed")
            reader.feed(data)
            reply = reader.gets()
        if type(reply) is hiredis.ReplyError:
            raise FloorError(str(reply))
        return reply

    def call(self, *args: Any) -> Any:
        self.sock.sendall(pack(args))
        return self.read()

    def drain(self) -> None:
        """Drop whatever has arrived (stale pub/sub messages) without blocking."""
        try:
            while data := self.sock.recv(65536, socket.MSG_DONTWAIT):
                self.reader.feed(data)
        except BlockingIOError:
            pass
        while self.reader.gets() is not False:
            pass

    def close(self) -> None:
        self.sock.close()


class SyncSide:
    """The absolute floor: blocking sockets, a command connection and a subscribed one.
    ``acquire`` blocks the thread (and its event loop) until the lock is taken."""

    def __init__(self, url: str, name: str) -> None:
        endpoint = Endpoint.from_url(url)
        self.key = name.encode()
        self.channel = channel_of(name).encode()
        self.owner = _owner()
        self.lease = str(LEASE_MS).encode()
        self.last_message_ns = 0
        self.cmd = _BlockingConnection(endpoint)
        for script in (ACQUIRE, RELEASE):
            self.cmd.call(b"SCRIPT", b"LOAD", script.source)
        self.sub = _BlockingConnection(endpoint)
        self.sub.call(b"SUBSCRIBE", self.channel)

    def acquire_blocking(self) -> None:
        # messages that arrived before this acquire (our own last release's) are stale: the
        # script below sees the state after them
        self.sub.drain()
        while True:
            reply = self.cmd.call(b"EVALSHA", ACQUIRE.sha, b"1", self.key, self.lease, self.owner)
            if reply is None:
                return
            while True:
                reply = self.sub.read()
                if type(reply) is list and reply[0] == b"message":
                    break
            self.last_message_ns = time.monotonic_ns()

    def release_blocking(self) -> None:
        reply = self.cmd.call(
            b"EVALSHA", RELEASE.sha, b"2", self.key, self.channel, UNLOCK_MESSAGE, self.lease,
            self.owner, b"1", b"PUBLISH",
        )  # fmt: skip
        if reply is None:
            raise FloorError("release: not held")

    async def acquire(self) -> None:
        self.acquire_blocking()

    async def release(self) -> None:
        self.release_blocking()

    async def aclose(self) -> None:
        self.cmd.close()
        self.sub.close()


async def open_side(mode: HandoffMode, url: str, name: str) -> HandoffSide:
    if mode == "sync":
        return SyncSide(url, name)
    return await AsyncSide.open(url, name)


async def handoff_worker(params: dict[str, Any], link: ParentLink) -> dict[str, Any]:
    """The waiter process (``benchmarks._worker`` role ``floor-handoff``): acquire when told
    (WAIT), report [t_call, t_acquired, t_message], release."""
    side = await open_side(params["mode"], params["url"], params["name"])
    try:
        link.send("READY", {"loop": loop_label()})
        while (cmd := await link.recv()) == "WAIT":
            t_call = time.monotonic_ns()
            side.last_message_ns = 0
            await side.acquire()
            t_acquired = time.monotonic_ns()
            t_message = side.last_message_ns  # before our own release's message overwrites it
            await side.release()
            link.send("ACQ", [t_call, t_acquired, t_message])
        return {"last": cmd}
    finally:
        await side.aclose()


async def handoff_variant(
    url: str,
    mode: HandoffMode,
    loop: LoopName,
    rounds: int,
    gap_s: tuple[float, float] = HANDOFF_GAP_S,
    seed: int = 1234,
) -> dict[str, Any]:
    """Release here -> acquired in a worker process, as ``handoff.py`` measures aiolock:
    this process holds for U(gap) after telling the worker to acquire, stamps
    ``time.monotonic_ns()`` and releases; the worker stamps when its acquire returns (and when
    the unlock message reached it). Rounds where the worker was not yet waiting are left out."""
    name = f"bench:handoff:floor-{mode}"
    lo, hi = gap_s
    rng = random.Random(seed)
    a = await open_side(mode, url, name)
    b = await WorkerProc.start(
        {"role": "floor-handoff", "loop": loop, "url": url, "name": name, "mode": mode}
    )
    handoffs: list[int] = []
    to_message: list[int] = []
    message_to_acquired: list[int] = []
    late = 0
    try:
        b_loop = await b.expect("READY", 30)
        for _ in range(rounds):
            await a.acquire()
            await b.send("WAIT")
            await asyncio.sleep(rng.uniform(lo, hi))
            t_release = time.monotonic_ns()
            await a.release()
            t_call, t_acquired, t_message = json.loads(await b.expect("ACQ", 30))
            if t_call >= t_release:
                late += 1  # the worker was not waiting yet: not a hand-off
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
        "variant": f"floor {mode}",
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


# --------------------------------------------------------------------------------------------
# 3. memory per parked waiter
# --------------------------------------------------------------------------------------------


async def _until(pred: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached in {within:g} s")
        await asyncio.sleep(0.02)


async def parked_waiter_memory(url: str, names: Sequence[str], per_name: int) -> dict[str, Any]:
    """``len(names) * per_name`` floor waiters (a task each, running :meth:`FloorLock.lock`)
    parked on names another client holds: Python heap by tracemalloc from before they are
    spawned to when all are parked, / N. Names' keys and channels are encoded before (cached
    per name), each waiter's owner id inside the window; the subscriptions (one per name) are
    sent inside it too, the connections opened before it. All are cancelled afterwards."""
    holder = await FloorLock.open(url, lease_ms=60_000)
    client = await FloorLock.open(url, lease_ms=60_000)
    encoded = [(n.encode(), channel_of(n).encode()) for n in names]
    hold_owner = _owner()
    n = len(names) * per_name
    out: dict[str, Any] = {"waiters": n, "names": len(names)}
    tasks: list[asyncio.Future[None]] = []
    try:
        await client.open_pubsub()
        held = await asyncio.gather(*(holder.try_lock(key, hold_owner) for key, _ in encoded))
        if not all(held):
            raise FloorError("memory floor: some names were already held")
        prefix = f"{uuid.uuid4()}:"

        async def waiter(key: bytes, channel: bytes, i: int) -> None:
            await client.lock(key, channel, f"{prefix}{i}".encode())

        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            t0 = time.monotonic()
            tasks = [
                asyncio.ensure_future(waiter(key, channel, i * per_name + j))
                for i, (key, channel) in enumerate(encoded)
                for j in range(per_name)
            ]
            await _until(lambda: client.parked == n, 120, "floor waiters parked")
            out["setup_s"] = time.monotonic() - t0
            gc.collect()
            traced = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        out["bytes_per_waiter"] = traced / n
        out["channels"] = len(client.channels)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(
            *(holder.unlock(key, channel, hold_owner) for key, channel in encoded),
            return_exceptions=True,
        )
        holder.close()
        client.close()
    return out


# --------------------------------------------------------------------------------------------
# python -m benchmarks.floor
# --------------------------------------------------------------------------------------------


async def _standalone(url: str, loop: LoopName, quick: bool) -> dict[str, Any]:
    n_waiters, n_names = (2_000, 200) if quick else (10_000, 1_000)
    rounds = 50 if quick else 200
    return {
        "uncontended": await measure_uncontended(url, seconds=1.0 if quick else 3.0),
        "handoff asyncio": await handoff_variant(url, "asyncio", loop, rounds),
        "handoff sync": await handoff_variant(url, "sync", loop, rounds),
        "memory": await parked_waiter_memory(
            url, [f"bench:floor:mem:{i}" for i in range(n_names)], n_waiters // n_names
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.floor", description=__doc__)
    parser.add_argument("--redis", metavar="URL", help="use this server instead of starting one")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args(argv)
    server: Any = None
    if args.redis:
        url = args.redis
    else:
        from aiolock.testing import RedisServer

        server = RedisServer()
        server.start()
        url = server.url
    try:
        load = "/".join(f"{x:.2f}" for x in os.getloadavg())
        data = run_on(args.loop, _standalone(url, args.loop, args.quick))
        unc, mem = data["uncontended"], data["memory"]
        print(f"floors on {args.loop}, {os.cpu_count()} CPUs, load average {load}")
        print(
            f"uncontended: {unc['cycles_per_s']:,.0f} cycles/s, "
            f"{unc['client_cpu_us_per_cycle']:.1f} us client CPU per cycle"
        )
        for mode in ("asyncio", "sync"):
            h = data[f"handoff {mode}"]["handoff_ms"]
            print(f"hand-off {mode}: p50 {h['p50']:.3f} ms, p99 {h['p99']:.3f} ms (n={h['n']})")
        print(
            f"memory: {mem['bytes_per_waiter']:.0f} bytes per parked waiter "
            f"({mem['waiters']} waiters on {mem['names']} names)"
        )
        print(f"load average at end {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
        return 0
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
