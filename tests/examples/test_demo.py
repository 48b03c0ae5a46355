"""``aiolock demo``: the flash sale across worker processes, its parts, and its Redis choice."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

pytest.importorskip("rich", reason="the demo extra is not installed: pip install -e '.[demo]'")

import redis
import redis.asyncio
from redis.exceptions import ResponseError

from aiolock.cli import main
from aiolock.demo.db import Order, open_store
from aiolock.demo.orders import GROUP, OrderWriter, create_group, writing_orders
from aiolock.demo.report import StrategyResult, percentile
from aiolock.demo.sale import Outcome, SaleKeys, arrivals
from aiolock.demo.strategies import SECKILL_BUY, Atomic
from aiolock.testing import find_redis_server_binary

# A PostgreSQL the demo may write to (the postgres extra); the test skips without one.
POSTGRES_URL = os.environ.get(
    "AIOLOCK_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)

# Small, but racy: 2 processes x 16 buyers each read the stock before anyone writes it back.
SMALL = ["--coupons", "20", "--users", "40", "--attempts", "150", "--workers", "2",
         "--concurrency", "16", "--seed", "7"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def answers(address: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(address, timeout=1):
            return True
    except OSError:
        return False


def by_strategy(json_path: Path) -> dict[str, dict[str, Any]]:
    return {r["strategy"]: r for r in json.loads(json_path.read_text())}


def assert_correct(result: dict[str, Any], coupons: int = 20) -> None:
    assert result["correct"]
    assert (result["sold"], result["stock_left"]) == (coupons, 0)
    assert (result["oversold"], result["duplicate_users"]) == (0, 0)


# -- the whole demo ---------------------------------------------------------------------------


def test_all_strategies_naive_oversells_lock_and_lua_do_not(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "results.json"
    code = main(["demo", "--strategy", "all", *SMALL, "--redis", redis_url, "--json", str(out)])

    assert code == 0
    results = by_strategy(out)
    assert list(results) == ["naive", "lock", "lua"]
    naive = results["naive"]
    assert naive["oversold"] > 0 and not naive["correct"]
    assert naive["sold"] > 20
    for strategy in ("lock", "lua"):
        assert_correct(results[strategy])
        assert results[strategy]["attempts"] == 150
        assert results[strategy]["outcomes"]["bought"] == 20
    database = results["lua"]["database"]
    assert (database["rows"], database["distinct_users"], database["matches_sold"]) == (
        20, 20, True,
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert "Flash sale: 20 coupons, one per user" in printed
    assert "naive: buyers read the same stock" in printed


def test_the_demo_leaves_no_key_behind(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as client:
        client.set("someone-else:data", "kept")
        code = main(["demo", "--strategy", "lock", *SMALL, "--redis", redis_url])
        assert code == 0
        assert client.keys("*") == [b"someone-else:data"]


def test_python_m_aiolock_demo(redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "aiolock", "demo", *SMALL, "--redis", redis_url,
         "--json", str(out)],
        capture_output=True, text=True, timeout=50, check=False,
    )  # fmt: skip

    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = by_strategy(out)
    assert results["naive"]["oversold"] > 0
    assert_correct(results["lock"])
    assert_correct(results["lua"])
    assert "correct" in proc.stdout and "WRONG" in proc.stdout


def postgresql() -> Any:
    """asyncpg, once ``POSTGRES_URL`` is known to accept a connection; else skip, saying why
    (nothing answers; the postgres extra is not installed; PostgreSQL refuses the URL)."""
    parts = urlsplit(POSTGRES_URL)
    where = f"{parts.hostname}:{parts.port or 5432}"
    if not answers((parts.hostname or "127.0.0.1", parts.port or 5432)):
        pytest.skip(f"no PostgreSQL at {where}")
    asyncpg = pytest.importorskip(
        "asyncpg",
        reason=f"PostgreSQL answers at {where} but the postgres extra is not installed: "
        "pip install -e '.[postgres]'",
    )

    async def connect() -> None:
        conn = await asyncpg.connect(POSTGRES_URL, timeout=10)
        await conn.close()

    try:
        asyncio.run(connect())
    except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
        pytest.skip(
            f"PostgreSQL at {where} refuses {POSTGRES_URL} (set AIOLOCK_TEST_POSTGRES_URL): {exc}"
        )
    return asyncpg


def test_lua_orders_land_in_postgresql_once(redis_url: str, tmp_path: Path) -> None:
    asyncpg = postgresql()
    out = tmp_path / "results.json"
    code = main(
        ["demo", "--strategy", "lua", *SMALL, "--redis", redis_url, "--db", POSTGRES_URL,
         "--json", str(out)]
    )  # fmt: skip

    assert code == 0
    lua = by_strategy(out)["lua"]
    assert_correct(lua)
    parts = urlsplit(POSTGRES_URL)
    assert (
        lua["database"]["store"] == f"PostgreSQL {parts.hostname}:{parts.port or 5432}{parts.path}"
    )
    assert (lua["database"]["rows"], lua["database"]["distinct_users"]) == (20, 20)
    table = lua["database"]["table"]

    async def table_exists() -> bool:
        conn = await asyncpg.connect(POSTGRES_URL)
        try:
            return bool(await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table))
        finally:
            await conn.close()

    assert not asyncio.run(table_exists())  # dropped at the end of the run


@pytest.mark.skipif(find_redis_server_binary() is None, reason="no redis-server binary")
def test_starts_and_stops_a_private_redis_when_none_answers(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "AIOLOCK_URL")}
    env["AIOLOCK_URL"] = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    proc = subprocess.run(
        [sys.executable, "-m", "aiolock", "demo", "--strategy", "lua", *SMALL],
        capture_output=True, text=True, timeout=50, check=False, env=env,
    )  # fmt: skip

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"No Redis answers at {env['AIOLOCK_URL']}." in proc.stdout
    assert "Started a private redis-server (pid " in proc.stdout
    assert "Stopped the private redis-server." in proc.stdout
    pid = int(proc.stdout.split("(pid ", 1)[1].split(")", 1)[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # signal 0: only checks that the process exists


def test_unreachable_redis_fails_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    assert main(["demo", *SMALL, "--redis", url]) == 2
    assert f"no Redis answers at {url}" in capsys.readouterr().out


def test_bad_arguments_exit_2() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--workers", "0"])
    assert exc.value.code == 2


# -- the parts --------------------------------------------------------------------------------


def test_arrivals_give_every_user_a_try_and_some_users_more() -> None:
    users = arrivals(users=50, attempts=200, seed=3)
    assert len(users) == 200
    assert set(users) == set(range(1, 51))
    assert max(Counter(users).values()) > 1
    assert users == arrivals(users=50, attempts=200, seed=3)
    assert sorted(arrivals(users=50, attempts=10, seed=3)) == sorted(set(arrivals(50, 10, 3)))


async def test_seckill_script_checks_stock_and_one_per_user(
    redis_client: redis.asyncio.Redis,
) -> None:
    keys = SaleKeys.for_run("t", "lua")
    script_keys = (keys.stock, keys.buyers, keys.stream)

    async def buy(user: int) -> Any:
        return await redis_client.eval(SECKILL_BUY.source, 3, *script_keys, user, f"o-{user}")

    with pytest.raises(ResponseError, match="sale not started"):
        await buy(1)
    await redis_client.set(keys.stock, 2)
    assert [await buy(1), await buy(1), await buy(2), await buy(3)] == [0, 2, 0, 1]
    assert await redis_client.get(keys.stock) == b"0"
    assert await redis_client.smembers(keys.buyers) == {b"1", b"2"}
    entries: Any = await redis_client.xrange(keys.stream)
    assert [fields for _, fields in entries] == [
        {b"order_id": b"o-1", b"user_id": b"1"},
        {b"order_id": b"o-2", b"user_id": b"2"},
    ]
    assert all("{seckill}" in key for key in script_keys)


async def test_lua_strategy_loads_the_script_again_after_a_flush(
    redis_client: redis.asyncio.Redis,
) -> None:
    keys = SaleKeys.for_run("t", "lua")
    await redis_client.set(keys.stock, 2)
    await redis_client.script_flush()
    strategy = Atomic(redis_client, keys)
    outcomes = [await strategy.buy(user, f"o-{n}") for n, user in enumerate([1, 1, 2, 3])]
    assert outcomes == [Outcome.BOUGHT, Outcome.ALREADY_BOUGHT, Outcome.BOUGHT, Outcome.SOLD_OUT]


async def test_writers_store_pending_entries_of_a_crashed_writer_once(
    redis_client: redis.asyncio.Redis, tmp_path: Path
) -> None:
    stream = "orders-stream"
    await create_group(redis_client, stream)
    await create_group(redis_client, stream)  # again: BUSYGROUP is fine
    for n in range(1, 11):
        await redis_client.xadd(stream, {"order_id": f"o{n}", "user_id": n})
    # writer-1 and writer-9 read entries and "crash" before storing / acknowledging them.
    await redis_client.xreadgroup(GROUP, "writer-1", {stream: ">"}, count=3)
    await redis_client.xreadgroup(GROUP, "writer-9", {stream: ">"}, count=3)

    async with open_store(str(tmp_path / "orders.db"), "orders") as store:
        assert await store.insert([Order("o1", 1)]) == 1  # one was even stored already
        restarted = OrderWriter(redis_client, stream, store, "writer-1", claim_idle_ms=0)
        await restarted.recover()  # its own 3, then writer-9's 3
        assert (restarted.delivered, restarted.stored) == (6, 5)
        async with writing_orders(redis_client, stream, store, writers=2) as writers:
            pass  # on exit, they store the 4 entries never delivered, and stop
        assert sum(w.delivered for w in writers) == 4
        assert await store.counts() == (10, 10)
        assert await store.insert([Order(f"o{n}", n) for n in range(1, 11)]) == 0  # idempotent
    pending = await redis_client.xpending(stream, GROUP)
    assert pending["pending"] == 0


async def test_a_second_order_for_one_user_is_refused_by_the_database(tmp_path: Path) -> None:
    async with open_store(f"sqlite:///{tmp_path}/orders.db", "orders") as store:
        await store.insert([Order("o1", 1)])
        with pytest.raises(sqlite3.IntegrityError):
            await store.insert([Order("o2", 1)])
        assert await store.counts() == (1, 1)


def test_report_judges_oversold_and_duplicates() -> None:
    def result(users: list[int], stock_left: int) -> StrategyResult:
        outcomes = Counter({Outcome.BOUGHT: len(users)})
        return StrategyResult("x", 3, 10, users, stock_left, 1.0, outcomes, [1.0, 2.0, 3.0])

    assert result([1, 2, 3], 0).correct
    wrong = result([1, 2, 2, 4, 5], 1)
    assert (wrong.oversold, wrong.duplicate_users, wrong.correct) == (2, 1, False)
    assert result([1], -2).oversold == 2
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert percentile(list(map(float, range(1, 101))), 0.99) == 99.0
