"""The watchdog: keeps alive the leases of holds taken without ``lease_time``.

One expiration-renewal map for the process, keyed by (client id, lock name); its entries
hold every local owner's hold of that lock. Each client runs one renewal task while it has
entries. An entry is due a renewal ``watchdog_timeout / 3`` after its last one; due times are
rounded down to a tick (a tenth of that period), so entries due in the same tick share round
trips: up to ``BATCH`` holds are renewed by one script call.

Each renewal call is bounded by the earliest local deadline of its holds (asyncio.timeout;
scripts are never retried by the client's retry policy). A renewal that finds a hold gone
marks it lost; one that cannot be confirmed in time leaves the hold's own deadline timer to
mark it lost (see aiolock.holds). Entries leave the map on the final unlock, on
force_unlock, when their hold is lost, and when the client closes, so a renewal never
outlives the hold it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from . import scripts
from .holds import Hold

if TYPE_CHECKING:
    from .client import AioLock

logger = logging.getLogger("aiolock.watchdog")

BATCH = 100


class Renewal:
    """An entry of the expiration-renewal map: one lock of one client."""

    __slots__ = ("due", "holds", "key")

    def __init__(self, key: tuple[str, str]) -> None:
        self.key = key
        self.holds: dict[str, Hold] = {}
        self.due = 0


#: the process-wide expiration-renewal map: (client id, lock name) -> entry
RENEWALS: dict[tuple[str, str], Renewal] = {}


class Watchdog:
    """The renewal task of one client and its tick buckets."""

    def __init__(self, client: AioLock) -> None:
        self._client = client
        self.period = client.config.watchdog_timeout / 3
        self.tick = max(self.period / 10, 0.005)
        self._lease_ms = max(1, round(client.config.watchdog_timeout * 1000))
        self._buckets: dict[int, list[Renewal]] = {}
        self._task: asyncio.Task[None] | None = None
        self._batches: set[asyncio.Task[None]] = set()
        #: renewal script calls made (each renews up to BATCH holds)
        self.calls = 0
        self._warned_at = -math.inf

    def register(self, hold: Hold) -> None:
        """Keep ``hold`` renewed until it is unregistered or lost."""
        key = (self._client.id, hold.name)
        entry = RENEWALS.get(key)
        if entry is None:
            entry = RENEWALS[key] = Renewal(key)
            self._schedule(entry, asyncio.get_running_loop().time() + self.period)
        entry.holds[hold.owner] = hold
        hold.renewed = True
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def unregister(self, hold: Hold) -> None:
        key = (self._client.id, hold.name)
        entry = RENEWALS.get(key)
        if entry is not None and entry.holds.get(hold.owner) is hold:
            del entry.holds[hold.owner]
            if not entry.holds:
                del RENEWALS[key]

    async def aclose(self) -> None:
        """Stop renewing: cancel the task and in-flight batches, drop this client's entries."""
        tasks = [t for t in (self._task, *self._batches) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for key in [key for key in RENEWALS if key[0] == self._client.id]:
            del RENEWALS[key]
        self._buckets.clear()

    def _schedule(self, entry: Renewal, when: float) -> None:
        entry.due = math.floor(when / self.tick)
        self._buckets.setdefault(entry.due, []).append(entry)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._buckets:
                due = min(self._buckets)
                wait = due * self.tick - loop.time()
                if wait > 0:
                    # at most a tick at a time: a retry may land in an earlier bucket
                    await asyncio.sleep(min(wait, self.tick))
                    continue
                holds = [
                    hold
                    for entry in self._buckets.pop(due)
                    if RENEWALS.get(entry.key) is entry and entry.due == due
                    for hold in entry.holds.values()
                ]
                for hold in [hold for hold in holds if hold.lost is not None]:
                    self.unregister(hold)
                    holds.remove(hold)
                for start in range(0, len(holds), BATCH):
                    task = loop.create_task(self._renew(holds[start : start + BATCH]))
                    self._batches.add(task)
                    task.add_done_callback(self._batches.discard)
        finally:
            self._task = None

    async def _renew(self, holds: list[Hold]) -> None:
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        limit = min(hold.deadline for hold in holds) - sent_at
        keys = tuple(hold.name for hold in holds)
        args = (self._lease_ms, *(hold.owner for hold in holds))
        self.calls += 1
        try:
            if limit <= 0:
                raise TimeoutError
            async with asyncio.timeout(limit):
                replies = await self._client.run_script(scripts.LOCK_RENEW, keys, args)
        except (TimeoutError, scripts.OutcomeUnknown, scripts.NotSent, RedisError) as exc:
            self._warn(f"renewing {len(holds)} lock(s) failed: {exc!r}; retrying next tick")
            self._reschedule(holds, loop.time() + self.tick)
            return
        for hold, renewed in zip(holds, replies, strict=True):
            if hold.lost is not None or not self._serves(hold):
                continue
            if renewed:
                hold.confirm(sent_at)
            else:
                hold.mark_lost("the watchdog found the lock gone (expired or force-unlocked)")
                self.unregister(hold)
        self._reschedule(holds, sent_at + self.period)

    def _warn(self, message: str) -> None:
        """Log a failure: a warning at most once per renewal period, the rest at debug level
        (a slow server fails every batch of a tick at once)."""
        now = asyncio.get_running_loop().time()
        if now - self._warned_at >= self.period:
            self._warned_at = now
            logger.warning("aiolock watchdog: %s", message)
        else:
            logger.debug("aiolock watchdog: %s", message)

    def _serves(self, hold: Hold) -> bool:
        entry = RENEWALS.get((self._client.id, hold.name))
        return entry is not None and entry.holds.get(hold.owner) is hold

    def _reschedule(self, holds: list[Hold], when: float) -> None:
        seen: set[str] = set()
        for hold in holds:
            entry = RENEWALS.get((self._client.id, hold.name))
            if entry is not None and hold.name not in seen and entry.holds:
                seen.add(hold.name)
                self._schedule(entry, when)
        if self._buckets and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
