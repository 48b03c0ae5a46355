"""THE acquisition loop, shared by every lock type, and the release of holds.

A lock type describes itself with a :class:`Rule`: the script that tries to take it and what
its reply means, the channel a release is announced on and how many waiters a message
wakes, the release script, how to settle a lost reply, how to remove an owner's counts. The
loop does the rest, once for every type (Redisson's loop)::

    try --granted--> done
     |  busy (the holder's TTL)
    subscribe (confirmed) -> try again if the subscription came after the try
     |  busy
    wait for a wake-up, at most the holder's TTL and the time left -> try again -> ...

Bounds. ``try_lock(wait_time=W)`` returns or raises within ``W + command_timeout``: nothing
is sent after the wait ends, and each command is bounded by its link's health check
(``command_timeout``), or by a timer of the caller's own when that would come too late. A
release is bounded by ``cleanup_timeout``. A bound is when the call has returned, so each
gives up a small margin before it (see :func:`margin`); whatever is not done by then
(giving back a grant, settling a lost reply, a release) goes on in the background, in the
owner's turn on the hold.

Cancellation (and a caller's deadline passing with a command in flight) never leaks: the
command's outcome is handed to a background cleanup that holds the owner's turn on the hold
(so the owner's next operation waits for it), undoes a grant, and settles a lost reply; the
cancelled caller waits for it at most ``cleanup_timeout`` (shielded, also from anyio cancel
scopes) and then gets its CancelledError back unchanged.

Lost replies. A command whose link dropped may or may not have run, and may still run later.
Nothing is concluded until the transport has fenced the dropped link (``CLIENT KILL``); then
the rule reads what happened, and a command proven not to have run is sent again. When the
link cannot be fenced, an acquire is never sent again and whatever it may have taken is
removed by the cleanup (or expires with its lease, unrenewed); a release is never sent again
either, and the hold is purged instead (removing an owner's counts is harmless whatever a
late release does).
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import anyio

from .config import Config
from .errors import (
    ClientClosedError,
    LockLostError,
    LockNotOwnedError,
    OutcomeUnknownError,
    RedisOperationError,
    RedisTimeoutError,
    RedisUnavailableError,
    ReplicationError,
    SubscriptionError,
)
from .leases import Hold, HoldState, Leases, Owner, Renewal
from .metrics import Metrics
from .pubsub import Entry, PubSub
from .transport import (
    Call,
    Chain,
    ErrorReply,
    NotSent,
    OutcomeUnknown,
    SubscribeRefused,
    Transport,
    first_reply,
    is_readonly,
    pack,
)

logger = logging.getLogger("aiolock")

Command = bytes  # an encoded command, e.g. Script.command(keys, args)


class _NotRun:
    def __repr__(self) -> str:
        return "NOT_RUN"


#: a settled lost command that certainly did not run (it may be sent again)
NOT_RUN: Final = _NotRun()


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one try said: granted (with a fencing token for a fenced lock, or what else
    the type hands out in ``value``, e.g. a permit id), or busy, with the time in ms after
    which trying again may succeed although no message came (the holder's remaining TTL;
    None: unknown or never, wait for a message)."""

    granted: bool
    ttl_ms: int | None = None
    token: int | None = None
    value: Any = None


GRANTED = Attempt(True)


@dataclass(frozen=True, slots=True)
class GiveUp:
    """What an acquisition that tried and got nothing sends when it ends (a fair lock's
    waiter leaves the line), and for how many seconds it is sent again while it cannot be
    known to have run: after that, what it would remove is gone on the server anyway. It
    must be harmless when it runs twice."""

    command: Command
    retry_for: float = 0.0


@dataclass(frozen=True, slots=True)
class Runtime:
    """What the loop works with: one client's transport, wait entries and holds."""

    transport: Transport
    pubsub: PubSub
    leases: Leases
    config: Config
    spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]]
    #: where acquisitions are recorded (None: no metrics)
    metrics: Metrics | None = None


