"""The members of the composites (multi-lock, red lock): what a member lock must offer, the
multi-lock owners of a task, the composites' background work, and the parallel release of
members."""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from collections.abc import Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from .errors import (
    AioLockError,
    ClientClosedError,
    LockLostError,
    LockNotOwnedError,
    RedisOperationError,
)
from .holds import CompositeOwner, LostCallback, Owner
from .runtime import Runtime
from .tasks import current_task, new_id

logger = logging.getLogger("aiolock")


class MemberLock(Protocol):
    """What a multi-lock or red lock needs of a member: the public surface every aiolock lock
    type shares (and the runtime of the client it belongs to)."""

    @property
    def name(self) -> str: ...

    @property
    def runtime(self) -> Runtime: ...

    async def try_lock(
        self, wait_time: float = ..., lease_time: float | None = ..., *, owner: Owner | None = ...
    ) -> bool: ...

    async def lock(self, lease_time: float | None = ..., *, owner: Owner | None = ...) -> None: ...

    async def unlock(self, *, owner: Owner | None = ...) -> None: ...

    def statistics(self, *, owner: Owner | None = ...) -> Any: ...

    async def is_locked(self) -> bool: ...

    async def hold_count(self, *, owner: Owner | None = ...) -> int: ...

    def on_lost(
        self, callback: LostCallback, *, owner: Owner | None = ...
    ) -> Callable[[], None]: ...

    def release_lost(self, *, owner: Owner | None = ...) -> LockLostError | None: ...


@dataclass(frozen=True, slots=True)
class Member:
    lock: MemberLock
    runtime: Runtime
    #: (server address, database)
    server: tuple[str, int]


# -- owners ----------------------------------------------------------------------------------

#: the numbers of the multi-lock owners of each task, by client id (numbers, not Owners: an
#: Owner refers to its task, which would keep the weak key alive)
_TASK_OWNERS: weakref.WeakKeyDictionary[asyncio.Task[Any], dict[str, int]] = (
    weakref.WeakKeyDictionary()
)


def task_owner(runtime: Runtime) -> Owner:
    """The current task's owner of the multi-locks and red locks whose first member is on
    ``runtime``'s client (its number made on first use; its id is ``<client uuid>:<n>``)."""
    task = current_task()
    numbers = _TASK_OWNERS.get(task)
    if numbers is None:
        numbers = _TASK_OWNERS[task] = {}
    number = numbers.get(runtime.id)
    if number is None:
        number = numbers[runtime.id] = new_id()
    return Owner(f"{runtime.id}:{number}", task)


def other_task_owners(who: Owner, task: asyncio.Task[Any]) -> list[Owner]:
    """The other owners of multi-locks and red locks of ``task``."""
    numbers = _TASK_OWNERS.get(task, {})
    owners = [CompositeOwner(f"{client_id}:{n}", task) for client_id, n in numbers.items()]
    return [owner for owner in owners if owner.id != who.id]


# -- background work -------------------------------------------------------------------------

#: cleanups spanning several clients (each member's own work runs on its client's spawn)
_DETACHED: set[asyncio.Task[Any]] = set()


