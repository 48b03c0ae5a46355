"""The parts of the cluster transport: one node's links (:class:`Node`), a channel routed
to a node (:class:`Routed`), and the rewrite of script publishes for sharded pub/sub."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..config import Config
from ..keys import LATCH_CHANNEL_PREFIX, key_slot
from .calls import NotSent
from .connector import Connector
from .link import Link
from .settings import ServerSettings
from .subscriber import Listener, Subscriber, SubscribeRefused


class Node:
    """The links of one cluster node."""

    def __init__(
        self,
        name: str,
        settings: ServerSettings,
        config: Config,
        *,
        sharded: bool,
        on_opened: Callable[[Node, Link], None],
        on_link_closed: Callable[[Node], None],
    ) -> None:
        self._on_opened = on_opened
        self._on_link_closed = on_link_closed
        #: ``host:port``, as in redis-py's slot map
        self.name = name
        self.settings = settings
        self.link: Link | None = None
        #: the node process's ``run_id`` seen by the latest command link (None: not yet, or
        #: a user not allowed INFO): another one means the node restarted
        self.run_id: str | None = None
        what = f"Redis Cluster node {settings.address}"

        async def open_link() -> Link:
            return await Link.open(
                settings,
                command_timeout=config.command_timeout,
                ping_interval=config.ping_interval,
                on_closed=self._closed,
                ask_run_id=True,
            )

        async def open_subscriber_link(
            sink: Callable[[bytes, bytes], None],
            on_closed: Callable[[Link, BaseException], None],
        ) -> Link:
            return await Link.open(
                settings,
                command_timeout=config.command_timeout,
                ping_interval=config.ping_interval,
                sink=sink,
                on_closed=on_closed,
            )

        self.connector = Connector(open_link, self._adopt, config, what=what)
        self.subscriber = Subscriber(open_subscriber_link, config, what=what, sharded=sharded)
        #: with sharded pub/sub, the classic subscriber of channels that scripts cannot
        #: SPUBLISH to (a latch channel outside its count's slot; see aiolock.latch)
        self.classic = Subscriber(open_subscriber_link, config, what=what) if sharded else None

    def subscribers(self) -> list[Subscriber]:
        return [self.subscriber] if self.classic is None else [self.subscriber, self.classic]

    def subscriber_for(self, channel: bytes) -> Subscriber:
        if self.classic is not None and classic_only(channel):
            return self.classic
        return self.subscriber

    def _adopt(self, link: Link) -> None:
        self.link = link
        self._on_opened(self, link)
        if link.closed:  # closed as it opened, before its loss was ours to hear
            self._closed(link, link.error or ConnectionError("closed as it opened"))

    def _closed(self, link: Link, error: BaseException) -> None:
        if link is self.link:
            self._on_link_closed(self)

    def ready_link(self) -> Link | None:
        link = self.link
        if link is None or link.closed or link.paused is not None:
            return None
        return link

    async def aclose(self) -> None:
        await self.connector.aclose()
        for subscriber in self.subscribers():
            await subscriber.aclose()
        link, self.link = self.link, None
        if link is not None:
            link.close(NotSent("the client is closed"))


class Routed:
    """A channel's listener, with the node it is subscribed on (a Listener itself)."""

    __slots__ = ("channel", "key", "listener", "listening", "node", "reroute")

    def __init__(self, channel: bytes, key: str, listener: Listener, node: Node) -> None:
        self.channel = channel
        self.key = key
        self.listener = listener
        self.node = node
        self.listening = True
        self.reroute: Callable[[], None] | None = None

    def on_message(self, data: bytes) -> None:
        self.listener.on_message(data)

    def on_reset(self, listening: bool) -> None:
        self.listening = listening
        self.listener.on_reset(listening)
        if not listening and self.reroute is not None:
            self.reroute()

    def on_refused(self, error: Exception) -> None:
        self.listening = False
        if isinstance(error, SubscribeRefused) and error.code in ("MOVED", "ASK"):
            # its slot moved (the listener was told when the connection dropped): it is
            # subscribed again where the slot is now
            if self.reroute is not None:
                self.reroute()
            return
        self.listener.on_refused(error)


_LATCH_PREFIX = LATCH_CHANNEL_PREFIX.encode()
_PUBLISH = b"$7\r\nPUBLISH\r\n"
_LAST_PUBLISH = b"\r\n" + _PUBLISH
_SPUBLISH = b"$8\r\nSPUBLISH\r\n"
_SCRIPT_RUNS = frozenset({b"EVALSHA", b"EVAL", b"evalsha", b"eval"})


def classic_only(channel: bytes) -> bool:
    """A latch channel outside its count's slot: published with classic PUBLISH (see
    aiolock.latch), so listened to with classic SUBSCRIBE."""
    if not channel.startswith(_LATCH_PREFIX):
        return False
    name = channel[len(_LATCH_PREFIX) + 1 : -1]
    return key_slot(name) != key_slot(channel)


def to_sharded(packed: bytes) -> bytes:
    """A script run (EVALSHA/EVAL) with every ``PUBLISH`` argument (ARGV, never a key)
    made ``SPUBLISH``: scripts take the publish command as an argument, as Redisson's do."""
    if _PUBLISH not in packed:
        return packed
    if packed.endswith(_LAST_PUBLISH) and packed.count(b"PUBLISH") == 1:
        # The lock scripts' case: the publish command is the last argument. It is an ARGV,
        # not a key, if there are more arguments than keys.
        first = packed.index(b"\r\n")
        pos = first + 2
        values: list[bytes] = []
        for _ in range(3):  # the command, the script (or its sha), numkeys
            end = packed.index(b"\r\n", pos)
            start = end + 2
            stop = start + int(packed[pos + 1 : end])
            values.append(packed[start:stop])
            pos = stop + 2
        if values[0] in _SCRIPT_RUNS and int(values[2]) < int(packed[1:first]) - 3:
            return packed[: -len(_PUBLISH)] + _SPUBLISH
    pos = packed.index(b"\r\n") + 2
    count = int(packed[1 : pos - 2])
    items: list[tuple[int, int, int]] = []  # (header start, value start, value end)
    for _ in range(count):
        end = packed.index(b"\r\n", pos)
        start = end + 2
        stop = start + int(packed[pos + 1 : end])
        items.append((pos, start, stop))
        pos = stop + 2
    if count < 3 or packed[items[0][1] : items[0][2]] not in _SCRIPT_RUNS:
        return packed
    numkeys = int(packed[items[2][1] : items[2][2]])
    parts: list[bytes] = []
    last = 0
    for header, start, stop in items[3 + numkeys :]:
        if packed[start:stop] == b"PUBLISH":
            parts += (packed[last:header], _SPUBLISH)
            last = stop + 2
    if not parts:
        return packed
    parts.append(packed[last:])
    return b"".join(parts)


def slot_words(slots: list[int]) -> str:
    """``slot 7``, ``slots 0-5460``, ``slots 1-3, 7``: sorted slot numbers in words."""
    ranges: list[str] = []
    start = previous = slots[0]
    for slot in [*slots[1:], -1]:
        if slot == previous + 1:
            previous = slot
            continue
        ranges.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = slot
    if len(ranges) > 8:
        ranges = [*ranges[:8], f"... ({len(slots)} slots)"]
    word = "slot" if len(slots) == 1 else "slots"
    return f"{word} {', '.join(ranges)}"


def moved(routed: Routed) -> Callable[[asyncio.Future[None]], None]:
    def done(future: asyncio.Future[None]) -> None:
        if not future.cancelled() and future.exception() is None:
            routed.on_reset(True)  # subscribed on the new node: waiters re-check

    return done
