"""The reentrant lock (Redisson's RLock): a script and a rule on the shared acquisition loop."""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NoReturn

from . import acquire, commands, extending, releases, scripts
from .config import check_max_hold
from .contexts import async_only
from .errors import AioLockError, LockLostError, LockNotOwnedError, RedisOperationError
from .guard import Guard, release_at_exit
from .holds import Hold, HoldState, LostCallback, Owner, Renewal, check_callback
from .keys import (
    PUBLISH,
    UNLOCK_MESSAGE,
    WAKE_ALL_MESSAGE,
    check_lease,
    check_seconds,
    lock_channel,
    to_millis,
)
from .pubsub import ALL
from .rules import GRANTED, NOT_RUN, Attempt, Command, Rule
from .runtime import Runtime, RuntimeSource, runtime_of
from .transport import NotSent

_UNLOCK = UNLOCK_MESSAGE.encode()
_WAKE_ALL = WAKE_ALL_MESSAGE.encode()


@dataclass(frozen=True, slots=True)
class LockStatistics:
    """What this client knows of one lock, for one owner (no Redis call)."""

    name: str
    #: the owner asked about (the current task by default)
    owner: str
    #: the owner holds it (as far as this client knows)
    held: bool
    hold_count: int
    #: the hold's state: acquiring, held, releasing, released, lost (None: no hold)
    state: str | None
    #: the owner's hold was lost and it has not unlocked it as often as it took it
    lost: bool
    #: seconds until the hold's lease runs out unless renewed (None: not held)
    lease_remaining: float | None
    #: the watchdog renews the hold
    renewed: bool
    #: tasks of this client parked waiting for the lock
    tasks_waiting: int


def lock_wakes(data: bytes) -> int:
    """A lock channel's messages: ``0`` wakes one waiter, ``1`` wakes every waiter."""
    if data == _UNLOCK:
        return 1
    if data == _WAKE_ALL:
        return ALL
    raise ValueError(data)


class LockRule(Rule):
    """The reentrant lock: a hash at ``name`` (owner id -> hold count, TTL = lease)."""

    kind = "lock"

    __slots__ = ("_channel", "_channel_key", "key", "name", "renewal")

    def __init__(self, name: str) -> None:
        self.name = self.key = name
        self._channel_key = lock_channel(name)
        self._channel = self._channel_key.encode()
        self.renewal = Renewal(scripts.LOCK_RENEW, name)

    def channel(self, owner: str) -> bytes:
        return self._channel

    def wakes(self, data: bytes) -> int:
        return lock_wakes(data)

    def attempt(self, owner: str, lease_ms: int, wait_ms: int | None) -> Command:
        return scripts.LOCK_ACQUIRE.command((self.name,), (lease_ms, owner))

    def parse(self, reply: Any) -> Attempt:
        return GRANTED if reply is None else Attempt(False, int(reply))

    async def count(self, rt: Runtime, owner: str) -> int:
        """The owner's hold count on the server."""
        value = await commands.read(rt, self.key, "HGET", self.name, owner, what="reading a hold")
        return int(value) if value is not None else 0

    async def settle_attempt(self, rt: Runtime, owner: str, count: int) -> Attempt | Any:
        now = await self.count(rt, owner)
        if now == count + 1:
            return GRANTED
        if now == count:
            return NOT_RUN
        return Attempt(False, 0)  # the owner's hold changed under it: not this attempt's

    def release(self, owner: str, lease_ms: int, count: int) -> Command:
        return scripts.LOCK_RELEASE.command(
            (self.name, self._channel_key), (UNLOCK_MESSAGE, lease_ms, owner, count, PUBLISH)
        )

    def parse_release(self, reply: Any) -> bool | None:
        return None if reply is None or reply == -1 else reply == 1

    async def settle_release(self, rt: Runtime, owner: str, count: int) -> bool | Any | None:
        now = await self.count(rt, owner)
        if now == count - 1:
            return now == 0
        if now == count:
            return NOT_RUN
        return None

    def purge(self, owner: str) -> Command:
        return scripts.LOCK_PURGE.command(
            (self.name, self._channel_key), (UNLOCK_MESSAGE, owner, PUBLISH)
        )

    def force_unlock(self) -> Command:
        """The command that deletes the lock whoever holds it and wakes its waiters; it
        replies 1 (deleted), 0 (nothing there) or -1 (held in a way this lock object may not
        force: the other mode of a read-write lock)."""
        return scripts.LOCK_FORCE_UNLOCK.command(
            (self.name, self._channel_key), (UNLOCK_MESSAGE, PUBLISH)
        )


