"""The demo's worker processes, seen from the runner: started once, reused for each strategy.

Each worker is ``python -m aiolock.demo.worker`` with pipes on stdin and stdout (see
:mod:`aiolock.demo.messages`); stderr is shared with the runner so tracebacks show.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from .errors import DemoError
from .messages import Job, WorkerResult

LINE_LIMIT = 1 << 24
"""Longest event line read from a worker (a ``done`` event carries every latency)."""

STOP_TIMEOUT = 5.0
"""Seconds the workers get to exit after their stdin closes before they are killed."""


class WorkerPool:
    """``size`` worker processes; ``async with`` starts them and always stops them."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._procs: list[asyncio.subprocess.Process] = []

    async def __aenter__(self) -> WorkerPool:
        try:
            for _ in range(self.size):
                self._procs.append(
                    await asyncio.create_subprocess_exec(
                        sys.executable,
                        "-m",
                        "aiolock.demo.worker",
                        stdin=asyncio.subprocess.PIPE,
                        stdout=asyncio.subprocess.PIPE,
                        limit=LINE_LIMIT,
                        start_new_session=True,  # Ctrl-C is for the runner, which kills them
                    )
                )
            # Wait until all have imported everything, so that they start buying together.
            for proc in self._procs:
                event = await _next_event(proc)
                if event["event"] != "ready":
                    raise DemoError(f"worker {proc.pid} said {event!r} instead of ready")
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def run(
        self, jobs: Sequence[Job], on_progress: Callable[[int], None]
    ) -> list[WorkerResult]:
        """Give job i to worker i, all at once; ``on_progress(attempts done so far)``.

        If this does not return normally, every worker has been killed.
        """
        if len(jobs) != len(self._procs):
            raise ValueError(f"{len(jobs)} jobs for {len(self._procs)} workers")
        done = [0] * len(jobs)

        async def follow(index: int, proc: asyncio.subprocess.Process) -> WorkerResult:
            while True:
                event = await _next_event(proc)
                if event["event"] == "progress":
                    done[index] = int(event["done"])
                elif event["event"] == "done":
                    result = WorkerResult.from_event(event)
                    done[index] = len(result.latencies_ms)
                    on_progress(sum(done))
                    return result
                else:
                    raise DemoError(f"worker {proc.pid} failed:\n{event.get('message', event)}")
                on_progress(sum(done))

        try:
            for job, proc in zip(jobs, self._procs, strict=True):
                assert proc.stdin is not None
                proc.stdin.write(job.to_line())
                await proc.stdin.drain()
            return list(await asyncio.gather(*(follow(i, p) for i, p in enumerate(self._procs))))
        except BaseException:
            # Failed or cancelled (Ctrl-C) halfway: the others must not go on writing to Redis
            # behind the runner's back, e.g. after it deleted the sale's keys.
            await self._kill()
            raise

    async def _kill(self) -> None:
        for proc in self._procs:
            if proc.returncode is None:
                proc.kill()
        for proc in self._procs:
            await proc.wait()

    async def aclose(self) -> None:
        """Close the workers' stdin (they exit when it ends); kill those that linger."""
        for proc in self._procs:
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            async with asyncio.timeout(STOP_TIMEOUT):
                for proc in self._procs:
                    await proc.wait()
        except TimeoutError:
            await self._kill()
        self._procs.clear()


async def _next_event(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    assert proc.stdout is not None
    line = await proc.stdout.readline()
    if not line:
        code = await proc.wait()
        raise DemoError(f"worker {proc.pid} exited with code {code} in the middle of its work")
    event: dict[str, Any] = json.loads(line)
    return event
