"""One operation of an owner on an object (:class:`Op`): it holds the hold's turn while it
runs, and hands its unsettled work (a reply lost with its link, a grant its caller left) to
a background cleanup in that turn."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio

from .commands import (
    LINK_LATE,
    LOOK_AGAIN,
    cancel_allowance,
    fence_until,
    past,
)
from .errors import (
    ClientClosedError,
    OutcomeUnknownError,
    RedisOperationError,
    RedisTimeoutError,
    RedisUnavailableError,
)
from .holds import Hold, Owner
from .rules import (
    Rule,
)
from .runtime import Runtime
from .transport import (
    Call,
    NotSent,
    OutcomeUnknown,
)

logger = logging.getLogger("aiolock")


# -- one operation of an owner ---------------------------------------------------------------

Finish = Callable[[Any], Awaitable[None]]
Settle = Callable[[], Awaitable[Any]]


class Op:
    """One operation of an owner on an object. On a hold it holds the hold's turn until it
    ends; if its caller leaves with work unsettled, a background task takes the turn over
    and finishes that work (``handed_over``, ``in_background``)."""

    __slots__ = (
        "field",
        "handed_over",
        "hold",
        "in_background",
        "owner",
        "owns_turn",
        "rt",
        "rule",
    )

    def __init__(self, rt: Runtime, rule: Rule, owner: Owner, hold: Hold | None) -> None:
        self.rt = rt
        self.rule = rule
        self.owner = owner
        self.hold = hold
        #: the owner id the commands of this operation write (the hold's field)
        self.field = owner.id if hold is None else hold.field
        #: True from the start for an acquisition whose record is deferred (see record())
        self.owns_turn = False
        self.handed_over = False
        self.in_background = False

    def record(self) -> Hold:
        """The hold this operation works on; for an acquisition that started without one
        (``Leases.for_acquire``), made now, with this operation's turn on it."""
        hold = self.hold
        if hold is None:
            rule = self.rule
            assert rule.holds
            hold, turn = self.rt.leases.adopt(rule.name, self.owner, self.field, rule.kind)
            self.hold = hold
            if not turn:
                self.owns_turn = False  # (never end a turn that is not this operation's)
        return hold

    def _keep_turn(self) -> None:
        """Before work outlives this call (or runs in another task): a deferred record is
        made, so the owner's next operation on the object waits for that work."""
        if self.hold is None and self.rule.holds:
            self.record()

    async def begin(self, deadline: float | None) -> None:
        """Take the hold's turn (at once when it is free), waiting at most until
        ``deadline`` for the owner's operations before this one (TimeoutError)."""
        hold = self.hold
        assert hold is not None
        if not hold.take_turn():
            if deadline is None:
                await hold.wait_turn()
            else:
                async with asyncio.timeout_at(deadline):
                    await hold.wait_turn()
        self.owns_turn = True

    def end(self) -> None:
        if self.owns_turn:
            self.owns_turn = False
            hold = self.hold
            if hold is not None:  # (None: a deferred record never made, nothing to end)
                hold.end_turn()
                self.rt.leases.forget_if_idle(hold)

    def hand_over(self, outcome: Awaitable[Any], finish: Finish) -> asyncio.Task[None]:
        """Leave ``finish(await outcome)`` to a background task, which ends the turn."""
        self._keep_turn()
        self.handed_over = True
        had_turn, self.owns_turn = self.owns_turn, False

        async def background() -> None:
            self.in_background = True
            try:
                await finish(await outcome)
            except RedisOperationError as exc:
                logger.warning(
                    "aiolock: %r: finding out in the background whether an acquire whose reply "
                    "was lost took it: %s",
                    self.rule.name,
                    exc,
                )
            except Exception:
                logger.exception(
                    "aiolock: %r: finding out in the background whether an acquire whose reply "
                    "was lost took it failed",
                    self.rule.name,
                )
            finally:
                self.owns_turn = had_turn
                self.end()

        return self.rt.spawn(background())

    async def within(self, work: Coroutine[Any, Any, None], deadline: float | None) -> bool:
        """Run ``work`` (giving back what this operation obtained, in its turn) in a task of
        its own, and wait for it until ``deadline`` (None: until it ends). True: it ended in
        time, and the turn is still this operation's. False: the caller's time ran out
        first; the task finishes the work in the background and ends the turn then (the
        owner's next operation waits for it). A cancelled caller waits for it at most
        cleanup_timeout, then its CancelledError goes on."""
        if self.in_background:
            await work  # no caller to bound
            return True
        self._keep_turn()
        name = self.rule.name

        async def run() -> None:
            try:
                await work
            except RedisOperationError as exc:
                logger.warning("aiolock: giving back what was taken of %r: %s", name, exc)
            except Exception:
                logger.exception("aiolock: giving back what was taken of %r failed", name)

        task = self.rt.spawn(run())
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait(
                (task,), timeout=None if deadline is None else max(0.0, deadline - loop.time())
            )
        except asyncio.CancelledError:
            await wait_shielded(task, cancel_allowance(self.rt.config))
            if not task.done():
                self._leave_turn_to(task)
            raise
        if task.done():
            return True
        self._leave_turn_to(task)
        return False

    def _leave_turn_to(self, task: asyncio.Task[None]) -> None:
        """The caller leaves; ``task`` ends this operation's turn when it is done."""
        self._keep_turn()
        self.handed_over = True
        had_turn, self.owns_turn = self.owns_turn, False

        def done(_: object) -> None:
            self.owns_turn = had_turn
            self.end()

        task.add_done_callback(done)

    async def send(self, packed: bytes, deadline: float | None) -> Call:
        """Write a command, opening a link if needed; RedisUnavailableError when it cannot
        be sent after ``retry_attempts`` tries. (Callers try ``transport.send_now`` first.)"""
        attempts = self.rt.config.retry_attempts + 1
        for attempt in range(attempts):
            try:
                return await self.rt.transport.send(packed, key=self.rule.key, deadline=deadline)
            except NotSent as exc:
                if attempt == attempts - 1 or past(deadline):
                    raise RedisUnavailableError(f"{self.rule.name!r}: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def reply(self, call: Call, deadline: float | None, finish: Finish) -> Any:
        """The reply of ``call``. If the caller is cancelled, or ``deadline`` passes first,
        ``finish(outcome)`` runs in the background once the outcome is known; a cancelled
        caller waits for it at most cleanup_timeout, then its CancelledError goes on; past
        the deadline RedisTimeoutError is raised."""
        try:
            if self.in_background or deadline is None or self.link_bounds(call, deadline):
                return await call.future  # the link's health check bounds it
            # A bare timer that cancels the reply's future (asyncio.timeout_at costs 2-3x
            # more, and this runs for every try_lock without a wait): the caller's own
            # cancellation is told apart by its task's cancellation count, as asyncio's is,
            # and by the timer's message on the future: a cancellation already pending when
            # the task got here (requested while it ran) cancels the future at the wait,
            # before the timer, and the count does not move then.
            future = call.future
            task = asyncio.current_task()
            assert task is not None
            cancels = task.cancelling()
            timer = asyncio.get_running_loop().call_at(
                deadline - LOOK_AGAIN, future.cancel, GIVE_UP
            )
            try:
                return await future
            except asyncio.CancelledError:
                if task.cancelling() != cancels or not gave_up(future):
                    raise  # the caller was cancelled (perhaps as the timer went off too)
            finally:
                timer.cancel()
        except asyncio.CancelledError:
            await self.cancelled(call, finish)
            raise
        # Look once more after the loop has polled (see LOOK_AGAIN). call.future was
        # cancelled with the wait: a reply arriving from now on goes to this handler.
        assert deadline is not None  # (only a caller with a timer of its own gets here)
        loop = asyncio.get_running_loop()
        late: asyncio.Future[Any] = loop.create_future()
        call.abandon(lambda value: None if late.done() else late.set_result(value))
        try:
            # at least a millisecond: a timer due at once runs before the poll on uvloop
            await asyncio.wait((late,), timeout=max(0.001, deadline - loop.time()))
        except asyncio.CancelledError:
            await wait_shielded(self.hand_over(late, finish), cancel_allowance(self.rt.config))
            raise
        if late.done():
            return late.result()
        self.hand_over(late, finish)
        raise RedisTimeoutError(
            f"no reply about {self.rule.name!r} in time; it is settled in the background"
        )

    async def outcome(
        self, call: Call, deadline: float | None, finish: Finish, settle: Settle
    ) -> Any:
        """The reply of ``call`` or, if its link dropped, what ``settle`` says it did
        (NOT_RUN: it did not run and may be sent again); see :meth:`reply`, :meth:`settle`."""
        if self.link_bounds(call, deadline):
            try:
                reply = await call.future  # the link's health check bounds it
            except asyncio.CancelledError:
                await self.cancelled(call, finish)
                raise
        else:
            reply = await self.reply(call, deadline, finish)
        if isinstance(reply, OutcomeUnknown):
            return await self.settle(reply, deadline, settle, finish)
        return reply

    def link_bounds(self, call: Call, deadline: float | None) -> bool:
        """Whether the link's health check settles ``call`` before ``deadline`` (else the
        caller arms a timer of its own)."""
        return (
            deadline is None
            or call.sent_at + self.rt.config.command_timeout + LINK_LATE <= deadline
        )

    def abandon(self, call: Call, finish: Finish) -> asyncio.Task[None]:
        """The caller leaves ``call``: ``finish(outcome)`` runs in the background."""
        # Its future is no longer awaited (a no-op if it is done, or cancelled with the
        # caller's wait): the reply, whenever it comes, goes to the handler.
        call.future.cancel()
        outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        call.abandon(lambda value: None if outcome.done() else outcome.set_result(value))
        return self.hand_over(outcome, finish)

    async def cancelled(self, call: Call, finish: Finish) -> None:
        """The caller was cancelled waiting for ``call``: :meth:`abandon` it and wait for
        the cleanup at most cleanup_timeout (the caller re-raises its CancelledError)."""
        if not self.in_background:
            await wait_shielded(self.abandon(call, finish), cancel_allowance(self.rt.config))

    async def settle(
        self, unknown: OutcomeUnknown, deadline: float | None, settle: Settle, finish: Finish
    ) -> Any:
        """What a command lost with its link did: fence the link, then ask the rule, trying
        until the caller's ``deadline`` (without one, for one command_timeout): a waiter with
        time left keeps it. If that cannot be done in time, ``finish(unknown)`` takes it over
        (in the background) and OutcomeUnknownError is raised."""
        loop = asyncio.get_running_loop()
        if deadline is None:
            limit = loop.time() + self.rt.config.command_timeout
        else:
            limit = max(deadline, loop.time())
        try:
            if await fence_until(self.rt, unknown, limit):
                async with asyncio.timeout_at(limit):
                    return await settle()
        except (TimeoutError, RedisOperationError):
            pass
        except asyncio.CancelledError:
            if not self.in_background:
                cleanup = self.hand_over(ready(unknown), finish)
                await wait_shielded(cleanup, cancel_allowance(self.rt.config))
            raise
        if self.rule.holds:
            self.rt.leases.taint(self.record(), self.field)  # the old request may still arrive
        if self.in_background:
            await finish(unknown)
        else:
            self.hand_over(ready(unknown), finish)
        if self.rt.leases.closed:
            raise ClientClosedError(f"the client closed while working on {self.rule.name!r}")
        raise OutcomeUnknownError(
            f"the reply about {self.rule.name!r} was lost and what it did could not be "
            f"settled in time ({unknown}); it is settled in the background"
        )


#: the message with which :meth:`Op.reply`'s own timer cancels a reply's future
GIVE_UP = "aiolock: the caller's own time to wait for the reply ran out"


def gave_up(future: asyncio.Future[Any]) -> bool:
    """Whether ``future`` was cancelled by :meth:`Op.reply`'s own timer (not by its task)."""
    try:
        future.exception()
    except asyncio.CancelledError as exc:
        return bool(exc.args) and exc.args[0] is GIVE_UP
    return False


async def wait_shielded(task: asyncio.Future[Any], seconds: float) -> None:
    """Wait for ``task`` at most ``seconds``, shielded from anyio cancel scopes (a second
    native cancellation still ends the wait; the task goes on either way)."""
    with anyio.CancelScope(shield=True):
        await asyncio.wait((task,), timeout=seconds)


def ready(value: Any) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future
