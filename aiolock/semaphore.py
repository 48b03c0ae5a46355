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
import math
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

from . import acquire, scripts
from .acquire import GRANTED, NOT_RUN, Attempt, Command, Rule, Runtime
from .config import check_max_hold
from .contexts import async_only
from .errors import (
    AioLockError,
    ClientClosedError,
    LockLostError,
    LockNotOwnedError,
    LockStateError,
    LockTimeout,
    RedisOperationError,
)
from .keys import (
    MAX_PERMITS,
    PUBLISH,
    check_lease,
    check_permits,
    check_seconds,
    permit_timeouts_key,
    semaphore_channel,
    to_millis,
)
from .leases import Hold, HoldState, LostCallback, Owner, Renewal, SingleUseOwner
from .requests import REQUEST_TTL_MS, RequestLatches, latches_of, mutate
from .transport import OutcomeUnknown

if TYPE_CHECKING:
    from .client import AioLock

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


class _GrantRule(Rule):
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


class SemaphoreRule(_GrantRule):
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

    __slots__ = ("_channel_key", "_client", "name")

    def __init__(self, client: AioLock, name: str) -> None:
        self._client = client
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
        _check_delta(permits)
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
        value = await acquire.read(
            self._client.runtime(), self.name, "GET", self.name, what="available_permits"
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
        client = self._client
        rt = client.runtime()
        latches = latches_of(client)
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
            await acquire.wait_shielded(rt.spawn(rule.give_back()), rt.config.cleanup_timeout)
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
            deadline=acquire.cleanup_deadline(
                asyncio.get_running_loop().time(), self._client.config
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
        entry = self._client.runtime().pubsub.entry(self._channel_key.encode())
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
        client = self._client
        rt = client.runtime()
        latches = latches_of(client)
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


def _check_delta(permits: object) -> None:
    """Validate a number of permits to add (negative: to remove), never 0."""
    if isinstance(permits, int) and not isinstance(permits, bool) and permits < 0:
        check_permits(-permits, "permits to remove")
    else:
        check_permits(permits)


def _parse_int(value: bytes) -> int:
    return int(value)


def _parse_add(value: bytes) -> list[int]:
    return [1, int(value)]


# -- the permit-expirable semaphore ---------------------------------------------------------


def check_permit_id(value: object) -> str:
    """A permit id as users see it: 32 hex digits (returned lowercase)."""
    if not isinstance(value, str):
        raise TypeError(f"permit_id must be a str, not {type(value).__name__}")
    if len(value) != 32:
        raise ValueError(f"permit_id must be 32 hex digits, got {value!r}")
    try:
        bytes.fromhex(value)
    except ValueError:
        raise ValueError(f"permit_id must be 32 hex digits, got {value!r}") from None
    return value.lower()


class PermitRule(Rule):
    """A permit of the permit-expirable semaphore ``name``. The owner the loop passes is the
    permit's own: its id is the permit id (32 hex digits), so each permit is one hold, keyed
    (name, permit id) in the lease registry and renewed by its id."""

    kind = "permit_expirable_semaphore"

    __slots__ = ("_channel", "_channel_key", "_timeouts", "key", "name", "renewal")

    def __init__(self, name: str) -> None:
        self.name = self.key = name
        self._timeouts = permit_timeouts_key(name)
        self._channel_key = semaphore_channel(name)
        self._channel = self._channel_key.encode()
        self.renewal = Renewal(scripts.PERMIT_RENEW, name)

    def _keys(self) -> tuple[str, str, str]:
        return (self.name, self._timeouts, self._channel_key)

    def channel(self, owner: str) -> bytes:
        return self._channel

    def wakes(self, data: bytes) -> int:
        return semaphore_wakes(data)

    def attempt(self, owner: str, lease_ms: int, wait_ms: int | None) -> Command:
        return scripts.PERMIT_ACQUIRE.command(
            self._keys(), (bytes.fromhex(owner), lease_ms, PUBLISH, RECLAIM_LIMIT)
        )

    def parse(self, reply: Any) -> Attempt:
        taken, wait_ms = int(reply[0]), int(reply[1])
        if taken:
            return GRANTED
        no_count(self.name, self.kind, reply[2] == 1)
        return Attempt(False, wait_ms if wait_ms >= 0 else None)

    async def held(self, rt: Runtime, permit: str) -> bool:
        """Whether the permit is in the semaphore's set (on the server)."""
        score = await acquire.read(
            rt, self.key, "ZSCORE", self._timeouts, bytes.fromhex(permit), what="reading a permit"
        )
        return score is not None

    async def settle_attempt(self, rt: Runtime, owner: str, count: int) -> Attempt | Any:
        # The permit id is new: present means this attempt took it. (Absent with a short
        # lease may also mean taken and already expired: sending it again is harmless.)
        return GRANTED if await self.held(rt, owner) else NOT_RUN

    def release(self, owner: str, lease_ms: int, count: int) -> Command:
        # A permit is one hold of count 1 (never re-entered): no count to compare.
        return scripts.PERMIT_RELEASE.command(
            self._keys(), (bytes.fromhex(owner), PUBLISH, RECLAIM_LIMIT)
        )

    def parse_release(self, reply: Any) -> bool | None:
        return True if reply == 1 else None  # 0: it had expired; -1: not held

    async def settle_release(self, rt: Runtime, owner: str, count: int) -> bool | Any | None:
        return NOT_RUN if await self.held(rt, owner) else True

    def purge(self, owner: str) -> Command:
        return self.release(owner, 0, 1)  # idempotent: a permit not held is left alone


@dataclass(frozen=True, slots=True)
class PermitStatistics:
    """What this client knows of one permit-expirable semaphore (no Redis call)."""

    name: str
    #: permits this client holds (as far as it knows), and how many the watchdog renews
    permits_held: int
    renewed: int
    #: permits of this client lost (lease ran out, renewal failed) and not released since
    lost: int
    #: tasks of this client parked waiting for a permit
    tasks_waiting: int


class PermitExpirableSemaphore:
    """A semaphore whose permits expire; get one with
    ``client.permit_expirable_semaphore(name)``.

    ``acquire()`` returns a permit id (32 hex digits), a handle: ``release(permit_id)`` gives
    it back from any task, or another process (Redisson passes permit ids between threads).
    The task that took it ending gives nothing back (``asyncio.wait_for``, ``gather`` and
    ``create_task`` run their coroutines in tasks of their own). A permit taken with
    ``lease_time`` lives until released or expired; one taken without is renewed by the
    watchdog (``config.watchdog_timeout``) while the client lives (closing it gives the
    permit back). A process that dies loses its permits at the latest one lease later: they
    return to the pool by themselves. ``owner`` is accepted for compatibility and changes
    nothing: a permit belongs to no task.

    A permit whose lease ran out, or whose renewal could not be confirmed in time, is lost
    like a lock's hold: :meth:`on_lost` callbacks run, :meth:`guard` cancels its body, and
    releasing it raises LockLostError.
    """

    __slots__ = ("_client", "_rule", "name")

    def __init__(self, client: AioLock, name: str) -> None:
        self._client = client
        self.name = name
        self._rule = client.rule(PermitRule, name)

    def __repr__(self) -> str:
        return f"<aiolock.PermitExpirableSemaphore {self.name!r}>"

    # -- setting up -------------------------------------------------------------------------

    async def try_set_permits(self, permits: int) -> bool:
        """Give the semaphore ``permits`` available permits if it has no count yet (also 0);
        True if set, False if it had a count already."""
        return bool(await self._semaphore().try_set_permits(permits))

    async def add_permits(self, permits: int) -> int:
        """Add ``permits`` available permits (a negative number removes available ones) and
        return the new available count; LockStateError (nothing changed) if fewer are
        available than asked to remove."""
        _check_delta(permits)
        if permits < 0:
            await self._counts()  # expired permits count as available
        return await self._semaphore().add_permits(permits)

    def _semaphore(self) -> Semaphore:
        return Semaphore(self._client, self.name)  # the same count, the same scripts

    # -- acquiring ------------------------------------------------------------------------

    async def acquire(
        self,
        lease_time: float | None = None,
        *,
        owner: Owner | None = None,
        max_hold: float | None = None,
    ) -> str:
        """Take a permit, waiting as long as it takes; its id."""
        permit = await self._acquire(None, lease_time, owner, max_hold)
        assert permit is not None
        return permit

    async def try_acquire(
        self,
        wait_time: float = 0,
        lease_time: float | None = None,
        *,
        owner: Owner | None = None,
        max_hold: float | None = None,
    ) -> str | None:
        """Take a permit within ``wait_time`` seconds; its id, or None. Returns or raises
        within ``wait_time + config.command_timeout``. A permit taken without
        ``lease_time`` is renewed by the watchdog for at most ``max_hold`` seconds (None:
        ``config.max_hold``; ``math.inf``: no cap), then lost like a lock's hold (see
        ``Lock.try_lock``)."""
        wait = check_seconds(wait_time, "wait_time")
        return await self._acquire(wait, lease_time, owner, max_hold)

    async def _acquire(
        self,
        wait: float | None,
        lease_time: float | None,
        owner: Owner | None,
        max_hold: float | None = None,
    ) -> str | None:
        client = self._client
        cap = None
        if lease_time is None:
            lease_ms = to_millis(client.config.watchdog_timeout)
            cap = client.config.max_hold if max_hold is None else check_max_hold(max_hold)
            if cap == math.inf:
                cap = None
            elif cap is not None:
                lease_ms = min(lease_ms, to_millis(cap))
        else:
            lease_ms = to_millis(check_lease(lease_time, "lease_time"))
            if max_hold is not None:
                raise ValueError("max_hold caps renewal; a permit with lease_time is not renewed")
        rt = client.runtime()
        if owner is not None:
            client.resolve_owner(owner)  # checked, and no more: a permit belongs to no task
        permit = secrets.token_hex(16)
        who = SingleUseOwner(permit)
        granted = await acquire.acquire(
            rt, self._rule, who, wait=wait, lease_ms=lease_ms, renew=lease_time is None
        )
        if granted is None:
            return None
        hold = rt.leases.get(self._rule.name, who)
        if cap is not None and hold is not None:
            rt.leases.limit(hold, cap)  # no suspension since the grant
        return permit

    # -- releasing ------------------------------------------------------------------------

    async def release(self, permit_id: str) -> None:
        """Give a permit back. Raises LockLostError if it was this client's and was lost
        (its lease ran out), LockNotOwnedError if it is not held (released already, expired,
        or unknown). Once called, it completes even if the caller is cancelled."""
        permit = check_permit_id(permit_id)
        if not await self._release(permit):
            raise LockNotOwnedError(
                f"permit {permit} of semaphore {self.name!r} is not held (released already, "
                "expired, or unknown)",
                name=self.name,
                owner=permit,
            )

    async def try_release(self, permit_id: str) -> bool:
        """Give a permit back; False if it was not held (or was lost)."""
        try:
            return await self._release(check_permit_id(permit_id))
        except LockLostError:
            return False

    async def _release(self, permit: str) -> bool:
        rt = self._client.runtime()
        hold = rt.leases.holds.get((self.name, permit))
        if hold is not None and (hold.count or hold.stale):
            try:
                await acquire.release(rt, self._rule, hold.owner)
            except LockLostError:
                raise
            except LockNotOwnedError:  # released meanwhile by a concurrent call
                return False
            return True
        # Not a hold of this client: taken by another client or process (or gone).
        rule = self._rule

        async def settle(sent_at: float) -> Any:
            return NOT_RUN if await rule.held(rt, permit) else 1

        reply = await mutate(
            rt,
            self.name,
            rule.release(permit, 0, 1),
            settle,
            what=f"releasing permit {permit} of semaphore {self.name!r}",
            deadline=acquire.cleanup_deadline(asyncio.get_running_loop().time(), rt.config),
        )
        return bool(reply == 1)

    @async_only
    async def permit(
        self,
        lease_time: float | None = None,
        *,
        wait_time: float | None = None,
        owner: Owner | None = None,
    ) -> AsyncIterator[str]:
        """Hold a permit for the ``async with`` body (its id is the target) and give it back
        at the end; waits as long as it takes, or raises LockTimeout after ``wait_time``."""
        permit = await self._take(lease_time, wait_time, owner)
        try:
            yield permit
        except BaseException as exc:
            await self._release_at_exit(permit, exc)
            raise
        else:
            await self._release_at_exit(permit, None)

    @async_only
    async def guard(
        self,
        lease_time: float | None = None,
        *,
        wait_time: float | None = None,
        owner: Owner | None = None,
    ) -> AsyncIterator[str]:
        """:meth:`permit`, and the body is cancelled if the permit is lost (as
        ``Lock.guard``): LockLostError is raised from the ``async with`` then."""
        permit = await self._take(lease_time, wait_time, owner)
        task = asyncio.current_task()
        assert task is not None
        cancelling = task.cancelling()
        state = {"inside": True, "cancelled": False}

        def lost(_: LockLostError) -> None:
            if state["inside"]:
                state["cancelled"] = True
                task.cancel(f"aiolock: permit {permit} of {self.name!r} was lost")

        hold = self._hold(permit, lost_ok=True)  # lost already: told at the first await
        remove = self._client.runtime(closed_ok=True).leases.on_lost(hold, lost)
        try:
            yield permit
        except asyncio.CancelledError as exc:
            state["inside"] = False
            if state["cancelled"] and task.uncancel() <= cancelling:
                await self._release_at_exit(permit, None, lost_ok=True)
                assert hold.lost is not None
                raise hold.lost from exc
            await self._release_at_exit(permit, exc)
            raise
        except BaseException as exc:
            state["inside"] = False
            await self._release_at_exit(permit, exc)
            raise
        else:
            state["inside"] = False
            await self._release_at_exit(permit, None)
        finally:
            state["inside"] = False
            remove()

    async def _take(
        self, lease_time: float | None, wait_time: float | None, owner: Owner | None
    ) -> str:
        if wait_time is None:
            return await self.acquire(lease_time, owner=owner)
        permit = await self.try_acquire(wait_time, lease_time, owner=owner)
        if permit is None:
            raise LockTimeout(
                f"no permit of semaphore {self.name!r} within {wait_time} s", name=self.name
            )
        return permit

    async def _release_at_exit(
        self, permit: str, exc: BaseException | None, *, lost_ok: bool = False
    ) -> None:
        """The release at the end of an ``async with``: the body's own exception wins."""
        try:
            await self.release(permit)
        except LockLostError:
            if lost_ok:
                return
            if exc is None:
                raise
            exc.add_note(f"aiolock: permit {permit} of {self.name!r} was lost before the end")
        except AioLockError as error:
            if exc is None:
                raise
            exc.add_note(f"aiolock: releasing permit {permit} of {self.name!r} failed: {error}")
            logger.warning(
                "aiolock: releasing permit %s of %r after an error in the block failed: %s",
                permit,
                self.name,
                error,
            )

    # -- losing ---------------------------------------------------------------------------

    def on_lost(self, permit_id: str, callback: LostCallback) -> Callable[[], None]:
        """Call ``callback(LockLostError)`` once if this client's permit is lost (its lease
        ran out, a renewal was not confirmed in time, its task ended, the client closed).
        A permit already lost (and not released yet) is told at once: the callback is
        scheduled as it would have been at the loss. Returns a function that removes the
        callback; LockNotOwnedError if neither held nor lost here."""
        hold = self._hold(check_permit_id(permit_id), lost_ok=True)
        return self._client.runtime(closed_ok=True).leases.on_lost(hold, callback)

    def _hold(self, permit: str, *, lost_ok: bool = False) -> Hold:
        """The permit's hold, held; or, with ``lost_ok``, lost and not released yet."""
        leases = self._client.runtime(closed_ok=lost_ok).leases
        hold = leases.holds.get((self.name, permit))
        if hold is not None:
            state = leases.current(hold).state
            if state is HoldState.HELD or (lost_ok and state is HoldState.LOST and hold.stale):
                return hold
        if lost_ok:
            self._client.runtime()  # a closed client: ClientClosedError
        raise LockNotOwnedError(
            f"permit {permit} of semaphore {self.name!r} is not held by this client",
            name=self.name,
            owner=permit,
        )

    # -- reading --------------------------------------------------------------------------

    async def available_permits(self) -> int:
        """Permits available now (expired ones are returned to the pool first)."""
        return (await self._counts())[0]

    async def acquired_permits(self) -> int:
        """Permits taken and not expired (by anyone)."""
        return (await self._counts())[1]

    async def get_permits(self) -> int:
        """All permits: available + taken."""
        available, taken = await self._counts()
        return available + taken

    async def _counts(self) -> tuple[int, int]:
        rt = self._client.runtime()
        rule = self._rule
        cmd = scripts.PERMIT_COUNTS.command(rule._keys(), (PUBLISH, RECLAIM_LIMIT))
        for _ in range(2):  # it only returns expired permits: harmless to run again
            reply = await acquire.command(rt, self.name, cmd, None)
            if isinstance(reply, list):
                return int(reply[0]), int(reply[1])
            if not isinstance(reply, OutcomeUnknown):
                break
        raise RedisOperationError(f"reading the permits of semaphore {self.name!r} failed: {reply}")

    def statistics(self) -> PermitStatistics:
        """What this client knows of the semaphore (no Redis call)."""
        client = self._client
        rt = client.runtime()
        held = renewed = lost = 0
        for hold in client.holds_of(self.name):
            rt.leases.current(hold)
            if hold.state is HoldState.HELD:
                held += 1
                renewed += hold.renewal is not None
            elif hold.stale:
                lost += 1
        entry = rt.pubsub.entry(self._rule.channel(""))
        return PermitStatistics(
            name=self.name,
            permits_held=held,
            renewed=renewed,
            lost=lost,
            tasks_waiting=entry.parked if entry is not None else 0,
        )


__all__ = [
    "PermitExpirableSemaphore",
    "PermitStatistics",
    "Semaphore",
    "SemaphoreStatistics",
]
