"""The fault-injection TCP proxy: :class:`TcpProxy`."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import socket
import struct
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, Literal, Self
from urllib.parse import urlsplit, urlunsplit

from ._discovery import LOCALHOST
from ._resp import RespFramer, is_push, parse_request

_Direction = Literal["requests", "replies"]
_READ_SIZE: Final = 65536
_CLOSE_TIMEOUT: Final = 1.0
_LATE_REPLIES_TIMEOUT: Final = 5.0
_SUBSCRIBE_COMMANDS: Final = frozenset({b"SUBSCRIBE", b"PSUBSCRIBE", b"SSUBSCRIBE"})
#: how a subscription's confirmation begins, after its array (or push) header
_CONFIRMATIONS: Final = (b"$9\r\nsubscribe\r\n", b"$10\r\npsubscribe\r\n", b"$10\r\nssubscribe\r\n")

RequestMatcher = str | Callable[[tuple[bytes, ...]], bool]
"""Which requests a fault is about: a command name (``"EVALSHA"``, any case), or a predicate
on the request's arguments (``lambda args: args[0] == b"GET" and args[1] == b"k"``)."""


@dataclasses.dataclass
class _Fault:
    delay: float = 0.0
    blackhole: bool = False
    hold: bool = False


@dataclasses.dataclass
class _DropRule:
    remaining: int
    match: Callable[[tuple[bytes, ...]], bool] | None


@dataclasses.dataclass(slots=True)
class _Frame:
    """One unit to forward: a whole RESP value, or a raw chunk of a stream that is not RESP.

    ``data == b""`` marks the end of the stream (EOF or error on the reading side).
    """

    arrived: float
    data: bytes
    framed: bool = True
    request: tuple[bytes, ...] | None = None
    """For a request, its arguments; for a reply, the request it answers (when known)."""


def _check_delay(seconds: float) -> float:
    seconds = float(seconds)
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"delay must be a finite number of seconds >= 0, got {seconds!r}")
    return seconds


def _matcher(to: RequestMatcher | None) -> Callable[[tuple[bytes, ...]], bool] | None:
    if to is None or callable(to):
        return to
    if not isinstance(to, str) or not to or to.strip() != to:
        raise ValueError(f"expected a command name or a predicate, got {to!r}")
    name = to.upper().encode()
    return lambda request: bool(request) and request[0].upper() == name


