"""Semaphores across processes, with holders killed (kill -9): never more than N holders of
an N-permit semaphore; an expirable semaphore's permits come back, a plain one's leak."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio

import aiolock
from tests.sync_helpers import eventually, true

WORKER = Path(__file__).with_name("sync_worker.py")


class Worker:
    """tests/sync_worker.py in its own process, read line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def line(self, within: float = 20) -> str:
        assert self.proc.stdout is not None
        async with asyncio.timeout(within):
            return (await self.proc.stdout.readline()).decode().strip()

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()


async def start_worker(*args: str) -> Worker:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), *args, stdout=asyncio.subprocess.PIPE
    )
    return Worker(proc)


@pytest.fixture
async def workers() -> AsyncIterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        await worker.stop()


async def _kill_a_holder(
    workers: list[Worker], redis_client: redis.asyncio.Redis, inside: str
) -> int:
    """Kill -9 a worker while it holds a permit; forget it in the guard set (a dead process
    is nobody's holder). Returns how many of its tasks were inside when it died (0: nobody
    held a permit for 3 s: a plain semaphore's permits may all have leaked already).

    The worker is frozen (SIGSTOP) before its holders are counted: a task seen inside could
    otherwise leave and release its permit between the look and the kill. A task leaves the
    guard set before it releases, so one still in the set of a frozen worker holds its permit."""
    loop = asyncio.get_running_loop()
    until = loop.time() + 3
    while loop.time() < until:
        members = await _members(redis_client, inside)
        for worker in workers:
            pid = worker.proc.pid
            if worker.proc.returncode is not None or not any(
                m.startswith(f"{pid}:") for m in members
            ):
                continue
            os.kill(pid, signal.SIGSTOP)
            await asyncio.sleep(0.05)  # what it wrote before it froze reaches the server
            held = {m for m in await _members(redis_client, inside) if m.startswith(f"{pid}:")}
            if not held:
                os.kill(pid, signal.SIGCONT)
                continue
            worker.kill()
            await worker.proc.wait()
            for member in held:
                await redis_client.srem(inside, member)
            return len(held)
        await asyncio.sleep(0.01)
    return 0


async def _members(redis_client: redis.asyncio.Redis, key: str) -> set[str]:
    members: set[bytes] = await redis_client.smembers(key)  # type: ignore[assignment]
    return {member.decode() for member in members}


@pytest.mark.parametrize("kind", ["pes", "sem"])
async def test_never_more_than_n_holders_while_holders_are_killed(
    kind: str, redis_url: str, redis_client: redis.asyncio.Redis, workers: list[Worker]
) -> None:
    """4 processes x 4 tasks take 3 permits in turn for 4 s; two of them are killed while
    holding permits (and two more started). An overlap is a task finding more than 3 live
    holders inside. Afterwards an expirable semaphore has its 3 permits back (the dead
    ones expired within a watchdog timeout); a plain one lost what the dead held."""
    permits, tasks, seconds, watchdog = 3, 4, "4", "1.5"
    name = f"kill-{kind}"
    async with aiolock.from_url(redis_url) as client:
        if kind == "pes":
            assert await client.permit_expirable_semaphore(name).try_set_permits(permits)
            args = ["pes-hammer", redis_url, name, str(permits), str(tasks), seconds, watchdog]
        else:
            assert await client.semaphore(name).try_set_permits(permits)
            args = ["sem-hammer", redis_url, name, str(permits), str(tasks), seconds]
        for _ in range(4):
            workers.append(await start_worker(*args))
        for worker in workers:
            assert await worker.line() == "started"
        kills = 0
        for _ in range(2):
            await asyncio.sleep(0.7)
            kills += bool(await _kill_a_holder(workers, redis_client, f"inside:{name}"))
            workers.append(await start_worker(*args))
            assert await workers[-1].line() == "started"
        for worker in workers:
            if worker.proc.returncode is None:
                done, _, _ = (await worker.line(within=30)).split()
                assert done == "done"
        # rounds of all workers, the killed ones included: the survivors alone may have had
        # none, a plain semaphore's permits all leaked with one killed process that held them
        assert int(await redis_client.get(f"rounds:{name}") or 0) > 20
        assert await redis_client.get(f"overlaps:{name}") is None  # never more than 3 inside
        if kind == "pes":
            pes = client.permit_expirable_semaphore(name)
            await eventually(lambda: _counts(pes, permits), within=5)
        else:
            leaked = permits - await client.semaphore(name).available_permits()
            assert kills >= 1  # each killed while one of its tasks was inside, at least
            assert kills <= leaked <= min(permits, kills * tasks), "killed holders leak permits"


async def _counts(pes: aiolock.PermitExpirableSemaphore, permits: int) -> bool:
    return await true((await pes.available_permits(), await pes.acquired_permits()) == (permits, 0))
