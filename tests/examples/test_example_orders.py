"""examples/orders: every order paid exactly once however its payments arrive, in the FastAPI
app (the lock dependency, the decorator), the aiohttp app (decorated handlers) and the queue
workers (a decorated job function); run twice; and the README's commands."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest

pytest.importorskip("fastapi", reason="the examples extra is not installed")
pytest.importorskip("aiohttp", reason="the examples extra is not installed")

import httpx
import redis.asyncio
from aiohttp.test_utils import TestClient, TestServer

import aiolock
from examples.orders import aiohttp_app, fastapi_app, orders, worker
from examples.orders.orders import order_lock
from tests.examples.conftest import free_port, keys_left, run_example, serving

ORDERS = [f"o{n}" for n in range(5)]
CLICKS = 6


@pytest.fixture(autouse=True)
def default_client_restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The apps make their client the process default (aiolock.configure): put it back."""
    monkeypatch.setattr(aiolock.default, "_configured", None)
    yield


@asynccontextmanager
async def fastapi_served(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = fastapi_app.create_app(redis_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://shop") as http:
            yield http


def assert_paid_once(statuses: list[tuple[str, int]], states: list[dict[str, object]]) -> None:
    """Of each order's clicks one paid (200) and the others were told it was busy (429) or
    paid already (409); the provider charged each order once."""
    paid = Counter(order_id for order_id, status in statuses if status == 200)
    assert paid == dict.fromkeys(ORDERS, 1)
    assert {status for _, status in statuses} <= {200, 409, 429}
    assert [(s["status"], s["charged"]) for s in states] == [("paid", 1)] * len(ORDERS)


def assert_refunded_once(statuses: list[int]) -> None:
    """The refunds wait for the order's lock (``wait_time=2``): one refund of each order,
    the others find it refunded (409), or on a very busy machine waited their 2 s (429)."""
    codes = Counter(statuses)
    assert codes[200] == len(ORDERS)
    assert set(codes) <= {200, 409, 429}


async def test_fastapi_pays_each_order_once_run_after_run(redis_url: str) -> None:
    for _ in range(2):  # the second run starts afresh: the first one left nothing behind
        async with fastapi_served(redis_url) as http:
            clicks = [order_id for order_id in ORDERS for _ in range(CLICKS)]
            responses = await asyncio.gather(*(http.post(f"/orders/{o}/pay") for o in clicks))
            states = [(await http.get(f"/orders/{o}")).json() for o in ORDERS]
            refunds = await asyncio.gather(*(http.post(f"/orders/{o}/refund") for o in clicks))
        assert_paid_once(
            [(o, r.status_code) for o, r in zip(clicks, responses, strict=True)], states
        )
        busy = [r for r in responses if r.status_code == 429]
        assert all(r.headers["retry-after"] == "1" for r in busy)
        assert_refunded_once([r.status_code for r in refunds])
        assert keys_left(redis_url) == []


async def test_fastapi_busy_order_and_a_waiting_refund(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async with fastapi_served(redis_url) as http, aiolock.from_url(redis_url) as other:
        assert (await http.post("/orders/o1/pay")).status_code == 200
        lock = other.lock(order_lock("o1"))
        await lock.lock()
        busy = await http.post("/orders/o1/pay")
        refund = asyncio.create_task(http.post("/orders/o1/refund"))
        await asyncio.sleep(0.3)
        assert not refund.done()  # it waits for the order's lock
        await lock.unlock()
        refunded = await refund
    assert (busy.status_code, busy.json()) == (429, {"detail": aiolock.fastapi.BUSY})
    assert (refunded.status_code, refunded.json()["status"]) == (200, "refunded")
    assert keys_left(redis_url) == []


async def test_aiohttp_pays_each_order_once_run_after_run(redis_url: str) -> None:
    for _ in range(2):
        async with TestClient(TestServer(aiohttp_app.create_app(redis_url))) as http:
            clicks = [order_id for order_id in ORDERS for _ in range(CLICKS)]
            responses = await asyncio.gather(*(http.post(f"/orders/{o}/pay") for o in clicks))
            states = [await (await http.get(f"/orders/{o}")).json() for o in ORDERS]
            refunds = await asyncio.gather(*(http.post(f"/orders/{o}/refund") for o in clicks))
        assert_paid_once([(o, r.status) for o, r in zip(clicks, responses, strict=True)], states)
        assert_refunded_once([r.status for r in refunds])
        assert keys_left(redis_url) == []


async def test_workers_pay_each_order_once_run_after_run(
    redis_url: str, redis_client: redis.asyncio.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    await redis_client.set("someone-else:order", 1)
    await redis_client.set(orders.order_key("o9"), 1)  # what a killed earlier run left
    for _ in range(2):
        assert await worker.main(redis_url, workers=3, count=12, deliveries=3)
        assert "orders paid: 12 of 12; charged more than once: 0" in capsys.readouterr().out
        assert keys_left(redis_url) == [b"someone-else:order"]


async def test_without_the_lock_an_order_is_charged_more_than_once(
    redis_client: redis.asyncio.Redis,
) -> None:
    """The control experiment: the payments of one order at once, unlocked, do go wrong."""
    await asyncio.gather(*(orders.pay(redis_client, "o1") for _ in range(5)))
    assert (await orders.state(redis_client, "o1"))["charged"] == 5


@pytest.mark.slow
def test_the_readme_commands(redis_url: str) -> None:
    out = run_example("examples.orders.worker", redis_url)
    assert "charged more than once: 0" in out
    assert keys_left(redis_url) == []
    port = free_port()
    uvicorn = [sys.executable, "-m", "uvicorn", "examples.orders.fastapi_app:app",
               "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    with serving(uvicorn, port, redis_url, ready="/orders/o1") as base:
        assert httpx.post(f"{base}/orders/o1/pay", timeout=10).status_code == 200
        assert httpx.post(f"{base}/orders/o1/pay", timeout=10).status_code == 409
    assert keys_left(redis_url) == []
    port = free_port()
    aiohttp_command = [sys.executable, "-m", "examples.orders.aiohttp_app"]
    with serving(aiohttp_command, port, redis_url, ready="/orders/o1", PORT=str(port)) as base:
        assert httpx.post(f"{base}/orders/o1/pay", timeout=10).status_code == 200
        assert httpx.post(f"{base}/orders/o1/refund", timeout=10).json()["status"] == "refunded"
    assert keys_left(redis_url) == []