class Lock:
    """A reentrant distributed lock; get one with ``client.lock(name)``.

    The owner is the current asyncio Task (or an explicit :class:`~aiolock.Owner` passed as
    ``owner=``): it may take the lock again (the hold count grows) and must unlock as often;
    any other owner, in this process or another, waits. Waiting is woken by the unlock
    message on the lock's channel, never by polling. ``async with lock:`` is :meth:`lock`
    then :meth:`unlock`. Lock objects are cheap and stateless: two of one name on one client
    are the same lock. ``max_hold`` (seconds) caps how long the watchdog renews a hold taken
    through this object (see :meth:`lock`); None: the client's ``config.max_hold``.
    """

    __slots__ = ("_max_hold", "_rule", "_runtime", "name")

    _rule_class: type[LockRule] = LockRule

    def __init__(
        self, runtime: Runtime | RuntimeSource, name: str, *, max_hold: float | None = None
    ) -> None:
        self._runtime = runtime = runtime_of(runtime)
        self.name = name
        self._max_hold = None if max_hold is None else check_max_hold(max_hold)
        self._rule = runtime.rule(self._rule_class, name)

    @property
    def runtime(self) -> Runtime:
        """The runtime the lock works with (what composites of locks build on).

        :meta private:
        """
        return self._runtime

    def __repr__(self) -> str:
        try:
            stats = self.statistics() if _in_task() else None
        except AioLockError:  # a closed client, another event loop: no state to show
            stats = None
        state = f" held x{stats.hold_count}" if stats is not None and stats.held else ""
        return f"<aiolock.{type(self).__name__} {self.name!r}{state}>"

    # -- acquiring --------------------------------------------------------------------------

    async def try_lock(
        self,
        wait_time: float = 0,
        lease_time: float | None = None,
        *,
        owner: Owner | None = None,
        max_hold: float | None = None,
    ) -> bool:
        """Take the lock, waiting at most ``wait_time`` seconds; True if taken.

        With ``lease_time`` (seconds) the hold expires after it and is never renewed; without
        it the lease is ``config.watchdog_timeout`` and the watchdog renews it while held,
        for at most ``max_hold`` seconds after the grant (None: the lock object's, else
        ``config.max_hold``; ``math.inf``: no cap). Once the cap is reached the lease runs
        out and the hold is lost like any other (``on_lost``, ``guard()``, LockLostError
        from ``unlock()`` naming the cap). A nested acquire or release never carries the
        lease past a hold's cap; a cap set earlier is never raised. ``max_hold`` with
        ``lease_time`` is a ValueError (such a hold is not renewed).
        Returns or raises within ``wait_time + config.command_timeout``.
        """
        wait = (
            0.0
            if wait_time == 0 and type(wait_time) is int
            else check_seconds(wait_time, "wait_time")
        )
        return await self._grant(wait, lease_time, owner, max_hold) is not None

    async def lock(
        self,
        lease_time: float | None = None,
        *,
        owner: Owner | None = None,
        max_hold: float | None = None,
    ) -> None:
        """Take the lock, waiting as long as it takes (``max_hold``: see :meth:`try_lock`)."""
        await self._grant(None, lease_time, owner, max_hold)

    def _grant(
        self,
        wait: float | None,
        lease_time: float | None,
        owner: Owner | None,
        max_hold: float | None = None,
    ) -> Coroutine[Any, Any, Attempt | None]:
        """Take one count for ``owner``: the acquisition to await (its grant, or None if
        ``wait`` ran out). A plain function: no coroutine frame of its own per waiter
        (unless the hold is capped: max_hold)."""
        runtime = self._runtime
        cap = None
        if lease_time is None:
            lease_ms = to_millis(runtime.config.watchdog_timeout)
            if max_hold is not None:
                cap = check_max_hold(max_hold)
            else:
                cap = self._max_hold if self._max_hold is not None else runtime.config.max_hold
            if cap == math.inf:
                cap = None
            elif cap is not None:
                lease_ms = min(lease_ms, to_millis(cap))
        else:
            lease_ms = to_millis(check_lease(lease_time, "lease_time"))
            if max_hold is not None:
                raise ValueError(
                    "max_hold caps the watchdog's renewals; a hold taken with lease_time is "
                    "never renewed (its lease is its cap): pass one or the other"
                )
        rt = runtime.use()
        who = self._owner(owner)
        held = rt.leases.get(self.name, who)
        if held is not None and held.cap != math.inf:
            lease_ms = rt.leases.capped_lease(held, lease_ms)  # a nested acquire: never past it
        grant = self._acquisition(rt, who, wait, lease_ms, lease_time is None)
        return grant if cap is None else self._capped(grant, who, cap)

    def _acquisition(
        self, rt: Runtime, who: Owner, wait: float | None, lease_ms: int, renew: bool
    ) -> Coroutine[Any, Any, Attempt | None]:
        """How this type waits: the shared loop, woken by the lock's channel."""
        return acquire.acquire(rt, self._rule, who, wait=wait, lease_ms=lease_ms, renew=renew)

    async def _capped(
        self, grant: Coroutine[Any, Any, Attempt | None], who: Owner, max_hold: float
    ) -> Attempt | None:
        """``grant``, then its hold's renewal capped at ``max_hold`` seconds from now (no
        suspension between the two: nothing can run in between)."""
        result = await grant
        if result is not None and result.granted:
            leases = self._runtime.use(closed_ok=True).leases
            hold = leases.get(self.name, who)
            if hold is not None:
                leases.limit(hold, max_hold)
        return result

    async def __aenter__(self) -> Lock:
        await self.lock()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await unlock_at_exit(self, exc, None)

    def __enter__(self) -> NoReturn:
        raise TypeError(f"use 'async with' with an aiolock {type(self).__name__}, not 'with'")

    def __exit__(self, *args: object) -> None:  # pragma: no cover - __enter__ always raises
        pass

    # -- releasing --------------------------------------------------------------------------

    async def unlock(self, *, owner: Owner | None = None) -> None:
        """Drop one hold count of the owner (the current task by default); the last one
        releases the lock.

        Once called, the release completes even if the caller is cancelled. Raises
        LockNotOwnedError if the owner holds no count, LockLostError if it did but the hold
        was lost (lease expired, force-unlocked, renewal not confirmed in time, client
        closed), and a RedisOperationError if the release could not be confirmed within
        ``config.cleanup_timeout`` (it is finished in the background then; the hold is never
        renewed again).
        """
        runtime = self._runtime
        rt = runtime.use(closed_ok=True)  # a closed client's lost holds are reported
        await releases.release(rt, self._rule, self._owner(owner))

    async def force_unlock(self) -> bool:
        """Delete the lock whoever holds it and wake its waiters; True if it was held.

        Holds of other owners of this client on the lock are marked lost (their guards are
        cancelled); the calling owner's own hold simply ends."""
        runtime = self._runtime
        rt = runtime.use()
        try:
            reply = await commands.command(rt, self.name, self._rule.force_unlock(), None)
        except NotSent as exc:
            raise RedisOperationError(f"force_unlock of {self.name!r}: {exc}") from exc
        if not isinstance(reply, int):  # idempotent: a lost reply may be asked again
            raise RedisOperationError(f"force_unlock of {self.name!r} failed: {reply}")
        if reply < 0:
            return False  # held in a way this object may not force: nothing was done
        mine = {runtime.resolve_owner(None).id, self._owner(None).id}
        for hold in runtime.holds_of(self.name):
            if hold.state is HoldState.ACQUIRING:
                continue  # never granted: nothing of it to end (its acquire goes on)
            if hold.owner.id in mine:
                rt.leases.released(hold)
            else:
                rt.leases.lose(hold, "it was force-unlocked", cleanup=False)
        return bool(reply)

    async def extend(self, seconds: float, *, owner: Owner | None = None) -> None:
        """Make the owner's hold run out ``seconds`` from now (never sooner than it already
        would), if and only if the owner still holds the lock on the server.

        For a hold taken with ``lease_time`` (never renewed); a hold the watchdog renews
        raises LockUsageError (cap it with ``max_hold`` instead). Atomic (one script, the
        watchdog's renewal script for this one hold). Raises LockNotOwnedError if the owner
        holds no count, LockLostError if its hold was lost or the server no longer has it
        (``on_lost`` is told; each later unlock still reports the loss), and a
        RedisOperationError if the server's answer did not come within
        ``config.command_timeout``. A cancelled or timed-out extend whose reply is still
        outstanding is settled in the background: the hold's deadline here moves only once
        the server has said it extended the lease, so it is never later than the server's.
        """
        lease_ms = to_millis(check_lease(seconds, "seconds"))
        rt = self._runtime.use(closed_ok=True)
        await extending.extend(rt, self._rule, self._owner(owner), lease_ms)

    # -- losing -------------------------------------------------------------------------------

    def on_lost(self, callback: LostCallback, *, owner: Owner | None = None) -> Callable[[], None]:
        """Call ``callback(LockLostError)`` once if the owner's hold is lost.

        The hold is lost when a renewal finds the lock gone, when its lease runs out before a
        renewal is confirmed (e.g. Redis unreachable), when it is force-unlocked, when its
        task ends without unlocking, when a release finds it gone, or when the client closes.
        The callback runs soon after, from the event loop (a coroutine result is run as a
        task); it must not block. A hold already lost (and not unlocked yet: its unlock
        would raise LockLostError) is told at once: the callback is scheduled the same way.
        Returns a function that removes the callback.
        Raises LockNotOwnedError if the owner neither holds the lock nor has a lost hold of
        it left to unlock.
        """
        check_callback(callback)
        return self._runtime.use(closed_ok=True).leases.on_lost(
            self._held(owner, lost_ok=True), callback
        )

    @async_only
    async def guard(
        self,
        lease_time: float | None = None,
        *,
        owner: Owner | None = None,
        max_hold: float | None = None,
    ) -> AsyncIterator[Lock]:
        """Hold the lock for the body and cancel the body if the hold is lost.

        ``async with lock.guard():`` takes the lock like ``async with lock:``; when the hold
        is lost, the body is cancelled once (as ``asyncio.timeout`` does: ``finally`` blocks
        and other cleanup in it still run) and LockLostError is raised from the
        ``async with``, so work done under a lock no longer held stops. A hold lost before
        the body even started (the process stalled right after the grant) is told the same
        way, at the body's first suspension. With ``max_hold`` (see :meth:`try_lock`) a body
        still running when the cap is reached is cancelled the same way.
        """
        await self.lock(lease_time, owner=owner, max_hold=max_hold)
        hold = self._held(owner, lost_ok=True)
        rt = self._runtime.use(closed_ok=True)

        async def release(exc: BaseException | None) -> None:
            await unlock_at_exit(self, exc, owner)

        async def release_lost() -> None:
            releases.release_lost(rt, self._rule, hold.owner)  # hold.owner: resolved already

        async with Guard(
            f"the hold on {self.name!r}",
            functools.partial(rt.leases.on_lost, hold),
            release,
            release_lost,
        ):
            yield self

    def release_lost(self, *, owner: Owner | None = None) -> LockLostError | None:
        """Give back one count of the owner's lost hold without waiting for its cleanup
        still under way (a guard telling a loss at once; the cleanup goes on in the
        background). The loss given back (None: nothing to give back, nothing done).

        :meta private:
        """
        return releases.release_lost(
            self._runtime.use(closed_ok=True), self._rule, self._owner(owner)
        )

    # -- reading --------------------------------------------------------------------------------

    def statistics(self, *, owner: Owner | None = None) -> LockStatistics:
        """What this client knows of the lock for ``owner`` (the current task by default)."""
        who = self._owner(owner)
        rt = self._runtime.use(closed_ok=True)
        hold = rt.leases.get(self.name, who)
        if hold is not None:
            rt.leases.current(hold)
        remaining = None
        if hold is not None and hold.state is HoldState.HELD:
            remaining = max(0.0, hold.deadline - asyncio.get_running_loop().time())
        return LockStatistics(
            name=self.name,
            owner=who.id,
            held=hold is not None and hold.state is HoldState.HELD,
            hold_count=hold.count if hold is not None else 0,
            state=hold.state.value if hold is not None else None,
            lost=hold is not None and hold.stale > 0,
            lease_remaining=remaining,
            renewed=hold is not None and hold.renewal is not None and hold.state is HoldState.HELD,
            tasks_waiting=self._tasks_waiting(who),
        )

    def _tasks_waiting(self, who: Owner) -> int:
        """Tasks of this client parked waiting for the lock (no Redis call)."""
        entry = self._runtime.use(closed_ok=True).pubsub.entry(self._rule.channel(who.id))
        return entry.parked if entry is not None else 0

    async def is_locked(self) -> bool:
        """True if anyone holds the lock (checked on the server)."""
        return bool(await self._read("EXISTS", self.name))

    async def is_held_by_current_task(self, *, owner: Owner | None = None) -> bool:
        """True if the owner (the current task by default) holds the lock (on the server)."""
        return await self.hold_count(owner=owner) > 0

    async def hold_count(self, *, owner: Owner | None = None) -> int:
        """How many times the owner (the current task by default) holds the lock (server)."""
        rt = self._runtime.use()
        return await self._rule.count(rt, rt.leases.field(self.name, self._owner(owner)))

    async def remaining_ttl(self) -> float | None:
        """Seconds until the lease runs out; None if unlocked, ``math.inf`` if it never does."""
        pttl = int(await self._read("PTTL", self.name))
        if pttl == -2:
            return None
        if pttl == -1:
            return math.inf
        return pttl / 1000

    async def _read(self, *args: Any) -> Any:
        return await commands.read(self._runtime.use(), self.name, *args, what=args[0])

    def _owner(self, owner: Owner | None) -> Owner:
        """The owner whose hold an operation is about: ``owner``, or the current task's."""
        return self._runtime.resolve_owner(owner)

    def _held(self, owner: Owner | None, *, lost_ok: bool = False) -> Hold:
        """The owner's hold, held; or, with ``lost_ok``, lost and not unlocked yet (it has
        stale counts: its unlock raises LockLostError). Else LockNotOwnedError (and
        ClientClosedError on a closed client, unless it is such a lost hold)."""
        who = self._owner(owner)
        leases = self._runtime.use(closed_ok=lost_ok).leases
        hold = leases.get(self.name, who)
        if hold is not None:
            state = leases.current(hold).state
            if state is HoldState.HELD or (lost_ok and state is HoldState.LOST and hold.stale):
                return hold
        if lost_ok:
            self._runtime.use()  # a closed client: ClientClosedError
        raise LockNotOwnedError(
            f"lock {self.name!r} is not held by {who.id}", name=self.name, owner=who.id
        )


async def unlock_at_exit(
    lock: Lock, exc: BaseException | None, owner: Owner | None, *, lost_ok: bool = False
) -> None:
    """The unlock at the end of an ``async with`` (see :func:`release_at_exit`)."""
    await release_at_exit(lock.unlock(owner=owner), exc, repr(lock.name), lost_ok=lost_ok)


def _in_task() -> bool:
    try:
        return asyncio.current_task() is not None
    except RuntimeError:
        return False
