"""What travels on a link: a command encoded (:func:`pack`), its :class:`Call` (the caller's
future), a :class:`Chain` of commands that go out together, the replies and errors a call
ends with (:class:`ErrorReply`, :class:`NotSent`, :class:`OutcomeUnknown`), and the scripts
a link may send as EVAL when the server lost its script cache."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hiredis


class ErrorReply(Exception):
    """An error reply from Redis (``-ERR ...``, ``-NOSCRIPT ...``, ``-WRONGTYPE ...``)."""

    @property
    def code(self) -> str:
        """The error's first word: ERR, NOSCRIPT, WRONGTYPE, NOPERM, MOVED, ...; READONLY also
        for a script whose write a replica refused ("ERR Error running script ...: -READONLY
        ..."): a replica refuses every write, so such a script wrote nothing either."""
        text = str(self)
        if text.startswith("ERR Error running script") and ": -READONLY " in text:
            return "READONLY"
        return text.split(" ", 1)[0]


class NotSent(Exception):
    """Nothing was sent: no connection could be opened (safe to try again)."""


class Refused(NotSent):
    """The server answered and refused the connection for a reason that waiting does not
    change (AUTH or SELECT refused, a password required but none given (NOAUTH) or wrong
    credentials (WRONGPASS), a cluster node or a Sentinel where one server was expected):
    callers fail at once with it while the next attempt waits its backoff."""


@dataclass(frozen=True, slots=True)
class LinkIdentity:
    """Who a link was on the server: enough to kill it there (``CLIENT KILL``)."""

    server: str
    client_id: int | None
    #: the client's address as the server saw it (``CLIENT INFO``'s ``addr``)
    addr: str | None
    #: the server process's ``run_id`` (``INFO server``) when the link asked for it: a
    #: server restarted (empty, unless it persists) answers another one
    run_id: str | None = None


class OutcomeUnknown(Exception):
    """A command was possibly sent but its reply was lost: it may or may not have run, and
    until its link is fenced it may still run later."""

    def __init__(self, message: str, link: LinkIdentity | None) -> None:
        super().__init__(message)
        self.link = link


class _Arrived:
    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value


class Chain(bytes):
    """Encoded commands written together, in order, whose replies settle one :class:`Call`
    as a tuple (e.g. a script and ``WAIT``). Make it with ``Chain.of(cmd1, cmd2, ...)``."""

    replies: int

    @classmethod
    def of(cls, *commands: bytes) -> Chain:
        return cls.joined(b"".join(commands), len(commands))

    @classmethod
    def joined(cls, data: bytes, replies: int) -> Chain:
        chain = cls(data)
        chain.replies = replies
        return chain


def first_reply(reply: Any) -> Any:
    """The reply of a single command, or of the first command of a :class:`Chain`."""
    return reply[0] if type(reply) is tuple else reply


def is_readonly(reply: Any) -> bool:
    """Whether ``reply`` (or a Chain's first reply) is ``-READONLY``: the command ran into a
    replica and wrote nothing (it may be sent again, to the master)."""
    reply = first_reply(reply)
    return type(reply) is ErrorReply and reply.code == "READONLY"


class Call:
    """One command in flight; ``future`` gets its reply: a value, an :class:`ErrorReply`, or
    an :class:`OutcomeUnknown` (given as results, never raised into the future)."""

    __slots__ = ("_late", "epoch", "future", "mark", "packed", "parts", "sent_at")

    def __init__(
        self, future: asyncio.Future[Any], sent_at: float, packed: bytes, mark: bytes | None = None
    ) -> None:
        self.future = future
        self.sent_at = sent_at
        #: the command as sent (an EVALSHA is sent again as EVAL from it on NOSCRIPT)
        self.packed = packed
        #: for a marker PING (see Link), the reply it must get
        self.mark = mark
        #: for a :class:`Chain`, the replies arrived so far
        self.parts: list[Any] | None = [] if type(packed) is Chain else None
        #: the transport's epoch when the command whose reply settles it was sent (see
        #: ``Transport.epoch``; set by the transport)
        self.epoch = 0
        self._late: _Arrived | Callable[[Any], None] | None = None

    def settle(self, value: object) -> None:
        future = self.future
        if not future.done():
            future.set_result(value)
            return
        late = self._late
        if late is None:
            self._late = _Arrived(value)  # the caller is leaving: abandon() picks it up
        elif not isinstance(late, _Arrived):
            late(value)

    def abandon(self, handler: Callable[[Any], None]) -> None:
        """The caller stops waiting: ``handler(value)`` gets the outcome (now, if known)."""
        future = self.future
        if future.done() and not future.cancelled():
            handler(future.result())
            return
        late = self._late
        if isinstance(late, _Arrived):
            handler(late.value)
        else:
            self._late = handler


def pack(args: tuple[Any, ...]) -> bytes:
    """One command in RESP (raises if an argument cannot be encoded)."""
    packed: bytes = hiredis.pack_command(args)
    return packed


#: script SHA1 (hex, bytes) -> the EVAL command's head with the script's source
_EVAL_BODIES: dict[bytes, bytes] = {}
_EVALSHA = b"$7\r\nEVALSHA\r\n$40\r\n"


def register_script(sha: str, source: str) -> None:
    """Make ``EVALSHA sha ...`` commands fall back to EVAL with ``source`` on NOSCRIPT."""
    encoded = source.encode()
    _EVAL_BODIES[sha.encode()] = b"$4\r\nEVAL\r\n$%d\r\n%s\r\n" % (len(encoded), encoded)


def eval_fallback(packed: bytes) -> bytes | None:
    """The EVAL command equivalent to an encoded EVALSHA of a registered script."""
    head = packed.find(b"\r\n") + 2
    start = head + len(_EVALSHA)
    if packed[head:start] != _EVALSHA:
        return None
    body = _EVAL_BODIES.get(packed[start : start + 40])
    if body is None:
        return None
    return packed[:head] + body + packed[start + 42 :]
