"""Semaphores, in Redisson's layout, on the shared acquisition loop.

:class:`Semaphore` (Redisson's RSemaphore): a string at ``name`` holds the available permits;
acquiring decrements it if enough are available, releasing increments it and publishes the
new count on ``redisson_sc:{name}``. Permits are not holds of an owner: nothing on the server
says who has them, so a holder that dies without releasing leaks its permits (as in
Redisson); a lost reply is settled with a request latch (aiolock.requests).

:class:`PermitExpirableSemaphore` (Redisson's RPermitExpirableSemaphore): the same count, plus
``{name}:timeout``, a sorted set of the permits taken (member = 16 random bytes, the permit
id, given to users as 32 hex digits; score = when it expires, in ms). Each permit is a hold
named by its id, a handle that any task may pass on, not a hold of the task that took it: one
taken with ``lease_time`` lives until released or expired, one taken without is renewed by
the watchdog while the client lives, and its loss is reported like a lock's. Expired permits
return to the pool by themselves: every script of the semaphore returns them first (acquire,
release, counts, the watchdog's renewal), and a waiter wakes when the earliest one expires,
so no one has to come by.

Waiting is the shared loop's: a release publishes the new number of available permits, which
wakes local waiters in turn while they fit in it (a waiter for k permits counts k), so a
release of one permit wakes one waiter, not all of them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NoReturn

from . import acquire, commands, operation, scripts
from .errors import (
    AioLockError,
    ClientClosedError,
    LockStateError,
    RedisOperationError,
)
from .holds import Owner
from .keys import (
    MAX_PERMITS,
    PUBLISH,
    check_permits,
    check_seconds,
    semaphore_channel,
)
from .requests import REQUEST_TTL_MS, RequestLatches, latches_of, mutate
from .rules import GRANTED, NOT_RUN, Attempt, Command, Rule
from .runtime import Runtime, RuntimeSource, runtime_of

logger = logging.getLogger("aiolock")

#: the most permits a message's wake-up counts (any request fits; the waiters woken are
#: bounded by those parked, what is left over by the entry's borrowers)
WAKE_CAP = MAX_PERMITS
#: expired permits one script call returns to the pool at most
RECLAIM_LIMIT = 100
#: how long the background settling of an abandoned acquire may keep trying to fence
_SETTLE_WINDOW_MS = REQUEST_TTL_MS // 2


def semaphore_wakes(data: bytes) -> int:
    """A semaphore channel's messages are permit counts in decimal: a message announcing n
    permits wakes local waiters in turn while their requests fit in n."""
    return max(0, min(int(data), WAKE_CAP))


#: semaphores found without a count (their key absent) and reported since they last had one
_UNSET_REPORTED: set[str] = set()
_UNSET_REPORTED_KEPT = 1000


def no_count(name: str, kind: str, unset: bool) -> None:
    """Say (once per process, until it has a count again) that the semaphore ``name`` has no
    count at all: it was never given permits, or was deleted. Like Redisson, aiolock reads
    that as no permits (another process may set them later), so an acquire waits and a
    try_acquire fails, which looks like a hang unless someone says why."""
    if not unset:
        _UNSET_REPORTED.discard(name)
        return
    if name in _UNSET_REPORTED:
        return
    if len(_UNSET_REPORTED) >= _UNSET_REPORTED_KEPT:
        _UNSET_REPORTED.clear()
    _UNSET_REPORTED.add(name)
    what = "semaphore" if kind == "semaphore" else "permit-expirable semaphore"
    logger.warning(
        "aiolock: %s %r has no permits: it was never given any (its key does not exist). "
        "acquire() waits and try_acquire() fails until try_set_permits(n), add_permits(n) "
        "or release() gives it some",
        what,
        name,
    )


class GrantRule(Rule):
    """A rule whose grants are not holds: nothing to release, settle or purge per owner."""

    holds = False

    def release(self, owner: str, lease_ms: int, count: int) -> Command:
        raise AssertionError("grants of this rule are not holds")

    def parse_release(self, reply: Any) -> bool | None:
        raise AssertionError("grants of this rule are not holds")

    async def settle_release(self, rt: Runtime, owner: str, count: int) -> Any:
        raise AssertionError("grants of this rule are not holds")

    def purge(self, owner: str) -> Command:
        raise AssertionError("grants of this rule are not holds")


# -- the plain semaphore --------------------------------------------------------------------


class SemaphoreRule(GrantRule):
    """Taking ``permits`` permits of the semaphore ``name``. The "owner" the loop passes is
    the acquisition's request id: the script records a grant under it, which is how a lost
    reply is settled."""

    kind = "semaphore"

    __slots__ = (
        "_channel",
        "_channel_key",
        "_latches",
        "_requests",
        "_rt",
        "key",
        "name",
        "weight",
    )

    def __init__(self, rt: Runtime, name: str, permits: int, latches: RequestLatches) -> None:
        self.name = self.key = name
        self.weight = permits
        self._rt = rt
        self._channel_key = semaphore_channel(name)
        self._channel = self._channel_key.encode()
        self._latches = latches
        self._requests = latches.key(name)

    def channel(self, owner: str) -> bytes:
        return self._channel

    def wakes(self, data: bytes) -> int:
        return semaphore_wakes(data)

    def attempt(self, owner: str, lease_ms: int, wait_ms: int | None) -> Command:
        return scripts.SEMAPHORE_ACQUIRE.command(
            (self.name, self._requests),
            (self.weight, REQUEST_TTL_MS, owner, *self._latches.take_done(self.name)),
        )

    def parse(self, reply: Any) -> Attempt:
        if reply == 1:
            return GRANTED
        no_count(self.name, self.kind, reply == -1)
        return Attempt(False)

    async def settle_attempt(self, rt: Runtime, owner: str, count: int) -> Attempt | Any:
        if await self._latches.read(rt, self.name, owner) is not None:
            return GRANTED
        return NOT_RUN  # absent: it did not run (an acquire's latch is read soon after)

    def undo(self, owner: str, grant: Attempt) -> Command | None:
        # Given back like a release (its own request id, a lost reply settled, never applied
        # twice), in a task of its own: the loop would send a command once and forget it.
        self._rt.spawn(self.give_back())
        return None

    async def give_back(self) -> None:
        """Release the permits of a grant whose caller left."""
        latches, rt = self._latches, self._rt
        request = latches.new_id()
        cmd = scripts.SEMAPHORE_RELEASE.command(
            (self.name, self._channel_key, self._requests),
            (self.weight, REQUEST_TTL_MS, PUBLISH, request, *latches.take_done(self.name)),
        )
        what = f"giving back {self.weight} permit(s) of semaphore {self.name!r}"
        try:
            await mutate(rt, self.name, cmd, latches.settle(rt, self.name, request, int), what=what)
        except RedisOperationError as exc:
            latches.finished_later(self.name, request)
            logger.warning("aiolock: %s failed: %s", what, exc)
            return
        latches.finished(self.name, request)


@dataclass(frozen=True, slots=True)
class SemaphoreStatistics:
    """What this client knows of one semaphore (no Redis call)."""

    name: str
    #: tasks of this client parked waiting for permits
    tasks_waiting: int


class Semaphore:
    """A distributed counting semaphore; get one with ``client.semaphore(name)``.

    ``try_set_permits(n)`` gives it ``n`` permits once; ``acquire(k)`` takes ``k``, waiting
    (woken by pub/sub, never polling) until they are available; ``release(k)`` gives ``k``
    back, from any task or process. ``async with sem:`` takes one and gives it back.

    Permits are not tied to their holder on the server (Redisson's layout): a process that
    dies holding permits leaks them, and nothing stops ``release`` from raising the count
    above what was set. Use :class:`PermitExpirableSemaphore` when holders may crash.
    """

    __slots__ = ("_channel_key", "_runtime", "name")

    def __init__(self, runtime: Runtime | RuntimeSource, name: str) -> None:
        self._runtime = runtime = runtime_of(runtime)
        self.name = name
        self._channel_key = semaphore_channel(name)

    def __repr__(self) -> str:
        return f"<aiolock.Semaphore {self.name!r}>"

    # -- setting up -------------------------------------------------------------------------

    async def try_set_permits(self, permits: int) -> bool:
        """Give the semaphore ``permits`` available permits if it has no count yet (also 0);
        True if set, False if it had a count already."""
        permits = check_permits(permits, minimum=0)
        reply = await self._mutate(
            scripts.SEMAPHORE_TRY_SET,
            (self.name, self._channel_key),
            (permits, REQUEST_TTL_MS, PUBLISH),
            "try_set_permits",
        )
        return bool(reply)

    async def add_permits(self, permits: int) -> int:
        """Add ``permits`` available permits (a negative number removes some) and return the
        new available count. Raises LockStateError, changing nothing, if fewer are available
        than asked to remove."""
        check_delta(permits)
        done, available = await self._mutate(
            scripts.SEMAPHORE_ADD,
            (self.name, self._channel_key),
            (permits, REQUEST_TTL_MS, PUBLISH),
            "add_permits",
        )
        if not done:
            raise LockStateError(
                f"cannot remove {-permits} permits of semaphore {self.name!r}: "
                f"{available} available",
                name=self.name,
            )
        return int(available)

    async def drain_permits(self) -> int:
        """Take every available permit at once; how many were taken."""
        drained = await self._mutate(
            scripts.SEMAPHORE_DRAIN, (self.name,), (REQUEST_TTL_MS,), "drain_permits"
        )
        return int(drained)

    async def available_permits(self) -> int:
        """How many permits are available now (on the server)."""
        value = await commands.read(
            self._runtime.use(), self.name, "GET", self.name, what="available_permits"
        )
        return int(value) if value is not None else 0

    # -- acquiring and releasing ----------------------------------------------------------

    async def acquire(self, permits: int = 1) -> None:
        """Take ``permits`` permits, waiting as long as it takes."""
        await self._acquire(check_permits(permits), None)

    async def try_acquire(self, permits: int = 1, wait_time: float = 0) -> bool:
        """Take ``permits`` permits, waiting at most ``wait_time`` seconds; True if taken.
        Returns or raises within ``wait_time + config.command_timeout``."""
        return await self._acquire(check_permits(permits), check_seconds(wait_time, "wait_time"))

    async def _acquire(self, permits: int, wait: float | None) -> bool:
        runtime = self._runtime
        rt = runtime.use()
        latches = latches_of(runtime)
        request = latches.new_id()
        rule = SemaphoreRule(rt, self.name, permits, latches)
        try:
            granted = await acquire.acquire(
                rt, rule, Owner(request), wait=wait, lease_ms=_SETTLE_WINDOW_MS, renew=False
            )
        except BaseException:
            latches.finished_later(self.name, request)  # may still be settled in the background
            raise
        latches.finished(self.name, request)
        if granted is not None and rt.leases.closed:
            # The client closed while the grant was on its way (aclose waits for replies in
            # flight): no grant; its permits go back before saying so, as a lock's are.
            await operation.wait_shielded(rt.spawn(rule.give_back()), rt.config.cleanup_timeout)
            raise ClientClosedError(f"the client closed while acquiring {self.name!r}")
        return granted is not None

    async def release(self, permits: int = 1) -> None:
        """Give ``permits`` permits back (any task or process may) and wake waiters.

        Once called, the release completes even if the caller is cancelled (the caller waits
        for it at most ``config.cleanup_timeout``); a lost reply is settled, never sent again
        blindly, so permits are never added twice. Returns within ``cleanup_timeout``: a
        release not confirmed by then raises RedisTimeoutError and goes on in the
        background."""
        permits = check_permits(permits)
        await self._mutate(
            scripts.SEMAPHORE_RELEASE,
            (self.name, self._channel_key),
            (permits, REQUEST_TTL_MS, PUBLISH),
            "release",
            deadline=commands.cleanup_deadline(
                asyncio.get_running_loop().time(), self._runtime.config
            ),
        )

    async def __aenter__(self) -> Semaphore:
        await self.acquire()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.release()
        except AioLockError as error:
            if exc is None:
                raise
            exc.add_note(f"aiolock: releasing a permit of {self.name!r} failed: {error}")
            logger.warning(
                "aiolock: releasing a permit of %r after an error in the block failed: %s",
                self.name,
                error,
            )

    def __enter__(self) -> NoReturn:
        raise TypeError("use 'async with' with an aiolock Semaphore, not 'with'")

    def __exit__(self, *args: object) -> None:  # pragma: no cover - __enter__ always raises
        pass

    # -- reading ----------------------------------------------------------------------------

    def statistics(self) -> SemaphoreStatistics:
        """What this client knows of the semaphore (no Redis call)."""
        entry = self._runtime.use().pubsub.entry(self._channel_key.encode())
        return SemaphoreStatistics(
            name=self.name, tasks_waiting=entry.parked if entry is not None else 0
        )

    async def _mutate(
        self,
        script: scripts.Script,
        keys: tuple[str, ...],
        args: tuple[Any, ...],
        what: str,
        *,
        deadline: float | None = None,
    ) -> Any:
        """Run a script that records its reply under a new request id: KEYS are ``keys``
        then the client's request latches, ARGV ``args`` then the request id and the ids to
        forget. Its lost reply is settled by that record. See ``mutate`` for ``deadline``."""
        runtime = self._runtime
        rt = runtime.use()
        latches = latches_of(runtime)
        request = latches.new_id()
        cmd = script.command(
            (*keys, latches.key(self.name)),
            (*args, request, *latches.take_done(self.name)),
        )
        parse = _parse_add if script is scripts.SEMAPHORE_ADD else _parse_int
        what = f"{what} of semaphore {self.name!r}"
        try:
            reply = await mutate(
                rt,
                self.name,
                cmd,
                latches.settle(rt, self.name, request, parse),
                what=what,
                deadline=deadline,
            )
        except BaseException:
            latches.finished_later(self.name, request)
            raise
        latches.finished(self.name, request)
        return reply


def check_delta(permits: object) -> None:
    """Validate a number of permits to add (negative: to remove), never 0."""
    if isinstance(permits, int) and not isinstance(permits, bool) and permits < 0:
        check_permits(-permits, "permits to remove")
    else:
        check_permits(permits)


def _parse_int(value: bytes) -> int:
    return int(value)


def _parse_add(value: bytes) -> list[int]:
    return [1, int(value)]


__all__ = [
    "Semaphore",
    "SemaphoreStatistics",
]
