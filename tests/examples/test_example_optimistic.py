"""examples/optimistic: compare-and-set and the lock both sell exactly the stock."""

from __future__ import annotations

import asyncio

import pytest

import aiolock
from examples.optimistic.cas import Inventory, main, sell_out
from tests.examples.conftest import keys_left, run_example


@pytest.mark.parametrize(("optimistic", "max_tries"), [(True, 100), (True, 1), (False, 0)])
async def test_concurrent_takers_sell_exactly_the_stock(
    redis_url: str, optimistic: bool, max_tries: int
) -> None:
    async with aiolock.from_url(redis_url) as locks:
        inventory = Inventory(locks, "item")
        await inventory.restock(30)
        takers = [
            inventory.take_optimistic(max_tries) if optimistic else inventory.take_locked()
            for _ in range(50)
        ]
        results = await asyncio.gather(*takers)
        assert results.count(True) == 30
        assert await inventory.stock() == 0
        assert await locks.redis.hget("item", "version") == b"30"
        stats = inventory.stats
        assert (stats.taken, stats.sold_out) == (30, 20)
        if optimistic:
            assert stats.conflicts > 0  # 50 takers at once: many lost a compare-and-set
        if max_tries == 1:
            assert stats.fell_back > 0


async def test_a_version_bump_in_between_is_a_conflict(redis_url: str) -> None:
    """ABA: the stock is back to what was read, but the version says it changed."""
    async with aiolock.from_url(redis_url) as locks:
        inventory = Inventory(locks, "item")
        await inventory.restock(5)
        await locks.redis.hset("item", mapping={"stock": 5, "version": 2})  # 5 -> 4 -> 5
        assert await inventory._cas(keys=["item"], args=[0, 4]) == 0
        assert await inventory._cas(keys=["item"], args=[2, 4]) == 1
        assert await locks.redis.hmget("item", ["stock", "version"]) == [b"4", b"3"]


async def test_main_compares_low_and_high_contention(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await main(redis_url, total=64)
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(row[0], row[5]) for row in rows] == [
        ("64", "optimistic"), ("64", "lock"), ("1", "optimistic"), ("1", "lock"),
    ]  # fmt: skip
    conflicts = [int(row[-2]) for row in rows]
    assert conflicts[:2] == [0, 0]  # one taker per item: nobody to conflict with
    assert conflicts[3] == 0  # lock holders never race each other
    assert keys_left(redis_url) == []  # main cleans up


def test_the_readme_command_twice(redis_url: str) -> None:
    for _ in range(2):
        out = run_example("examples.optimistic.cas", redis_url)
        assert len(out.splitlines()) == 5
        assert keys_left(redis_url) == []


async def test_sell_out_drains_every_item(redis_url: str) -> None:
    async with aiolock.from_url(redis_url) as locks:
        items = [Inventory(locks, f"item:{n}") for n in range(3)]
        for item in items:
            await item.restock(5)
        assert await sell_out(items, takers_per_item=4, optimistic=True) > 0
        assert [item.stats.taken for item in items] == [5, 5, 5]
        assert [await item.stock() for item in items] == [0, 0, 0]
