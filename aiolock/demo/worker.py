"""A demo worker process (``python -m aiolock.demo.worker``): many buyers on one event loop.

It reads :class:`~aiolock.demo.messages.Job` lines on stdin until stdin closes. For each job it
connects to Redis, runs the job's purchase attempts with ``concurrency`` asyncio tasks (each
takes the next attempt as soon as its previous one is answered), and reports on stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from redis.asyncio import Redis

from ..client import from_url
from .messages import Job, WorkerResult
from .sale import SaleKeys
from .strategies import Atomic, Locked, Naive, Strategy

PROGRESS_INTERVAL = 0.05
"""Seconds between two progress events."""


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


@asynccontextmanager
async def open_strategy(job: Job) -> AsyncIterator[Strategy]:
    """The job's strategy on its own connections, closed on exit."""
    keys = SaleKeys(job.key_prefix)
    if job.strategy == "lock":
        async with from_url(job.redis_url) as locks:
            yield Locked(locks, keys)
        return
    redis = Redis.from_url(job.redis_url)
    try:
        yield Naive(redis, keys) if job.strategy == "naive" else Atomic(redis, keys)
    finally:
        await redis.aclose()


async def run_job(job: Job) -> WorkerResult:
    """Run every attempt of ``job``; progress events go out while it runs."""
    loop = asyncio.get_running_loop()
    result = WorkerResult()
    attempts = iter(job.attempts)  # shared: each buyer task takes the next attempt

    async def buyer(strategy: Strategy) -> None:
        for number, user_id in attempts:
            started = loop.time()
            outcome = await strategy.buy(user_id, f"{job.key_prefix}{number}")
            result.add(outcome, (loop.time() - started) * 1000)

    async def report_progress() -> None:
        while True:
            emit({"event": "progress", "done": len(result.latencies_ms)})
            await asyncio.sleep(PROGRESS_INTERVAL)

    async with open_strategy(job) as strategy:
        reporter = asyncio.create_task(report_progress())
        try:
            async with asyncio.TaskGroup() as buyers:
                for _ in range(job.concurrency):
                    buyers.create_task(buyer(strategy))
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
    return result


def main() -> None:
    """Serve jobs until stdin closes."""
    emit({"event": "ready"})
    for line in sys.stdin:
        try:
            result = asyncio.run(run_job(Job.from_line(line)))
        except Exception:
            emit({"event": "error", "message": traceback.format_exc()})
        else:
            emit(result.to_event())


if __name__ == "__main__":
    main()
