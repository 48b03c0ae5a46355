"""The watchdog: renews the holds of one client taken without a lease, in batches of one
script call per slot, and tells the lease registry what each renewal found (see the
docstring of :mod:`aiolock.leases` for the process-wide renewal map)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import threading
from collections.abc import Coroutine, Hashable
from typing import Any, Protocol

from .config import Config
from .errors import LockLostError
from .holds import (
    Hold,
    HoldState,
    describe_failure,
)
from .keys import key_slot
from .metrics import Metrics
from .scripts import Script
from .transport import ErrorReply, OutcomeUnknown, Transport

logger = logging.getLogger("aiolock")
watchdog_logger = logging.getLogger("aiolock.watchdog")

#: holds renewed by one script call at most
BATCH = 100

# -- the watchdog ------------------------------------------------------------------------------


class Registry(Protocol):
    """What the watchdog needs of the lease registry (:class:`aiolock.leases.Leases`): the
    holds, their server epochs, and the transitions a renewal's outcome makes."""

    holds: dict[tuple[str, str], Hold]
    metrics: Metrics | None

    @property
    def epoch(self) -> int: ...

    def epoch_of(self, hold: Hold) -> int: ...

    def stale(self, hold: Hold, epoch: int) -> bool: ...

    def change_of(self, hold: Hold) -> str: ...

    def current(self, hold: Hold) -> Hold: ...

    def confirmed(self, hold: Hold, sent_at: float, lease_ms: int) -> None: ...

    def lose(
        self, hold: Hold, reason: str, *, cleanup: bool = True, used: int = 0
    ) -> LockLostError: ...


#: the process-wide expiration-renewal map: client id -> that client's map (see the docstring)
RENEWALS: dict[str, dict[tuple[str, str], Hold]] = {}
_RENEWALS_LOCK = threading.Lock()