def detach(coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Run ``coro`` in a task that nobody awaits; failures are logged."""
    task = asyncio.get_running_loop().create_task(coro)
    _DETACHED.add(task)
    task.add_done_callback(_detached_done)
    return task


def _detached_done(task: asyncio.Task[Any]) -> None:
    _DETACHED.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.error("aiolock: a multi-lock cleanup failed", exc_info=task.exception())


def keep(task: asyncio.Task[Any]) -> None:
    """Keep a task its caller no longer waits for until it ends (its outcome is retrieved:
    what it raises was told to that caller or does not matter any more)."""
    _DETACHED.add(task)
    task.add_done_callback(_DETACHED.discard)
    task.add_done_callback(retrieve)


def retrieve(task: asyncio.Future[Any]) -> None:
    """A done callback that marks a task's exception as seen (it is reported elsewhere)."""
    if not task.cancelled():
        task.exception()


async def wait_shielded(tasks: Collection[asyncio.Future[Any]], seconds: float) -> None:
    """Wait for ``tasks`` at most ``seconds``, shielded from anyio cancel scopes (they go on
    either way; a second native cancellation still ends the wait)."""
    if tasks and seconds > 0:
        with anyio.CancelScope(shield=True):
            await asyncio.wait(tasks, timeout=seconds)


def member_stats(member: Member, who: Owner) -> Any:
    """The member's statistics for ``who``; a closed client's lock still reports the holds
    its closing lost (lost, until unlocked)."""
    return member.lock.statistics(owner=who)


class Unconfirmed(RedisOperationError):
    """A member release that did not end in time (it goes on in the background)."""


def run_callback(callback: LostCallback, error: LockLostError) -> None:
    try:
        result = callback(error)
        if inspect.isawaitable(result):
            detach(_await(result))
    except Exception:
        logger.exception("aiolock: an on_lost callback failed")


async def _await(awaitable: Any) -> None:
    try:
        await awaitable
    except Exception:
        logger.exception("aiolock: an on_lost callback failed")


# -- members ---------------------------------------------------------------------------------


def members_of(locks: Sequence[Any], kind: str) -> list[Member]:
    """Check the member locks (before any I/O); raise TypeError / ValueError."""
    if isinstance(locks, str | bytes) or not isinstance(locks, Sequence):
        raise TypeError(f"a {kind} takes lock objects, not {type(locks).__name__}")
    if not locks:
        raise ValueError(f"a {kind} needs at least one lock")
    members: list[Member] = []
    seen: dict[tuple[str, int, str], Any] = {}
    for lock in locks:
        runtime = getattr(lock, "runtime", None)
        name = getattr(lock, "name", None)
        if (
            not isinstance(runtime, Runtime)
            or not isinstance(name, str)
            or not all(
                callable(getattr(lock, method, None))
                for method in ("try_lock", "lock", "unlock", "statistics", "on_lost")
            )
        ):
            raise TypeError(f"a {kind} takes aiolock lock objects, not {lock!r}")
        server = runtime.deployment
        key = (*server, name)
        if key in seen:
            raise ValueError(
                f"{lock!r} and {seen[key]!r} are the same lock ({name!r} on "
                f"{server[0]}/{server[1]}); a {kind} takes each lock once"
            )
        seen[key] = lock
        members.append(Member(lock, runtime, server))
    return members


def member_order(member: Member) -> tuple[str, int, str]:
    return (*member.server, member.lock.name)


async def release_members(
    members: Sequence[Member], who: Owner, seconds: float
) -> dict[Member, BaseException | None]:
    """Release one count of each member in parallel, each in a task of its client (so a
    cancelled caller cannot stop them); wait for them at most ``seconds`` (shielded).
    What each release raised (None: released)."""
    tasks: dict[asyncio.Task[None], Member] = {}
    results: dict[Member, BaseException | None] = {}
    for member in members:
        try:
            runtime = member.runtime.use(closed_ok=True)
        except AioLockError as exc:  # another event loop
            results[member] = exc
            continue
        if runtime.closed:
            # its close lost every hold: the loss is told at once, no work is started there
            lost = member.lock.release_lost(owner=who)
            results[member] = lost or ClientClosedError(
                f"releasing {member.lock.name!r}: aiolock client {runtime.id} is closed"
            )
            continue
        task = runtime.spawn(member.lock.unlock(owner=who))
        task.add_done_callback(retrieve)
        tasks[task] = member
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    try:
        if tasks:
            await asyncio.wait(tasks, timeout=seconds)
    except asyncio.CancelledError:
        await wait_shielded(tasks, until - loop.time())
        raise
    for task, member in tasks.items():
        if not task.done():
            results[member] = Unconfirmed(
                f"releasing {member.lock.name!r} did not end within {seconds:.3g} s; "
                "it goes on in the background"
            )
        elif task.cancelled():
            results[member] = Unconfirmed(f"releasing {member.lock.name!r} was cancelled")
        else:
            results[member] = task.exception()
    return results


def report_release(
    kind: str,
    name: str,
    all_members: Sequence[Member],
    quorum: int,
    who: Owner,
    results: dict[Member, BaseException | None],
) -> None:
    """Raise what the member releases say of the hold (see ``MultiLock.unlock``). Held to the
    end: a quorum of them (every member of a multi-lock) confirmed released. Lost:
    fewer than that, and not even with the releases left unconfirmed (which may or may
    not have found their member held), because members were found lost."""
    released = [m for m, e in results.items() if e is None]
    lost = [e for e in results.values() if isinstance(e, LockLostError)]
    unconfirmed = [
        e
        for e in results.values()
        if e is not None and not isinstance(e, LockNotOwnedError)  # nor LockLostError
    ]
    members = len(all_members)
    for member, error in results.items():
        if error is not None:
            logger.debug(
                "aiolock: %s %r: releasing %r on %s failed: %s",
                kind,
                name,
                member.lock.name,
                "{}/{}".format(*member.server),
                error,
            )
    if len(released) >= quorum:
        return
    if len(released) + len(unconfirmed) < quorum:
        if lost:
            raise LockLostError(
                f"{kind} {name!r} held by {who.id} was lost: "
                + (
                    f"only {len(released)} of its {members} members were still held at "
                    f"unlock (a quorum is {quorum}); the first lost: {lost[0]}"
                    if quorum < members
                    else str(lost[0])
                ),
                name=name,
                owner=who.id,
            ) from lost[0]
        missing = ", ".join(repr(m.lock.name) for m in all_members if m not in released)
        raise LockNotOwnedError(
            f"{kind} {name!r}: {who.id} held only {len(released)} of its "
            f"{members} members (not {missing})"
            + (f", fewer than a quorum of {quorum}" if quorum < members else "")
            + "; those it held were released",
            name=name,
            owner=who.id,
        )
    raise RedisOperationError(
        f"releasing {kind} {name!r}: {len(unconfirmed)} of {len(results)} member "
        f"releases were not confirmed ({unconfirmed[0]}), so whether it was held to the "
        "end is not known; they go on in the background or expire unrenewed"
    ) from unconfirmed[0]
