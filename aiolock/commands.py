"""Running one command for the acquisition layer, and the bounds it works to: the margin a
bound gives up before it, the point an acquisition gives up at, a cleanup's deadline."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .config import Config
from .errors import (
    RedisOperationError,
    RedisUnavailableError,
)
from .holds import Hold
from .rules import (
    Command,
)
from .runtime import Runtime
from .transport import (
    Chain,
    ErrorReply,
    NotSent,
    OutcomeUnknown,
    is_readonly,
    pack,
)

logger = logging.getLogger("aiolock")


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
LOOK_AGAIN = 0.01

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
            if attempt == rt.config.retry_attempts or past(deadline):
                raise
            continue
        reply = await call.future
        if is_readonly(reply) and attempt < rt.config.retry_attempts and not past(deadline):
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


def past(deadline: float | None) -> bool:
    return deadline is not None and asyncio.get_running_loop().time() >= deadline


async def fence_until(rt: Runtime, unknown: OutcomeUnknown, until: float) -> bool:
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


async def fence_or_taint(rt: Runtime, unknown: OutcomeUnknown, hold: Hold, field: str) -> None:
    """A command of ``hold`` naming ``field`` was lost with its link and may still reach the
    server later, where it could match the owner's next generation if that wrote ``field``
    again (a release expecting count 1, a purge). Fence the link (for at most one
    command_timeout: this runs in the owner's turn, which its next acquire waits for), or
    else taint the field: the next generation writes another one (Leases.taint)."""
    if rt.leases.tainted(hold, field):
        return  # the next generation writes another field already
    until = asyncio.get_running_loop().time() + rt.config.command_timeout
    if not await fence_until(rt, unknown, until):
        rt.leases.taint(hold, field)