class Rule(ABC):
    """What one object type tells the acquisition loop (see the module docstring).

    A grant is a count of a hold of its owner (locks, and a permit-expirable semaphore's
    permits) unless ``holds`` is False (a semaphore's plain permits, a latch opening): then
    nothing is registered, the loop returns the grant, and a grant whose caller left is given
    back with :meth:`undo`."""

    #: the object's name (for messages) and the key commands about it are routed by
    name: str
    key: str
    #: the object's type, as metrics name it (the attribute ``lock.type``)
    kind: ClassVar[str] = "other"
    #: how the watchdog renews a hold taken without a lease
    renewal: Renewal | None = None
    #: whether a grant is a hold of its owner (see above)
    holds: bool = True
    #: whether an acquisition may queue behind tasks of this client already waiting for the
    #: object (parked on its channel under a live lease) instead of trying first; False when
    #: a waiter may be granted while others of the client wait (a read lock: readers share
    #: it while a writer waits, and a writer takes the read lock it blocks others from)
    queue_locally: bool = True
    #: a parked waiter's share of a wake-up: a message waking n wakes waiters in turn while
    #: their weights fit in n (a semaphore's waiter for k permits weighs k)
    weight: int = 1
    #: whether a grant is written on the server (and so confirmed by ``replica_acks``);
    #: False for a grant that only reads (a latch found open)
    replicated: bool = True

    @abstractmethod
    def channel(self, owner: str) -> bytes:
        """The channel a waiter owned by ``owner`` listens to."""

    def channel_key(self, owner: str) -> str:
        """The key a subscription to ``channel(owner)`` is routed by (a cluster transport
        listens on the node serving it): the object's key, unless the channel lives in
        another hash slot (a countdown latch whose name has a hash tag of its own)."""
        return self.key

    @abstractmethod
    def wakes(self, data: bytes) -> int:
        """How many waiters a message wakes (pubsub.ALL: every one); ValueError if malformed."""

    @abstractmethod
    def attempt(self, owner: str, lease_ms: int, wait_ms: int | None) -> Command:
        """The command that tries to take one count for ``owner``; ``wait_ms`` is how long
        the whole acquisition may wait (None: as long as it takes)."""

    @abstractmethod
    def parse(self, reply: Any) -> Attempt:
        """What the attempt's reply says."""

    @abstractmethod
    async def settle_attempt(self, rt: Runtime, owner: str, count: int) -> Attempt | _NotRun:
        """After a fence: what a lost attempt did, ``count`` being the owner's count before."""

    @abstractmethod
    def release(self, owner: str, lease_ms: int, count: int) -> Command:
        """The command that releases one count of ``owner``, whose count before it is
        ``count`` (a script that compares it makes a late or repeated release harmless)."""

    @abstractmethod
    def parse_release(self, reply: Any) -> bool | None:
        """True: the last count was released; False: counts remain; None: the owner holds
        none, or not the count it expected (its hold cannot be trusted)."""

    @abstractmethod
    async def settle_release(self, rt: Runtime, owner: str, count: int) -> bool | _NotRun | None:
        """After a fence: what a lost release did, ``count`` being the owner's count before."""

    @abstractmethod
    def purge(self, owner: str) -> Command:
        """The command that removes every count of ``owner`` (idempotent)."""

    def give_up(self, owner: str) -> GiveUp | None:
        """What an acquisition that tried and got nothing sends when it ends (a fair lock's
        waiter leaves the queue); None: nothing. Sent in the background, in the owner's turn
        on its hold (its next acquisition waits for it), again and again for at most
        ``retry_for`` seconds until it is known to have run."""
        return None

    def undo(self, owner: str, grant: Attempt) -> Command | None:
        """For ``holds = False``: the command giving back a grant whose caller left."""
        return None


# -- running one command ---------------------------------------------------------------------

#: how long after ``sent_at + command_timeout`` a link's own health check may take to settle
#: a command it gave up on (the link looks once more, 10 ms later, after the loop has polled
#: the socket; then its timer's lateness). A caller whose deadline comes sooner than that
#: bounds the command with a timer of its own.
LINK_LATE = 0.02

#: a caller's own give-up looks at its command once more, after the loop has polled its
#: sockets, in the last this-many seconds before its deadline (as the link's health check
#: does): when the loop itself was held up past the deadline (a burst of tasks, blocking
#: code), the reply may be there unread (uvloop runs due timers before it polls), and that
#: delay was not the server's
_LOOK_AGAIN = 0.01

#: a call bounded by a documented time (``try_lock``: ``wait_time + command_timeout``;
#: ``unlock``: ``cleanup_timeout``) gives up this share of the command or cleanup allowance
#: before it, between _MARGIN_MIN and _MARGIN_MAX s (and at most half the allowance): giving
#: up takes time too (a timer fires late, the caller raises and hands its work to the
#: background, and every caller whose time runs out at that moment does the same), and the
#: bound is when the call has returned, not when its give-up was armed
_MARGIN_SHARE = 0.05
_MARGIN_MIN = 0.005
_MARGIN_MAX = 0.05


def margin(allowance: float) -> float:
    """How long before its bound a call whose bound ends with ``allowance`` seconds of
    command or cleanup time gives up (see _MARGIN_SHARE)."""
    return min(_MARGIN_MAX, max(_MARGIN_MIN, allowance * _MARGIN_SHARE), allowance / 2)


def give_up_point(wait_until: float | None, config: Config) -> float | None:
    """When an acquisition whose waiting ends at ``wait_until`` (None: never) gives up a
    command still unanswered, so that it returns within ``wait_time + command_timeout``."""
    if wait_until is None:
        return None
    return wait_until + config.command_timeout - margin(config.command_timeout)


def cleanup_deadline(start: float, config: Config) -> float:
    """When a call bounded by ``cleanup_timeout`` (``unlock``, an ``async with`` exit,
    ``aclose``) that started at ``start`` leaves what is not done yet to the background,
    so that it returns within its bound."""
    return start + config.cleanup_timeout - margin(config.cleanup_timeout)


def cancel_allowance(config: Config) -> float:
    """How long a cancelled call waits, from its cancellation, for the work it hands to the
    background (giving back a grant, settling a lost reply) before its CancelledError goes
    on, so that it is back within ``cleanup_timeout`` of its cancellation."""
    return config.cleanup_timeout - margin(config.cleanup_timeout)


async def command(rt: Runtime, key: str, cmd: Command, deadline: float | None) -> Any:
    """Send ``cmd`` and return its reply (an ErrorReply or OutcomeUnknown is returned, not
    raised); NotSent after ``retry_attempts`` failed connects is raised. A READONLY reply
    (a demoted master: nothing was written) is sent again, to the master, as often."""
    for attempt in range(rt.config.retry_attempts + 1):
        try:
            call = await rt.transport.send(cmd, key=key, deadline=deadline)
        except NotSent:
            if attempt == rt.config.retry_attempts or _past(deadline):
                raise
            continue
        reply = await call.future
        if is_readonly(reply) and attempt < rt.config.retry_attempts and not _past(deadline):
            continue
        return reply
    raise AssertionError("unreachable")  # pragma: no cover


