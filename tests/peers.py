"""Driving lock users in other processes: tests/aiolock_peer.py (aiolock) and
tests/redisson_peer.py (Redisson's scripts and waiting loop) speak one line protocol."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from asyncio.subprocess import PIPE
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
AIOLOCK_PEER = HERE / "aiolock_peer.py"
REDISSON_PEER = HERE / "redisson_peer.py"


@dataclass(frozen=True)
class Event:
    peer: PeerProcess
    tid: str
    what: str
    rest: list[str]


class PeerProcess:
    """One peer process. ``send(tid, ...)`` runs a command on its thread ``tid``; events
    arrive on ``events`` (shared by every peer given the same queue)."""

    def __init__(
        self, proc: asyncio.subprocess.Process, kind: str, events: asyncio.Queue[Event]
    ) -> None:
        self.proc = proc
        self.kind = kind
        self.events = events
        self.id = ""
        self.owners: dict[str, str] = {}
        self._owner_reported: dict[str, asyncio.Event] = {}
        self._reader: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._stderr = b""

    @classmethod
    async def start(
        cls, kind: str, url: str, events: asyncio.Queue[Event], *args: str
    ) -> PeerProcess:
        script = AIOLOCK_PEER if kind == "aiolock" else REDISSON_PEER
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(script), url, *args, stdin=PIPE, stdout=PIPE, stderr=PIPE
        )
        peer = cls(proc, kind, events)
        peer._reader = asyncio.create_task(peer._read())
        async with asyncio.timeout(30):
            peer.id = await peer._ready
        return peer

    def __repr__(self) -> str:
        return f"<{self.kind} peer {self.proc.pid}>"

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            words = line.decode().split()
            if not words:
                continue
            if words[0] == "ready":
                self._ready.set_result(words[1])
            elif words[1] == "owner":
                self.owners[words[0]] = words[2]
                self._owner_reported.setdefault(words[0], asyncio.Event()).set()
            else:
                self.events.put_nowait(Event(self, words[0], words[1], words[2:]))
        if not self._ready.done():
            assert self.proc.stderr is not None
            err = await self.proc.stderr.read()
            self._ready.set_exception(RuntimeError(f"peer died: {err.decode()[-2000:]}"))

    def owner(self, tid: str) -> str:
        """The owner id (Redis hash field) of thread ``tid``."""
        if self.kind == "redisson":
            return f"{self.id}:{tid}"
        return self.owners[tid]

    async def send(self, tid: str, *words: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((" ".join(map(str, (tid, *words))) + "\n").encode())
        await self.proc.stdin.drain()

    async def wait_owner(self, tid: str) -> str:
        """The owner id of ``tid`` once its thread has started (aiolock peers report it)."""
        if self.kind == "aiolock":
            async with asyncio.timeout(10):
                await self._owner_reported.setdefault(tid, asyncio.Event()).wait()
        return self.owner(tid)

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    async def close(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError, AssertionError):
                assert self.proc.stdin is not None
                self.proc.stdin.write(b"quit\n")
                await self.proc.stdin.drain()
                self.proc.stdin.close()
            try:
                async with asyncio.timeout(10):
                    await self.proc.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGCONT)
                    self.proc.kill()
                await self.proc.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


class Peers:
    """Peer processes of one test, reporting to one queue of events."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.started: list[PeerProcess] = []

    async def start(self, kind: str, *args: object, url: str | None = None) -> PeerProcess:
        """A peer ("aiolock" or "redisson") on ``url`` (the test's server by default)."""
        peer = await PeerProcess.start(kind, url or self.url, self.events, *(str(a) for a in args))
        self.started.append(peer)
        return peer

    async def next(self, within: float = 10) -> Event:
        """The next event of any peer."""
        async with asyncio.timeout(within):
            return await self.events.get()

    async def expect(self, peer: PeerProcess, tid: str, what: str, within: float = 10) -> Event:
        """The next event, which must be ``what`` from ``peer``'s ``tid``."""
        event = await self.next(within)
        assert (event.peer, event.tid, event.what) == (peer, tid, what), event
        return event

    async def aclose(self) -> None:
        await asyncio.gather(*(peer.close() for peer in self.started))
