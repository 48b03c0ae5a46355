"""examples/worker: jobs of one account never overlap, so no deposit is lost; a run leaves no
key behind and can be run again."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

import aiolock
from examples.worker import worker
from tests.examples.conftest import keys_left, run_example


async def test_workers_lose_no_deposit_and_never_overlap_run_after_run(
    redis_url: str, redis_client: redis.asyncio.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    await redis_client.set("someone-else:balance", 7)
    for _ in range(2):
        assert await worker.main(redis_url, workers=6, jobs=150, accounts=3)
        assert "overlapping jobs: 0" in capsys.readouterr().out
        assert keys_left(redis_url) == [b"someone-else:balance"]


async def test_a_run_after_a_killed_run_still_succeeds(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    await redis_client.set(worker.balance_key("acct-0"), 1000)  # what a killed run left
    await redis_client.lpush(worker.QUEUE, '{"account": "acct-9", "amount": 5}')
    assert await worker.main(redis_url, workers=2, jobs=20, accounts=2)
    assert keys_left(redis_url) == []


def test_the_readme_command_twice(redis_url: str) -> None:
    for _ in range(2):
        out = run_example("examples.worker.worker", redis_url)
        assert "overlapping jobs: 0" in out
        assert keys_left(redis_url) == []


async def test_without_the_lock_jobs_overlap_and_deposits_are_lost(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """The control experiment: the same jobs applied at once, unlocked, do go wrong."""
    async with aiolock.from_url(redis_url) as locks:
        await asyncio.gather(*(worker.apply(locks, "acct-0", 1) for _ in range(20)))

    assert int(await redis_client.get(worker.OVERLAPS) or 0) > 0
    assert int(await redis_client.get(worker.balance_key("acct-0")) or 0) < 20