class Watchdog:
    """The renewal task of one client (see the module docstring)."""

    def __init__(self, client_id: str, leases: Registry, transport: Transport, config: Config):
        self._client_id = client_id
        self._leases = leases
        self._transport = transport
        self.period = config.watchdog_timeout / 3
        self.tick = max(self.period / 10, 0.005)
        self._retry_delay = (config.reconnect_delay, config.reconnect_max_delay)
        #: the rounds checking every hold after a server change (Leases.server_changed)
        self._checks: set[asyncio.Task[None]] = set()
        self._lease_ms = max(1, round(config.watchdog_timeout * 1000))
        self._map: dict[tuple[str, str], Hold] = {}
        self._closed = False
        self._queue: list[tuple[float, int, Hold]] = []
        #: holds added since the last tick and when their lease was set: most are released
        #: long before their first renewal, and never enter the queue (a released one leaves
        #: at once: kept until the tick, it kept its Hold alive through young collections)
        self._fresh: dict[Hold, float] = {}
        self._order = itertools.count()
        self._task: asyncio.Task[None] | None = None
        #: renewal script calls made (each renews up to BATCH holds)
        self.calls = 0
        self._warned_at = -math.inf

    @property
    def renewing(self) -> int:
        return len(self._map)

    def add(self, hold: Hold, sent_at: float) -> None:
        if self._closed:
            return
        if self._map is not RENEWALS.get(self._client_id):
            with _RENEWALS_LOCK:  # in the process-wide map from its first hold until closed
                RENEWALS[self._client_id] = self._map
        self._map[(hold.name, hold.owner.id)] = hold
        hold.due = sent_at + self.period
        self._fresh[hold] = sent_at
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def remove(self, hold: Hold) -> None:
        key = (hold.name, hold.owner.id)
        if self._map.get(key) is hold:
            del self._map[key]
        self._fresh.pop(hold, None)
        hold.due = math.inf

    def _leave(self) -> None:
        with _RENEWALS_LOCK:
            if RENEWALS.get(self._client_id) is self._map:
                del RENEWALS[self._client_id]

    def _schedule(self, hold: Hold, when: float) -> None:
        hold.due = when
        heapq.heappush(self._queue, (when, next(self._order), hold))

    def _serves(self, hold: Hold) -> bool:
        return self._map.get((hold.name, hold.owner.id)) is hold

    async def _run(self) -> None:
        """Renew while there are holds; with none, linger a period before ending (a loop of
        lock and unlock would otherwise start a task per hold)."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not self._map:
                    await asyncio.sleep(self.period)
                    if not self._map:
                        return
                try:
                    await self._sleep_until_due(loop)
                    await self._renew_due(loop)
                except Exception:  # never expected; the renewal task must not die
                    watchdog_logger.exception("aiolock watchdog: a renewal round failed")
                    await asyncio.sleep(self.tick)
        finally:
            self._task = None

    def _promote(self) -> None:
        """Queue the fresh holds still held (each is due a period after it was taken)."""
        fresh, self._fresh = self._fresh, {}
        for hold, sent_at in fresh.items():
            if self._serves(hold) and hold.due == sent_at + self.period:
                self._schedule(hold, hold.due)

    async def _sleep_until_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """Sleep until the earliest renewal is due, a tick at a time (holds added meanwhile
        join the queue each tick)."""
        self._promote()
        queue = self._queue
        while queue:
            when, _, hold = queue[0]
            if hold.due != when or not self._serves(hold):
                heapq.heappop(queue)  # released, lost or rescheduled since
                continue
            wait = when - loop.time()
            if wait <= 0:
                return
            await asyncio.sleep(min(wait, self.tick))
            self._promote()
        if not queue:
            await asyncio.sleep(self.tick)

    async def _renew_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """Renew every hold due within the next tick, grouped per script and batch key."""
        now = loop.time()
        horizon = now + self.tick
        groups: dict[tuple[Script, Hashable], list[Hold]] = {}
        last: list[Coroutine[Any, Any, None]] = []
        queue = self._queue
        while queue and queue[0][0] <= horizon:
            when, _, hold = heapq.heappop(queue)
            if hold.due != when or not self._serves(hold) or hold.renewal is None:
                continue
            if self._leases.current(hold).state is not HoldState.HELD:
                continue  # its deadline passed unconfirmed: lost, not renewed
            if self._near_cap(hold, now):
                # max_hold: the last renewal, carrying the lease up to the cap and no
                # further; the hold is never renewed again, and its lease runs out then
                hold.capped = True
                hold.due = math.inf
                left = math.floor((hold.cap - now) * 1000)
                if left >= 1:
                    last.append(self._renew(hold.renewal.script, [hold], final_ms=left))
                continue
            batch = (hold.renewal.script, self._transport.batch_key(hold.renewal.key))
            groups.setdefault(batch, []).append(hold)
        chunks = [
            (script, holds[start : start + BATCH])
            for (script, _), holds in groups.items()
            for start in range(0, len(holds), BATCH)
        ]
        if chunks or last:
            await asyncio.gather(*(self._renew(script, holds) for script, holds in chunks), *last)

    def _near_cap(self, hold: Hold, now: float) -> bool:
        """Whether a renewal now would carry ``hold``'s lease past its cap (max_hold)."""
        return hold.capped or (hold.cap - now) * 1000 < self._lease_ms

    async def _renew(
        self,
        script: Script,
        holds: list[Hold],
        lease_ms: int | None = None,
        *,
        final_ms: int | None = None,
    ) -> None:
        """Renew ``holds`` (all renewed by ``script``) in one call; with ``lease_ms``, check
        one hold that has a lease_time instead: the script then extends its lease to what
        is left of it, which changes nothing where the hold is, and renews nothing. With
        ``final_ms``, make one hold's last renewal (max_hold), to that lease: confirmed,
        never scheduled again."""
        loop = asyncio.get_running_loop()
        leases = self._leases
        checking = lease_ms is not None
        lease = lease_ms or final_ms or self._lease_ms
        how = (hold.check if checking else hold.renewal for hold in holds)
        keys = tuple(renewal.key for renewal in how if renewal is not None)
        args = (lease, *(hold.field for hold in holds))
        packed = script.command(keys, args)
        self.calls += 1
        sent_at = loop.time()
        epoch = leases.epoch
        try:
            call = await self._transport.send(packed, key=keys[0])
            epoch = call.epoch
            replies = await call.future
        except Exception as exc:  # NotSent, or anything unforeseen: try again next tick
            replies = exc
        metrics = leases.metrics if not checking else None
        if type(replies) is ErrorReply and replies.code == "CROSSSLOT" and len(holds) > 1:
            # Refused before it ran: a server that did not say it is a cluster node (a
            # proxy in front of one). Per slot from now on, and this batch again at once.
            if not self._transport.by_slot:
                self._transport.refused_cross_slot()
                watchdog_logger.warning(
                    "aiolock watchdog: the server refused a renewal across hash slots "
                    "(CROSSSLOT): renewing per slot from now on. Is it a cluster behind a "
                    "proxy? A redis+cluster:// URL would route by slot"
                )
            slots: dict[Hashable, list[Hold]] = {}
            for hold in holds:
                if hold.renewal is not None:
                    slots.setdefault(key_slot(hold.renewal.key), []).append(hold)
            if len(slots) > 1:
                await asyncio.gather(*(self._renew(script, group) for group in slots.values()))
                return
        # the reply of a server that is not the one serving them now
        stale = any(leases.stale(hold, epoch) for hold in holds)
        if isinstance(replies, ErrorReply | OutcomeUnknown | Exception) or stale:
            if not stale:
                self._warn(
                    f"renewing {len(holds)} lock(s) failed ({describe_failure(replies)}); "
                    "trying again next tick, and a hold whose lease runs out first is "
                    "reported lost"
                )
            for hold in holds:
                if self._serves(hold) and not checking:
                    if metrics is not None and not stale:
                        metrics.renewal(hold.kind, hold.name, False)
                    if final_ms is None:
                        self._schedule(hold, loop.time() + self.tick)
            return
        for hold, renewed in zip(holds, replies, strict=True):
            if checking and hold.state is not HoldState.HELD:
                continue
            if not checking and not self._serves(hold):
                continue  # released (or lost) meanwhile
            if metrics is not None:
                metrics.renewal(hold.kind, hold.name, renewed == 1)
            if renewed == 1:
                hold.epoch = epoch  # it is there, on the server of this epoch
                if final_ms is not None:
                    leases.confirmed(hold, sent_at, final_ms)
                elif not checking:
                    leases.confirmed(hold, sent_at, self._lease_ms)
                    self._schedule(hold, sent_at + self.period)
            elif hold.epoch < leases.epoch_of(hold):
                leases.lose(hold, f"{leases.change_of(hold)}, and the lock is not there")
            else:
                why = "the key is not a lock any more" if renewed == -1 else "gone"
                leases.lose(hold, f"the watchdog found the lock {why} (expired or force-unlocked)")

    # -- after a server change ---------------------------------------------------------------

    def revalidate(self, epoch: int) -> None:
        """Check every hold whose server changed since its last check, now (see the module
        docstring); ``epoch`` is the latest."""
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._revalidate(epoch))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _revalidate(self, epoch: int) -> None:
        """Check the holds not checked since their server changed, in the watchdog's
        batches (renewing those it renews), until each is checked or lost, or a server
        changes again (a newer round takes over: epoch ``epoch`` is over); a check that
        failed is tried again with backoff."""
        loop = asyncio.get_running_loop()
        leases = self._leases
        delay, max_delay = self._retry_delay
        try:
            while not self._closed and leases.epoch == epoch:
                pending = [
                    hold
                    for hold in list(leases.holds.values())
                    if hold.epoch < leases.epoch_of(hold)
                    and leases.current(hold).state is HoldState.HELD
                ]
                if not pending:
                    return
                groups: dict[tuple[Script, Hashable], list[Hold]] = {}
                calls: list[Coroutine[Any, Any, None]] = []
                now = loop.time()
                for hold in pending:
                    if (
                        hold.renewal is not None
                        and self._serves(hold)
                        and not self._near_cap(hold, now)
                    ):
                        batch = (hold.renewal.script, self._transport.batch_key(hold.renewal.key))
                        groups.setdefault(batch, []).append(hold)
                    elif hold.check is None:
                        leases.lose(
                            hold, f"{leases.change_of(hold)}, and the lock cannot be checked"
                        )
                    else:
                        left = math.floor((hold.deadline - loop.time()) * 1000)
                        if left >= 1:  # else its deadline marks it lost
                            calls.append(self._renew(hold.check.script, [hold], left))
                calls.extend(
                    self._renew(script, holds[start : start + BATCH])
                    for (script, _), holds in groups.items()
                    for start in range(0, len(holds), BATCH)
                )
                await asyncio.gather(*calls)
                if any(
                    hold.epoch < leases.epoch_of(hold) and hold.state is HoldState.HELD
                    for hold in pending
                ):
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, max_delay)
        except Exception:  # never expected; the watchdog's own ticks still renew
            watchdog_logger.exception("aiolock watchdog: checking the holds after a change failed")

    def _warn(self, message: str) -> None:
        """Log a failure: a warning at most once per renewal period, the rest at debug
        level (a slow server fails every batch of a tick at once)."""
        now = asyncio.get_running_loop().time()
        if now - self._warned_at >= self.period:
            self._warned_at = now
            watchdog_logger.warning("aiolock watchdog: %s", message)
        else:
            watchdog_logger.debug("aiolock watchdog: %s", message)

    def close(self) -> None:
        """Stop renewing anything and leave the process-wide map."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        for task in self._checks:
            task.cancel()
        self._map.clear()
        self._queue.clear()
        self._fresh.clear()
        self._leave()

    async def wait_closed(self) -> None:
        task = self._task
        if task is not None:
            try:
                await task
            except asyncio.CancelledError:
                pass
