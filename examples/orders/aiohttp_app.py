"""Orders in aiohttp: handlers decorated with ``aiolock.locked``, the order's lock named from
``request.match_info``.

* ``POST /orders/{order_id}/pay``: ``@aiolock.locked(PREFIX +
  ":lock:order:{request.match_info[order_id]}", wait_time=0)``: a template reaches into the
  handler's ``request`` argument. A second payment of the order while one is in progress is
  answered 429 at once, a payment of a paid order 409.
* ``POST /orders/{order_id}/refund``: ``@aiolock.locked(lambda request: ..., wait_time=2)``,
  a function of the handler's arguments that returns the name.
* ``GET /orders/{order_id}`` reads the order.

A middleware answers a LockTimeout with 429. The aiolock client is opened in the app's
``cleanup_ctx`` and made the process default, which the decorated handlers look up at each
request. Every key starts with ``aiolock-example:orders:``; the app deletes them at cleanup.
Run it (``PORT`` defaults to 8080)::

    pip install -e '.[examples]'
    REDIS_URL=redis://localhost:6379/0 python -m examples.orders.aiohttp_app
    curl -X POST localhost:8080/orders/42/pay
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

import aiolock
from examples.orders import orders
from examples.orders.orders import PREFIX, AlreadyPaid, NotPaid, order_lock

LOCKS = web.AppKey("locks", aiolock.AioLock)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@aiolock.locked(PREFIX + ":lock:order:{request.match_info[order_id]}", wait_time=0)
async def pay(request: web.Request) -> web.Response:
    try:
        paid = await orders.pay(request.app[LOCKS].redis, request.match_info["order_id"])
    except AlreadyPaid as exc:
        return web.json_response({"detail": str(exc)}, status=409)
    return web.json_response(paid)


@aiolock.locked(lambda request: order_lock(request.match_info["order_id"]), wait_time=2)
async def refund(request: web.Request) -> web.Response:
    try:
        done = await orders.refund(request.app[LOCKS].redis, request.match_info["order_id"])
    except NotPaid as exc:
        return web.json_response({"detail": str(exc)}, status=409)
    return web.json_response(done)


async def order(request: web.Request) -> web.Response:
    redis = request.app[LOCKS].redis
    return web.json_response(await orders.state(redis, request.match_info["order_id"]))


@web.middleware
async def busy_is_429(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A decorated handler's lock stayed busy past its wait_time."""
    try:
        return await handler(request)
    except aiolock.LockTimeout:
        return web.json_response(
            {"detail": "busy, try again"}, status=429, headers={"Retry-After": "1"}
        )


def create_app(redis_url: str | None = None) -> web.Application:
    """The app, on Redis at ``redis_url`` (default $REDIS_URL)."""
    url = redis_url or os.environ.get("REDIS_URL", "redis://localhost:6379/0")

    async def open_locks(app: web.Application) -> AsyncIterator[None]:
        async with aiolock.from_url(url) as locks:  # at startup...
            app[LOCKS] = locks
            aiolock.configure(locks)  # what the decorated handlers use
            try:
                yield
            finally:
                await orders.clear(locks.redis)  # ...and at cleanup

    app = web.Application(middlewares=[busy_is_429])
    app.cleanup_ctx.append(open_locks)
    app.router.add_post("/orders/{order_id}/pay", pay)
    app.router.add_post("/orders/{order_id}/refund", refund)
    app.router.add_get("/orders/{order_id}", order)
    return app


if __name__ == "__main__":
    web.run_app(create_app(), host="127.0.0.1", port=int(os.environ.get("PORT", "8080")))
