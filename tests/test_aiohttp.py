"""aiohttp: the ``locked`` decorator on request handlers (the lock named from
``request.match_info``), through aiohttp's test client and a real server, against a real
Redis."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

pytest.importorskip("aiohttp", reason="the examples extra is not installed")

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

import aiolock

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Client = TestClient[web.Request, web.Application]


@web.middleware
async def busy_is_429(request: web.Request, handler: Handler) -> web.StreamResponse:
    """What an app does with the LockTimeout of a handler whose lock stays busy."""
    try:
        return await handler(request)
    except aiolock.LockTimeout as exc:
        return web.json_response(
            {"detail": f"{exc.name} is busy"}, status=429, headers={"Retry-After": "1"}
        )


class Gate:
    """Holds requests inside their handler until opened."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()
        self.left = asyncio.Event()

    async def pass_(self) -> None:
        self.entered.set()
        try:
            async with asyncio.timeout(20):
                await self.opened.wait()
        finally:
            self.left.set()


def order_app(locks: aiolock.AioLock, gate: Gate) -> web.Application:
    @locks.locked("order:{request.match_info[order_id]}", wait_time=0)
    async def pay(request: web.Request) -> web.Response:
        await gate.pass_()
        return web.json_response({"order": request.match_info["order_id"]})

    @locks.locked(lambda request: f"user:{request.headers['X-User']}", wait_time=0)
    async def profile(request: web.Request) -> web.Response:
        held = await locks.lock(f"user:{request.headers['X-User']}").is_held_by_current_task()
        return web.json_response({"held": held})

    app = web.Application(middlewares=[busy_is_429])
    app.router.add_post("/orders/{order_id}/pay", pay)
    app.router.add_get("/me", profile)
    return app


@pytest.fixture
async def http(
    client: aiolock.AioLock,
) -> AsyncIterator[tuple[Client, Gate]]:
    gate = Gate()
    async with TestClient(TestServer(order_app(client, gate))) as test_client:
        yield test_client, gate


async def test_two_requests_for_one_order_one_gets_the_lock_the_other_429(
    client: aiolock.AioLock, http: tuple[Client, Gate]
) -> None:
    test_client, gate = http
    first = asyncio.create_task(test_client.post("/orders/1/pay"))
    await gate.entered.wait()
    busy = await test_client.post("/orders/1/pay")
    gate.opened.set()
    other = await test_client.post("/orders/2/pay")
    done = await first

    assert (busy.status, await busy.json()) == (429, {"detail": "order:1 is busy"})
    assert busy.headers["Retry-After"] == "1"
    assert (done.status, await done.json()) == (200, {"order": "1"})
    assert other.status == 200
    me = await test_client.get("/me", headers={"X-User": "ann"})
    assert await me.json() == {"held": True}
    assert not await client.lock("order:1").is_locked()
    assert client.statistics().holds.get("held", 0) == 0


async def test_a_client_that_disconnects_releases_the_lock(
    client: aiolock.AioLock, http: tuple[Client, Gate]
) -> None:
    """aiohttp cancels the handler when its client goes away (``handler_cancellation``,
    which the test server turns on): the lock is released then, not when the handler would
    have ended."""
    test_client, gate = http
    request = asyncio.create_task(test_client.post("/orders/1/pay"))
    await gate.entered.wait()
    assert await client.lock("order:1").is_locked()
    request.cancel()  # the client closes its connection
    with pytest.raises(asyncio.CancelledError):
        await request
    async with asyncio.timeout(10):
        await gate.left.wait()  # the handler was cancelled
    assert not await client.lock("order:1").is_locked()
    assert not gate.opened.is_set()
    gate.opened.set()
    assert (await test_client.post("/orders/1/pay")).status == 200


async def test_without_handler_cancellation_the_lock_is_held_until_the_handler_ends(
    client: aiolock.AioLock,
) -> None:
    """aiohttp's default (``web.run_app``, ``AppRunner``): a handler whose client went away
    runs on, and holds its lock until it ends."""
    gate = Gate()
    runner = web.AppRunner(order_app(client, gate))
    await runner.setup()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        async with aiohttp.ClientSession() as session:
            request = asyncio.create_task(session.post(f"http://127.0.0.1:{port}/orders/1/pay"))
            await gate.entered.wait()
            request.cancel()
            with pytest.raises(asyncio.CancelledError):
                await request
        await asyncio.sleep(0.2)
        assert not gate.left.is_set()
        assert await client.lock("order:1").is_locked()  # the handler still runs
        gate.opened.set()
        async with asyncio.timeout(10):
            await gate.left.wait()
        for _ in range(100):  # the release follows the handler's end
            if not await client.lock("order:1").is_locked():
                break
            await asyncio.sleep(0.05)
        assert not await client.lock("order:1").is_locked()
    finally:
        await runner.cleanup()


async def test_a_worker_in_the_app_with_the_default_client(client: aiolock.AioLock) -> None:
    """A background worker started by the app (``cleanup_ctx``) whose job function is
    decorated with ``aiolock.locked`` (the process default client, configured at startup):
    a handler that wants the same account waits for the job to finish."""
    log: list[str] = []
    job_started = asyncio.Event()

    @aiolock.locked("account:{account}")
    async def settle(account: str, *, seconds: float) -> None:
        log.append(f"settle {account}")
        job_started.set()
        await asyncio.sleep(seconds)
        log.append(f"settled {account}")

    @aiolock.locked("account:{request.match_info[account]}", wait_time=10)
    async def balance(request: web.Request) -> web.Response:
        log.append(f"balance {request.match_info['account']}")
        return web.json_response(log)

    async def worker(app: web.Application) -> AsyncIterator[None]:
        aiolock.configure(client)
        task = asyncio.create_task(settle("a", seconds=0.3))
        yield
        await task
        aiolock.configure(aiolock.default.DEFAULT_URL)

    app = web.Application()
    app.cleanup_ctx.append(worker)
    app.router.add_get("/accounts/{account}/balance", balance)
    async with TestClient(TestServer(app)) as test_client:
        await job_started.wait()
        response = await test_client.get("/accounts/a/balance")
        assert await response.json() == ["settle a", "settled a", "balance a"]
