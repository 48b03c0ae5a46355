"""The behaviour suite of tests/test_lock_family.py on a Redis Cluster: the cases that need
only clients (no worker process, no server restart, no proxy) run every lock type against
the session's LocalCluster, with the pub/sub mode Redisson would choose there (sharded on
Redis 7). Fixtures of the same names as conftest's make the imported cases use the cluster.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio

import aiolock
from aiolock.testing import LocalCluster
from tests.test_lock_family import (  # the cases, and the fixtures they are parametrized by
    lock_type,
    make_exclusive,
    make_lock,
    test_1000_random_cancellations_leave_nothing_behind,
    test_a_force_unlock_elsewhere_cancels_the_guard,
    test_a_lease_runs_out_and_the_loss_is_reported,
    test_cancelled_waiter_holds_nothing,
    test_mutual_exclusion_under_contention,
    test_reentrant,
    test_waiter_gets_it_on_release,
)

__all__ = [
    "lock_type",
    "make_exclusive",
    "make_lock",
    "test_1000_random_cancellations_leave_nothing_behind",
    "test_a_force_unlock_elsewhere_cancels_the_guard",
    "test_a_lease_runs_out_and_the_loss_is_reported",
    "test_cancelled_waiter_holds_nothing",
    "test_mutual_exclusion_under_contention",
    "test_reentrant",
    "test_waiter_gets_it_on_release",
]


@pytest.fixture
async def redis_client(healthy_cluster: LocalCluster) -> AsyncIterator[redis.asyncio.RedisCluster]:
    """A RedisCluster on the healthy session cluster (scan_iter covers every master)."""
    client = redis.asyncio.RedisCluster(startup_nodes=healthy_cluster.startup_nodes())
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def client(redis_client: redis.asyncio.RedisCluster) -> AsyncIterator[aiolock.AioLock]:
    async with aiolock.AioLock(redis_client) as lock_client:
        yield lock_client


@pytest.fixture
async def make_client(cluster_url: str) -> AsyncIterator[Callable[..., aiolock.AioLock]]:
    made: list[aiolock.AioLock] = []

    def make(url: str = cluster_url, **config: Any) -> aiolock.AioLock:
        made.append(aiolock.from_url(url, **config))
        return made[-1]

    yield make
    for each in made:
        await each.aclose()
