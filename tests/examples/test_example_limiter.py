"""examples/limiter: a semaphore keeps calls across workers within the limit, with both kinds;
a run leaves no key behind and can be run again."""

from __future__ import annotations

import pytest
import redis.asyncio

from examples.limiter import limiter
from tests.examples.conftest import keys_left, run_example


@pytest.mark.parametrize("kind", ["semaphore", "permit_expirable_semaphore"])
async def test_at_most_limit_calls_at_once_run_after_run(
    redis_url: str, redis_client: redis.asyncio.Redis, kind: str
) -> None:
    await redis_client.set("someone-else:calls", 7)
    for _ in range(2):
        partner = await limiter.run(redis_url, kind)
        assert partner.calls == 40
        assert 1 <= partner.peak <= limiter.LIMIT
        assert keys_left(redis_url) == [b"someone-else:calls"]


def test_the_readme_command_twice(redis_url: str) -> None:
    for _ in range(2):
        out = run_example("examples.limiter.limiter", redis_url)
        assert "semaphore: 40 calls, at most " in out
        assert "permit_expirable_semaphore: 40 calls, at most " in out
        for line in out.splitlines():
            assert int(line.split("at most ")[1].split()[0]) <= limiter.LIMIT, out
        assert keys_left(redis_url) == []


async def test_without_the_semaphore_calls_exceed_the_limit(redis_url: str) -> None:
    """The control experiment: the same calls, unlimited, do run more than LIMIT at once."""
    partner = await limiter.run(redis_url, None)
    assert partner.calls == 40
    assert partner.peak > limiter.LIMIT
