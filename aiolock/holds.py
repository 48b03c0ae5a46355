"""What a client knows of one owner's hold on one lock, and how a hold is lost.

Every hold has a local deadline: the time its lease was last set on the server (measured
from when the acquire or renewal was *sent*, so the server's expiry is never earlier) plus the
lease, minus a small drift. A timer marks the hold lost when the deadline passes without a
confirmed renewal, so the holder learns no later than the server-side expiry. Lost holds run
their ``on_lost`` callbacks once.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from .errors import LockLostError

logger = logging.getLogger("aiolock")

#: the local deadline is this fraction of the lease (plus DRIFT_MIN) before the server's
DRIFT_FACTOR = 0.01
DRIFT_MIN = 0.002

LostCallback = Callable[[LockLostError], Any]


class Hold:
    """One owner's hold on one lock: its count, lease, local deadline and lost state."""

    __slots__ = (
        "_callbacks",
        "_timer",
        "count",
        "deadline",
        "lease_ms",
        "lost",
        "name",
        "owner",
        "renewed",
        "token",
    )

    def __init__(self, name: str, owner: str, lease_ms: int) -> None:
        self.name = name
        self.owner = owner
        self.count = 0
        self.lease_ms = lease_ms
        #: whether the watchdog keeps this hold's lease alive
        self.renewed = False
        #: the fencing token of a fenced lock's hold
        self.token: int | None = None
        self.deadline = 0.0
        self.lost: LockLostError | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._callbacks: list[LostCallback] = []

    def __repr__(self) -> str:
        state = "lost" if self.lost else f"count={self.count}"
        return f"<Hold {self.name!r} by {self.owner} {state}>"

    def confirm(self, sent_at: float) -> None:
        """The lease was set on the server by a command sent at ``sent_at`` (loop time)."""
        if self.lost is not None:
            return
        lease = self.lease_ms / 1000
        self.deadline = sent_at + lease - (lease * DRIFT_FACTOR + DRIFT_MIN)
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(self.deadline, self._expired)

    def _expired(self) -> None:
        self._timer = None
        reason = "no renewal was confirmed in time" if self.renewed else "its lease ran out"
        self.mark_lost(reason)

    def mark_lost(self, reason: str) -> None:
        """Mark the hold lost (once) and run its callbacks soon, outside the caller."""
        if self.lost is not None:
            return
        self.end()
        self.lost = LockLostError(
            f"lock {self.name!r} held by {self.owner} was lost: {reason}",
            name=self.name,
            owner=self.owner,
        )
        loop = asyncio.get_running_loop()
        for callback in self._callbacks:
            loop.call_soon(_run_callback, callback, self.lost)
        self._callbacks.clear()

    def add_callback(self, callback: LostCallback) -> Callable[[], None]:
        """Call ``callback(error)`` once when the hold is lost; returns a remover."""
        if self.lost is not None:
            asyncio.get_running_loop().call_soon(_run_callback, callback, self.lost)
            return lambda: None
        self._callbacks.append(callback)

        def remove() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return remove

    def end(self) -> None:
        """The hold is over (released or lost): stop its deadline timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _run_callback(callback: LostCallback, error: LockLostError) -> None:
    try:
        result = callback(error)
        if inspect.isawaitable(result):
            asyncio.ensure_future(result).add_done_callback(_log_failure)
    except Exception:
        logger.exception("aiolock: an on_lost callback failed")


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("aiolock: an on_lost callback failed", exc_info=task.exception())
