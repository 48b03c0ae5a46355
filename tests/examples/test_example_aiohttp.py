"""examples/aiohttp_app: concurrent purchases through a real aiohttp server."""

from __future__ import annotations

import asyncio
from collections import Counter

from aiohttp.test_utils import TestClient, TestServer

import aiolock
from examples.aiohttp_app import app as aiohttp_app


async def test_concurrent_buyers_get_one_coupon_each(redis_url: str) -> None:
    async with TestClient(TestServer(aiohttp_app.create_app(redis_url, coupons=10))) as http:
        users = [f"user-{n % 20}" for n in range(60)]  # 20 users, 3 clicks each
        responses = await asyncio.gather(*(http.post(f"/buy/{user}") for user in users))
        codes = Counter(response.status for response in responses)
        buyers = [(await r.json())["user_id"] for r in responses if r.status == 200]
        state = await (await http.get("/sale")).json()

    assert codes == {200: 10, 409: 50}
    assert len(set(buyers)) == 10  # none twice
    assert sorted(state["orders"]) == sorted(buyers)
    assert state["stock"] == 0


async def test_busy_user_lock_answers_429(redis_url: str) -> None:
    async with TestClient(TestServer(aiohttp_app.create_app(redis_url, coupons=1))) as http:
        async with aiolock.from_url(redis_url) as other, other.lock("seckill:lock:user:alice"):
            busy = await http.post("/buy/alice")
        bought = await http.post("/buy/alice")

    assert busy.status == 429
    assert bought.status == 200
