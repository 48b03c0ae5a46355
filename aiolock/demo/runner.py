"""The demo from start to end: for each strategy, open a sale, let the workers buy, count.

Every strategy gets a fresh sale under the run's own key prefix, starts with the same stock
and faces the same buyers in the same order; its keys are deleted when it is done.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from .db import open_store
from .messages import Job
from .orders import writing_orders
from .pool import WorkerPool
from .report import DatabaseCheck, StrategyResult
from .sale import Outcome, SaleKeys, arrivals


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What to sell, to whom, how hard, and where."""

    strategies: tuple[str, ...]
    redis_url: str
    db_url: str | None
    """Where the lua strategy's orders go (a SQLite path/URL or a postgresql:// URL);
    required when "lua" is among the strategies."""
    coupons: int = 200
    users: int = 500
    attempts: int = 2000
    workers: int = 4
    """Worker processes."""
    concurrency: int = 64
    """Buyers (asyncio tasks) per worker process."""
    seed: int = 0

    def __post_init__(self) -> None:
        if "lua" in self.strategies and self.db_url is None:
            raise ValueError("the lua strategy needs a database (db_url)")


ProgressStart = Callable[[str, int], Callable[[int], None]]
"""``start(strategy, total)`` returns ``update(done)``: how the runner reports progress."""


async def run_demo(options: DemoOptions, on_start: ProgressStart) -> list[StrategyResult]:
    """Run each strategy in turn on one pool of worker processes; return their results."""
    run_id = secrets.token_hex(4)
    numbered = list(enumerate(arrivals(options.users, options.attempts, options.seed), 1))
    results = []
    async with Redis.from_url(options.redis_url) as redis, WorkerPool(options.workers) as pool:
        for strategy in options.strategies:
            keys = SaleKeys.for_run(run_id, strategy)
            # Round robin: at any moment all workers are at about the same point of the queue.
            jobs = [
                Job(strategy, options.redis_url, keys.prefix, numbered[i :: pool.size],
                    options.concurrency)
                for i in range(pool.size)
            ]  # fmt: skip
            on_progress = on_start(strategy, len(numbered))
            try:
                results.append(await _sell(redis, pool, jobs, options, keys, run_id, on_progress))
            finally:
                await delete_keys(redis, keys)
    return results


async def _sell(
    redis: Redis,
    pool: WorkerPool,
    jobs: list[Job],
    options: DemoOptions,
    keys: SaleKeys,
    run_id: str,
    on_progress: Callable[[int], None],
) -> StrategyResult:
    """One strategy's sale: stock up, let the workers buy, read back what was sold."""
    await redis.set(keys.stock, options.coupons)
    database = None
    if jobs[0].strategy == "lua":
        assert options.db_url is not None
        async with open_store(options.db_url, f"aiolock_demo_{run_id}") as store:
            async with writing_orders(redis, keys.stream, store):
                purchases = await _purchase(pool, jobs, on_progress)
            rows, distinct_users = await store.counts()
            database = DatabaseCheck(store.description, store.table, rows, distinct_users)
        entries: Any = await redis.xrange(keys.stream)
        order_users = [int(fields[b"user_id"]) for _, fields in entries]
    else:
        purchases = await _purchase(pool, jobs, on_progress)
        order_users = [int(user) for user in await redis.lrange(keys.orders, 0, -1)]
    return StrategyResult(
        strategy=jobs[0].strategy,
        coupons=options.coupons,
        attempts=len(purchases.latencies_ms),
        order_users=order_users,
        stock_left=int(await redis.get(keys.stock) or 0),
        elapsed_s=purchases.elapsed_s,
        outcomes=purchases.outcomes,
        latencies_ms=purchases.latencies_ms,
        database=database,
    )


@dataclass(frozen=True, slots=True)
class _Purchases:
    """Every worker's attempts of one strategy, together."""

    outcomes: Counter[Outcome]
    latencies_ms: list[float]
    elapsed_s: float


async def _purchase(
    pool: WorkerPool, jobs: list[Job], on_progress: Callable[[int], None]
) -> _Purchases:
    """Run the jobs on the workers, timed; merge what they report."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    results = await pool.run(jobs, on_progress)
    elapsed = loop.time() - started
    outcomes: Counter[Outcome] = Counter()
    latencies: list[float] = []
    for result in results:
        outcomes.update(result.outcomes)
        latencies.extend(result.latencies_ms)
    return _Purchases(outcomes, latencies, elapsed)


async def delete_keys(redis: Redis, keys: SaleKeys) -> None:
    """Delete every key of one strategy's run."""
    found = [key async for key in redis.scan_iter(match=keys.pattern, count=1000)]
    for start in range(0, len(found), 1000):
        await redis.unlink(*found[start : start + 1000])
