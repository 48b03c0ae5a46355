"""The flash sale as an aiohttp app; the aiolock client lives in the app's ``cleanup_ctx``.

``POST /buy/{user_id}`` answers 200 with the order, 409 when sold out or already bought,
and 429 when a lock stays busy longer than ``WAIT_TIME``. ``GET /sale`` shows the stock.

The sale's keys live under ``aiolock-example:aiohttp:seckill``; the last instance to stop
deletes them. Run it (``PORT`` defaults to 8080)::

    pip install -e '.[examples]'
    REDIS_URL=redis://localhost:6379/0 python -m examples.aiohttp_app.app
    curl -X POST localhost:8080/buy/alice
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import asdict

from aiohttp import web

import aiolock
from examples.seckill import AlreadyBought, CouponSale, SoldOut

SALE_NAME = "aiolock-example:aiohttp:seckill"
"""Every key of the sale starts with this."""

SALE = web.AppKey("sale", CouponSale)
WAIT_TIME = 0.5
"""Seconds a request waits for a busy lock before answering 429."""


async def buy(request: web.Request) -> web.Response:
    sale = request.app[SALE]
    try:
        order = await sale.buy(request.match_info["user_id"], wait_time=WAIT_TIME)
    except (SoldOut, AlreadyBought) as exc:
        return web.json_response({"detail": str(exc)}, status=409)
    except aiolock.LockTimeout:
        return web.json_response({"detail": "busy, try again"}, status=429)
    return web.json_response(asdict(order))


async def sale_state(request: web.Request) -> web.Response:
    sale = request.app[SALE]
    return web.json_response({"stock": await sale.stock(), "orders": await sale.orders()})


def create_app(redis_url: str | None = None, coupons: int = 100) -> web.Application:
    """An app selling ``coupons`` coupons, on Redis at ``redis_url`` (default $REDIS_URL)."""
    url = redis_url or os.environ.get("REDIS_URL", "redis://localhost:6379/0")

    async def open_sale(app: web.Application) -> AsyncIterator[None]:
        client = aiolock.from_url(url)  # the code before yield runs at startup...
        try:
            sale = app[SALE] = CouponSale(client, SALE_NAME)
            await sale.open(coupons)
            try:
                yield
            finally:
                await sale.close()  # ...and this at cleanup: the last instance deletes the keys
        finally:
            await client.aclose()

    app = web.Application()
    app.cleanup_ctx.append(open_sale)
    app.router.add_post("/buy/{user_id}", buy)
    app.router.add_get("/sale", sale_state)
    return app


if __name__ == "__main__":
    web.run_app(create_app(), host="127.0.0.1", port=int(os.environ.get("PORT", "8080")))
