"""FastAPI: the dependency that holds a lock for a request (``lock_dependency``) and the
``locked`` decorator on endpoints, driven through httpx's ASGITransport against a real
Redis.

No ``from __future__ import annotations``: FastAPI evaluates an endpoint's annotations in
its module's globals, and these endpoints name local variables (the decorated endpoint's
test writes its annotations as strings on purpose)."""

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

import pytest

pytest.importorskip("fastapi", reason="the examples extra is not installed")

import httpx
from fastapi import BackgroundTasks, Depends, FastAPI, Path, Request
from fastapi.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

import aiolock
from aiolock.fastapi import BUSY


@asynccontextmanager
async def http_client(
    app: Any, *, raise_app_exceptions: bool = True
) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
    async with httpx.AsyncClient(transport=transport, base_url="http://shop") as http:
        yield http


class Gate:
    """Holds requests inside their endpoint until opened: ``entered`` tells that one is in."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()

    async def pass_(self) -> None:
        self.entered.set()
        async with asyncio.timeout(20):
            await self.opened.wait()


def order_app(locks: aiolock.AioLock, gate: Gate, **options: Any) -> FastAPI:
    app = FastAPI()
    OrderLock = Annotated[
        aiolock.Lock, Depends(locks.lock_dependency("order:{order_id}", **options))
    ]

    @app.post("/orders/{order_id}/pay")
    async def pay(order_id: str, lock: OrderLock) -> dict[str, Any]:
        await gate.pass_()
        return {"order": order_id, "lock": lock.name, "held": await lock.is_held_by_current_task()}

    return app


async def test_two_requests_for_one_order_one_gets_the_lock_the_other_429(
    client: aiolock.AioLock,
) -> None:
    gate = Gate()
    async with http_client(order_app(client, gate)) as http:
        first = asyncio.create_task(http.post("/orders/1/pay"))
        await gate.entered.wait()
        busy = await http.post("/orders/1/pay")
        gate.opened.set()  # other orders pass straight through now
        other = await http.post("/orders/2/pay")
        done = await first

    assert busy.status_code == 429
    assert busy.json() == {"detail": BUSY}
    assert busy.headers["retry-after"] == "1"
    assert done.status_code == 200
    assert done.json() == {"order": "1", "lock": "order:1", "held": True}
    assert other.status_code == 200
    assert not await client.lock("order:1").is_locked()
    assert client.statistics().holds.get("held", 0) == 0


@pytest.mark.parametrize(
    ("options", "status", "detail", "retry_after"),
    [
        ({"status_code": 409}, 409, BUSY, "1"),
        ({"status_code": 423, "detail": {"code": "locked"}}, 423, {"code": "locked"}, "1"),
        ({"retry_after": None}, 429, BUSY, None),
        ({"retry_after": 2.5}, 429, BUSY, "3"),
    ],
)
async def test_the_answer_to_a_busy_lock_is_configurable(
    client: aiolock.AioLock,
    make_client: Callable[..., aiolock.AioLock],
    options: dict[str, Any],
    status: int,
    detail: Any,
    retry_after: str | None,
) -> None:
    gate = Gate()
    gate.opened.set()
    async with http_client(order_app(client, gate, **options)) as http:
        async with make_client().lock("order:1"):
            busy = await http.post("/orders/1/pay")
    assert busy.status_code == status
    assert busy.json() == {"detail": detail}
    assert busy.headers.get("retry-after") == retry_after


async def test_with_wait_time_a_request_waits_for_the_lock(client: aiolock.AioLock) -> None:
    gate = Gate()
    async with http_client(order_app(client, gate, wait_time=20)) as http:
        first = asyncio.create_task(http.post("/orders/1/pay"))
        await gate.entered.wait()
        gate.entered.clear()
        second = asyncio.create_task(http.post("/orders/1/pay"))
        await asyncio.sleep(0.2)
        assert not gate.entered.is_set()  # the second one waits outside
        gate.opened.set()
        responses = await asyncio.gather(first, second)
    assert [r.status_code for r in responses] == [200, 200]


async def test_path_and_query_parameters_name_the_lock(client: aiolock.AioLock) -> None:
    """Path parameters as Starlette's convertors make them (``{item_id:int}``: 007 is 7),
    then query parameters; a function of the request for anything else."""
    app = FastAPI()
    by_template = locks_dep = client.lock_dependency("item:{item_id}:{region}")
    by_header = client.lock_dependency(lambda request: f"user:{request.headers['x-user']}")

    @app.get("/items/{item_id:int}")
    async def item(item_id: int, lock: Annotated[aiolock.Lock, Depends(locks_dep)]) -> str:
        return lock.name

    @app.get("/me")
    async def me(lock: Annotated[aiolock.Lock, Depends(by_header)]) -> str:
        return lock.name

    async with http_client(app) as http:
        named = await http.get("/items/007", params={"region": "eu"})
        missing = await http.get("/items/7")
        user = await http.get("/me", headers={"x-user": "ann"})

    assert by_template is locks_dep
    assert named.json() == "item:7:eu"
    assert missing.status_code == 422
    assert "'item:{item_id}:{region}' needs 'region'" in missing.json()["detail"]
    assert user.json() == "user:ann"
    assert client.statistics().holds.get("held", 0) == 0


async def test_a_request_that_names_no_usable_lock_is_answered_422(
    client: aiolock.AioLock,
) -> None:
    """A path or query value that makes the template's name unusable (a '}' with no '{':
    its side keys would straddle cluster slots; every deployment refuses it) is the
    request's fault: 422 saying why, as for a missing value, not a 500 from the ValueError
    the lock factory raises; nothing is written."""
    app = FastAPI()
    dep = client.lock_dependency("item:{item_id}:{region}")

    @app.get("/items/{item_id}")
    async def item(item_id: str, lock: Annotated[aiolock.Lock, Depends(dep)]) -> str:
        return lock.name

    async with http_client(app, raise_app_exceptions=False) as http:
        by_path = await http.get("/items/a%7Db", params={"region": "eu"})
        by_query = await http.get("/items/7", params={"region": "e}u"})
        fine = await http.get("/items/7", params={"region": "eu"})

    for answer in (by_path, by_query):
        assert answer.status_code == 422, answer.text
        assert "lock name" in answer.json()["detail"]
    assert fine.json() == "item:7:eu"
    assert client.statistics().holds.get("held", 0) == 0


# -- when the lock is released ------------------------------------------------------------


def recording(app: FastAPI, probe: aiolock.Lock, seen: list[tuple[str, bool]]) -> Any:
    """``app``, noting whether ``probe`` is locked when the response starts and when its
    last body part goes out."""

    async def recorder(scope: Scope, receive: Receive, send: Send) -> None:
        async def send_and_note(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen.append(("response starts", await probe.is_locked()))
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                seen.append(("response ends", await probe.is_locked()))
            await send(message)

        await app(scope, receive, send_and_note)
        seen.append(("app returned", await probe.is_locked()))

    return recorder


@pytest.mark.parametrize(
    ("scope", "expected"),
    [
        (
            "request",
            [
                ("endpoint", True),
                ("response starts", True),
                ("response ends", True),
                ("background task", True),
                ("app returned", False),
            ],
        ),
        (
            "function",
            [
                ("endpoint", True),
                ("response starts", False),
                ("response ends", False),
                ("background task", False),
                ("app returned", False),
            ],
        ),
    ],
)
async def test_when_the_lock_is_released(
    client: aiolock.AioLock,
    make_client: Callable[..., aiolock.AioLock],
    scope: str,
    expected: list[tuple[str, bool]],
) -> None:
    """FastAPI's default (``scope="request"``): the dependency's exit, the release, runs
    after the response was sent and its background tasks ran. ``scope="function"``: when the
    endpoint returns, before the response starts."""
    probe = make_client().lock("order:1")
    seen: list[tuple[str, bool]] = []
    dependency = Depends(client.lock_dependency("order:{order_id}"), scope=scope)  # type: ignore[arg-type]
    app = FastAPI()

    @app.post("/orders/{order_id}/pay")
    async def pay(
        order_id: str, background: BackgroundTasks, lock: Annotated[aiolock.Lock, dependency]
    ) -> str:
        seen.append(("endpoint", await probe.is_locked()))

        async def after() -> None:
            seen.append(("background task", await probe.is_locked()))

        background.add_task(after)
        return "paid"

    async with http_client(recording(app, probe, seen)) as http:
        assert (await http.post("/orders/1/pay")).json() == "paid"
    assert seen == expected


# -- cancellation and loss ----------------------------------------------------------------


async def test_a_cancelled_request_releases_its_lock(client: aiolock.AioLock) -> None:
    """The request's task is cancelled inside the endpoint (a client gone away, a server
    shutting down): the lock is free at once and the next request gets it."""
    gate = Gate()
    async with http_client(order_app(client, gate)) as http:
        request = asyncio.create_task(http.post("/orders/1/pay"))
        await gate.entered.wait()
        assert await client.lock("order:1").is_locked()
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert not await client.lock("order:1").is_locked()
        gate.opened.set()
        assert (await http.post("/orders/1/pay")).status_code == 200
    assert client.statistics().holds.get("held", 0) == 0


async def test_a_lost_hold_cancels_the_endpoint_and_the_request_fails(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    locks = make_client(watchdog_timeout=0.6)
    steps: list[str] = []
    app = FastAPI()

    @app.post("/orders/{order_id}/pay")
    async def pay(
        order_id: str,
        lock: Annotated[aiolock.Lock, Depends(locks.lock_dependency("order:{order_id}"))],
    ) -> str:
        assert await make_client().lock(lock.name).force_unlock()
        await asyncio.sleep(30)  # the watchdog finds the lock gone: cancelled here
        steps.append("charged without the lock")
        return "paid"

    async with http_client(app, raise_app_exceptions=False) as http:
        response = await asyncio.wait_for(http.post("/orders/1/pay"), 20)
    assert response.status_code == 500
    assert steps == []


async def test_without_guard_a_lost_hold_fails_the_request_after_the_endpoint(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    """``guard=False`` and ``scope="function"``: the endpoint runs to its end; the release,
    before the response, finds the hold lost, and the request fails."""
    locks = make_client(watchdog_timeout=0.6)
    steps: list[str] = []
    app = FastAPI()
    dependency = Depends(locks.lock_dependency("order:{order_id}", guard=False), scope="function")

    @app.post("/orders/{order_id}/pay")
    async def pay(order_id: str, lock: Annotated[aiolock.Lock, dependency]) -> str:
        assert await make_client().lock(lock.name).force_unlock()
        await asyncio.sleep(0.6)  # past a renewal, which finds the lock gone
        steps.append("ran to its end")
        return "paid"

    async with http_client(app, raise_app_exceptions=False) as http:
        response = await http.post("/orders/1/pay")
    assert response.status_code == 500
    assert steps == ["ran to its end"]


# -- the decorator on endpoints -----------------------------------------------------------


async def test_a_decorated_endpoint_keeps_its_parameters(client: aiolock.AioLock) -> None:
    """FastAPI reads the decorated function's parameters (annotations written as strings
    here, as ``from __future__ import annotations`` makes them); validation comes first;
    a LockTimeout is answered by the app's exception handler."""
    gate = Gate()
    app = FastAPI()

    @app.exception_handler(aiolock.LockTimeout)
    async def busy(request: Request, exc: aiolock.LockTimeout) -> JSONResponse:
        return JSONResponse({"detail": f"{exc.name} is busy"}, status_code=409)

    @app.post("/orders/{order_id}/pay")
    @client.locked("order:{order_id}", wait_time=0)
    async def pay(order_id: "Annotated[int, Path(ge=1)]", note: "str" = "") -> "dict[str, Any]":
        await gate.pass_()
        return {"order": order_id, "note": note}

    async with http_client(app) as http:
        first = asyncio.create_task(http.post("/orders/1/pay", params={"note": "hi"}))
        await gate.entered.wait()
        busy_response = await http.post("/orders/1/pay")
        invalid = await http.post("/orders/0/pay")
        gate.opened.set()
        done = await first
        schema = (await http.get("/openapi.json")).json()

    assert done.json() == {"order": 1, "note": "hi"}
    assert (busy_response.status_code, busy_response.json()) == (409, {"detail": "order:1 is busy"})
    assert invalid.status_code == 422
    parameters = schema["paths"]["/orders/{order_id}/pay"]["post"]["parameters"]
    assert [(p["name"], p["in"], p["schema"]["type"]) for p in parameters] == [
        ("order_id", "path", "integer"),
        ("note", "query", "string"),
    ]


