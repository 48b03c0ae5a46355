"""The spin lock (Redisson's RSpinLock): the reentrant lock without pub/sub. A waiter tries
again after a pause that grows, so no channel is subscribed and no release publishes."""

from __future__ import annotations

import asyncio
import random
import weakref
from collections import Counter
from collections.abc import Coroutine
from typing import Any

from . import acquire, scripts
from .errors import OutcomeUnknownError, RedisTimeoutError
from .holds import Owner
from .keys import check_seconds
from .lock import Lock, LockRule
from .rules import Attempt, Command
from .runtime import Runtime, RuntimeSource

#: a wait's last try goes out at least this long before the wait ends (none after it)
_LAST_TRY = 0.01

#: per client (its runtime), per name: its tasks pausing between tries now (they are its
#: waiting tasks)
_spinning: weakref.WeakKeyDictionary[Runtime, Counter[str]] = weakref.WeakKeyDictionary()


def spinning(runtime: Runtime) -> int:
    """How many tasks of a client (of its ``runtime``) are waiting for spin locks now (no
    Redis call)."""
    counts = _spinning.get(runtime)
    return 0 if counts is None else counts.total()


class SpinRule(LockRule):
    """The reentrant lock's hash and acquire; its releases publish nothing (and its channel
    is never subscribed: a spin lock runs the shared loop only for tries without waiting)."""

    kind = "spin_lock"

    __slots__ = ()

    def release(self, owner: str, lease_ms: int, count: int) -> Command:
        return scripts.SPIN_LOCK_RELEASE.command((self.name,), (lease_ms, owner, count))

    def purge(self, owner: str) -> Command:
        return scripts.SPIN_LOCK_PURGE.command((self.name,), (owner,))

    def force_unlock(self) -> Command:
        return scripts.SPIN_LOCK_FORCE_UNLOCK.command((self.name,), ())


class SpinLock(Lock):
    """A reentrant lock whose waiters never subscribe; get one with ``client.spin_lock(name)``.

    It is the :class:`Lock` in all but waiting (and Redisson's ``RSpinLock``: the same hash,
    so the two exclude each other on one name): a busy lock is tried again after a pause of
    ``initial_delay`` seconds, then of ``multiplier`` times the pause before plus a random
    jitter of up to 1 ms per try so far, at most ``max_delay`` (Redisson's defaults: 1 ms,
    x2, 128 ms), and never past the end of the wait. No channel per lock and no message per
    release: for very many locks, or a Redis without pub/sub. The price is a try per pause
    per waiter while the lock is busy, and a hand-off up to ``max_delay`` late.
    """

    __slots__ = ("_delays",)

    _rule_class = SpinRule

    def __init__(
        self,
        runtime: Runtime | RuntimeSource,
        name: str,
        *,
        initial_delay: float = 0.001,
        max_delay: float = 0.128,
        multiplier: float = 2.0,
        max_hold: float | None = None,
    ) -> None:
        super().__init__(runtime, name, max_hold=max_hold)
        first = check_seconds(initial_delay, "initial_delay", positive=True)
        most = check_seconds(max_delay, "max_delay", positive=True)
        if isinstance(multiplier, bool) or not isinstance(multiplier, int | float):
            raise TypeError(f"spin lock: multiplier must be a number, not {multiplier!r}")
        if most < first or not 1 <= multiplier < float("inf"):
            raise ValueError("spin lock: need initial_delay <= max_delay and multiplier >= 1")
        self._delays = (first, most, float(multiplier))

    def _acquisition(
        self, rt: Runtime, who: Owner, wait: float | None, lease_ms: int, renew: bool
    ) -> Coroutine[Any, Any, Attempt | None]:
        run = self._spin(who, wait, lease_ms, renew)
        metrics = rt.metrics
        if metrics is None or not metrics.recording():
            return run
        return metrics.acquisition(SpinRule.kind, self.name, run)

    async def _spin(
        self, owner: Owner, wait: float | None, lease_ms: int, renew: bool
    ) -> Attempt | None:
        """Try, pause, try again... until granted or ``wait`` seconds (None: no end) have
        passed. Each try is the shared loop's acquisition without waiting: bounded by
        command_timeout, cancellation-safe, and never subscribing."""
        runtime = self._runtime
        loop = asyncio.get_running_loop()
        until = None if wait is None else loop.time() + wait
        pause, most, multiplier = self._delays
        tries = 0
        counts: Counter[str] | None = None
        try:
            while True:
                rt = runtime.use().without_metrics()  # the whole acquisition is recorded once
                try:
                    grant = await acquire.acquire(
                        rt, self._rule, owner, wait=0.0, lease_ms=lease_ms, renew=renew
                    )
                except (OutcomeUnknownError, RedisTimeoutError):
                    # The try's reply was lost and could not be settled within the try's own
                    # bound (command_timeout); it is settled in the background, and the next
                    # try waits for that (the owner's turn on its hold). A wait_time goes on
                    # while it lasts, as the plain lock's does. (lock(), with no end, still
                    # raises: retried, a server that swallows everything would keep it
                    # trying for ever, where the plain lock raises.)
                    if until is None or loop.time() >= until - _LAST_TRY:
                        raise
                    grant = None
                if grant is not None:
                    return grant
                tries += 1
                sleep = pause if until is None else min(pause, until - _LAST_TRY - loop.time())
                if sleep <= 0:
                    return None
                if counts is None:
                    counts = _spinning.setdefault(runtime, Counter())
                    counts[self.name] += 1
                await asyncio.sleep(sleep)
                # Redisson's ExponentialBackOff: x multiplier, + up to 1 ms per try so far
                pause = min(most, pause * multiplier + random.random() * tries / 1000)
                if until is not None and loop.time() >= until:
                    return None
        finally:
            if counts is not None:
                counts[self.name] -= 1
                if counts[self.name] <= 0:
                    del counts[self.name]

    def _tasks_waiting(self, who: Owner) -> int:
        counts = _spinning.get(self._runtime)
        return 0 if counts is None else counts[self.name]
