"""Orders in FastAPI: the order's lock held for a request by aiolock's dependency, and by the
decorator around an endpoint.

* ``POST /orders/{order_id}/pay`` declares ``Depends(aiolock.lock_dependency(ORDER_LOCK))``:
  the order's lock is held for the request; a second payment of the order while one is in
  progress is answered 429 at once (``wait_time`` 0), a payment of a paid order 409.
* ``POST /orders/{order_id}/refund`` is decorated with ``@aiolock.locked(ORDER_LOCK,
  wait_time=2)``: it waits up to 2 s for the order's lock; the app answers the LockTimeout
  after that with 429.
* ``GET /orders/{order_id}`` reads the order (no lock needed).

The aiolock client is opened in the lifespan and made the process default
(``aiolock.configure``), which the dependency and the decorator look up at each request: the
routes are declared at import, before any client exists. Every key starts with
``aiolock-example:orders:``; the app deletes them when it stops. Run it::

    pip install -e '.[examples]'
    REDIS_URL=redis://localhost:6379/0 uvicorn examples.orders.fastapi_app:app
    curl -X POST localhost:8000/orders/42/pay
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

import aiolock
from examples.orders import orders
from examples.orders.orders import ORDER_LOCK, AlreadyPaid, NotPaid

router = APIRouter()


def get_redis(request: Request) -> orders.Client:
    """The Redis connection of the app's aiolock client (the lifespan opens it)."""
    locks: aiolock.AioLock = request.app.state.locks
    return locks.redis


Redis = Annotated[orders.Client, Depends(get_redis)]


@router.post(
    "/orders/{order_id}/pay",
    # The order's lock for the whole request: 429 (and Retry-After: 1) when it is busy.
    dependencies=[Depends(aiolock.lock_dependency(ORDER_LOCK))],
)
async def pay(order_id: str, redis: Redis) -> dict[str, str]:
    try:
        return await orders.pay(redis, order_id)
    except AlreadyPaid as exc:
        raise HTTPException(409, str(exc)) from exc


@router.post("/orders/{order_id}/refund")
@aiolock.locked(ORDER_LOCK, wait_time=2)  # the lock of this call's order_id
async def refund(order_id: str, redis: Redis) -> dict[str, str]:
    try:
        return await orders.refund(redis, order_id)
    except NotPaid as exc:
        raise HTTPException(409, str(exc)) from exc


@router.get("/orders/{order_id}")
async def order(order_id: str, redis: Redis) -> dict[str, str | int]:
    return await orders.state(redis, order_id)


async def busy(request: Request, exc: Exception) -> JSONResponse:
    """A decorated endpoint's lock stayed busy past its wait_time."""
    return JSONResponse(
        {"detail": "busy, try again"}, status_code=429, headers={"Retry-After": "1"}
    )


def create_app(redis_url: str | None = None) -> FastAPI:
    """The app, on Redis at ``redis_url`` (default $REDIS_URL)."""
    url = redis_url or os.environ.get("REDIS_URL", "redis://localhost:6379/0")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with aiolock.from_url(url) as locks:
            app.state.locks = locks
            aiolock.configure(locks)  # what aiolock.lock_dependency and aiolock.locked use
            try:
                yield
            finally:
                await orders.clear(locks.redis)  # the example leaves nothing behind

    app = FastAPI(title="aiolock orders", lifespan=lifespan)
    app.include_router(router)
    app.add_exception_handler(aiolock.LockTimeout, busy)
    return app


app = create_app()
