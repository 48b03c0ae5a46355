"""A FastAPI flash sale: one coupon per user, never oversold, however many instances run.

The aiolock client is opened in the lifespan and closed with ``await client.aclose()``. The
sale's keys live under ``aiolock-example:fastapi:seckill``; the last instance to stop deletes
them.

* ``POST /buy/{user_id}`` waits for the locks as long as it takes;
* ``POST /try-buy/{user_id}?wait=0.1`` waits at most ``wait`` seconds and answers
  429 Too Many Requests (with Retry-After) when a lock is still busy;
* both answer 200 with the order, or 409 Conflict when sold out or already bought;
* ``GET /sale`` shows the stock and the orders.

Run it (several instances may share one Redis)::

    pip install -e '.[examples]'
    REDIS_URL=redis://localhost:6379/0 uvicorn examples.fastapi_seckill.app:app
    curl -X POST localhost:8000/buy/alice
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request

import aiolock
from examples.seckill import AlreadyBought, CouponSale, SoldOut

SALE_NAME = "aiolock-example:fastapi:seckill"
"""Every key of the sale starts with this."""

router = APIRouter()


def get_sale(request: Request) -> CouponSale:
    """The sale opened by the lifespan."""
    sale: CouponSale = request.app.state.sale
    return sale


Sale = Annotated[CouponSale, Depends(get_sale)]


@router.post("/buy/{user_id}")
async def buy(user_id: str, sale: Sale) -> dict[str, Any]:
    """Buy one coupon, waiting for the locks as long as it takes."""
    try:
        return asdict(await sale.buy(user_id))
    except (SoldOut, AlreadyBought) as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from exc


@router.post("/try-buy/{user_id}")
async def try_buy(
    user_id: str, sale: Sale, wait: Annotated[float, Query(ge=0, le=10)] = 0.1
) -> dict[str, Any]:
    """Buy one coupon, giving up with 429 when a lock stays busy for ``wait`` seconds."""
    try:
        return asdict(await sale.buy(user_id, wait_time=wait))
    except (SoldOut, AlreadyBought) as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from exc
    except aiolock.LockTimeout as exc:
        raise HTTPException(
            status_code=429, detail="busy, try again", headers={"Retry-After": "1"}
        ) from exc


@router.get("/sale")
async def sale_state(sale: Sale) -> dict[str, Any]:
    return {"stock": await sale.stock(), "orders": await sale.orders()}


def create_app(redis_url: str | None = None, coupons: int = 100) -> FastAPI:
    """An app selling ``coupons`` coupons, on Redis at ``redis_url`` (default $REDIS_URL)."""
    url = redis_url or os.environ.get("REDIS_URL", "redis://localhost:6379/0")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = aiolock.from_url(url)
        try:
            sale = app.state.sale = CouponSale(client, SALE_NAME)
            await sale.open(coupons)
            try:
                yield
            finally:
                await sale.close()  # the last instance to stop deletes the sale's keys
        finally:
            await client.aclose()

    app = FastAPI(title="aiolock flash sale", lifespan=lifespan)
    app.include_router(router)
    return app


app = create_app()
