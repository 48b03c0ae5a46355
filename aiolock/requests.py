"""Request latches: settling the lost reply of a command that changes no hold.

A lock's lost reply is settled by reading the owner's hold count. A plain semaphore has no
owner on the server and a countdown latch's count has none either, so their mutating
scripts record what they did under a request id, in one hash per client and object, in the
object's hash slot::

    {name}:aiolock_requests:<client id>    field = request id, value = the script's reply

The hash expires :data:`REQUEST_TTL_MS` after the client's last write to it. After the
transport has fenced a dropped link (none of its requests can run any more), a request's
field says what it did: present -> it ran, and that was its reply; absent -> it did not run
(as long as the field would still be there: read within :data:`TRUSTED_FOR` seconds of the
send), and it is sent again. The scripts also return the recorded reply when their request
id is already there, so a request that ran is never applied twice: a release never adds its
permits twice, a count-down never counts twice.

The hash does not grow: once a request's reply has arrived its field is forgotten (HDEL) by
the client's next script on the same object, which carries the ids in its arguments; a
request whose outcome is still being settled is forgotten after :data:`REQUEST_TTL_MS`.
Redisson's clients ignore these keys (their own unlock latch is a separate key).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from .commands import LINK_LATE, cancel_allowance
from .errors import (
    OutcomeUnknownError,
    RedisOperationError,
    RedisTimeoutError,
    RedisUnavailableError,
)
from .keys import requests_key
from .operation import wait_shielded
from .rules import NOT_RUN, Command
from .runtime import Runtime, RuntimeSource, runtime_of
from .tasks import new_id
from .transport import Call, ErrorReply, NotSent, OutcomeUnknown, is_readonly

logger = logging.getLogger("aiolock")

#: how long a client's request latches on one object live after its last write to them
REQUEST_TTL_MS = 60_000
#: a latch read this long after its request was sent proves nothing by its absence
TRUSTED_FOR = REQUEST_TTL_MS / 2000
#: request ids forgotten by one script at most
FORGET_BATCH = 32
#: objects whose ids to forget a client remembers at most (the oldest are dropped: their
#: fields simply expire with their hash)
FORGET_NAMES = 1024

#: what a lost command did: its reply, or NOT_RUN; given the loop time it was sent at
Settle = Callable[[float], Awaitable[Any]]


class RequestLatches:
    """One client's request latches: new request ids, and the ids to forget per object."""

    __slots__ = ("__weakref__", "_done", "client_id")

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self._done: dict[str, list[str]] = {}

    def key(self, name: str) -> str:
        return requests_key(name, self.client_id)

    @staticmethod
    def new_id() -> str:
        """A request id this client has not used (a number, unique in the process)."""
        return str(new_id())

    def take_done(self, name: str) -> list[str]:
        """Ids of requests on ``name`` to forget, for the next script on it to carry."""
        done = self._done.get(name)
        if not done:
            return []
        if len(done) <= FORGET_BATCH:
            del self._done[name]
            return done
        taken = done[-FORGET_BATCH:]
        del done[-FORGET_BATCH:]
        return taken

    def finished(self, name: str, request: str) -> None:
        """The outcome of ``request`` on ``name`` is known: its latch may be forgotten."""
        done = self._done.get(name)
        if done is None:
            if len(self._done) >= FORGET_NAMES:
                del self._done[next(iter(self._done))]
            done = self._done[name] = []
        done.append(request)

    def finished_later(self, name: str, request: str) -> None:
        """Its outcome is being settled in the background: forget it once its latch would
        have expired anyway (HDEL of a missing field is harmless)."""
        asyncio.get_running_loop().call_later(REQUEST_TTL_MS / 1000, self.finished, name, request)

    async def read(self, rt: Runtime, name: str, request: str) -> bytes | None:
        """The recorded reply of ``request`` (None: it did not run, or is forgotten)."""
        from .commands import read

        value: bytes | None = await read(
            rt, name, "HGET", self.key(name), request, what="reading a request latch"
        )
        return value

    def settle(self, rt: Runtime, name: str, request: str, parse: Callable[[bytes], Any]) -> Settle:
        """A :data:`Settle` reading the request's latch (``parse`` turns it into the reply)."""

        async def settle(sent_at: float) -> Any:
            value = await self.read(rt, name, request)
            if value is not None:
                return parse(value)
            if asyncio.get_running_loop().time() - sent_at < TRUSTED_FOR:
                return NOT_RUN
            raise OutcomeUnknownError(
                f"the reply about {name!r} was lost and it was settled too late to tell "
                "whether it ran; it is not sent again"
            )

        return settle


