"""The multi-lock: several locks, possibly on different Redis servers, held all or nothing
(Redisson's ``RedissonMultiLock``), and the base of the red lock (:mod:`aiolock.redlock`).

A multi-lock has no key of its own: it is its member locks, each taken through its own
public methods (``try_lock``, ``lock``, ``unlock``, ``statistics``, ``on_lost``) for one
owner, so any lock type built on the core (lock, fenced lock, fair lock, read or write lock)
can be a member, on any client.

**One owner across the members.** Every member is taken for the same
:class:`~aiolock.Owner`, passed as ``owner=`` even to members on other clients, so each
member's hash on each server names the same owner id (except where the core writes a fresh
id for a lock after a request about it that it could not fence: see ``Leases.taint``). By
default that owner follows the current task, as a Lock's owner is the task on the lock's
client: it is the task's multi-lock owner on the client of the first member (in acquisition
order), ``<that client's uuid>:<n>``, one per task and client, made on first use and tied to
the task (a task that ends holding a multi-lock has its members released, with a warning).
So the multi-locks and red locks a task takes re-enter each other when their first members
share a client (always, on one client), and exclude other tasks and other clients. It is not
the owner of the task's direct holds: a member the task already holds itself, or through a
multi-lock under another of its owners, cannot be taken by the same task (it would wait for
itself), and that raises :class:`~aiolock.LockUsageError` at once. Pass
``owner=client.new_owner()`` (of one of the members' clients: ValueError otherwise) to
choose: one owner for direct holds and multi-locks alike, or holds that pass between tasks.
(A client refuses another client's owner for its own locks, so a direct hold under an
explicit owner is taken on the client that made it; only the composites hand one owner to
every member's client.)

**Acquisition** (all or nothing, in a stable order): members are sorted by (server address,
database, name) and taken one after the other, each waiting at most what is left of
``wait_time``, so two multi-locks sharing members never wait for each other in a cycle.
When a member cannot be taken in time, or an error comes back, every member taken so far is
released (shielded, bounded by ``cleanup_timeout``) before the call returns False or raises;
so is everything on cancellation, also inside anyio cancel scopes.

**Leases.** Without ``lease_time`` each member is renewed by its client's watchdog while
held. With it, each member is taken with that lease as it is taken, so the multi-lock holds
for ``lease_time`` minus the time its acquisition took (``statistics().lease_remaining``
says how long is left); the wait for each member is bounded by the earliest lease of those
already taken, and if that lease runs out first everything is released and the acquisition
starts over while ``wait_time`` lasts. No member ever outlives the lease asked for, even if
the process dies half-way (Redisson takes members with ``2 x wait_time`` and PEXPIREs them
afterwards, unchecked).

**Losing it.** A composite reports a loss exactly as a plain lock does: ``on_lost``
callbacks run once, ``guard()`` cancels its body, ``unlock()`` raises
:class:`~aiolock.LockLostError`. A multi-lock needs every member, so it is lost as soon as
any member is (its lease ran out, its renewal found it gone, it was force-unlocked, its
client closed, or its release found nothing: its server restarted empty); a red lock needs
a quorum (:mod:`aiolock.redlock`). ``unlock()`` releases every member the owner holds (or
lost) in parallel and decides from what those releases report, after they ran: held to the
end when a quorum of them (every member here) found their member held; lost when even with
the unconfirmed ones that quorum is out of reach because members were found lost; not known
(RedisOperationError) when only unconfirmed releases could make it up. ``on_lost`` on a
composite already lost (not unlocked yet) schedules the callback at once.

A loss inside an acquisition is the acquisition's own business: a member this call took is
lost before the others are taken (the process stalled past its lease between two grants),
so the attempt gives back what it took and goes on (``lock()`` waits on, ``try_lock()``
tries again while ``wait_time`` lasts); the caller, who never held the multi-lock, is never
told it was lost. Only counts held before the call and lost since make it raise
LockLostError.

Deliberate differences from Redisson (see ``REDISSON.md`` section 7): a stable order instead
of the order given; ``unlock()`` releases every member in parallel and reports afterwards
(Redisson's sync unlock stops at the first failure and leaves the rest locked); the lease
arithmetic above (no x1000 growth on retries, no unchecked PEXPIRE); an error of one member
is not taken for "maybe acquired": the core settles lost replies and undoes what a cancelled
or failed attempt took; reentrant per owner; statistics and loss reporting instead of
``UnsupportedOperationException``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NoReturn

from .commands import cleanup_deadline, give_up_point
from .config import Config
from .contexts import async_only
from .errors import (
    AioLockError,
    LockLostError,
    LockNotOwnedError,
    LockUsageError,
)
from .guard import Guard, release_at_exit
from .holds import CompositeOwner, LostCallback, Owner, check_callback
from .keys import check_lease, check_seconds
from .members import (
    Member,
    MemberLock,
    keep,
    member_order,
    member_stats,
    members_of,
    other_task_owners,
    release_members,
    report_release,
    run_callback,
    task_owner,
    wait_shielded,
)
from .runtime import check_owner
from .tasks import current_task


@dataclass(frozen=True, slots=True)
class MultiLockStatistics:
    """What the members' clients know of a multi-lock or red lock, for one owner (no Redis
    call), computed from the members' own statistics."""

    #: the multi-lock's name (its members' names, or the red lock's name)
    name: str
    #: the owner asked about (the current task's multi-lock owner by default)
    owner: str
    #: the owner holds it: every member (multi-lock), a quorum of them (red lock)
    held: bool
    #: how many times the owner holds it (reentrancy)
    hold_count: int
    #: it was lost (a member lost; fewer than a quorum left for a red lock) and the owner has
    #: not unlocked it yet
    lost: bool
    #: seconds until it is lost unless renewed (the earliest member lease for a multi-lock,
    #: the quorum-th longest for a red lock); None when not held
    lease_remaining: float | None
    #: every held member is renewed by its client's watchdog
    renewed: bool
    #: members held by the owner, and how many must be held
    members_held: int
    quorum: int
    #: each member's own statistics for the owner, in acquisition order
    members: tuple[Any, ...]


