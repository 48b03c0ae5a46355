"""examples/fastapi_seckill: concurrent purchases over two app instances sharing one Redis, run
twice; and the README's uvicorn command as a real server."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest

pytest.importorskip("fastapi", reason="the examples extra is not installed")

import httpx
from fastapi import FastAPI

import aiolock
from examples.fastapi_seckill.app import SALE_NAME, create_app
from tests.examples.conftest import free_port, keys_left, serving


@asynccontextmanager
async def serving_in_process(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """Run the app's lifespan and talk to it in-process."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://shop") as http:
            yield http


async def test_concurrent_buyers_on_two_instances_get_one_coupon_each(redis_url: str) -> None:
    for _ in range(2):  # the second run is a new sale: the first one left nothing behind
        async with AsyncExitStack() as stack:
            instances = [
                await stack.enter_async_context(serving_in_process(create_app(redis_url, 15)))
                for _ in range(2)
            ]
            users = [f"user-{n % 25}" for n in range(75)]  # 25 users, 3 clicks each
            responses = await asyncio.gather(
                *(instances[n % 2].post(f"/buy/{user}") for n, user in enumerate(users))
            )
            state = (await instances[0].get("/sale")).json()

        codes = Counter(response.status_code for response in responses)
        assert codes == {200: 15, 409: 60}
        buyers = [r.json()["user_id"] for r in responses if r.status_code == 200]
        assert sorted(state["orders"]) == sorted(buyers)
        assert len(set(buyers)) == 15  # none twice
        assert state["stock"] == 0
        details = {r.json()["detail"] for r in responses if r.status_code == 409}
        assert details <= {"sold out"} | {f"user {u} already has a coupon" for u in users}
        assert keys_left(redis_url) == []


async def test_try_buy_answers_429_while_the_stock_lock_is_busy(redis_url: str) -> None:
    async with serving_in_process(create_app(redis_url, coupons=1)) as http:
        async with (
            aiolock.from_url(redis_url) as other,
            other.lock(f"{SALE_NAME}:lock:stock"),
        ):
            busy = await http.post("/try-buy/alice", params={"wait": 0.05})
        bought = await http.post("/try-buy/alice", params={"wait": 0.05})
        again = await http.post("/try-buy/alice")
        sold_out = await http.post("/buy/bob")

    assert busy.status_code == 429
    assert busy.headers["retry-after"] == "1"
    assert bought.status_code == 200
    assert bought.json() == {"user_id": "alice", "coupons_left": 0}
    assert (again.status_code, again.json()["detail"]) == (409, "user alice already has a coupon")
    assert (sold_out.status_code, sold_out.json()["detail"]) == (409, "sold out")
    assert keys_left(redis_url) == []


def test_the_readme_uvicorn_command(redis_url: str) -> None:
    pytest.importorskip("uvicorn", reason="the examples extra is not installed")
    for _ in range(2):
        port = free_port()
        command = [sys.executable, "-m", "uvicorn", "examples.fastapi_seckill.app:app",
                   "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
        with serving(command, port, redis_url) as base:
            first = httpx.post(f"{base}/buy/alice", timeout=10)
            second = httpx.post(f"{base}/buy/alice", timeout=10)
            assert (first.status_code, first.json()) == (
                200, {"user_id": "alice", "coupons_left": 99},
            )  # fmt: skip
            assert second.status_code == 409
        assert keys_left(redis_url) == []