_LATCHES: weakref.WeakKeyDictionary[Runtime, RequestLatches] = weakref.WeakKeyDictionary()


def latches_of(source: Runtime | RuntimeSource) -> RequestLatches:
    """The request latches of a runtime (or of the runtime of the client given)."""
    runtime = runtime_of(source)
    latches = _LATCHES.get(runtime)
    if latches is None:
        latches = _LATCHES[runtime] = RequestLatches(runtime.id)
    return latches


# -- running one mutating command ------------------------------------------------------------


async def mutate(
    rt: Runtime,
    key: str,
    cmd: Command,
    settle: Settle,
    *,
    what: str,
    deadline: float | None = None,
) -> Any:
    """Run a mutating command and return its reply (an error reply raises
    RedisOperationError).

    A lost reply is settled: once the transport has fenced the dropped link, ``settle``
    says what the command did (its reply), or NOT_RUN, and then it is sent again. Cancelling
    the caller does not stop the command: it is finished in the background, and the caller
    waits for that at most ``cleanup_timeout`` before its CancelledError goes on. With a
    ``deadline`` (loop time; see ``cleanup_deadline``), the caller waits for the outcome
    until then at most: what is not known by then is finished in the background, exactly
    as for a cancelled caller, and RedisTimeoutError is raised."""
    try:
        call = rt.transport.send_now(cmd, key=key) or await rt.transport.send(
            cmd, key=key, deadline=deadline
        )
    except NotSent:
        return await _finish(rt, _run(rt, key, cmd, settle, what, None, 0.0), deadline, what)
    except asyncio.CancelledError:  # cancelled while connecting: nothing was sent yet
        await _finish_cancelled(rt, _run(rt, key, cmd, settle, what, None, 0.0))
        raise
    try:
        if deadline is None or _link_bounds(rt, call.sent_at, deadline):
            reply = await call.future  # the link's health check bounds it
        else:
            async with asyncio.timeout_at(deadline):
                reply = await call.future
    except asyncio.CancelledError:
        await _finish_cancelled(rt, _abandoned(rt, key, cmd, settle, what, call))
        raise
    except TimeoutError:
        task = rt.spawn(_abandoned(rt, key, cmd, settle, what, call))
        task.add_done_callback(_log_outcome)
        raise _unconfirmed(what) from None
    if isinstance(reply, OutcomeUnknown):
        return await _finish(
            rt, _run(rt, key, cmd, settle, what, _ready(reply), call.sent_at), deadline, what
        )
    if is_readonly(reply):  # ran into a replica (a demoted master), wrote nothing: again
        return await _finish(rt, _run(rt, key, cmd, settle, what, None, 0.0), deadline, what)
    return _checked(reply, what)


def _link_bounds(rt: Runtime, sent_at: float, deadline: float) -> bool:
    """Whether the link's health check gives a command sent at ``sent_at`` its reply (or
    drops the link) before ``deadline``."""
    return sent_at + rt.config.command_timeout + LINK_LATE <= deadline


def _abandoned(
    rt: Runtime, key: str, cmd: Command, settle: Settle, what: str, call: Call
) -> Coroutine[Any, Any, Any]:
    """Finishing ``call``, whose caller left, in the background: its reply, whenever it
    comes, goes to the settlement."""
    call.future.cancel()
    outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    call.abandon(lambda value: None if outcome.done() else outcome.set_result(value))
    return _run(rt, key, cmd, settle, what, outcome, call.sent_at)


def _unconfirmed(what: str) -> RedisTimeoutError:
    return RedisTimeoutError(
        f"{what} was not confirmed within cleanup_timeout; it goes on in the background "
        "(a lost reply is settled, never sent again blindly)"
    )


def _checked(reply: Any, what: str) -> Any:
    if isinstance(reply, ErrorReply):
        raise RedisOperationError(f"{what} failed: {reply}")
    return reply


def _ready(value: Any) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