async def test_the_default_client_and_the_read_lock(client: aiolock.AioLock) -> None:
    """``aiolock.lock_dependency`` uses the process default client of each request; two
    readers of one report are inside at once."""
    aiolock.configure(client)
    try:
        app = FastAPI()
        inside = 0
        both = asyncio.Event()
        dependency = aiolock.lock_dependency("report:{name}", kind="read_lock")

        @app.get("/reports/{name}")
        async def report(name: str, lock: Annotated[aiolock.Lock, Depends(dependency)]) -> str:
            nonlocal inside
            inside += 1
            if inside == 2:
                both.set()
            async with asyncio.timeout(10):
                await both.wait()
            return type(lock).__name__

        async with http_client(app) as http:
            responses = await asyncio.gather(http.get("/reports/q1"), http.get("/reports/q1"))
        assert [r.json() for r in responses] == ["ReadLock", "ReadLock"]
    finally:
        aiolock.configure(aiolock.default.DEFAULT_URL)


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "options", "error"),
    [
        ("x", {"status_code": 200}, ValueError),
        ("x", {"status_code": "429"}, TypeError),
        ("x", {"retry_after": -1}, ValueError),
        ("x", {"wait_time": float("nan")}, ValueError),
        ("x", {"kind": "semaphore"}, ValueError),
        ("order:{order_id", {}, ValueError),
        ("order:{}", {}, ValueError),
        (42, {}, TypeError),
    ],
)
def test_bad_arguments_are_refused_when_the_dependency_is_made(
    name: Any, options: dict[str, Any], error: type[Exception]
) -> None:
    locks = aiolock.from_url("redis://127.0.0.1:1/0")  # never used: no connection is opened
    with pytest.raises(error):
        locks.lock_dependency(name, **options)


@pytest.mark.parametrize("retry_after", [-1, float("nan"), "1", True])
def test_a_bad_retry_after_is_named(retry_after: Any) -> None:
    """The error names retry_after, not wait_time (attack finding A5)."""
    locks = aiolock.from_url("redis://127.0.0.1:1/0")  # never used: no connection is opened
    with pytest.raises((TypeError, ValueError), match="retry_after"):
        locks.lock_dependency("x", retry_after=retry_after)


def test_without_fastapi_the_dependency_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "fastapi", None)
    with pytest.raises(ImportError, match="pip install fastapi"):
        aiolock.lock_dependency("x")
