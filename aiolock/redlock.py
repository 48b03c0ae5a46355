"""The red lock: a lock held by a majority of independent Redis masters (the Redlock
algorithm; Redisson's deprecated ``RedissonRedLock``, with the validity time it lacks).

Each master has an ordinary lock of the same name; the red lock is held when a quorum of
them, ``N // 2 + 1``, is held by one owner (one :class:`~aiolock.Owner` id on every master,
see :mod:`aiolock.multilock`).

**Acquisition, in rounds.** A round tries every master at once (one task per master, never
one after another), each attempt waiting (pub/sub) at most the round's wait: a random slice
of 0.1-0.3 s of what is left of ``wait_time`` (the whole of it if less, none for
``wait_time=0``). The round ends

* as soon as a quorum is held, after a short grace for the attempts still running (as long
  again as the quorum took, at least 2 ms), which are then cancelled (the core undoes what a
  cancelled attempt took);
* as soon as a quorum is out of reach: too many masters refused or failed (fail fast);
* when it holds some masters but not a quorum and the others stay busy for a short random
  time (5-25 ms; "busy": the attempt waits for a holder's release, as opposed to a reply, a
  reconnection or an error still to come, which are waited for): holding a minority while
  waiting would block the others, and contenders that split the masters between them would
  wait for each other; waiting while holding nothing harms nobody, so that lasts the slice;
* when every attempt has ended.

A round that reached a quorum succeeds if the **validity** left is positive::

    validity = lease - elapsed - (lease * drift_factor + 2 ms)

where ``lease`` is ``lease_time`` (or the watchdog timeout), ``elapsed`` runs from the start
of the round, before any command was sent, and the last term allows for the masters' clocks
running at different speeds (``drift_factor`` = 1 %, the Redlock paper's figure; the core
uses the same margin for each member's own deadline). A failed round releases every master
it took, waits a random 0-50 ms (so that contenders that split the masters between them do
not meet again) and starts over while ``wait_time`` lasts. When failures alone (a master
down, paused past ``command_timeout``, a client closed) put the quorum out of reach, the
acquisition stops at once and raises. ``try_lock(wait_time=W)`` returns or raises within
``W + command_timeout``, paused masters included: nothing waits for a master that does not
answer once a quorum is held or out of reach.

**Holding and losing it.** Each master's lock is renewed by its own client's watchdog (or
expires with ``lease_time``). The red lock is lost when fewer than a quorum of its members
are still held: a member is lost when its renewal finds it gone or its lease runs out
unconfirmed (a master killed or paused for longer than the lease), or when its release
finds it gone (a master restarted empty). ``on_lost`` (once), ``guard()`` and ``unlock()``
report it, as for a multi-lock. ``unlock()`` releases every master held, in parallel, and
decides from what the releases report: a quorum of them found their master held, and it
was held to the end (the other masters are not an error: their member was lost or expires
unrenewed); fewer, and not even the unconfirmed releases could make up a quorum because
masters were found lost: LockLostError; only the unconfirmed ones could:
RedisOperationError (whether it was held to the end is not known). A round whose grants
reach a quorum in number but whose masters are not all still held at its end (one granted
early was lost meanwhile) is a failed round: it gives back what it took and the acquisition
goes on.

**What it does not guarantee.** A master that restarts without the key (no persistence, or
a failover to a replica that had not received it) lets a second owner gather a quorum while
the first still believes it holds the lock; so does a holder paused longer than its
validity (a GC pause, SIGSTOP). The renewal notices the first case at its next tick, and the
first owner's ``unlock()`` at the latest (its releases find the masters forgotten or taken);
nothing notices the second. Only a fencing token checked by the guarded resource closes
these gaps (see docs/multilock.md).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Awaitable, Sequence
from typing import Any

from .commands import cancel_allowance, cleanup_deadline, give_up_point
from .errors import (
    AioLockError,
    ClientClosedError,
    RedisOperationError,
)
from .holds import Owner
from .members import (
    Member,
    MemberLock,
    detach,
    member_stats,
    release_members,
    wait_shielded,
)
from .multilock import MultiLock

logger = logging.getLogger("aiolock")

#: the clock drift allowed for, as a fraction of the lease, plus DRIFT_MIN seconds
DRIFT_FACTOR = 0.01
DRIFT_MIN = 0.002
#: a round waits a random slice of this range (seconds) for masters held by others
ROUND_WAIT = (0.1, 0.3)
#: a failed round is followed by a random delay of at most this (seconds)
RETRY_DELAY = 0.05
#: attempts still running when a quorum is held get as long again as the quorum took, and
#: at least this (seconds), before they are cancelled
GRACE_MIN = 0.002
#: a round holding some masters but not a quorum, the others busy, gives them up after a
#: random wait in this range (seconds): waiting while holding a minority blocks the others
#: (contenders that split the masters between them would wait for each other)
MINORITY_WAIT = (0.005, 0.025)
#: how often a round holding a minority looks whether the other masters are busy (seconds)
MINORITY_POLL = 0.005

Attempts = dict["asyncio.Task[bool]", Member]


class RedLock(MultiLock):
    """A lock held by a quorum of independent Redis masters; get one with
    :func:`aiolock.red_lock`. See the module docstring for the algorithm and its limits."""

    __slots__ = ("_drift_factor", "_watchdog_timeout")

    _kind = "red lock"

    def __init__(
        self,
        locks: Sequence[MemberLock],
        *,
        name: str | None = None,
        drift_factor: float = DRIFT_FACTOR,
    ) -> None:
        if name is None and locks and not isinstance(locks, str):
            names = {getattr(lock, "name", None) for lock in locks}
            if len(names) == 1 and isinstance(next(iter(names)), str):
                name = next(iter(names))
        super().__init__(locks, name=name)
        addresses: dict[str, MemberLock] = {}
        for member in self._members:
            other = addresses.setdefault(member.server[0], member.lock)
            if other is not member.lock:
                raise ValueError(
                    f"{other!r} and {member.lock!r} are on the same server "
                    f"({member.server[0]}); a red lock needs independent masters"
                )
        if isinstance(drift_factor, bool) or not isinstance(drift_factor, int | float):
            raise TypeError(f"drift_factor must be a number, not {type(drift_factor).__name__}")
        if not 0 <= drift_factor < 1:
            raise ValueError(f"drift_factor must be in [0, 1), got {drift_factor!r}")
        self._drift_factor = float(drift_factor)
        self._watchdog_timeout = min(m.runtime.config.watchdog_timeout for m in self._members)

    @property
    def quorum(self) -> int:
        """How many masters must be held: a majority, ``N // 2 + 1``."""
        return len(self._members) // 2 + 1

    @property
    def drift_factor(self) -> float:
        return self._drift_factor

    # -- acquiring ------------------------------------------------------------------------

    async def _acquire(self, wait: float | None, lease: float | None, who: Owner) -> bool:
        loop = asyncio.get_running_loop()
        wait_until = None if wait is None else loop.time() + wait
        # a bound is when the call has returned: it gives up a margin before it (the core's)
        give_up_at = give_up_point(wait_until, self._bounds)
        while True:
            left = None if wait_until is None else max(0.0, wait_until - loop.time())
            slice_ = random.uniform(*ROUND_WAIT)
            round_wait = slice_ if left is None else min(left, slice_)
            took: list[Member] = []
            outcome = await self._round(who, round_wait, lease, give_up_at, took)
            if outcome is True:
                return True
            # can it ever be taken? (checked only now: nothing is looked up on the fast path;
            # a loss of what this round took is the round's own business, given back)
            self._check_usage(who, self._members, exclude=took)
            if isinstance(outcome, BaseException):
                raise outcome
            if wait_until is not None:
                left = wait_until - loop.time()
                if left <= 0:
                    return False
            delay = random.uniform(0, RETRY_DELAY)
            await asyncio.sleep(delay if left is None else min(delay, left))

    async def _round(
        self,
        who: Owner,
        wait: float,
        lease: float | None,
        give_up_at: float | None,
        took: list[Member],
    ) -> bool | BaseException:
        """One round (see the module docstring): True (held), False (not this time), or the
        error to raise (the quorum is out of reach because masters failed). The masters it
        was granted are added to ``took``."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        attempts: Attempts = {
            loop.create_task(m.lock.try_lock(wait, lease, owner=who)): m for m in self._members
        }
        members, quorum = len(attempts), self.quorum
        granted = refused = 0
        errors: list[BaseException] = []
        pending: set[asyncio.Task[bool]] = set(attempts)
        grace_until: float | None = None
        minority_until: float | None = None
        try:
            while pending:
                if grace_until is None and granted and minority_until is None:
                    # a minority held: once every other attempt waits on a busy master
                    # (rather than a reply, a reconnection, an error to come), give it up
                    # soon, else look again shortly
                    if all(self._busy(attempts[task], who) for task in pending):
                        minority_until = loop.time() + random.uniform(*MINORITY_WAIT)
                until = grace_until if grace_until is not None else minority_until
                if until is None and granted and grace_until is None:
                    until = loop.time() + MINORITY_POLL
                timeout = None if until is None else max(0.0, until - loop.time())
                done, pending = await asyncio.wait(
                    pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    error = task.exception() if not task.cancelled() else asyncio.CancelledError()
                    if error is None:
                        if task.result():
                            granted += 1
                            took.append(attempts[task])
                        else:
                            refused += 1
                    elif isinstance(error, AioLockError):
                        errors.append(error)
                    else:
                        raise error  # a bug, not a master failing: abandon and raise
                now = loop.time()
                if granted >= quorum and grace_until is None:
                    grace_until = now + max(now - start, GRACE_MIN)
                if members - refused - len(errors) < quorum:
                    break  # out of reach: fail fast
                if grace_until is not None and now >= grace_until:
                    break
                if grace_until is None and minority_until is not None and now >= minority_until:
                    break  # holding a minority while the rest is busy: give it up
        except BaseException:
            deadline = cleanup_deadline(loop.time(), self._bounds)
            cleanup = detach(self._abandon(attempts, who))
            await wait_shielded({cleanup}, deadline - loop.time())
            raise
        if granted >= quorum:
            lease_s = lease if lease is not None else self._watchdog_timeout
            elapsed = loop.time() - start
            validity = lease_s - elapsed - (lease_s * self._drift_factor + DRIFT_MIN)
            # and a quorum still held now: a master granted early in the round may have been
            # lost since (force-unlocked, found gone by a renewal), the round's own business
            if validity > 0 and self._held(self._stats(who)):
                if pending:  # stragglers: cancelled; whatever they took is given back
                    detach(self._abandon({t: attempts[t] for t in pending}, who))
                return True
            logger.debug(
                "aiolock: red lock %r: quorum after %.3f s, no validity or quorum left",
                self.name,
                elapsed,
            )
        cleanup = detach(self._abandon(attempts, who))
        await _wait_for(cleanup, self._budget(give_up_at), cancel_allowance(self._bounds))
        if members - len(errors) < quorum:
            return self._out_of_reach(errors)
        return False

    @staticmethod
    def _busy(member: Member, who: Owner) -> bool:
        """Whether tasks of the member's client wait for its lock (they park only after a
        try found it held), i.e. the master is busy rather than slow or failing."""
        return bool(getattr(member_stats(member, who), "tasks_waiting", 0))

    def _budget(self, give_up_at: float | None) -> float:
        """How long a failed round waits for its give-back: until the acquisition's give-up
        point (None: lock(), cleanup_timeout), never past it."""
        if give_up_at is None:
            return self._cleanup_timeout
        left = give_up_at - asyncio.get_running_loop().time()
        return min(self._cleanup_timeout, max(left, 0.0))

    def _out_of_reach(self, errors: list[BaseException]) -> BaseException:
        members, quorum = len(self._members), self.quorum
        message = (
            f"red lock {self.name!r}: {len(errors)} of {members} masters failed, so a quorum "
            f"of {quorum} is out of reach; the first: {errors[0]}"
        )
        error: BaseException
        if all(isinstance(e, ClientClosedError) for e in errors):
            error = ClientClosedError(message)
        else:
            error = RedisOperationError(message)
        error.__cause__ = errors[0]
        return error

    async def _abandon(self, attempts: Attempts, who: Owner) -> None:
        """Cancel the attempts still running and give back every master any of them took
        (a cancelled attempt undoes itself; one that ended with the master is released):
        those already granted at once, the others as they end."""
        granted = {t for t in attempts if t.done() and _granted(t)}
        running = [t for t in attempts if not t.done()]
        for task in running:
            task.cancel()
        limit = self._cleanup_timeout + self._command_timeout
        first = [m for t, m in attempts.items() if t in granted]
        waits: list[Awaitable[Any]] = []
        if first:
            waits.append(release_members(first, who, self._cleanup_timeout))
        if running:
            waits.append(asyncio.wait(running, timeout=limit))
        await asyncio.gather(*waits)
        took: list[Member] = []
        for task, member in attempts.items():
            if task in granted:
                continue
            if not task.done():
                logger.warning(
                    "aiolock: red lock %r: an attempt on %r did not end %.3g s after it was "
                    "cancelled; it is released if it ever ends with the lock",
                    self.name,
                    member.lock.name,
                    limit,
                )
                task.add_done_callback(functools.partial(self._release_late, member, who))
            elif _granted(task):
                took.append(member)
        if took:
            await release_members(took, who, self._cleanup_timeout)

    def _release_late(self, member: Member, who: Owner, task: asyncio.Task[bool]) -> None:
        if _granted(task):
            detach(release_members([member], who, self._cleanup_timeout))


def _granted(task: asyncio.Task[bool]) -> bool:
    """An attempt that ended with its master taken."""
    return not task.cancelled() and task.exception() is None and task.result()


async def _wait_for(task: asyncio.Task[Any], seconds: float, cancelled_seconds: float) -> None:
    """Wait for a cleanup at most ``seconds``; if cancelled meanwhile, at most
    ``cancelled_seconds`` more (shielded), then the CancelledError goes on."""
    try:
        await asyncio.wait((task,), timeout=seconds)
    except asyncio.CancelledError:
        await wait_shielded({task}, cancelled_seconds)
        raise


__all__ = ["DRIFT_FACTOR", "RedLock"]