async def _finish(
    rt: Runtime, coro: Coroutine[Any, Any, Any], deadline: float | None, what: str
) -> Any:
    """Run ``coro`` in a background task; if the caller is cancelled meanwhile, or
    ``deadline`` passes first (RedisTimeoutError), it goes on."""
    task = rt.spawn(coro)
    try:
        if deadline is None:
            return await asyncio.shield(task)
        timeout = max(0.0, deadline - asyncio.get_running_loop().time())
        await asyncio.wait((task,), timeout=timeout)
    except asyncio.CancelledError:
        task.add_done_callback(_log_outcome)
        await wait_shielded(task, cancel_allowance(rt.config))
        raise
    if task.done():
        return task.result()
    task.add_done_callback(_log_outcome)
    raise _unconfirmed(what)


async def _finish_cancelled(rt: Runtime, coro: Coroutine[Any, Any, Any]) -> None:
    """The caller is being cancelled: run ``coro`` in the background, wait for it at most
    cleanup_timeout."""
    task = rt.spawn(coro)
    task.add_done_callback(_log_outcome)
    await wait_shielded(task, cancel_allowance(rt.config))


def _log_outcome(task: asyncio.Task[Any]) -> None:
    """Nobody waits for ``task`` any more: say how it failed, if it did."""
    if not task.cancelled() and task.exception() is not None:
        logger.warning("aiolock: finishing a command in the background: %s", task.exception())


async def _run(
    rt: Runtime,
    key: str,
    cmd: Command,
    settle: Settle,
    what: str,
    first: Awaitable[Any] | None,
    sent_at: float,
) -> Any:
    """Send ``cmd`` (unless ``first``, the reply of a send already made, is given) until its
    outcome is known."""
    loop = asyncio.get_running_loop()
    reply = None if first is None else await first
    for attempt in range(rt.config.retry_attempts + 2):
        if reply is None:
            try:
                call = await rt.transport.send(
                    cmd, key=key, deadline=loop.time() + rt.config.command_timeout
                )
            except NotSent as exc:
                if attempt > rt.config.retry_attempts:
                    raise RedisUnavailableError(f"{what}: {exc}") from exc
                continue
            sent_at = call.sent_at
            reply = await call.future
        if is_readonly(reply) and attempt <= rt.config.retry_attempts:
            reply = None  # ran into a replica, wrote nothing: sent again, to the master
            continue
        if not isinstance(reply, OutcomeUnknown):
            return _checked(reply, what)
        limit = loop.time() + rt.config.command_timeout
        if not await rt.transport.fence(reply, limit):
            rt.spawn(_settle_later(rt, key, cmd, settle, what, reply, sent_at))
            raise OutcomeUnknownError(
                f"{what}: the reply was lost and the connection it went out on could not be "
                f"fenced in time ({reply}); it is settled in the background"
            )
        settled = await settle(sent_at)
        if settled is not NOT_RUN:
            return settled
        reply = None
    raise RedisUnavailableError(f"{what}: sent {rt.config.retry_attempts + 2} times, never ran")


async def _settle_later(
    rt: Runtime,
    key: str,
    cmd: Command,
    settle: Settle,
    what: str,
    lost: OutcomeUnknown,
    sent_at: float,
) -> None:
    """Background: keep trying to fence the dropped link (with backoff) while the request's
    record can still be trusted, then settle the command, sending it again if it did not
    run: a release whose reply was lost still goes through exactly once."""
    loop = asyncio.get_running_loop()
    until = sent_at + TRUSTED_FOR - rt.config.command_timeout
    delay = rt.config.reconnect_delay
    while not await rt.transport.fence(lost, None):
        if lost.link is None or lost.link.client_id is None or loop.time() + delay > until:
            logger.warning(
                "aiolock: %s: the reply was lost and its connection could not be closed in "
                "time, so whether the command ran stays unknown",
                what,
            )
            return
        await asyncio.sleep(delay)
        delay = min(delay * 2, rt.config.reconnect_max_delay)
    try:
        if await settle(sent_at) is NOT_RUN:
            await _run(rt, key, cmd, settle, what, None, 0.0)
    except RedisOperationError as exc:
        logger.warning(
            "aiolock: %s: finding out in the background whether it ran failed: %s", what, exc
        )