def _confirms_subscription(frame: bytes) -> bool:
    """Whether a value the server sent is a subscription's confirmation."""
    header, _, rest = frame.partition(b"\r\n")
    return header[:1] in (b"*", b">") and rest.startswith(_CONFIRMATIONS)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close a stream at once, with an RST (SO_LINGER 0) rather than a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Link:
    """One proxied client connection and its own upstream connection.

    Each direction has a reader task that cuts the bytes into whole RESP values (so a fault
    never splits one) and queues them, and a forwarding task that applies the proxy's current
    fault to each value, in order. Requests are remembered in order so that each reply knows
    which request it answers (not on pub/sub connections, whose messages are unsolicited).

    EOF or an error on either side ends the whole link (Redis clients do not half-close), except
    after :meth:`TcpProxy.reset_client_side`: then the upstream side lives on, without a client,
    until :meth:`TcpProxy.release_held_requests` delivers what was held and the server has
    answered it.
    """

    def __init__(
        self,
        proxy: TcpProxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self.client_reader, self.client_writer = client
        self.upstream_reader, self.upstream_writer = upstream
        self.client_gone = False
        """The client side was reset by reset_client_side(); the upstream side is kept."""
        self.holding = False
        """Requests held when the client side was reset stay held until released."""
        self.released = asyncio.Event()
        self.pending_requests = 0
        """Requests read from the client and neither forwarded nor dropped yet."""
        self.requests_written = 0
        self.replies_read = 0
        self.late_requests = 0
        """Requests written upstream after the client side was reset."""
        self._sent: collections.deque[tuple[bytes, ...]] = collections.deque()
        #: one entry per channel subscribed and not yet confirmed: the request subscribing it
        self._subscribing: collections.deque[tuple[bytes, ...]] = collections.deque()
        self._pubsub = False
        self._upstream_ended = False
        self._reply_read = asyncio.Event()

    def abort(self) -> None:
        _abort(self.client_writer)
        _abort(self.upstream_writer)

    def reset_client(self, *, hold: bool) -> None:
        self.client_gone = True
        self.holding = hold
        _abort(self.client_writer)

    async def run(self) -> None:
        requests: asyncio.Queue[_Frame] = asyncio.Queue()
        replies: asyncio.Queue[_Frame] = asyncio.Queue()
        forward_requests = asyncio.create_task(self._forward_requests(requests))
        forward_replies = asyncio.create_task(self._forward_replies(replies))
        tasks = {
            asyncio.create_task(self._read(self.client_reader, requests, "requests")),
            asyncio.create_task(self._read(self.upstream_reader, replies, "replies")),
            forward_requests,
            forward_replies,
        }
        try:
            done, _ = await asyncio.wait(
                {forward_requests, forward_replies}, return_when=asyncio.FIRST_COMPLETED
            )
            if forward_replies not in done and self.client_gone:
                # Released: every held request has been written upstream. Wait (bounded) for
                # their replies, so that they have run before the upstream is closed.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_LATE_REPLIES_TIMEOUT):
                        await self._replies_caught_up()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._close()

    async def _replies_caught_up(self) -> None:
        while self.replies_read < self.requests_written and not self._upstream_ended:
            self._reply_read.clear()
            await self._reply_read.wait()

    async def _close(self) -> None:
        for writer in (self.client_writer, self.upstream_writer):
            if writer.transport.is_closing():
                continue
            writer.close()
            try:
                async with asyncio.timeout(_CLOSE_TIMEOUT):
                    await writer.wait_closed()
            except (OSError, TimeoutError):
                writer.transport.abort()

    async def _read(
        self, reader: asyncio.StreamReader, queue: asyncio.Queue[_Frame], direction: _Direction
    ) -> None:
        """Read one direction until EOF or error, queueing whole RESP values as they complete."""
        loop = asyncio.get_running_loop()
        framer = RespFramer(inline=direction == "requests")
        try:
            while True:
                data = await reader.read(_READ_SIZE)
                if not data:
                    break
                now = loop.time()
                for frame in framer.feed(data):
                    queue.put_nowait(self._frame(now, frame, direction))
                if framer.broken:  # not RESP: pass it on as raw chunks
                    raw = framer.take_raw()
                    if raw:
                        queue.put_nowait(_Frame(now, raw, framed=False))
        except OSError:
            pass
        finally:
            queue.put_nowait(_Frame(loop.time(), b""))
            if direction == "replies":
                self._upstream_ended = True
                self._reply_read.set()

    def _frame(self, now: float, frame: bytes, direction: _Direction) -> _Frame:
        if direction == "requests":
            self.pending_requests += 1
            self.proxy._pulse()
            return _Frame(now, frame, request=parse_request(frame))
        request = None
        if self._subscribing and _confirms_subscription(frame):
            request = self._subscribing.popleft()
        if not is_push(frame):
            self.replies_read += 1
            self._reply_read.set()
            if self._sent:
                request = self._sent.popleft()
        return _Frame(now, frame, request=request)

    async def _forward_requests(self, queue: asyncio.Queue[_Frame]) -> None:
        writer = self.upstream_writer
        try:
            while True:
                item = await queue.get()
                if not item.data:
                    if self.client_gone:
                        await self.released.wait()  # the server keeps seeing its client
                    return
                forward = await self.proxy._due("requests", item.arrived, self)
                if item.framed:
                    self.pending_requests -= 1
                    self.proxy._pulse()
                if not forward:
                    continue
                if item.request:  # a command: the server will answer it
                    if item.request[0].upper() in _SUBSCRIBE_COMMANDS:
                        self._pubsub = True  # replies no longer follow requests one to one
                        self._sent.clear()
                        # but each channel's confirmation answers it
                        self._subscribing.extend(item.request for _ in item.request[1:])
                    elif not self._pubsub:
                        self._sent.append(item.request)
                    self.requests_written += 1
                    if self.client_gone:
                        self.late_requests += 1
                writer.write(item.data)
                await writer.drain()
        except OSError:
            return

    async def _forward_replies(self, queue: asyncio.Queue[_Frame]) -> None:
        writer = self.client_writer
        while True:
            item = await queue.get()
            if not item.data:
                return
            if not await self.proxy._due("replies", item.arrived, self):
                continue
            if self.proxy._drops(item) or self.client_gone:
                continue  # dropped, or nobody left to deliver it to
            try:
                writer.write(item.data)
                await writer.drain()
            except OSError:
                if not self.client_gone:
                    return


class TcpProxy:
    """An asyncio TCP proxy in front of a Redis server, for fault injection.

    Every accepted client connection gets its own connection to the upstream server. The proxy
    cuts both directions into whole RESP values ("frames"; a stream that is not RESP is passed
    on in raw chunks), so a fault never splits a value, however the bytes were chunked.

    Faults are set per direction ("requests" = client -> server, "replies" = server -> client)
    and apply to all current and future connections; setting a delay, blackhole or hold
    replaces the direction's previous one, while :meth:`drop_replies` counts on top of them. A
    fault is judged when a value is due to be forwarded, and each connection forwards its values
    strictly in order through one queue per direction (a value delayed by 1 s holds back the
    ones behind it).

    ================================  ==========================================================
    :meth:`delay_requests`,           forward each value ``seconds`` after it was read
    :meth:`delay_replies`
    :meth:`blackhole_requests`,       read and discard everything
    :meth:`blackhole_replies`
    :meth:`drop_replies`,             discard the next ``n`` replies (optionally only replies to
    :meth:`drop_next_reply`           one command); the ones after them pass, so a client that
                                      pipelines is now out of step
    :meth:`hold_requests`             keep requests, forward nothing, until released
    :meth:`reset_client_side`         RST the clients, keep the upstream connections (and what
                                      they hold) open; :meth:`release_held_requests` delivers
                                      the held requests later, then closes them
    :meth:`reset_connections`         RST both sides of every connection
    :meth:`pass_through`              back to normal
    ================================  ==========================================================

    Use it inside a running event loop::

        async with TcpProxy.for_url(server.url) as proxy:
            client = redis.asyncio.Redis.from_url(proxy.url)
            proxy.blackhole_replies()
            ...

    A request that arrives after its sender gave up on it::

        proxy.hold_requests()
        attempt = asyncio.create_task(lock.unlock())
        await proxy.wait_for_held_requests()   # the script is in the proxy, not the server
        proxy.reset_client_side()              # the client sees a reset; Redis still sees it
        ...                                    # the client reconnects and retries
        await proxy.release_held_requests()    # the first attempt runs now, late

    The fault controls are plain methods; call them from the proxy's event loop thread.
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        url_template: str | None = None,
        connect_timeout: float = 5.0,
    ) -> None:
        """Prepare (not start) a proxy to ``upstream_host:upstream_port``.

        Args:
            upstream_host: the server's host.
            upstream_port: the server's port.
            url_template: a Redis URL whose scheme, credentials, path and query :attr:`url`
                keeps (only host and port are replaced); default ``redis://.../0``.
            connect_timeout: seconds to connect to the upstream for each new client.
        """
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self._url_template = url_template or "redis://127.0.0.1/0"
        self._connect_timeout = connect_timeout
        self.host = LOCALHOST
        self._port: int | None = None
        self._server: asyncio.Server | None = None
        self._closed = False
        self._links: dict[asyncio.Task[Any], _Link | None] = {}
        self._faults: dict[_Direction, _Fault] = {"requests": _Fault(), "replies": _Fault()}
        self._drop: _DropRule | None = None
        self._changed = asyncio.Event()
        self._activity: asyncio.Event | None = None
        self.connections_accepted = 0
        """Client connections accepted so far (including ones whose upstream connect failed)."""
        self.replies_dropped = 0
        """Replies discarded by :meth:`drop_replies` so far (not counting blackholed ones)."""

    @classmethod
    def for_url(cls, url: str, **kwargs: Any) -> TcpProxy:
        """A proxy in front of the server of a Redis URL; :attr:`url` keeps its db/credentials."""
        parts = urlsplit(url)
        return cls(parts.hostname or "localhost", parts.port or 6379, url_template=url, **kwargs)

    # -- properties ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port the proxy listens on (after :meth:`start`)."""
        if self._port is None:
            raise RuntimeError("TcpProxy is not started")
        return self._port

    @property
    def url(self) -> str:
        """The Redis URL to connect through the proxy."""
        parts = urlsplit(self._url_template)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@" if userinfo else ""
        netloc += f"{self.host}:{self.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    @property
    def active_connections(self) -> int:
        """Client connections currently being piped (not counting reset client sides)."""
        return sum(1 for link in self._live_links() if not link.client_gone)

    @property
    def orphaned_connections(self) -> int:
        """Upstream connections kept open by :meth:`reset_client_side`, not yet released."""
        return sum(1 for link in self._live_links() if link.client_gone)

    @property
    def held_requests(self) -> int:
        """Requests read from clients and held back by :meth:`hold_requests`, not yet released.

        Counts whole requests (RESP arrays or inline commands), on every connection that holds.
        """
        hold = self._faults["requests"].hold
        return sum(link.pending_requests for link in self._live_links() if hold or link.holding)

    @property
    def pending_drops(self) -> int:
        """Replies :meth:`drop_replies` still has to drop."""
        return self._drop.remaining if self._drop is not None else 0

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> Self:
        """Listen on a free ``127.0.0.1`` port."""
        if self._closed:
            raise RuntimeError("TcpProxy is closed")
        if self._server is None:
            self._server = await asyncio.start_server(self._handle, self.host, 0)
            self._port = self._server.sockets[0].getsockname()[1]
        return self

    async def aclose(self) -> None:
        """Stop listening and abort every piped connection; waits for all tasks. Idempotent."""
        if self._closed:
            return
        self._closed = True
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self._abort_all()
        tasks = list(self._links)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- fault controls -----------------------------------------------------------------------

    def delay_replies(self, seconds: float) -> None:
        """Forward each server -> client value ``seconds`` after it was read (order kept)."""
        self._set("replies", _Fault(delay=_check_delay(seconds)))

    def delay_requests(self, seconds: float) -> None:
        """Forward each client -> server value ``seconds`` after it was read (order kept)."""
        self._set("requests", _Fault(delay=_check_delay(seconds)))

    def blackhole_replies(self) -> None:
        """Read the server's replies and drop them; the client hears nothing."""
        self._set("replies", _Fault(blackhole=True))

    def blackhole_requests(self) -> None:
        """Read the clients' requests and drop them; the server hears nothing."""
        self._set("requests", _Fault(blackhole=True))

    def drop_replies(self, n: int = 1, *, to: RequestMatcher | None = None) -> None:
        """Drop the next ``n`` whole replies going server -> client, then pass the rest.

        The connection stays open and the replies after the dropped ones are delivered, so a
        client with requests in flight behind the lost one reads each later reply as the answer
        to the previous request: it is out of step unless it notices (a lone request just
        never gets its answer). Replaces an earlier :meth:`drop_replies` not yet used up.

        Args:
            n: how many replies to drop (0 cancels).
            to: only drop replies to these requests: a command name (``"EVALSHA"``) or a
                predicate on the request's arguments. On a pub/sub connection only a
                subscription's confirmation matches it (as the reply to its SUBSCRIBE).
                Without it, the next ``n`` values the server sends on any connection are
                dropped (pub/sub messages included).

        :attr:`pending_drops` counts down as replies are dropped; :meth:`wait_for_drops`
        waits for it to reach 0.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        self._drop = _DropRule(n, _matcher(to)) if n else None
        self._pulse()

    def drop_next_reply(self, *, to: RequestMatcher | None = None) -> None:
        """Drop exactly one reply: ``drop_replies(1, to=to)``."""
        self.drop_replies(1, to=to)

    def hold_requests(self) -> None:
        """Read the clients' requests and keep them, in order, forwarding none.

        They are delivered by :meth:`release_held_requests` (or when another requests fault
        replaces this one, e.g. :meth:`pass_through`). :attr:`held_requests` counts them;
        :meth:`wait_for_held_requests` waits for them to arrive.
        """
        self._set("requests", _Fault(hold=True))

    def reset_client_side(self) -> int:
        """RST every current client connection, but keep its upstream connection open.

        The server still sees each of these clients connected, and requests that were held
        (:meth:`hold_requests`) stay held in the proxy, until :meth:`release_held_requests`
        writes them upstream and then closes those upstream connections. This is a middlebox
        that reset the client while it still had the request, and delivered it later.

        Holding ends for new connections: a client that reconnects is piped normally (call
        :meth:`hold_requests` again to hold its requests too). Returns how many connections
        were reset.
        """
        hold = self._faults["requests"].hold
        count = 0
        for task, link in list(self._links.items()):
            if link is None:
                task.cancel()  # still connecting upstream: there is nothing to keep
            elif not link.client_gone:
                link.reset_client(hold=hold)
                count += 1
        if hold:
            self._set("requests", _Fault())
        return count

    async def release_held_requests(self) -> int:
        """Deliver every held request upstream, in order; end holding.

        On connections whose client side was reset (:meth:`reset_client_side`), this waits
        until the server has answered the delivered requests (so they have run; at most 5 s
        per connection), then closes those upstream connections gracefully; the replies are
        discarded. On connections whose client is still there, held requests are forwarded as
        usual and their replies go to the client. Returns how many requests were delivered on
        reset connections.
        """
        if self._faults["requests"].hold:
            self._set("requests", _Fault())
        orphans = {task: link for task, link in self._links.items() if link and link.client_gone}
        for link in orphans.values():
            link.holding = False
            link.released.set()
        self._wake()
        if orphans:
            # Each link bounds its own wait; shielded from our cancellation by asyncio.wait.
            await asyncio.wait(orphans)
        return sum(link.late_requests for link in orphans.values())

    def pass_through(self) -> None:
        """Back to normal in both directions: no delay, nothing dropped or held.

        Values still queued are forwarded at once (held requests too, except on connections
        whose client side was reset: those wait for :meth:`release_held_requests`). A
        connection that lost replies stays out of step with its client; new connections are
        clean.
        """
        self._drop = None
        self._set("requests", _Fault())
        self._set("replies", _Fault())

    def reset_connections(self) -> None:
        """Abruptly close (RST) every current client connection and its upstream connection.

        The proxy keeps listening; new connections are piped as usual.
        """
        self._abort_all()
        for task in self._links:
            task.cancel()

    async def wait_for_held_requests(self, n: int = 1) -> None:
        """Wait until at least ``n`` requests are held (see :attr:`held_requests`).

        Unbounded: wrap it in ``asyncio.timeout(...)`` as a hang guard.
        """
        await self._wait_until(lambda: self.held_requests >= n)

    async def wait_for_drops(self) -> None:
        """Wait until every reply :meth:`drop_replies` asked for has been dropped.

        Unbounded: wrap it in ``asyncio.timeout(...)`` as a hang guard.
        """
        await self._wait_until(lambda: self.pending_drops == 0)

    # -- internals ----------------------------------------------------------------------------

    def _live_links(self) -> list[_Link]:
        return [link for link in self._links.values() if link is not None]

    def _set(self, direction: _Direction, fault: _Fault) -> None:
        self._faults[direction] = fault
        self._wake()

    def _wake(self) -> None:
        """Wake forwarders waiting on a delay or a hold, to judge their value again."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _pulse(self) -> None:
        """Something countable happened: wake the ``wait_for_*`` methods."""
        event, self._activity = self._activity, None
        if event is not None:
            event.set()

    async def _wait_until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            if self._activity is None:
                self._activity = asyncio.Event()
            await self._activity.wait()

    def _abort_all(self) -> None:
        for link in self._live_links():
            link.abort()

    async def _due(self, direction: _Direction, arrived: float, link: _Link) -> bool:
        """Wait until a value read at ``arrived`` may go; False if it must be dropped."""
        loop = asyncio.get_running_loop()
        while True:
            fault = self._faults[direction]
            if fault.blackhole:
                return False
            held = direction == "requests" and (fault.hold or link.holding)
            remaining = arrived + fault.delay - loop.time()
            if not held and remaining <= 0:
                return True
            changed = self._changed
            if held:
                await changed.wait()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await changed.wait()

    def _drops(self, item: _Frame) -> bool:
        """Whether :meth:`drop_replies` takes this reply (counting it if so)."""
        rule = self._drop
        if rule is None or not item.framed:
            return False
        if rule.match is not None and (item.request is None or not rule.match(item.request)):
            return False
        rule.remaining -= 1
        if rule.remaining <= 0:
            self._drop = None
        self.replies_dropped += 1
        self._pulse()
        return True

    async def _handle(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        self.connections_accepted += 1
        task = asyncio.current_task()
        assert task is not None
        if self._closed:
            _abort(client_writer)
            return
        self._links[task] = None
        try:
            try:
                async with asyncio.timeout(self._connect_timeout):
                    upstream = await asyncio.open_connection(self.upstream_host, self.upstream_port)
            except (OSError, TimeoutError):
                _abort(client_writer)  # upstream down: the client sees its connection reset
                return
            except BaseException:
                _abort(client_writer)
                raise
            link = _Link(self, (client_reader, client_writer), upstream)
            self._links[task] = link
            if self._closed:
                link.abort()
                return
            await link.run()
        except asyncio.CancelledError:
            pass  # aclose() or reset_connections(); the link closed its streams
        finally:
            del self._links[task]
            self._pulse()
