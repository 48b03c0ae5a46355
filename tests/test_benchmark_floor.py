"""The benchmarks' physical floor runs aiolock's own scripts with their current arguments:
a change of a script's ARGV that the floor misses makes its releases no-ops (its figures then
measure something else, and the hand-off floor hangs)."""

from __future__ import annotations

import redis.asyncio


async def test_the_floor_releases_what_it_takes(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    from benchmarks import floor

    uncontended = await floor.UncontendedFloor.open(redis_url)
    try:
        for _ in range(3):
            assert await uncontended.cycle("bench:floor-check")
            assert not await redis_client.exists("bench:floor-check")
    finally:
        uncontended.close()