# -- the multi-lock --------------------------------------------------------------------------


class MultiLock:
    """Several locks held all or nothing; get one with :func:`aiolock.multi_lock`.

    ``async with multi:`` is :meth:`lock` then :meth:`unlock`. See the module docstring for
    the owner, the acquisition order, leases and losses. Like a Lock, a multi-lock object is
    stateless: two multi-locks over the same members are the same multi-lock.
    """

    __slots__ = ("_bounds", "_cleanup_timeout", "_command_timeout", "_members", "name")

    _kind = "multi-lock"

    def __init__(self, locks: Sequence[MemberLock], *, name: str | None = None) -> None:
        members = members_of(locks, self._kind)
        self._members: tuple[Member, ...] = tuple(sorted(members, key=member_order))
        self.name = name if name is not None else ", ".join(m.lock.name for m in self._members)
        clients = {id(m.runtime): m.runtime for m in self._members}.values()
        self._cleanup_timeout = max(c.config.cleanup_timeout for c in clients)
        self._command_timeout = max(c.config.command_timeout for c in clients)
        #: the timeouts the composite's bounds are made of (the members' largest), for the
        #: core's give_up_point and cleanup_deadline: a bound is when the call has returned,
        #: so it gives up a small margin before it, as a single lock does
        self._bounds: Config = dataclasses.replace(
            self._members[0].runtime.config,
            command_timeout=self._command_timeout,
            cleanup_timeout=self._cleanup_timeout,
        )

    def __repr__(self) -> str:
        members = ", ".join(f"{m.lock.name}@{m.server[0]}/{m.server[1]}" for m in self._members)
        state = ""
        if _in_task():
            stats = self.statistics()
            state = " lost" if stats.lost else f" held x{stats.hold_count}" if stats.held else ""
        return f"<aiolock.{type(self).__name__} [{members}]{state}>"

    @property
    def members(self) -> tuple[MemberLock, ...]:
        """The member locks, in acquisition order."""
        return tuple(m.lock for m in self._members)

    @property
    def quorum(self) -> int:
        """How many members must be held: all of them."""
        return len(self._members)

    # -- owners ---------------------------------------------------------------------------

    def owner(self) -> Owner:
        """The current task's owner of this multi-lock (the default ``owner``): the task's
        multi-lock owner on the client of the first member."""
        return task_owner(self._members[0].runtime)

    def _owner(self, owner: Owner | None) -> Owner:
        """The owner handed to every member (on every member's client): ``owner``, which
        must belong to one of the members' clients, or the current task's."""
        if owner is None:
            owner = self.owner()
        else:
            check_owner(owner)
            if not any(m.runtime.owns(owner) for m in self._members):
                raise ValueError(
                    f"owner {owner.id} belongs to none of the clients of {self._kind} "
                    f"{self.name!r}; make it with new_owner() of one of them"
                )
        return CompositeOwner(owner.id, owner.task)

    def _ready(self, owner: Owner | None) -> Owner:
        """The owner, after the checks made before any Redis call: every client open and on
        this event loop."""
        for member in self._members:
            member.runtime.use()  # ClientClosedError, WrongEventLoopError
        return self._owner(owner)

    def _check_usage(
        self,
        who: Owner,
        members: Sequence[Member],
        exclude: Collection[Member] = (),
        task: asyncio.Task[Any] | None = None,
    ) -> None:
        """Raise if ``members`` (that could not be taken at once) cannot be taken at all:
        the multi-lock was lost and not unlocked yet (LockLostError; losses of the members
        in ``exclude``, taken by the acquisition under way, are its own business), or the
        calling task (``task``, by default the current one) holds one of them under another
        owner of its own, so it would wait for itself (LockUsageError). Checked only then:
        nothing is looked up on the fast path."""
        self._check_not_lost(who, exclude)
        if task is None:
            task = asyncio.current_task()
        if task is None or who.task is not task:
            return  # an explicit owner: whatever else holds them is another owner
        others = other_task_owners(who, task)
        for member in members:
            if member.runtime.closed:
                continue
            direct = member.runtime.resolve_owner(None, task)
            for other in (direct, *others):
                if member.lock.statistics(owner=other).hold_count:
                    how = "itself" if other.id == direct.id else "through another multi-lock"
                    raise LockUsageError(
                        f"this task holds {member.lock.name!r} {how} (owner {other.id}), so "
                        f"taking it through {self._kind} {self.name!r} (owner {who.id}) "
                        "would wait for itself; pass owner= to share one owner",
                        name=self.name,
                    )

    # -- acquiring ------------------------------------------------------------------------

    async def try_lock(
        self, wait_time: float = 0, lease_time: float | None = None, *, owner: Owner | None = None
    ) -> bool:
        """Take every member, waiting at most ``wait_time`` seconds in all; True if taken.

        With ``lease_time`` every member expires after it (counted from when each is taken);
        without it each is renewed by its client's watchdog while held. Returns or raises
        within ``wait_time + command_timeout`` (plus the round trips to the other servers).
        On False or an exception every member taken is released first (past that bound, in
        the background)."""
        wait = check_seconds(wait_time, "wait_time")
        lease = None if lease_time is None else check_lease(lease_time, "lease_time")
        return await self._acquire(wait, lease, self._ready(owner))

    async def lock(self, lease_time: float | None = None, *, owner: Owner | None = None) -> None:
        """Take every member, waiting as long as it takes."""
        lease = None if lease_time is None else check_lease(lease_time, "lease_time")
        await self._acquire(None, lease, self._ready(owner))

    async def _acquire(self, wait: float | None, lease: float | None, who: Owner) -> bool:
        loop = asyncio.get_running_loop()
        wait_until = None if wait is None else loop.time() + wait
        caller = current_task()
        backoff = 0.005
        while True:
            outcome = await self._attempt_in_task(who, wait_until, lease, caller)
            if outcome is not None:
                return outcome
            # a lease ran out before every member was taken: start over while time is left
            left = None if wait_until is None else wait_until - loop.time()
            if left is not None and left <= 0:
                return False
            delay = random.uniform(0, backoff)
            await asyncio.sleep(delay if left is None else min(delay, left))
            backoff = min(backoff * 2, 0.5)

    async def _attempt_in_task(
        self, who: Owner, wait_until: float | None, lease: float | None, caller: asyncio.Task[Any]
    ) -> bool | None:
        """:meth:`_attempt` in a task of its own, so that a cancelled caller is back within
        cleanup_timeout of its cancellation. Awaited directly, a member acquire cancelled
        with its command in flight waits for its own give-back first (up to
        cleanup_timeout), and only then could the attempt start giving back the members it
        took before: twice cleanup_timeout. Here, at the cancellation, the attempt is
        cancelled (the member acquire under way gives back what it obtained) and the
        members it took are given back at the same time; the caller waits for both until
        cleanup_timeout after the cancellation, and what is not done by then goes on in the
        background (each member in its owner's turn: the owner's next acquisition waits)."""
        loop = asyncio.get_running_loop()
        taken: list[Member] = []
        attempt = loop.create_task(self._attempt(who, wait_until, lease, caller, taken))
        try:
            await asyncio.wait((attempt,))
        except asyncio.CancelledError:
            deadline = cleanup_deadline(loop.time(), self._bounds)
            attempt.cancel()  # a no-op if it ended (then taken is empty, or every member)
            give_back = loop.create_task(self._give_back(taken, who, deadline - loop.time()))
            for task in (attempt, give_back):
                keep(task)
            await wait_shielded({attempt, give_back}, deadline - loop.time())
            raise
        return attempt.result()

    async def _attempt(
        self,
        who: Owner,
        wait_until: float | None,
        lease: float | None,
        caller: asyncio.Task[Any],
        taken: list[Member],
    ) -> bool | None:
        """One pass over the members in order, for the task ``caller``: True (all taken),
        False (one could not be taken in time), None (an earlier member's lease ran out
        first: start over). ``taken`` lists the members taken and not given back yet (see
        :meth:`_give_back`): every member when it returns True, none otherwise."""
        loop = asyncio.get_running_loop()
        expires = math.inf  # loop time at which the earliest lease taken runs out
        try:
            for member in self._members:
                if not await member.lock.try_lock(0, lease, owner=who):
                    if any(member_stats(m, who).lost for m in taken):
                        # A member this attempt took was lost meanwhile (the process stalled
                        # past its lease during this try, it was force-unlocked): the
                        # attempt's own business. Give back what it took and start over (a
                        # loss of counts held before this call is then reported by the next
                        # attempt: they stay lost until unlocked).
                        await self._give_back(taken, who, self._release_budget(wait_until))
                        return None
                    # busy: check that it can ever be taken, then wait for it, at most what
                    # is left of the wait and of the earliest lease taken
                    self._check_usage(who, [member], exclude=taken, task=caller)
                    left = None if wait_until is None else max(0.0, wait_until - loop.time())
                    bounded_by_lease = False
                    if lease is not None and taken:
                        until_expiry = expires - loop.time()
                        if until_expiry <= 0:
                            await self._give_back(taken, who, self._release_budget(wait_until))
                            return None
                        if left is None or until_expiry < left:
                            left, bounded_by_lease = until_expiry, True
                    if left is None:
                        await member.lock.lock(lease, owner=who)
                    elif not await member.lock.try_lock(left, lease, owner=who):
                        await self._give_back(taken, who, self._release_budget(wait_until))
                        return None if bounded_by_lease else False
                taken.append(member)
                if lease is not None:
                    remaining = member_stats(member, who).lease_remaining
                    expires = min(expires, loop.time() + (remaining or 0.0))
            if all(s.held for s in self._stats(who)):
                return True
            # a member taken first was lost meanwhile (lease ran out, force-unlocked): the
            # attempt's own business, as above
            await self._give_back(taken, who, self._release_budget(wait_until))
            return None
        except BaseException as exc:
            await self._give_back(taken, who, self._release_budget(wait_until))
            if isinstance(exc, LockLostError):
                # a member's own lost counts, from before this call (its try refuses to
                # take it again before they are unlocked): the multi-lock's own error
                self._check_not_lost(who)
            raise

    async def _give_back(self, taken: list[Member], who: Owner, seconds: float) -> None:
        """Release the members an attempt took, waiting at most ``seconds``. They leave
        ``taken`` at once: whoever gives them back first (the attempt, or its caller when
        cancelled) does it alone, so no count is released twice (a member may hold counts
        of an outer multi-lock of the same owner)."""
        members = taken[:]
        taken.clear()
        if members:
            await release_members(members, who, seconds)

    def _release_budget(self, wait_until: float | None) -> float:
        """How long a failing acquisition waits for its releases: until it gives up so as to
        have returned within ``wait_time + command_timeout`` (commands.give_up_point), at
        most ``cleanup_timeout``; what is not done by then goes on in the background."""
        if wait_until is None:
            return self._cleanup_timeout
        give_up_at = give_up_point(wait_until, self._bounds)
        assert give_up_at is not None
        left = give_up_at - asyncio.get_running_loop().time()
        return min(self._cleanup_timeout, max(left, 0.0))

    def _check_not_lost(self, who: Owner, exclude: Collection[Member] = ()) -> None:
        """Raise LockLostError if the owner's hold was lost and not unlocked yet; a loss of
        the members in ``exclude`` (taken by the acquisition under way) does not count."""
        stats = self._stats(who)
        if self._lost(stats) and any(
            s.lost for m, s in zip(self._members, stats, strict=True) if m not in exclude
        ):
            raise LockLostError(
                f"{self._kind} {self.name!r} held by {who.id} was lost; unlock it as often as "
                "it was taken before taking it again",
                name=self.name,
                owner=who.id,
            )

    async def __aenter__(self) -> MultiLock:
        await self.lock()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._unlock_at_exit(exc, None)

    def __enter__(self) -> NoReturn:
        raise TypeError(f"use 'async with' with an aiolock {type(self).__name__}, not 'with'")

    def __exit__(self, *args: object) -> None:  # pragma: no cover - __enter__ always raises
        pass

    # -- releasing ------------------------------------------------------------------------

    async def unlock(self, *, owner: Owner | None = None) -> None:
        """Drop one hold of every member the owner holds, in parallel.

        Once called, the releases complete even if the caller is cancelled (it waits for them
        at most ``cleanup_timeout``). What it raises is decided from what the member
        releases report, after they ran (a member lost unnoticed, e.g. its server restarted
        empty, is found by its release); with the quorum every member for a multi-lock and
        ``N // 2 + 1`` for a red lock: nothing if a quorum of releases found their member
        held; LockLostError if fewer did, even counting the releases left unconfirmed,
        because members were found lost (gone at release, or reported lost before; the
        other members are released all the same); LockNotOwnedError if fewer did and none
        was lost (the owner held only some members; those were released), or if it holds
        none (nothing is sent); a RedisOperationError if only unconfirmed releases could
        make up the quorum (they go on in the background; those members are never renewed
        again)."""
        who = self._owner(owner)
        stats = self._stats(who)
        targets = [m for m, s in zip(self._members, stats, strict=True) if s.hold_count or s.lost]
        if not targets:
            raise LockNotOwnedError(
                f"{self._kind} {self.name!r} is not held by {who.id}", name=self.name, owner=who.id
            )
        start = asyncio.get_running_loop().time()
        results = await release_members(targets, who, cleanup_deadline(start, self._bounds) - start)
        report_release(self._kind, self.name, self._members, self.quorum, who, results)

    async def force_unlock(self) -> bool:
        """Force-unlock every member, in parallel, whoever holds it (each member's own
        ``force_unlock``: its waiters are woken, other owners' holds are lost); True if any
        member was held. Raises the first error of a member after all were tried."""
        for member in self._members:
            if not callable(getattr(member.lock, "force_unlock", None)):
                raise TypeError(f"{member.lock!r} has no force_unlock()")
        results = await asyncio.gather(
            *(member.lock.force_unlock() for member in self._members),  # type: ignore[attr-defined]
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return any(results)

    async def _release_lost(self, owner: Owner | None) -> None:
        """The release when a guard tells the loss: as :meth:`unlock`, but the lost members
        give back their lost counts at once, without waiting for their cleanups (those go
        on in the background); the members still held are released for real."""
        who = self._owner(owner)
        stats = self._stats(who)
        held: list[Member] = []
        results: dict[Member, BaseException | None] = {}
        for member, of_member in zip(self._members, stats, strict=True):
            if of_member.hold_count:
                held.append(member)
            elif of_member.lost:
                results[member] = member.lock.release_lost(owner=who)
        if held:
            start = asyncio.get_running_loop().time()
            seconds = cleanup_deadline(start, self._bounds) - start
            results.update(await release_members(held, who, seconds))
        if not results:
            return
        try:
            report_release(self._kind, self.name, self._members, self.quorum, who, results)
        except LockLostError:
            return

    async def _unlock_at_exit(
        self, exc: BaseException | None, owner: Owner | None, *, lost_ok: bool = False
    ) -> None:
        """The unlock at the end of an ``async with`` (see :func:`release_at_exit`)."""
        what = f"{self._kind} {self.name!r}"
        await release_at_exit(self.unlock(owner=owner), exc, what, lost_ok=lost_ok)

    # -- losing ---------------------------------------------------------------------------

    def on_lost(self, callback: LostCallback, *, owner: Owner | None = None) -> Callable[[], None]:
        """Call ``callback(LockLostError)`` once if the owner loses the multi-lock (any
        member lost; for a red lock, fewer than a quorum still held). It runs from the event
        loop soon after (a coroutine result is run as a task). A multi-lock already lost
        (and not unlocked yet: its unlock would raise LockLostError) is told at once: the
        callback is scheduled the same way. Returns a remover.
        Raises LockNotOwnedError if the owner neither holds it nor has it lost to unlock."""
        check_callback(callback)
        who = self._owner(owner)
        stats = self._stats(who)
        if self._held(stats):
            watched = [m for m, s in zip(self._members, stats, strict=True) if s.held]
            spare = len(watched) - self.quorum  # losses it survives
        elif self._lost(stats):
            # lost already: a lost member tells its loss at once, and so this callback
            watched = [m for m, s in zip(self._members, stats, strict=True) if s.lost][:1]
            spare = 0
        else:
            raise LockNotOwnedError(
                f"{self._kind} {self.name!r} is not held by {who.id}", name=self.name, owner=who.id
            )
        losses = 0
        removers: list[Callable[[], None]] = []
        fired = False

        def member_lost(error: LockLostError) -> None:
            nonlocal losses, fired
            losses += 1
            if fired or losses <= spare:
                return
            fired = True
            remove()
            lost = LockLostError(
                f"{self._kind} {self.name!r} held by {who.id} was lost: {error}",
                name=self.name,
                owner=who.id,
            )
            lost.__cause__ = error
            run_callback(callback, lost)

        def remove() -> None:
            while removers:
                removers.pop()()

        for member in watched:
            removers.append(member.lock.on_lost(member_lost, owner=who))
        return remove

    @async_only
    async def guard(
        self, lease_time: float | None = None, *, owner: Owner | None = None
    ) -> AsyncIterator[MultiLock]:
        """Hold the multi-lock for the body and cancel the body if it is lost.

        Like ``Lock.guard()``: when the multi-lock is lost (see :meth:`on_lost`) the body is
        cancelled once and LockLostError is raised from the ``async with``; so it is when
        the body ended but the releases at its end find the multi-lock lost (see
        :meth:`unlock`)."""
        await self.lock(lease_time, owner=owner)

        async def release(exc: BaseException | None) -> None:
            await self._unlock_at_exit(exc, owner)

        async def release_lost() -> None:
            await self._release_lost(owner)

        async with Guard(
            f"{self._kind} {self.name!r}",
            functools.partial(self.on_lost, owner=owner),
            release,
            release_lost,
        ):
            yield self

    # -- reading --------------------------------------------------------------------------

    async def is_locked(self) -> bool:
        """True if a quorum of the members (every one of a multi-lock) is locked by anyone
        (read on the servers, in parallel)."""
        answers = await self._read(lambda lock: lock.is_locked())
        return sum(1 for answer in answers if answer is True) >= self.quorum

    async def hold_count(self, *, owner: Owner | None = None) -> int:
        """How many times the owner holds it on the servers: the quorum-th largest of its
        members' hold counts (the smallest for a multi-lock)."""
        who = self._owner(owner)
        answers = await self._read(lambda lock: lock.hold_count(owner=who))
        counts = sorted((a for a in answers if isinstance(a, int)), reverse=True)
        return counts[self.quorum - 1] if len(counts) >= self.quorum else 0

    async def is_held_by_current_task(self, *, owner: Owner | None = None) -> bool:
        """True if the owner (the current task's multi-lock owner by default) holds it, as
        the servers say."""
        return await self.hold_count(owner=owner) > 0

    async def _read(self, read: Callable[[Any], Awaitable[Any]]) -> list[Any]:
        """Ask every member's server at once; an answer per member (an AioLockError where
        its server failed). Raises the first error if fewer than a quorum answered."""
        answers = await asyncio.gather(
            *(read(m.lock) for m in self._members), return_exceptions=True
        )
        errors = [a for a in answers if isinstance(a, BaseException)]
        for error in errors:
            if not isinstance(error, AioLockError):
                raise error
        if len(answers) - len(errors) < self.quorum:
            raise errors[0]
        return answers

    def _stats(self, who: Owner) -> list[Any]:
        return [member_stats(m, who) for m in self._members]

    def _held(self, stats: Sequence[Any]) -> bool:
        return sum(1 for s in stats if s.held) >= self.quorum

    def _lost(self, stats: Sequence[Any]) -> bool:
        return any(s.lost for s in stats) and not self._held(stats)

    def statistics(self, *, owner: Owner | None = None) -> MultiLockStatistics:
        """What the members' clients know of it for ``owner`` (no Redis call)."""
        who = self._owner(owner)
        stats = self._stats(who)
        held_stats = [s for s in stats if s.held]
        quorum = self.quorum
        held = len(held_stats) >= quorum
        remaining = None
        count = 0
        if held:
            # the quorum-th longest lease / hold count of the held members (for a
            # multi-lock, whose quorum is every member: the shortest, the smallest)
            leases = sorted((s.lease_remaining or 0.0 for s in held_stats), reverse=True)
            remaining = leases[quorum - 1]
            counts = sorted((s.hold_count for s in held_stats), reverse=True)
            count = counts[quorum - 1]
        return MultiLockStatistics(
            name=self.name,
            owner=who.id,
            held=held,
            hold_count=count,
            lost=self._lost(stats),
            lease_remaining=remaining,
            renewed=bool(held_stats) and all(s.renewed for s in held_stats),
            members_held=len(held_stats),
            quorum=quorum,
            members=tuple(stats),
        )


def _in_task() -> bool:
    try:
        return asyncio.current_task() is not None
    except RuntimeError:
        return False


def multi_lock(*locks: MemberLock) -> MultiLock:
    """A multi-lock over ``locks`` (any aiolock lock objects, on one client or several):
    held all or nothing, taken in a stable order. See :class:`MultiLock`."""
    return MultiLock(locks)