async def read(rt: Runtime, key: str, *args: Any, what: str) -> Any:
    """A read-only command; idempotent, so a lost reply is simply asked again once."""
    packed = pack(args)
    for attempt in range(2):
        try:
            reply = await command(rt, key, packed, None)
        except NotSent as exc:
            raise RedisUnavailableError(f"{what} failed: {exc}") from exc
        if isinstance(reply, ErrorReply):
            raise RedisOperationError(f"{what} failed: {reply}")
        if not isinstance(reply, OutcomeUnknown):
            return reply
        if attempt:
            raise RedisOperationError(f"{what} failed: {reply}")
    raise AssertionError("unreachable")  # pragma: no cover


def with_acks(config: Config, packed: Command) -> Command:
    """``packed`` followed by ``WAIT n timeout`` on the same connection when
    ``config.replica_acks`` asks for replica acknowledgement (the reply is then a tuple)."""
    if not config.replica_acks:
        return packed
    wait = pack(("WAIT", config.replica_acks, max(1, round(config.replica_ack_timeout * 1000))))
    return Chain.of(packed, wait)


def _past(deadline: float | None) -> bool:
    return deadline is not None and asyncio.get_running_loop().time() >= deadline


# -- one operation of an owner ---------------------------------------------------------------

Finish = Callable[[Any], Awaitable[None]]
Settle = Callable[[], Awaitable[Any]]


