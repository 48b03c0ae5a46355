"""The permit-expirable semaphore (Redisson's RPermitExpirableSemaphore): each permit has an id
and a lease, held like a lock's hold (renewed by the watchdog when taken without one, lost
when it expires) on the shared acquisition loop."""

from __future__ import annotations

import asyncio
import functools
import math
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from . import acquire, commands, releases, scripts
from .config import check_max_hold
from .contexts import async_only
from .errors import (
    LockLostError,
    LockNotOwnedError,
    LockTimeout,
    RedisOperationError,
    RedisUnavailableError,
)
from .guard import Guard, release_at_exit
from .holds import (
    Hold,
    HoldState,
    LostCallback,
    Owner,
    Renewal,
    SingleUseOwner,
    check_callback,
)
from .keys import (
    PUBLISH,
    check_lease,
    check_seconds,
    permit_timeouts_key,
    semaphore_channel,
    to_millis,
)
from .requests import mutate
from .rules import GRANTED, NOT_RUN, Attempt, Command, Rule
from .runtime import Runtime, RuntimeSource, runtime_of
from .semaphore import (
    RECLAIM_LIMIT,
    Semaphore,
    check_delta,
    no_count,
    semaphore_wakes,
)
from .transport import NotSent, OutcomeUnknown

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
        score = await commands.read(
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

    __slots__ = ("_rule", "_runtime", "name")

    def __init__(self, runtime: Runtime | RuntimeSource, name: str) -> None:
        self._runtime = runtime = runtime_of(runtime)
        self.name = name
        self._rule = runtime.rule(PermitRule, name)

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
        check_delta(permits)
        if permits < 0:
            await self._counts()  # expired permits count as available
        return await self._semaphore().add_permits(permits)

    def _semaphore(self) -> Semaphore:
        return Semaphore(self._runtime, self.name)  # the same count, the same scripts

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
        runtime = self._runtime
        cap = None
        if lease_time is None:
            lease_ms = to_millis(runtime.config.watchdog_timeout)
            cap = runtime.config.max_hold if max_hold is None else check_max_hold(max_hold)
            if cap == math.inf:
                cap = None
            elif cap is not None:
                lease_ms = min(lease_ms, to_millis(cap))
        else:
            lease_ms = to_millis(check_lease(lease_time, "lease_time"))
            if max_hold is not None:
                raise ValueError("max_hold caps renewal; a permit with lease_time is not renewed")
        rt = runtime.use()
        if owner is not None:
            runtime.resolve_owner(owner)  # checked, and no more: a permit belongs to no task
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
        rt = self._runtime.use()
        hold = rt.leases.holds.get((self.name, permit))
        if hold is not None and (hold.count or hold.stale):
            try:
                await releases.release(rt, self._rule, hold.owner)
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
            deadline=commands.cleanup_deadline(asyncio.get_running_loop().time(), rt.config),
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
        hold = self._hold(permit, lost_ok=True)  # lost already: told at the first await
        rt = self._runtime.use(closed_ok=True)

        async def release(exc: BaseException | None) -> None:
            await self._release_at_exit(permit, exc)

        async def release_lost() -> None:
            releases.release_lost(rt, self._rule, hold.owner)

        async with Guard(
            f"permit {permit} of {self.name!r}",
            functools.partial(rt.leases.on_lost, hold),
            release,
            release_lost,
        ):
            yield permit

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
        """The release at the end of an ``async with`` (see :func:`release_at_exit`)."""
        what = f"permit {permit} of {self.name!r}"
        await release_at_exit(self.release(permit), exc, what, lost_ok=lost_ok)

    # -- losing ---------------------------------------------------------------------------

    def on_lost(self, permit_id: str, callback: LostCallback) -> Callable[[], None]:
        """Call ``callback(LockLostError)`` once if this client's permit is lost (its lease
        ran out, a renewal was not confirmed in time, its task ended, the client closed).
        A permit already lost (and not released yet) is told at once: the callback is
        scheduled as it would have been at the loss. Returns a function that removes the
        callback; LockNotOwnedError if neither held nor lost here."""
        check_callback(callback)
        hold = self._hold(check_permit_id(permit_id), lost_ok=True)
        return self._runtime.use(closed_ok=True).leases.on_lost(hold, callback)

    def _hold(self, permit: str, *, lost_ok: bool = False) -> Hold:
        """The permit's hold, held; or, with ``lost_ok``, lost and not released yet."""
        leases = self._runtime.use(closed_ok=lost_ok).leases
        hold = leases.holds.get((self.name, permit))
        if hold is not None:
            state = leases.current(hold).state
            if state is HoldState.HELD or (lost_ok and state is HoldState.LOST and hold.stale):
                return hold
        if lost_ok:
            self._runtime.use()  # a closed client: ClientClosedError
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
        rt = self._runtime.use()
        rule = self._rule
        cmd = scripts.PERMIT_COUNTS.command(rule._keys(), (PUBLISH, RECLAIM_LIMIT))
        for _ in range(2):  # it only returns expired permits: harmless to run again
            try:
                reply = await commands.command(rt, self.name, cmd, None)
            except NotSent as exc:
                raise RedisUnavailableError(
                    f"reading the permits of semaphore {self.name!r} failed: {exc}"
                ) from exc
            if isinstance(reply, list):
                return int(reply[0]), int(reply[1])
            if not isinstance(reply, OutcomeUnknown):
                break
        raise RedisOperationError(f"reading the permits of semaphore {self.name!r} failed: {reply}")

    def statistics(self) -> PermitStatistics:
        """What this client knows of the semaphore (no Redis call)."""
        runtime = self._runtime
        rt = runtime.use()
        held = renewed = lost = 0
        for hold in runtime.holds_of(self.name):
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


__all__ = ["PermitExpirableSemaphore", "PermitStatistics"]
