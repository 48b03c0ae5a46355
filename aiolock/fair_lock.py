"""The fair lock (Redisson's RFairLock): first come, first served, across tasks, processes and
languages. A script and a rule on the shared acquisition loop.

Layout (Redisson's, so Java and Python services share one line of waiters):

* ``name``: the lock hash, as the reentrant lock's (owner id -> hold count, TTL = lease);
* ``redisson_lock_queue:{name}``: a list of the waiting owners, first in line first;
* ``redisson_lock_timeout:{name}``: a sorted set, owner -> deadline in Unix milliseconds on
  the clock of the client that wrote it;
* ``redisson_lock__channel:{name}:<owner>``: one channel per waiter. A release publishes ``0``
  to the first waiter in line only, so exactly one waiter wakes, the right one;
* ``aiolock_lock_alive:{name}`` (aiolock's own, beside Redisson's keys): a sorted set, owner
  -> Unix milliseconds on the server's clock until which that waiter is presumed alive. It
  lives at least one allowance past the last deadline in line (so the run-out heartbeats of
  waiters that all stopped at once still tell them dead) and empties with the line.

A waiter joins the tail of the line at its first attempt and the lock goes only to the first
in line. Each waiter has a *wait allowance* (its ``wait_time``, at most the lock's
``wait_allowance``, 10 s by default). Its deadline is Redisson's: that much past the deadline
of the one ahead of it (the first one's: past the end of the holder's lease). Its heartbeat
is aiolock's: each check sets it to its allowance from now, and a waiter checks at least
every quarter of its allowance. A waiter past its deadline, or whose heartbeat ran out, is
presumed dead and dropped when it reaches the head, so dead waiters keep a free lock one
allowance at most, however many. See :mod:`aiolock.scripts` ``fair_lock_acquire.lua`` and
``fragments/fair_line.lua``.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Coroutine
from typing import Any

from . import commands, scripts
from .config import check_max_hold
from .holds import HoldState, Owner, Renewal
from .keys import (
    PUBLISH,
    UNLOCK_MESSAGE,
    check_seconds,
    fair_alive_key,
    fair_queue_key,
    fair_timeout_key,
    to_millis,
)
from .lock import Lock, LockRule
from .rules import Attempt, Command, GiveUp
from .runtime import Runtime, RuntimeSource, runtime_of

#: the wait allowance of a waiter without ``wait_time`` (seconds), see :class:`FairLock`
DEFAULT_WAIT_ALLOWANCE = 10.0
#: allowances of attempts in progress remembered per lock object, at most (see give_up)
_REMEMBERED = 10_000

Clock = Callable[[], float]


class FairRule(LockRule):
    """The fair lock: the lock hash plus Redisson's queue and deadlines (same hash slot)."""

    kind = "fair_lock"

    __slots__ = (
        "_alive_key",
        "_allowances",
        "_queue_key",
        "_timeout_key",
        "allowance_ms",
        "clock",
    )

    def __init__(
        self,
        name: str,
        allowance_ms: int = to_millis(DEFAULT_WAIT_ALLOWANCE),
        clock: Clock = time.time,
    ) -> None:
        super().__init__(name)
        self._queue_key = fair_queue_key(name)
        self._timeout_key = fair_timeout_key(name)
        self._alive_key = fair_alive_key(name)
        self.renewal = Renewal(scripts.FAIR_LOCK_RENEW, name)
        #: the most any waiter's allowance may be (ms)
        self.allowance_ms = allowance_ms
        #: the wall clock (seconds) whose milliseconds go into the deadlines
        self.clock = clock
        #: owner -> the allowance its acquisition in progress waits in line with (the one
        #: piece of state: lock objects of one name and settings share the rule)
        self._allowances: dict[str, int] = {}

    def _keys(self) -> tuple[str, str, str, str, str]:
        return (self.name, self._queue_key, self._timeout_key, self._channel_key, self._alive_key)

    def _now(self) -> int:
        return int(self.clock() * 1000)

    def channel(self, owner: str) -> bytes:
        return f"{self._channel_key}:{owner}".encode()

    def allowance(self, wait_ms: int | None) -> int:
        """The wait allowance of an acquisition that may wait ``wait_ms`` (0: none; it tries
        once and never joins the line)."""
        if wait_ms is None:
            return self.allowance_ms
        return min(wait_ms, self.allowance_ms)

    def attempt(self, owner: str, lease_ms: int, wait_ms: int | None) -> Command:
        allowance = self.allowance(wait_ms)
        remembered = self._allowances
        if owner not in remembered and len(remembered) >= _REMEMBERED:
            del remembered[next(iter(remembered))]  # the oldest; its give-up moves nobody
        remembered[owner] = allowance
        return scripts.FAIR_LOCK_ACQUIRE.command(
            self._keys(), (lease_ms, owner, allowance, self._now(), UNLOCK_MESSAGE, PUBLISH)
        )

    def give_up(self, owner: str) -> GiveUp | None:
        allowance = self._allowances.pop(owner, None)
        if allowance == 0:
            return None  # it only tried, it never joined the line
        # Unknown (forgotten): leave the line without moving anyone up; deadlines behind it
        # then come later than they could, never sooner. Sent again while it cannot be known
        # to have run, for as long as its heartbeat could keep it in line (its allowance
        # after its last check, which was before now).
        part = (owner, allowance or 0)
        cmd = scripts.FAIR_LOCK_GIVE_UP.command(
            self._keys(), (UNLOCK_MESSAGE, *part, self._now(), PUBLISH)
        )
        return GiveUp(cmd, (allowance or self.allowance_ms) / 1000, part)

    def give_ups(self, parts: list[tuple[Any, ...]]) -> Command:
        """Many waiters of this client leave the line in one call (one pass over it)."""
        more = [value for part in parts[1:] for value in part]
        return scripts.FAIR_LOCK_GIVE_UP.command(
            self._keys(), (UNLOCK_MESSAGE, *parts[0], self._now(), PUBLISH, *more)
        )

    def acquiring(self) -> list[str]:
        """The owners whose acquisitions are under way (as far as remembered)."""
        return list(self._allowances)

    def forget(self, owner: str) -> None:
        """The acquisition of ``owner`` ended (granted, or given up already)."""
        self._allowances.pop(owner, None)

    def release(self, owner: str, lease_ms: int, count: int) -> Command:
        return scripts.FAIR_LOCK_RELEASE.command(
            self._keys(), (UNLOCK_MESSAGE, lease_ms, owner, self._now(), count, PUBLISH)
        )

    def purge(self, owner: str) -> Command:
        return scripts.FAIR_LOCK_PURGE.command(
            self._keys(), (UNLOCK_MESSAGE, owner, self._now(), PUBLISH)
        )

    def force_unlock(self) -> Command:
        return scripts.FAIR_LOCK_FORCE_UNLOCK.command(
            self._keys(), (UNLOCK_MESSAGE, self._now(), PUBLISH)
        )


