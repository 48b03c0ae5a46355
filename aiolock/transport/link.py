"""One connection to a Redis server, as an asyncio Protocol: no reader task, no per-command Task.

Commands are encoded (hiredis) before anything is queued, written at once without waiting for
earlier replies, and matched to their :class:`Call` first-in first-out as replies are parsed in
``data_received``; a reply resolves its caller's future right there. A subscriber link is the
same with a ``sink``: pub/sub messages go to it (channel and payload as bytes, never decoded)
and everything else is a reply in order (one SUBSCRIBE per channel, so one reply each).

Health: a link whose oldest command waited ``command_timeout`` (counted from when it was written,
and looked at once more after the loop has polled the socket, so that time the loop itself was
held up does not count against the server) is dropped; a link silent for
``ping_interval`` is sent a PING (and so dropped if that goes unanswered). A dropped link
settles every call in flight with :class:`OutcomeUnknown` carrying the link's identity, so the
owner of the link can fence it (``CLIENT KILL``) before anything is concluded.

Replies in step: RESP has no request ids, so a reply lost while the connection stays up (a
faulty middlebox) would hand every later reply to the wrong caller. A command link therefore
ends each batch of commands with a marker, ``PING <n>``, and hands a batch's replies to their
callers only once its marker's own reply has come back in its place; a reply out of step
drops the link (every call in flight and held: :class:`OutcomeUnknown`, settled above).

A caller that stops waiting (cancelled, or past its own deadline) calls :meth:`Call.abandon`:
its reply, whenever it comes, goes to a handler instead (e.g. to undo a lock it took).

Several commands that must go out together on one connection, in order (a script and the
``WAIT`` that follows it), are written as one :class:`Chain`: one Call, settled with the
tuple of their replies once the last one arrived (never a list: that is an array reply).

A command answered ``-READONLY`` ran into a replica (a master demoted by a failover): the
link takes no more commands (``readonly``; its owner opens another, to wherever the master
is now) and closes itself once the replies in flight have come back.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import Callable
from typing import Any, Final, cast

import hiredis

from .calls import (
    Call,
    Chain,
    ErrorReply,
    LinkIdentity,
    NotSent,
    OutcomeUnknown,
    Refused,
    eval_fallback,
    pack,
)
from .settings import ServerSettings

logger = logging.getLogger("aiolock.transport")

Sink = Callable[[bytes, bytes], None]
_MESSAGE_KINDS: Final = frozenset({b"message", b"smessage"})
#: how long the health timer waits before its second look at a late command (one loop poll)
_LOOK_AGAIN: Final = 0.01


class Link(asyncio.Protocol):
    """One open connection (see the module docstring). Make it with :meth:`open`."""

    def __init__(
        self,
        settings: ServerSettings,
        *,
        command_timeout: float,
        ping_interval: float,
        sink: Sink | None = None,
        on_closed: Callable[[Link, BaseException], None] | None = None,
        master_only: bool = False,
        standalone: bool = False,
        ask_run_id: bool = False,
    ) -> None:
        self.settings = settings
        #: whether the handshake checks that the server is a master (``ROLE``)
        self.master_only = master_only
        #: whether the handshake checks that the server is neither a cluster node nor a
        #: Sentinel (``HELLO``'s ``mode``): the links of a one-server transport
        self.standalone = standalone
        #: whether the handshake asks the server's run_id (``INFO server``, once per link)
        self.ask_run_id = ask_run_id
        #: set once a command was answered READONLY (see the module docstring)
        self.readonly = False
        self._command_timeout = command_timeout
        self._ping_interval = ping_interval
        self._sink = sink
        self._on_closed = on_closed
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = hiredis.Reader(replyError=ErrorReply)
        self._pending: deque[Call] = deque()
        self._timer: asyncio.TimerHandle | None = None
        #: commands written while a flush is due, sent together by it (None: none due)
        self._batch: list[bytes] | None = None
        #: whether batches end with a marker (a command link once its handshake is done)
        self._marked = False
        self._marks = 0
        #: replies of the batch under way, handed out when its marker comes back in place
        self._held: list[tuple[Call, Any]] = []
        self._last_read = self._loop.time()
        #: the oldest call once the health timer found it late and looked again (see _check)
        self._looked_again: Call | None = None
        #: set while the socket takes no more writes (flow control)
        self.paused: asyncio.Future[None] | None = None
        self.identity = LinkIdentity(settings.address, None, None)
        self.closed = False
        #: why the link closed (None while open)
        self.error: BaseException | None = None

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._pending)} in flight"
        return f"<Link {self.identity.server} id={self.identity.client_id} {state}>"

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    # -- opening ------------------------------------------------------------------------------

    @classmethod
    async def open(
        cls, settings: ServerSettings, *, command_timeout: float, ping_interval: float, **kw: Any
    ) -> Link:
        """Connect and run the handshake (AUTH, SELECT, CLIENT SETNAME, HELLO and ROLE where
        asked, CLIENT INFO), bounded by ``command_timeout``. Raises :class:`NotSent` with what
        went wrong."""
        link = cls(settings, command_timeout=command_timeout, ping_interval=ping_interval, **kw)
        try:
            async with asyncio.timeout(command_timeout):
                await link._connect()
                await link._handshake()
            link._marked = link._sink is None
        except TimeoutError:
            link.close(NotSent("no answer"))
            hint = ""
            if settings.ssl_context is not None:
                hint = "; if that server does not speak TLS, use a redis:// URL, not rediss://"
            raise NotSent(
                f"cannot connect to Redis at {settings.address}: no answer within "
                f"{command_timeout:g} s (command_timeout){hint}"
            ) from None
        except BaseException as exc:
            link.close(exc)
            if isinstance(exc, NotSent | asyncio.CancelledError):
                raise
            raise NotSent(f"cannot connect to Redis at {settings.address}: {exc}") from exc
        return link

    async def _connect(self) -> None:
        settings = self.settings
        try:
            if settings.path is not None:
                await self._loop.create_unix_connection(lambda: self, settings.path)
            else:
                assert settings.host is not None
                await self._loop.create_connection(
                    lambda: self,
                    settings.host,
                    settings.port,
                    ssl=settings.ssl_context,
                    server_hostname=settings.host if settings.ssl_context else None,
                )
        except ssl.SSLCertVerificationError as exc:
            raise NotSent(
                f"TLS handshake with {settings.address} failed: the server's certificate was "
                f"not verified ({exc.verify_message or exc}). Give the CA that signed it "
                "(ssl_ca_certs=...), or ssl_cert_reqs='none' to skip verification"
            ) from exc
        except ssl.SSLError as exc:
            raise NotSent(
                f"TLS handshake with {settings.address} failed: {exc}. If the server does not "
                "speak TLS, use a redis:// URL instead of rediss://"
            ) from exc
        except OSError as exc:
            raise NotSent(f"cannot connect to Redis at {settings.address}: {exc}") from exc

    async def _handshake(self) -> None:
        settings = self.settings
        commands: list[tuple[Any, ...]] = []
        credentials = await settings.credentials()
        if credentials:
            commands.append(("AUTH", *credentials))
        if settings.db:
            commands.append(("SELECT", settings.db))
        if settings.client_name:
            commands.append(("CLIENT", "SETNAME", settings.client_name))
        if self.standalone:
            commands.append(_HELLO)
        if self.master_only:
            commands.append(("ROLE",))
        if self.ask_run_id:
            commands.append(("INFO", "server"))
        commands.append(("CLIENT", "INFO"))
        calls = [self.send(pack(command)) for command in commands]
        run_id = None
        for command, call in zip(commands, calls, strict=True):
            reply = await call.future
            if isinstance(reply, OutcomeUnknown):
                hint = ""
                if settings.ssl_context is None:
                    hint = " (if the server speaks TLS, use a rediss:// URL)"
                raise NotSent(f"connection to {settings.address} closed{hint}: {reply}")
            if isinstance(reply, ErrorReply):
                if command[:2] == ("CLIENT", "INFO") and _tolerable(reply):
                    break  # an old server or a restricted user: no identity, no fencing
                if command == ("ROLE",) and _tolerable(reply):
                    continue  # a restricted user: READONLY replies still tell a replica
                if command[0] == "INFO" and _tolerable(reply):
                    continue  # a restricted user: a restart is not told apart from a drop
                if command == _HELLO and _unanswered(reply):
                    continue  # Redis < 6, a proxy: the mode is not known
                if command[0] == "AUTH":
                    what = "AUTH (authentication)"
                elif command[0] == "SELECT":
                    what = f"SELECT {settings.db} (the database number of the URL or client)"
                else:
                    what = " ".join(map(str, command[:2]))
                hint = ""
                if reply.code == "NOAUTH":
                    hint = (
                        " (the server requires a password: give it in the URL, "
                        "redis://[user]:password@host, or to the redis client)"
                    )
                # Waiting does not change refused credentials or database: permanent.
                permanent = command[0] in ("AUTH", "SELECT") or reply.code in _AUTH_REFUSALS
                error = Refused if permanent else NotSent
                raise error(f"Redis at {settings.address} refused {what}: {reply}{hint}")
            if command == ("ROLE",):
                role = reply[0] if isinstance(reply, list) and reply else reply
                if role != b"master":
                    raise NotSent(
                        f"Redis at {settings.address} is not a master (ROLE: {role!r}); "
                        "a failover is under way"
                    )
            if command == _HELLO:
                _check_mode(settings.address, reply)
            if command[0] == "INFO":
                run_id = _run_id(reply)
                self.identity = LinkIdentity(settings.address, None, None, run_id)
            if command[:2] == ("CLIENT", "INFO"):
                self.identity = _identity(settings.address, reply, run_id)

    # -- commands -----------------------------------------------------------------------------

    def send(self, packed: bytes) -> Call:
        """Write one encoded command; its :class:`Call` settles with the reply. An EVALSHA
        of a script the server does not know (NOSCRIPT) is sent again as EVAL, same call."""
        if self.closed:
            raise NotSent(f"connection to {self.identity.server} is closed: {self.error}")
        loop = self._loop
        call = Call(loop.create_future(), loop.time(), packed)
        self._pending.append(call)
        if self._timer is None:
            self._arm(call.sent_at + self._command_timeout)
        self._write(packed)
        return call

    def _write(self, packed: bytes) -> None:
        batch = self._batch
        if batch is None:
            # The first command of a loop iteration goes out at once; those written after it
            # in the same iteration go out together, one system call, on the next one, and
            # the marker after them: commands sent one after the other stay adjacent on the
            # wire (the cluster's ASKING applies to the very next command; a marker written
            # with the first command broke that: tried, issue 18).
            assert self._transport is not None
            self._transport.write(packed)
            self._batch = []
            self._loop.call_soon(self._flush)
        else:
            batch.append(packed)

    def _flush(self) -> None:
        batch, self._batch = self._batch, None
        if batch is None or self.closed:
            return
        now = self._loop.time()
        if batch:
            # A batch's commands are sent now: their time starts now (a loop held up between
            # queueing and flushing them, by a burst of thousands of tasks, is not the server's
            # delay; and a lease set by them starts later still, on the server).
            pending = self._pending
            for index in range(len(pending) - len(batch), len(pending)):
                pending[index].sent_at = now
        if self._marked:
            self._marks += 1
            mark = b"\x00aiolock %d" % self._marks
            packed = pack(("PING", mark))
            self._pending.append(Call(_NO_FUTURE, now, packed, mark))
            batch.append(packed)
        if batch:
            assert self._transport is not None
            self._transport.write(b"".join(batch))

    async def drain(self, deadline: float | None = None) -> None:
        """Wait until the socket takes writes again: at most until the link's own health
        check drops it (its oldest command waited ``command_timeout``), and at most until
        ``deadline`` (loop time; None: no other bound), past which :class:`NotSent` is
        raised (nothing of the caller's was written). The link's own bound is measured from
        a command that may have been written long before the caller came, so a caller whose
        bound ends sooner (an unlock within cleanup_timeout) needs its own."""
        paused = self.paused
        if paused is None:
            return
        if deadline is None:
            await asyncio.shield(paused)
            return
        try:
            async with asyncio.timeout_at(deadline):
                await asyncio.shield(paused)
        except TimeoutError:
            raise NotSent(
                f"the connection to {self.identity.server} took no writes in time (the server "
                "is not reading them)"
            ) from None

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's do not subclass asyncio.Transport)
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        parser = self._parser
        try:
            parser.feed(data)
            while (reply := parser.gets()) is not False:
                self._deliver(reply)
        except Exception as exc:  # a protocol error, a reply nobody asked for: drop the link
            logger.warning(
                "aiolock: closing the connection to Redis at %s: it sent something "
                "unexpected (%s); its requests fail and a new connection is opened",
                self.identity.server,
                exc,
            )
            self.close(exc)
            return
        if self.readonly and not self._pending:
            self.close(ConnectionError(f"{self.identity.server} is a replica now (READONLY)"))

    def _deliver(self, reply: Any) -> None:
        sink = self._sink
        if sink is not None and type(reply) is list and len(reply) == 3:
            if reply[0] in _MESSAGE_KINDS:
                try:
                    sink(reply[1], reply[2])
                except Exception:
                    logger.exception("aiolock: dispatching a pub/sub message failed")
                return
            if reply[0] == b"sunsubscribe" and not self._asked_sunsubscribe(reply[1]):
                # A sharded channel's slot moved away from this node (Redis unsubscribes
                # its clients unasked): drop the link, so its channels are subscribed again
                # where their slots are now and their listeners re-check.
                raise SlotMoved(f"sharded channel {reply[1]!r} moved to another node")
        if not self._pending:
            # Nothing was asked. A server speaks first only to refuse the connection as it
            # closes it (-ERR max number of clients reached, written on accept, which can
            # arrive before the handshake is sent): that error is why the link is dropped.
            if type(reply) is ErrorReply:
                raise reply
            raise OutOfStep(f"a reply nobody asked for: {reply!r}")
        call = self._pending.popleft()
        parts = call.parts
        if parts is not None:
            parts.append(reply)
            if len(parts) < cast(Chain, call.packed).replies:
                self._pending.appendleft(call)  # more replies of its chain to come
                return
            call.parts = []
            reply = tuple(parts)
        mark = call.mark
        if mark is not None:
            if reply != mark:
                raise OutOfStep(f"a marker got {reply!r}: a reply went missing")
            held, self._held = self._held, []
            for held_call, held_reply in held:
                _hand_out(held_call, held_reply)
            return
        first = reply[0] if parts is not None else reply
        if type(first) is ErrorReply and str(first).startswith("NOSCRIPT"):
            fallback = eval_fallback(call.packed)
            if fallback is not None:
                if parts is not None:
                    fallback = Chain.joined(fallback, len(reply))
                # The script did not run (not in the server's cache): send it whole.
                call.packed = fallback
                call.sent_at = self._loop.time()
                self._pending.append(call)
                self._write(fallback)
                return
        if type(first) is ErrorReply and first.code == "READONLY":
            self.readonly = True  # a replica now: no more commands here
        if self._marked:
            self._held.append((call, reply))  # dropping the link settles it as unknown
            if type(reply) is bytes and reply.startswith(b"\x00aiolock "):
                raise OutOfStep("a command got a marker's reply: a reply went missing")
        else:
            _hand_out(call, reply)

    def _asked_sunsubscribe(self, channel: Any) -> bool:
        pending = self._pending
        return bool(pending) and pending[0].packed == pack(("SUNSUBSCRIBE", channel))

    def connection_lost(self, exc: Exception | None) -> None:
        self.close(exc or ConnectionError("the server closed the connection"))

    def pause_writing(self) -> None:
        self.paused = self._loop.create_future()

    def resume_writing(self) -> None:
        paused, self.paused = self.paused, None
        if paused is not None and not paused.done():
            paused.set_result(None)

    # -- health -------------------------------------------------------------------------------

    def _arm(self, when: float) -> None:
        self._timer = self._loop.call_at(when, self._check)

    def _check(self) -> None:
        """The health timer. It is always due within ``command_timeout`` while the link is
        open, so a command sent meanwhile needs no timer of its own: on firing it re-arms
        for the oldest command's deadline, or the next idle check."""
        self._timer = None
        if self.closed:
            return
        now = self._loop.time()
        pending = self._pending
        if pending:
            oldest = pending[0]
            due = oldest.sent_at + self._command_timeout
            if due <= now and self._looked_again is not oldest:
                # Its reply may be in the socket, unread while the loop was busy (uvloop runs
                # due timers before it polls): look again once the loop has polled.
                self._looked_again = oldest
                self._arm(now + _LOOK_AGAIN)
                return
            if due <= now:
                self.close(
                    TimeoutError(f"no reply within {self._command_timeout:g} s (command_timeout)")
                )
                return
            self._arm(due)
        elif self._last_read + self._ping_interval <= now:
            self.send(b"*1\r\n$4\r\nPING\r\n")  # its deadline drops a dead link
        else:
            self._arm(min(self._last_read + self._ping_interval, now + self._command_timeout))

    # -- closing ------------------------------------------------------------------------------

    def close(self, error: BaseException | None = None) -> None:
        """Drop the link now (unsent bytes are discarded); calls in flight settle with
        :class:`OutcomeUnknown`. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.error = error or ConnectionError("closed by aiolock")
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is not None:
            self._transport.abort()
        self.resume_writing()
        pending, self._pending = self._pending, deque()
        held, self._held = self._held, []
        lost = OutcomeUnknown(f"reply lost: {self.error!r}", self.identity)
        for call, _ in held:  # not proven in step: their replies cannot be trusted
            call.settle(lost)
        for call in pending:
            if call.mark is None:
                call.settle(lost)
        if self._on_closed is not None:
            self._on_closed(self, self.error)


class OutOfStep(Exception):
    """A reply came where another was due: the link is out of step and must be dropped."""


class SlotMoved(Exception):
    """A sharded pub/sub link was unsubscribed by the server: the slot of one of its
    channels moved to another node."""


#: the future of a marker PING (never awaited)
class _NoFuture:
    def done(self) -> bool:
        return True


_NO_FUTURE: Any = _NoFuture()


def _hand_out(call: Call, reply: Any) -> None:
    future = call.future
    if not future.done():
        future.set_result(reply)
    else:
        call.settle(reply)


#: asks the server's mode (standalone, cluster, sentinel) without leaving RESP2 (Redis >= 6)
_HELLO: Final = ("HELLO", "2")
#: error codes that say the server wants other credentials (none given, or wrong ones):
#: reconnecting does not change them (see Refused)
_AUTH_REFUSALS: Final = frozenset({"NOAUTH", "WRONGPASS"})


def _check_mode(address: str, reply: Any) -> None:
    """Refuse a cluster node or a Sentinel where one server is expected (``HELLO`` reply)."""
    if not isinstance(reply, list):
        return
    fields = dict(zip(reply[::2], reply[1::2], strict=False))
    mode = fields.get(b"mode")
    if mode == b"cluster":
        raise Refused(
            f"Redis at {address} is a Redis Cluster node (cluster-enabled yes), even with one "
            "shard: use a redis+cluster:// URL (aiolock.from_url('redis+cluster://host:port')) "
            "or AioLock(redis.asyncio.RedisCluster(...)). A client of one server would mix "
            "hash slots in one script (CROSSSLOT) and could not follow slots to other shards"
        )
    if mode == b"sentinel":
        raise Refused(
            f"Redis at {address} is a Sentinel, not the master it monitors: use a "
            "redis+sentinel://host:port/<service> URL or Sentinel(...).master_for(<service>)"
        )


def _unanswered(reply: ErrorReply) -> bool:
    """An error to HELLO that leaves the connection usable: HELLO unknown, renamed away or
    not supported (Redis < 6, a proxy), or asked before AUTH (then the next command says
    so, without HELLO's long explanation)."""
    text = str(reply).lower()
    return _tolerable(reply) or reply.code == "NOAUTH" or "support" in text


def _tolerable(reply: ErrorReply) -> bool:
    """An error to CLIENT INFO that leaves the connection usable: the command is unknown
    (Redis < 6.2) or not allowed to this user. Anything else (``max number of clients
    reached``, ``NOAUTH``) means the connection is refused."""
    text = str(reply).lower()
    return reply.code == "NOPERM" or "unknown" in text


def _identity(server: str, info: Any, run_id: str | None) -> LinkIdentity:
    """Parse ``CLIENT INFO`` (``id=7 addr=127.0.0.1:5000 laddr=... name=...``)."""
    text = info.decode() if isinstance(info, bytes) else str(info)
    fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
    client_id = int(fields["id"]) if fields.get("id", "").isdigit() else None
    return LinkIdentity(server, client_id, fields.get("addr"), run_id)


def _run_id(info: Any) -> str | None:
    """The ``run_id`` line of ``INFO server`` (None if absent: not a Redis-like server)."""
    text = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        if line.startswith("run_id:"):
            return line[7:].strip() or None
    return None


__all__ = ["Link", "OutOfStep", "SlotMoved", "pack"]  # pack: tests/test_cluster.py imports it here