class _Op:
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
        self.owns_turn = False
        self.handed_over = False
        self.in_background = False

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
            assert hold is not None
            hold.end_turn()
            self.rt.leases.forget_if_idle(hold)

    def hand_over(self, outcome: Awaitable[Any], finish: Finish) -> asyncio.Task[None]:
        """Leave ``finish(await outcome)`` to a background task, which ends the turn."""
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
                if attempt == attempts - 1 or _past(deadline):
                    raise RedisUnavailableError(f"{self.rule.name!r}: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def reply(self, call: Call, deadline: float | None, finish: Finish) -> Any:
        """The reply of ``call``. If the caller is cancelled, or ``deadline`` passes first,
        ``finish(outcome)`` runs in the background once the outcome is known; a cancelled
        caller waits for it at most cleanup_timeout, then its CancelledError goes on; past
        the deadline RedisTimeoutError is raised."""
        try:
            if self.in_background or deadline is None or self._link_bounds(call, deadline):
                return await call.future  # the link's health check bounds it
            async with asyncio.timeout_at(deadline - _LOOK_AGAIN):
                return await call.future
        except asyncio.CancelledError:
            await self.cancelled(call, finish)
            raise
        except TimeoutError:
            pass
        # Look once more after the loop has polled (see _LOOK_AGAIN). call.future was
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
        if self._link_bounds(call, deadline):
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

    def _link_bounds(self, call: Call, deadline: float | None) -> bool:
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
            if await _fence_until(self.rt, unknown, limit):
                async with asyncio.timeout_at(limit):
                    return await settle()
        except (TimeoutError, RedisOperationError):
            pass
        except asyncio.CancelledError:
            if not self.in_background:
                cleanup = self.hand_over(_ready(unknown), finish)
                await wait_shielded(cleanup, cancel_allowance(self.rt.config))
            raise
        if self.hold is not None:
            self.rt.leases.taint(self.hold, self.field)  # the old request may still arrive
        if self.in_background:
            await finish(unknown)
        else:
            self.hand_over(_ready(unknown), finish)
        if self.rt.leases.closed:
            raise ClientClosedError(f"the client closed while working on {self.rule.name!r}")
        raise OutcomeUnknownError(
            f"the reply about {self.rule.name!r} was lost and what it did could not be "
            f"settled in time ({unknown}); it is settled in the background"
        )


async def wait_shielded(task: asyncio.Future[Any], seconds: float) -> None:
    """Wait for ``task`` at most ``seconds``, shielded from anyio cancel scopes (a second
    native cancellation still ends the wait; the task goes on either way)."""
    with anyio.CancelScope(shield=True):
        await asyncio.wait((task,), timeout=seconds)


def _ready(value: Any) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


# -- acquiring -------------------------------------------------------------------------------


def acquire(
    rt: Runtime,
    rule: Rule,
    owner: Owner,
    *,
    wait: float | None,
    lease_ms: int,
    renew: bool,
) -> Coroutine[Any, Any, Attempt | None]:
    """Take one count of ``rule``'s object for ``owner``, waiting at most ``wait`` seconds
    (None: as long as it takes): the acquisition to await, whose result is the grant, or
    None if the wait ran out. A grant of a hold rule is a count of the owner's hold
    (``rt.leases.get(rule.name, owner)``). With metrics, the acquisition is recorded."""
    run = _acquire(rt, rule, owner, wait=wait, lease_ms=lease_ms, renew=renew)
    metrics = rt.metrics
    return run if metrics is None else metrics.acquisition(rule.kind, rule.name, run)


async def _acquire(
    rt: Runtime,
    rule: Rule,
    owner: Owner,
    *,
    wait: float | None,
    lease_ms: int,
    renew: bool,
) -> Attempt | None:
    loop = asyncio.get_running_loop()
    now = loop.time()
    wait_until = None if wait is None else now + wait
    give_up_at = give_up_point(wait_until, rt.config)
    hold = rt.leases.hold(rule.name, owner, rule.kind) if rule.holds else None
    op = _Op(rt, rule, owner, hold)
    tried = granted = False
    try:
        if hold is not None:
            try:
                await op.begin(give_up_at)
            except TimeoutError:
                return None  # the owner's previous operation on it did not end in time
            rt.leases.current(hold)
            if hold.stale:
                raise LockLostError(
                    f"{hold.lost}; unlock it as often as it was taken before taking it again",
                    name=rule.name,
                    owner=owner.id,
                )
            if not hold.count:
                # A new generation: the owner id it writes is chosen now that the work of
                # the one before has ended (a taint it made applies to this acquire).
                op.field = rt.leases.next_generation(hold)
        wait_ms = None if wait is None else round(wait * 1000)
        channel = rule.channel(op.field)
        entry = rt.pubsub.entry(channel)
        if (
            entry is not None
            and (wait_until is None or wait_until > now)
            and entry.parked
            and entry.confirmed_at is not None
            and entry.holder_until > now
            and (hold is None or not hold.count)
            and rule.queue_locally
        ):
            # Tasks of this client already wait for it under a live lease: queue behind them
            # instead of barging in with a try that would fail (a round trip saved, and first
            # come first served among local waiters). Never for a reentrant acquire.
            result = Attempt(False, round((entry.holder_until - now) * 1000))
        else:
            tried = True
            result = await _try(op, lease_ms, wait_ms, renew, give_up_at)
            if result.granted:
                granted = True
                return result
            if wait_until is not None and loop.time() >= wait_until:
                return None
        subscribed = await _subscribe(rt, rule, channel, op.field, wait_until)
        if subscribed is None:
            return None
        entry = subscribed
        try:
            # A release between our try and a subscription confirmed after it sent no
            # message we could see: try again. One confirmed before the try needs no retry.
            if entry.confirmed_at is None or entry.confirmed_at > now:
                tried = True
                result = await _try(op, lease_ms, wait_ms, renew, give_up_at)
                if result.granted:
                    granted = True
                    return result
            while True:
                until = wait_until
                if result.ttl_ms is not None and result.ttl_ms >= 0:
                    holder_until = loop.time() + result.ttl_ms / 1000
                    entry.holder_until = max(entry.holder_until, holder_until)
                    until = holder_until if until is None else min(until, holder_until)
                elif until is None:
                    # No TTL to bound the wait (a key without one): check again now and
                    # then anyway, so a lost message can never leave a waiter hanging.
                    until = loop.time() + rt.config.watchdog_timeout
                if wait_until is not None and loop.time() >= wait_until:
                    return None
                woken, timer = entry.park(until, rule.weight)
                try:
                    await woken
                except asyncio.CancelledError:
                    entry.pass_on(woken, rule.weight)
                    raise
                finally:
                    if timer is not None:
                        timer.cancel()
                if rt.pubsub.closed:
                    raise ClientClosedError(f"the client closed while waiting for {rule.name!r}")
                if wait_until is not None and loop.time() >= wait_until:
                    entry.pass_on(woken, rule.weight)  # a wake-up it will not use: the next's
                    return None
                tried = True
                result = await _try(op, lease_ms, wait_ms, renew, give_up_at)
                if result.granted:
                    granted = True
                    return result
        finally:
            rt.pubsub.release(entry)
    finally:
        if tried and not granted and not op.handed_over:
            _give_up(op)
        if op.owns_turn:
            op.end()
        elif hold is not None and not op.handed_over:
            rt.leases.forget_if_idle(hold)  # it never got the turn


async def _subscribe(
    rt: Runtime, rule: Rule, channel: bytes, owner: str, wait_until: float | None
) -> Entry | None:
    """Borrow the channel's entry once subscribed (None: the wait ran out first). A pub/sub
    connection that failed to open is tried again, as a command's is."""
    for attempt in range(rt.config.retry_attempts + 1):
        try:
            return await rt.pubsub.subscribe(
                channel, key=rule.channel_key(owner), wakes=rule.wakes, deadline=wait_until
            )
        except TimeoutError:
            return None
        except SubscribeRefused as exc:
            raise SubscriptionError(f"waiting for {rule.name!r}: {exc}") from exc
        except NotSent as exc:
            if attempt == rt.config.retry_attempts or _past(wait_until):
                raise RedisUnavailableError(f"waiting for {rule.name!r}: {exc}") from exc
    raise AssertionError("unreachable")  # pragma: no cover


def _give_up(op: _Op) -> None:
    """Tell the server an acquisition ended without a grant, in the background and in the
    owner's turn (so that its next acquisition cannot be overtaken by it)."""
    rt, rule = op.rt, op.rule
    give_up = rule.give_up(op.field)
    if give_up is None or rt.pubsub.closed:
        return

    async def send(_: Any) -> None:
        await _send_give_up(rt, rule, give_up)

    if op.owns_turn:
        op.hand_over(_ready(None), send)
    else:
        rt.spawn(send(None))


#: error replies that say "not now" (nothing ran): a give-up refused so is sent again
_BUSY_CODES = frozenset({"BUSY", "CLUSTERDOWN", "LOADING", "MASTERDOWN", "READONLY", "TRYAGAIN"})


async def _send_give_up(rt: Runtime, rule: Rule, give_up: GiveUp) -> None:
    """Send a give-up until it is known to have run (a reply), or for ``retry_for``: a
    give-up lost with its link, or refused for now (a server loading, a failover), would
    otherwise leave its waiter in line."""
    loop = asyncio.get_running_loop()
    until = loop.time() + give_up.retry_for
    delay = rt.config.reconnect_delay
    while True:
        reply: object
        try:
            reply = await command(rt, rule.key, give_up.command, None)
        except NotSent as error:
            reply = error
        if isinstance(reply, ErrorReply) and reply.code not in _BUSY_CODES:
            logger.warning("aiolock: %r: a waiter could not leave the line: %s", rule.name, reply)
            return
        if not isinstance(reply, OutcomeUnknown | ErrorReply | NotSent):
            return
        if loop.time() + delay > until or rt.transport.closed:
            logger.debug("aiolock: %r: a give-up was not confirmed: %s", rule.name, reply)
            return
        if isinstance(reply, OutcomeUnknown):
            # Fence its link first (when that can be done in time): the lost one then cannot
            # run later, after the owner's next acquisition joined the line again.
            await _fence_until(rt, reply, until)
        await asyncio.sleep(delay)
        delay = min(delay * 2, rt.config.reconnect_max_delay)


async def _best_effort(rt: Runtime, rule: Rule, cmd: Command) -> None:
    try:
        await command(rt, rule.key, cmd, None)
    except NotSent as exc:
        logger.debug("aiolock: %r: %s", rule.name, exc)


async def _try(
    op: _Op, lease_ms: int, wait_ms: int | None, renew: bool, give_up_at: float | None
) -> Attempt:
    """One attempt (sent again only when proven not to have run); a grant is registered."""
    rt, rule = op.rt, op.rule
    owner = op.field
    if op.hold is not None and op.hold.stale:
        # The hold this acquisition re-enters was lost while it waited (a server change
        # found it gone): as at the start, its lost counts are unlocked before a new grant.
        raise LockLostError(
            f"{op.hold.lost}; unlock it as often as it was taken before taking it again",
            name=rule.name,
            owner=owner,
        )
    before = op.hold.count if op.hold is not None else 0
    acks_wanted = rt.config.replica_acks if rule.replicated else 0
    packed = rule.attempt(owner, lease_ms, wait_ms)
    if acks_wanted:
        packed = with_acks(rt.config, packed)
    readonly: Any = None
    for _ in range(rt.config.retry_attempts + 1):
        call = rt.transport.send_now(packed, key=rule.key) or await op.send(packed, give_up_at)
        sent_at, epoch = call.sent_at, call.epoch

        async def finish(value: Any, sent_at: float = sent_at, epoch: int = epoch) -> None:
            await _undo_attempt(op, value, before, lease_ms, renew, sent_at, epoch)

        reply = await op.outcome(
            call, give_up_at, finish, lambda: rule.settle_attempt(rt, owner, before)
        )
        if reply is NOT_RUN:
            continue
        acks: Any = None
        if type(reply) is tuple:
            reply, acks = reply
        if is_readonly(reply):
            # It ran into a replica (the master was demoted) and wrote nothing: the link is
            # replaced, and the attempt sent again to wherever the master is now.
            readonly = reply
            continue
        if isinstance(reply, Attempt):  # settled
            result = reply
        elif isinstance(reply, ErrorReply):
            raise RedisOperationError(f"acquiring {rule.name!r} failed: {reply}")
        else:
            result = rule.parse(reply)
        if result.granted and acks_wanted and not (isinstance(acks, int) and acks > 0):
            # Given back within the call's bound, or else in the background (in the turn).
            given_back = await op.within(_roll_back(op, result, before, lease_ms), give_up_at)
            raise _replication_error(rt, rule, acks, given_back)
        hold = op.hold
        if result.granted and hold is not None:
            if rt.leases.closed:
                # The client closed meanwhile: no grant; give it back before saying so.
                await _purge_in_turn(op, lease_ms, give_up_at)
                raise ClientClosedError(f"the client closed while acquiring {rule.name!r}")
            if before and hold.state is not HoldState.HELD:
                # The hold this re-entered was lost meanwhile: the grant belongs to a lost
                # generation (the loss's cleanup removes the owner's counts).
                assert hold.lost is not None
                raise LockLostError(str(hold.lost), name=rule.name, owner=owner)
            if not _register(op, result, lease_ms, renew, sent_at, epoch):
                if before:  # the hold it re-entered was lost (see Leases.granted)
                    assert hold.lost is not None
                    raise LockLostError(str(hold.lost), name=rule.name, owner=owner)
                # It came after its own lease ran out, or from a server that is not the one
                # now: no grant, and removed before anything else is tried (a try after it
                # would re-enter it). If that takes the rest of the call's time, the removal
                # goes on in the background and the caller tries nothing more: its waiting
                # ended long before (margin < command_timeout).
                await _purge_in_turn(op, lease_ms, give_up_at)
                return Attempt(False, 0)
        return result
    if readonly is not None:
        raise RedisUnavailableError(f"acquiring {rule.name!r}: no master answered ({readonly})")
    raise RedisUnavailableError(f"acquiring {rule.name!r}: sent again and again, never ran")


def _replication_error(
    rt: Runtime, rule: Rule, acks: Any, given_back: bool = True
) -> ReplicationError:
    wanted = rt.config.replica_acks
    timeout = rt.config.replica_ack_timeout
    if isinstance(acks, int):
        why = f"no replica acknowledged it within {timeout:g} s (WAIT {wanted}: {acks})"
    elif acks is None:
        why = "its reply was lost, so whether a replica acknowledged it is unknown"
    else:
        why = f"WAIT failed: {acks}"
    back = "was given back" if given_back else "is being given back in the background"
    return ReplicationError(
        f"acquiring {rule.name!r}: {why}; the grant {back} (replica_acks={wanted})",
        acknowledged=acks if isinstance(acks, int) else None,
        requested=wanted,
    )


async def _roll_back(op: _Op, grant: Attempt, before: int, lease_ms: int) -> None:
    """Give back a grant that replicas did not acknowledge (not registered yet)."""
    rt, rule, hold = op.rt, op.rule, op.hold
    owner = op.field
    if hold is None:
        cmd = rule.undo(owner, grant)
        if cmd is not None:
            try:
                reply = await command(rt, rule.key, cmd, None)
            except NotSent:
                reply = None
            if isinstance(reply, OutcomeUnknown | ErrorReply | None):
                logger.warning(
                    "aiolock: %r: releasing a hold that no replica acknowledged (replica_acks) "
                    "failed (%s); it expires with its lease",
                    rule.name,
                    "not sent" if reply is None else reply,
                )
        return
    if not before:
        await purge(rt, rule, owner, lease_ms, hold)  # nothing else of the owner's is there
        return
    # A reentrant count on top of a hold: take that one count back (the script compares).
    try:
        reply = await command(rt, rule.key, rule.release(owner, hold.lease_ms, before + 1), None)
    except NotSent:
        reply = None
    if isinstance(reply, OutcomeUnknown):
        await _fence_or_taint(rt, reply, hold, owner)
    if (
        isinstance(reply, OutcomeUnknown | ErrorReply | None)
        or rule.parse_release(first_reply(reply)) is not False
    ):
        rt.leases.lose(hold, "an unacknowledged reentrant grant could not be given back")


async def _purge_in_turn(op: _Op, lease_ms: int, deadline: float | None) -> bool:
    """Purge the owner's counts in this operation's turn, waiting for it until ``deadline``
    (then, or if the caller is cancelled, it goes on in the background: see _Op.within)."""
    return await op.within(purge(op.rt, op.rule, op.field, lease_ms, op.hold), deadline)


def _register(
    op: _Op, result: Attempt, lease_ms: int, renew: bool, sent_at: float, epoch: int
) -> bool:
    rule, rt = op.rule, op.rt
    assert op.hold is not None
    field = op.field  # the generation's: the record may write another one by the cleanup

    return rt.leases.granted(
        op.hold,
        lease_ms=lease_ms,
        sent_at=sent_at,
        renewal=rule.renewal if renew else None,
        cleanup=lambda hold: purge(rt, rule, field, hold.lease_ms, hold),
        token=result.token,
        check=rule.renewal,
        epoch=epoch,
    )


async def _undo_attempt(
    op: _Op, value: Any, before: int, lease_ms: int, renew: bool, sent_at: float, epoch: int
) -> None:
    """Background: an attempt's caller left; give back what the attempt obtained (or take
    the owner out of the server's waiting state, when it obtained nothing)."""
    rt, rule, hold = op.rt, op.rule, op.hold
    owner = op.field
    value = first_reply(value)
    if isinstance(value, OutcomeUnknown):
        until = asyncio.get_running_loop().time() + lease_ms / 1000
        if not await _fence_until(rt, value, until):
            if hold is not None:
                rt.leases.taint(hold, owner)
            # It may still run: remove what the owner has (an outer hold of the owner can no
            # longer be trusted either); a grant arriving later expires unrenewed.
            if hold is None:
                logger.warning(
                    "aiolock: %r: could not find out whether an acquire whose reply was lost "
                    "took it; if it did, the hold expires with its lease",
                    rule.name,
                )
            elif hold.count:
                rt.leases.lose(hold, "the reply of a nested acquire was lost")
            else:
                await purge(rt, rule, owner, lease_ms, hold)
            return
        settled = await rule.settle_attempt(rt, owner, before)
        result = Attempt(False) if settled is NOT_RUN else settled
        assert isinstance(result, Attempt)
    elif isinstance(value, ErrorReply):
        result = Attempt(False)
    else:
        result = rule.parse(value)
    if not result.granted:
        give_up = rule.give_up(owner)
        if give_up is not None:
            await _send_give_up(rt, rule, give_up)
    elif hold is None:
        cmd = rule.undo(owner, result)
        if cmd is not None:
            await _best_effort(rt, rule, cmd)
    elif before and hold.state is not HoldState.HELD:
        pass  # it re-entered a hold lost meanwhile: the loss's cleanup removes it
    elif not _register(op, result, lease_ms, renew, sent_at, epoch):
        await purge(rt, rule, owner, lease_ms, hold)  # late or from another server: removed
    elif before:
        await _release_one(op, None)
    else:
        rt.leases.releasing(hold)
        await purge(rt, rule, owner, lease_ms, hold)
        rt.leases.released(hold)


async def _fence_until(rt: Runtime, unknown: OutcomeUnknown, until: float) -> bool:
    """Fence a dropped link, trying again with backoff until loop time ``until``."""
    loop = asyncio.get_running_loop()
    delay = rt.config.reconnect_delay
    while True:
        if await rt.transport.fence(unknown, until):
            return True
        if (
            unknown.link is None
            or unknown.link.client_id is None
            or loop.time() + delay > until
            or rt.transport.closed
        ):
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, rt.config.reconnect_max_delay)