@functools.lru_cache(maxsize=64)
def _rule_kind(allowance_ms: int, clock: Clock) -> Callable[[str], FairRule]:
    """The maker of fair rules with these settings: one per settings, so that the client
    shares one rule between lock objects of one name and the same settings."""
    if allowance_ms == to_millis(DEFAULT_WAIT_ALLOWANCE) and clock is time.time:
        return FairRule
    return functools.partial(FairRule, allowance_ms=allowance_ms, clock=clock)


class FairLock(Lock):
    """A reentrant lock handed out first come, first served; get one with
    ``client.fair_lock(name)``.

    Waiters of every task, process and language (Redisson's ``RFairLock`` shares the line) get
    the lock in the order they asked for it. Everything else is :class:`~aiolock.Lock`'s:
    reentrancy, leases and the watchdog, ``async with``, ``try_lock``, ``guard``, ``on_lost``.
    A ``try_lock()`` without ``wait_time`` never joins the line: it takes the lock only when
    it is free and nobody waits.

    Each waiter has a wait allowance: its ``wait_time``, at most ``wait_allowance`` (10 s by
    default; also the allowance of ``lock()``, which waits as long as it takes). It bounds
    what waiters that died (kill -9, a lost machine) cost the live ones behind them: a free
    lock is kept from a live waiter one allowance at most, however many dead waiters stand
    ahead of it. Every check of a waiter is its heartbeat, and it checks at least every
    quarter of its allowance; one whose heartbeat ran out is dropped. A live waiter keeps its
    place however long the holder keeps the lock; one stopped (or cut off from Redis) for
    most of its allowance loses it and joins the tail again when it runs again. A waiter that
    gives up (its wait ran out, it was cancelled) leaves the line at once; a give-up lost on
    the way is sent again until it is known to have run, for at most its allowance.

    The deadlines are Unix milliseconds on each client's clock (Redisson writes them so, and
    a mixed fleet shares them): clients whose clocks differ by less than the smallest wait
    allowance in use lose no place in line. Beyond that a waiter can be dropped early; it
    then joins the tail again at its next check. It never hangs, and mutual exclusion does not
    depend on clocks at all. ``clock`` (seconds, ``time.time`` by default) is that clock, to
    simulate a skewed client in tests.
    """

    __slots__ = ()

    _rule_class = FairRule

    def __init__(
        self,
        runtime: Runtime | RuntimeSource,
        name: str,
        *,
        wait_allowance: float | None = None,
        clock: Clock | None = None,
        max_hold: float | None = None,
    ) -> None:
        allowance_ms = to_millis(DEFAULT_WAIT_ALLOWANCE)
        if wait_allowance is not None:
            seconds = check_seconds(wait_allowance, "wait_allowance", positive=True)
            allowance_ms = to_millis(seconds)
        if clock is None:
            clock = time.time
        elif not callable(clock):
            raise TypeError(f"clock must be callable, not {type(clock).__name__}")
        self._runtime = runtime = runtime_of(runtime)
        self.name = name
        self._max_hold = None if max_hold is None else check_max_hold(max_hold)
        self._rule = runtime.rule(_rule_kind(allowance_ms, clock), name)

    @property
    def _fair_rule(self) -> FairRule:
        rule = self._rule
        assert isinstance(rule, FairRule)
        return rule

    @property
    def wait_allowance(self) -> float:
        """Seconds a waiter that died may hold up the line once the lock is free (at most)."""
        return self._fair_rule.allowance_ms / 1000

    def _grant(
        self,
        wait: float | None,
        lease_time: float | None,
        owner: Owner | None,
        max_hold: float | None = None,
    ) -> Coroutine[Any, Any, Attempt | None]:
        grant = super()._grant(wait, lease_time, owner, max_hold)
        return self._fair_grant(grant, self._owner(owner))

    async def _fair_grant(
        self, grant: Coroutine[Any, Any, Attempt | None], owner: Owner
    ) -> Attempt | None:
        try:
            return await grant
        finally:
            # the owner id the acquisition wrote (chosen once it had the owner's turn): the
            # hold's if granted, else what the owner writes next
            self._fair_rule.forget(self._runtime.use(closed_ok=True).leases.field(self.name, owner))

    def _tasks_waiting(self, who: Owner) -> int:
        # each waiter has a channel of its own: count the owners acquiring it whose wait
        # entry has a task parked (a task's acquisition has no hold record before its
        # grant: the rule knows the owners whose acquisitions are under way)
        pubsub = self._runtime.use().pubsub
        acquiring = set(self._fair_rule.acquiring())
        for hold in self._runtime.holds_of(self.name):
            if hold.state is HoldState.ACQUIRING:
                acquiring.add(hold.field)
        count = 0
        for field in acquiring:
            entry = pubsub.entry(self._rule.channel(field))
            if entry is not None and entry.parked:
                count += 1
        return count

    async def queue(self) -> list[tuple[str, float]]:
        """The owners waiting in line, first first, with their deadlines as Unix times
        (seconds; NaN: none), read from the server; waiters past their deadline included."""
        rule = self._fair_rule
        reply: Any = await commands.read(
            self._runtime.use(),
            self.name,
            "EVAL",
            _READ_QUEUE,
            2,
            rule._queue_key,
            rule._timeout_key,
            what="reading the queue",
        )
        owners, flat = reply
        deadlines = {flat[i]: float(flat[i + 1]) / 1000 for i in range(0, len(flat), 2)}
        return [(raw.decode(), deadlines.get(raw, math.nan)) for raw in owners]


_READ_QUEUE = (
    "return {redis.call('lrange', KEYS[1], 0, -1), redis.call('zrange', KEYS[2], 0, -1, "
    "'withscores')}"
)
