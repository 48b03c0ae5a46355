"""examples/worker: jobs of one account never overlap, so no deposit is lost."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

import aiolock
from examples.worker import worker


async def test_workers_lose_no_deposit_and_never_overlap(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await worker.main(redis_url, workers=6, jobs=150, accounts=3)
    assert "overlapping jobs: 0" in capsys.readouterr().out


async def test_without_the_lock_jobs_overlap_and_deposits_are_lost(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """The control experiment: the same jobs applied at once, unlocked, do go wrong."""
    async with aiolock.from_url(redis_url) as locks:
        await asyncio.gather(*(worker.apply(locks, "acct-0", 1) for _ in range(20)))

    assert int(await redis_client.get(worker.OVERLAPS) or 0) > 0
    assert int(await redis_client.get("balance:acct-0") or 0) < 20