async def _fence_or_taint(rt: Runtime, unknown: OutcomeUnknown, hold: Hold, field: str) -> None:
    """A command of ``hold`` naming ``field`` was lost with its link and may still reach the
    server later, where it could match the owner's next generation if that wrote ``field``
    again (a release expecting count 1, a purge). Fence the link (for at most one
    command_timeout: this runs in the owner's turn, which its next acquire waits for), or
    else taint the field: the next generation writes another one (Leases.taint)."""
    if rt.leases.tainted(hold, field):
        return  # the next generation writes another field already
    until = asyncio.get_running_loop().time() + rt.config.command_timeout
    if not await _fence_until(rt, unknown, until):
        rt.leases.taint(hold, field)


async def purge(
    rt: Runtime, rule: Rule, owner: str, lease_ms: int, hold: Hold | None = None
) -> None:
    """Remove every count of ``owner`` from the server (a lost or abandoned hold), trying
    until the server answers or a lease of ``lease_ms`` would be over anyway. ``hold`` is
    the hold whose generation wrote ``owner``: a purge lost with its link, which may still
    arrive, is fenced or its field tainted (see _fence_or_taint)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + max(lease_ms / 1000, rt.config.command_timeout)
    delay = rt.config.reconnect_delay
    while True:
        reply: object
        try:
            reply = await command(rt, rule.key, rule.purge(owner), None)
        except NotSent as error:
            reply = error
        if isinstance(reply, OutcomeUnknown) and hold is not None:
            await _fence_or_taint(rt, reply, hold, owner)
        if not isinstance(reply, OutcomeUnknown | ErrorReply | NotSent):
            return
        if loop.time() + delay > until or rt.transport.closed:
            logger.warning(
                "aiolock: could not remove %s's hold on %r (%s); it expires with its lease",
                owner,
                rule.name,
                "the client was closed" if rt.transport.closed else reply,
            )
            return
        await asyncio.sleep(delay)
        delay = min(delay * 2, rt.config.reconnect_max_delay)


# -- releasing -------------------------------------------------------------------------------


def _not_owned(rule: Rule, owner: Owner) -> LockNotOwnedError:
    return LockNotOwnedError(
        f"lock {rule.name!r} is not held by {owner.id}", name=rule.name, owner=owner.id
    )


async def release(rt: Runtime, rule: Rule, owner: Owner) -> None:
    """Release one count of ``owner``'s hold; the last one releases the object.

    Raises LockNotOwnedError if the owner holds none, LockLostError if its hold was lost
    (each unlock of a lost hold says so once), RedisOperationError subclasses if the release
    could not be confirmed within cleanup_timeout (it goes on in the background then, and
    the hold is never renewed again). Once called, it completes even if the caller is
    cancelled: the command goes out before the first suspension, or the whole release runs
    in a task of its own."""
    hold = rt.leases.get(rule.name, owner)
    if hold is not None:
        rt.leases.current(hold)
        if not hold.count and hold.stale:
            error = rt.leases.unlock_stale(hold)
            if not hold.stale and hold.busy:
                # its cleanup is still removing it from the server: let it end first (within
                # the unlock's bound), so the owner's next acquire finds its turn free
                await _wait_for_turn(rt, hold)
            raise error
    if rt.leases.closed:
        raise ClientClosedError(f"the client is closed; releasing {rule.name!r} is not possible")
    if hold is None or not hold.count:
        raise _not_owned(rule, owner)
    loop = asyncio.get_running_loop()
    deadline = cleanup_deadline(loop.time(), rt.config)
    op = _Op(rt, rule, owner, hold)
    if hold.take_turn():
        op.owns_turn = True
        try:
            await _release_one(op, deadline)
        finally:
            op.end()
        return
    # The owner's previous operation is still running (perhaps in the background, its
    # caller gone): the release queues behind it in a task of its own, which goes on
    # however long that takes, so an unlock once called is never dropped. The caller waits
    # for it until its deadline (cancelled or not), then leaves it to the background.
    task = rt.spawn(_release_later(op, deadline))
    try:
        await asyncio.wait((task,), timeout=max(0.0, deadline - loop.time()))
    except asyncio.CancelledError:
        await wait_shielded(task, max(0.0, deadline - loop.time()))
        task.add_done_callback(_log_release_failure)  # its caller is gone: nobody else hears
        raise
    if task.done():
        task.result()  # the release's own error, if any
        return
    task.add_done_callback(_log_release_failure)
    raise RedisTimeoutError(
        f"releasing {rule.name!r} was not confirmed within cleanup_timeout (it queued behind "
        "the owner's previous operation on it); it goes on in the background"
    )


def _log_release_failure(task: asyncio.Task[None]) -> None:
    """A release whose caller left (cancelled, or its time ran out) failed: say so."""
    if not task.cancelled() and (error := task.exception()) is not None:
        logger.warning("aiolock: a release left to the background failed: %s", error)


async def _wait_for_turn(rt: Runtime, hold: Hold) -> None:
    """Wait until the owner's operations on ``hold`` under way (a cleanup) have ended, at
    most until a release started now would give up (see cleanup_deadline)."""
    try:
        async with asyncio.timeout_at(
            cleanup_deadline(asyncio.get_running_loop().time(), rt.config)
        ):
            await hold.wait_turn()
    except TimeoutError:
        return
    hold.end_turn()
    rt.leases.forget_if_idle(hold)


async def _release_later(op: _Op, deadline: float) -> None:
    """Release one count once the owner's operations before this one have ended, however
    long they take (each is bounded by its own commands' bounds; a caller that waits for
    this is bounded by ``deadline``). A turn that comes after ``deadline`` gets a fresh
    cleanup_timeout for the release itself: the caller has left, and a release out of time
    before it is even sent would end in a purge (the hold lost) for no reason."""
    hold, rule = op.hold, op.rule
    assert hold is not None
    try:
        await op.begin(None)
        if not hold.count:  # lost meanwhile
            if hold.stale:
                raise op.rt.leases.unlock_stale(hold)
            raise _not_owned(rule, hold.owner)
        now = asyncio.get_running_loop().time()
        await _release_one(op, deadline if deadline > now else now + op.rt.config.cleanup_timeout)
    finally:
        op.end()


async def _release_one(op: _Op, deadline: float | None) -> None:
    rt, rule, hold = op.rt, op.rule, op.hold
    assert hold is not None
    owner = hold.field
    before = hold.count
    if before == 1:
        rt.leases.releasing(hold)  # renewal stops now, whatever follows
    packed = with_acks(rt.config, rule.release(owner, hold.lease_ms, before))
    readonly: Any = None

    def failed() -> None:
        """The release cannot be confirmed: the hold is lost (no count of it can be trusted,
        and a lost hold is never renewed) and its cleanup purges it in the background, which
        is harmless whatever a late release does. This unlock used up its own count."""
        rt.leases.lose(hold, "a release of it could not be confirmed", used=1)

    for _ in range(rt.config.retry_attempts + 1):
        call = rt.transport.send_now(packed, key=rule.key)
        if call is None:
            try:
                call = await op.send(packed, deadline)
            except (RedisUnavailableError, asyncio.CancelledError):
                failed()  # nothing was sent: the cleanup removes the hold
                raise
        sent_at, epoch = call.sent_at, call.epoch

        async def finish(value: Any, sent_at: float = sent_at, epoch: int = epoch) -> None:
            value = first_reply(value)
            if isinstance(value, OutcomeUnknown):
                # Its link dropped after the caller left: the release may still run. It must
                # not match the owner's next hold, which waits for this turn (see Leases.taint).
                await _fence_or_taint(rt, value, hold, owner)
            outcome = (
                None
                if isinstance(value, OutcomeUnknown | ErrorReply)
                else rule.parse_release(value)
            )
            if outcome is None:
                failed()
            else:
                _released(op, outcome, sent_at, epoch)  # a loss is told to on_lost

        reply = await op.outcome(
            call, deadline, finish, lambda: rule.settle_release(rt, owner, before)
        )
        if reply is NOT_RUN:
            continue
        if type(reply) is tuple:
            reply, acks = reply
            if not is_readonly(reply) and not (isinstance(acks, int) and acks > 0):
                # Released on the master; a failover before it reached a replica would bring
                # the hold back until its lease runs out (nobody renews it any more).
                logger.warning(
                    "aiolock: releasing %r: no replica acknowledged it (WAIT %d: %s)",
                    rule.name,
                    rt.config.replica_acks,
                    acks,
                )
        if is_readonly(reply):
            readonly = reply  # ran into a replica, wrote nothing: sent again to the master
            continue
        if reply is None or type(reply) is bool:  # settled
            outcome = reply
            if outcome is True and rt.leases.stale(hold, hold.epoch):
                # Settled by reading a server the hold was never checked on (it restarted,
                # or another master took over, since the hold was granted or last checked):
                # the owner holding nothing there cannot tell a release that ran from a
                # hold the change wiped.
                raise rt.leases.lose(
                    hold,
                    f"{rt.leases.change_of(hold)}, before its release was confirmed there",
                    used=1,
                )
        elif isinstance(reply, ErrorReply):
            failed()
            raise RedisOperationError(f"releasing {rule.name!r} failed: {reply}")
        else:
            outcome = rule.parse_release(reply)
        if outcome is None:
            # The server says the owner holds nothing (its lease ran out or it was
            # force-unlocked before anyone here noticed), or another count than it expects:
            # the hold is lost, and what is left of it on the server removed.
            rt.leases.lose(hold, "its lease expired, it was force-unlocked, or it was changed")
            raise rt.leases.unlock_stale(hold)
        lost = _released(op, outcome, sent_at, epoch)
        if lost is not None:
            raise lost  # the server changed before the release was confirmed there
        return
    failed()
    if readonly is not None:
        raise RedisUnavailableError(f"releasing {rule.name!r}: no master answered ({readonly})")
    raise RedisUnavailableError(f"releasing {rule.name!r}: sent again and again, never ran")


def _released(op: _Op, last: bool, sent_at: float, epoch: int) -> LockLostError | None:
    hold = op.hold
    assert hold is not None
    if last or hold.count <= 1 or hold.state is not HoldState.HELD:
        return op.rt.leases.released(hold, epoch)
    return op.rt.leases.released_one(hold, sent_at, epoch)
