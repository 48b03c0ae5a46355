"""examples/aiohttp_app: concurrent purchases through a real aiohttp server, run twice; and the
README's command as a real server."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter

import pytest

pytest.importorskip("aiohttp", reason="the examples extra is not installed")

from aiohttp.test_utils import TestClient, TestServer

import aiolock
from examples.aiohttp_app import app as aiohttp_app
from tests.examples.conftest import free_port, keys_left, serving


async def test_concurrent_buyers_get_one_coupon_each(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 60 purchases queue for the sale's locks; the app's 0.5 s WAIT_TIME ran out for some on
    # a loaded machine (429). This test is about who gets a coupon, so nobody gives up.
    monkeypatch.setattr(aiohttp_app, "WAIT_TIME", 30)
    for _ in range(2):  # the second run is a new sale: the first one left nothing behind
        app = aiohttp_app.create_app(redis_url, coupons=10)
        async with TestClient(TestServer(app)) as http:
            users = [f"user-{n % 20}" for n in range(60)]  # 20 users, 3 clicks each
            responses = await asyncio.gather(*(http.post(f"/buy/{user}") for user in users))
            codes = Counter(response.status for response in responses)
            buyers = [(await r.json())["user_id"] for r in responses if r.status == 200]
            state = await (await http.get("/sale")).json()

        assert codes == {200: 10, 409: 50}
        assert len(set(buyers)) == 10  # none twice
        assert sorted(state["orders"]) == sorted(buyers)
        assert state["stock"] == 0
        assert keys_left(redis_url) == []


async def test_busy_user_lock_answers_429(redis_url: str) -> None:
    async with TestClient(TestServer(aiohttp_app.create_app(redis_url, coupons=1))) as http:
        user_lock = f"{aiohttp_app.SALE_NAME}:lock:user:alice"
        async with aiolock.from_url(redis_url) as other, other.lock(user_lock):
            busy = await http.post("/buy/alice")
        bought = await http.post("/buy/alice")

    assert busy.status == 429
    assert bought.status == 200
    assert keys_left(redis_url) == []


def test_the_readme_command(redis_url: str) -> None:
    httpx = pytest.importorskip("httpx", reason="the examples extra is not installed")
    for _ in range(2):
        port = free_port()
        command = [sys.executable, "-m", "examples.aiohttp_app.app"]
        with serving(command, port, redis_url, PORT=str(port)) as base:
            assert httpx.post(f"{base}/buy/alice", timeout=10).status_code == 200
            assert httpx.post(f"{base}/buy/alice", timeout=10).status_code == 409
        assert keys_left(redis_url) == []
