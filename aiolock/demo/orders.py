"""The order writers: a Redis Streams consumer group that moves queued orders into the database.

The Lua script only queues an order (XADD); writers in the group ``order-writers`` read entries
(XREADGROUP), store them (:mod:`aiolock.demo.db`) and acknowledge them (XACK) only after
the insert committed. Delivery is at least once: a writer that crashes before its XACK leaves
its entries pending, and on restart a writer first re-reads its own pending entries, then
claims (XAUTOCLAIM) those that other writers left idle. The insert is idempotent, so an order
stored once and delivered again is not stored twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from .db import Order, OrderStore

GROUP = "order-writers"

Entry = tuple[bytes, dict[bytes, bytes]]


async def create_group(redis: Redis, stream: str) -> None:
    """Create the consumer group (and the stream), from the stream's first entry on."""
    try:
        await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


@asynccontextmanager
async def writing_orders(
    redis: Redis, stream: str, store: OrderStore, writers: int = 2
) -> AsyncIterator[list[OrderWriter]]:
    """Run ``writers`` order writers while the body queues orders; on exit, let them store
    everything queued so far, then stop them."""
    await create_group(redis, stream)
    stop = asyncio.Event()
    group = [OrderWriter(redis, stream, store, f"writer-{n}") for n in range(1, writers + 1)]
    tasks = [asyncio.create_task(writer.run(stop)) for writer in group]
    try:
        yield group
    finally:
        stop.set()
        await asyncio.gather(*tasks)


class OrderWriter:
    """One consumer of the group.

    ``run(stop)`` recovers pending entries, then reads new ones until ``stop`` is set and a
    read comes back empty: everything queued before ``stop`` was set has then been stored.
    """

    def __init__(
        self,
        redis: Redis,
        stream: str,
        store: OrderStore,
        name: str,
        *,
        batch: int = 100,
        block_ms: int = 50,
        claim_idle_ms: int = 10_000,
    ) -> None:
        self.redis = redis
        self.stream = stream
        self.store = store
        self.name = name
        self.batch = batch
        self.block_ms = block_ms
        self.claim_idle_ms = claim_idle_ms
        self.delivered = 0
        """Entries this writer handled (redeliveries included)."""
        self.stored = 0
        """Orders this writer inserted (an order already in the table does not count)."""

    async def run(self, stop: asyncio.Event) -> None:
        await self.recover()
        while True:
            entries = await self._read(">", block=self.block_ms)
            if entries:
                await self._handle(entries)
            elif stop.is_set():
                return

    async def recover(self) -> None:
        """Handle this writer's own pending entries, then claim other writers' idle ones."""
        while entries := await self._read("0"):
            await self._handle(entries)
        start = "0-0"
        while True:
            start_id, entries, *_ = await self.redis.xautoclaim(
                self.stream, GROUP, self.name, self.claim_idle_ms, start, count=self.batch
            )
            if entries:
                await self._handle(entries)
            start = start_id.decode() if isinstance(start_id, bytes) else str(start_id)
            if start == "0-0":
                return

    async def _read(self, start: str, *, block: int | None = None) -> list[Entry]:
        reply: Any = await self.redis.xreadgroup(
            GROUP, self.name, {self.stream: start}, count=self.batch, block=block
        )
        return list(reply[0][1]) if reply else []

    async def _handle(self, entries: Sequence[Entry]) -> None:
        orders = [
            Order(fields[b"order_id"].decode(), int(fields[b"user_id"]))
            for _, fields in entries
            if fields  # an entry deleted while pending comes back without fields
        ]
        if orders:
            self.stored += await self.store.insert(orders)
        self.delivered += len(entries)
        await self.redis.xack(self.stream, GROUP, *(entry_id for entry_id, _ in entries))
