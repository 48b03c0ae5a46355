"""The transport of a Redis Cluster: one pipelined command link and one pub/sub link per node.

Topology is redis-py's: the ``redis.asyncio.RedisCluster`` the user passes keeps the slot
map (``nodes_manager.slots_cache``), follows ``MOVED`` (``nodes_manager.move_slot``) and is
asked to reload it (``nodes_manager.initialize``) after a failover. Nothing here parses
``CLUSTER SLOTS``. Each node gets the part-1 :class:`Link` and :class:`Connector`, opened
with that node's connection settings, and commands go to the master of ``key``'s hash slot.

Redirects, retried within the command's time (``command_timeout`` from its first send):

* ``MOVED`` and ``ASK`` mean the command did not run there: it is sent again at once to the
  node named (``ASKING`` first, and a script as ``EVAL``, for ``ASK``); ``MOVED`` also
  updates redis-py's slot map and reloads it in the background.
* ``TRYAGAIN``, ``CLUSTERDOWN``, ``LOADING``, ``MASTERDOWN`` and ``READONLY`` (a master
  demoted under us) also mean it did not run: it is sent again after a backoff, the slot map
  reloaded first. Neither the reload nor the backoff waits more than half the time left, so
  the reply, and a redirect it may bring (the slot moved meanwhile), still come in time.
* When the time runs out (or after ``MAX_REDIRECTS`` redirects in a row), the last error
  reply is the result, saying what happened: the codes seen, the slot, how many sends over
  how long, and that the command did not run.
* ``NOSCRIPT`` (a promoted replica has an empty script cache) is the link's own fallback to
  ``EVAL``.

A reply that never came (the link dropped: ``OutcomeUnknown``) is never sent again here; the
layers above fence it first (:meth:`ClusterTransport.fence`). A node that cannot be reached
for ``CLIENT KILL`` counts as fenced once the reloaded slot map shows that it serves no slot
any more: whatever its lost requests did afterwards can never reach the master that serves
those slots now (a master that lost its slots to a promoted replica stops replicating to it).

Server changes (told to the watchers, :meth:`Transport.watch`, per slot: see
:meth:`Transport.epoch_of`): the master of a slot is another node in redis-py's map (compared
after every reload and ``MOVED``, and before any command goes to a master not told yet), or a
node's command link finds another ``run_id`` (it restarted, empty unless it persists). The map
is reloaded once a second while anything is held, waited on or in flight; a node's command
link lost while anything is held is opened again at once, while the node serves slots. A new
master that served no slot before is a failover (the replica may lack the latest writes:
replies from before are not trusted, :meth:`Transport.loss_epoch_of`); one that did is a
migration (the keys moved whole: they are). Either way the waiters of those slots are woken.

Pub/sub: each channel is subscribed on the master of its routing key's slot (classic
``SUBSCRIBE`` reaches every node, so a subscription stays valid when the slot moves while
the node lives). When a node's pub/sub connection is lost, its channels are moved to the
masters that serve their slots once the map says so, and their listeners are told (reset,
then listening again: waiters re-check).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import MovedError

from ..config import Config
from ..keys import key_slot
from .base import Transport, TransportStatistics, wait_call
from .calls import Call, ErrorReply, LinkIdentity, NotSent, OutcomeUnknown, eval_fallback, pack
from .cluster_node import Node, Routed, moved, slot_words, to_sharded
from .link import Link
from .settings import ServerSettings
from .subscriber import Listener

logger = logging.getLogger("aiolock.transport")

#: error codes meaning "not run here, the command belongs on another node now"
_REDIRECTS = frozenset({"MOVED", "ASK"})
#: error codes meaning "not run, try again shortly" (the slot map reloaded first)
_TRY_AGAIN = frozenset({"TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN", "READONLY"})
#: the most redirects one command follows (as redis-py's RedisCluster)
MAX_REDIRECTS = 16
_FENCES_KEPT = 64
#: how often (seconds, or ``ping_interval`` if shorter) the slot map is reloaded while
#: anything is held, waited on or in flight, and how long such a reload may take at most
TOPOLOGY_CHECK = 1.0
TOPOLOGY_CHECK_BOUND = 2.0
_ASKING = pack(("ASKING",))


class ClusterTransport(Transport):
    """Commands routed by hash slot over one link per master (see the module docstring)."""

    by_slot = True

    def __init__(self, cluster: RedisCluster, config: Config) -> None:
        self.cluster = cluster
        self.config = config
        self._nodes: dict[str, Node] = {}
        self._ready = False
        self._starting: asyncio.Task[None] | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self._refreshed_at = -1e9
        self._rerouting: asyncio.Task[None] | None = None
        self._routed: dict[bytes, Routed] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._fenced: dict[LinkIdentity, None] = {}
        self._fences = 0
        self._redirects = 0
        self._closed = False
        #: slot -> the master serving it, as last told (``host:port``; see _check_map)
        self._owners: dict[int, str] = {}
        #: slot -> the epoch of its latest change (see Transport.epoch_of), and of its
        #: latest change that may have lost writes (Transport.loss_epoch_of)
        self._epochs: dict[int, int] = {}
        self._loss_epochs: dict[int, int] = {}
        #: node name -> the task opening its command link again (see _link_closed)
        self._reopening: dict[str, asyncio.Task[None]] = {}
        self._watching: asyncio.Task[None] | None = None
        #: whether pub/sub is sharded (SSUBSCRIBE/SPUBLISH); known once the map is loaded
        self.sharded = bool(config.sharded_pubsub)
        #: the reply to Redisson's probe, if it was sent
        self.probe_reply: Any = None

    def __repr__(self) -> str:
        return f"<ClusterTransport {len(self._nodes)} nodes>"

    # -- topology (redis-py's) ------------------------------------------------------------------

    async def _start(self, deadline: float | None) -> None:
        """Load the slot map once (``RedisCluster.initialize``), by ``deadline``."""
        if self._ready:
            return
        if self._starting is None:
            self._starting = self._spawn(self._initialize())
        try:
            async with asyncio.timeout_at(deadline):
                await asyncio.shield(self._starting)
        except TimeoutError:
            raise NotSent(
                "no answer from the Redis Cluster in time (loading its slot map)"
            ) from None
        except NotSent:
            raise
        except Exception as exc:
            raise NotSent(f"cannot load the Redis Cluster's slot map: {exc!r}") from exc

    async def _initialize(self) -> None:
        try:
            await self.cluster.initialize()
            if self.config.sharded_pubsub is None:
                self.sharded = await self._probe_sharded()
            self._check_map()  # the first: every slot's master as it is
            self._ready = True
            if self._watching is None and not self._closed:
                self._watching = self._spawn(self._watch_topology())
        finally:
            self._starting = None

    async def _probe_sharded(self) -> bool:
        """Redisson's probe: sharded pub/sub if ``PUBSUB SHARDNUMSUB 0`` is understood."""
        masters = [nodes[0] for nodes in self.cluster.nodes_manager.slots_cache.values() if nodes]
        if not masters:
            raise NotSent("the Redis Cluster serves no slot")
        settings = ServerSettings.from_kwargs(
            masters[0].connection_class, masters[0].connection_kwargs
        )
        link = await Link.open(
            settings,
            command_timeout=self.config.command_timeout,
            ping_interval=self.config.ping_interval,
        )
        try:
            deadline = asyncio.get_running_loop().time() + self.config.command_timeout
            reply = await wait_call(link.send(pack(("PUBSUB", "SHARDNUMSUB", "0"))), deadline)
        finally:
            link.close()
        if isinstance(reply, OutcomeUnknown):
            raise NotSent(f"probing sharded pub/sub: {reply}")
        self.probe_reply = reply  # what the mode was chosen by (for diagnostics)
        if isinstance(reply, list):
            return True
        if isinstance(reply, ErrorReply) and "unknown" in str(reply).lower():
            return False  # a server without sharded pub/sub (Redis 6.2)
        # Not an answer to the question (LOADING, CLUSTERDOWN, ... of a node that has just
        # come back): ask again on the next send rather than settle on classic pub/sub.
        logger.debug("aiolock: the sharded pub/sub probe got %r", reply)
        raise NotSent(f"probing sharded pub/sub: {reply!r}")

    def refresh(self, within: float | None = None) -> asyncio.Task[None]:
        """Reload the slot map in the background (one reload at a time, at most one per
        ``reconnect_delay``, taking at most ``within`` s, else ``command_timeout``); returns
        the reload under way. A master changed in it is told (:meth:`_check_map`)."""
        task = self._refreshing
        if task is None:
            bound = self.config.command_timeout if within is None else within
            task = self._refreshing = self._spawn(self._refresh(bound))
        return task

    async def _refresh(self, bound: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            pause = self._refreshed_at + self.config.reconnect_delay - loop.time()
            if pause > 0:
                await asyncio.sleep(pause)
            async with asyncio.timeout(bound):
                await self.cluster.nodes_manager.initialize()
        except Exception as exc:
            logger.debug("aiolock: reloading the cluster slot map failed: %r", exc)
        finally:
            self._refreshed_at = loop.time()
            self._refreshing = None
        if self._ready:
            self._check_map()

    # -- server changes: another master for some slots, a node restarted -------------------------

    def epoch_of(self, key: str) -> int:
        return self._epochs.get(key_slot(key), 0)

    def loss_epoch_of(self, key: str) -> int:
        return self._loss_epochs.get(key_slot(key), 0)

    def _check_map(self, moved: dict[int, str] | None = None) -> None:
        """Compare redis-py's slot map with the masters last told, and tell a change for
        every slot whose master is another node now; with ``moved`` (slot -> node, from a
        ``MOVED``), those slots too, whatever the map says. The first call only takes note.

        A slot whose new master already served slots as a master was migrated: its keys
        moved whole (``MIGRATE``), so replies from the node before are still good; one whose
        new master was not a master before is a failover to a replica, which may lack the
        latest writes (see :meth:`Transport.loss_epoch_of`)."""
        owners = self._owners
        first = not owners
        changes: dict[int, str] = {}
        for slot, nodes in self.cluster.nodes_manager.slots_cache.items():
            if nodes and owners.get(slot) != nodes[0].name:
                changes[slot] = nodes[0].name
        if moved:
            changes.update((slot, name) for slot, name in moved.items() if owners.get(slot) != name)
        if first:
            owners.update(changes)
            return
        if not changes:
            return
        masters = set(owners.values())
        pairs: dict[tuple[str, str], list[int]] = {}
        for slot, name in changes.items():
            before = owners.get(slot)
            owners[slot] = name
            if before is not None:  # a slot served for the first time changes nothing
                pairs.setdefault((before, name), []).append(slot)
        for lossy in (True, False):
            told = {
                (before, now): slots
                for (before, now), slots in pairs.items()
                if (now not in masters) is lossy
            }
            if told:
                how = "a failover" if lossy else "migrated"
                why = "; ".join(
                    f"{slot_words(sorted(slots))} moved from {before} to {now} ({how})"
                    for (before, now), slots in told.items()
                )
                self._changed({slot for slots in told.values() for slot in slots}, why, lossy)

    def _opened(self, node: Node, link: Link) -> None:
        """A command link to ``node`` opened (before anything is sent on it): if the node
        has another ``run_id`` than before, it restarted, empty unless it persists."""
        run_id = link.identity.run_id
        if run_id is None:
            return
        before, node.run_id = node.run_id, run_id
        if before is None or before == run_id:
            return
        slots = {slot for slot, owner in self._owners.items() if owner == node.name}
        if slots:
            why = f"{node.name} restarted (another run_id), serving {slot_words(sorted(slots))}"
            self._changed(slots, why, lossy=True)

    def _changed(self, slots: set[int], why: str, lossy: bool) -> None:
        """The master of ``slots`` is another server now (which may lack what was written
        there if ``lossy``): a new epoch for them, told to the watchers (the holds there are
        checked at once), and their waiters woken to re-check there (no unlock message may
        ever come for a hold that the change wiped)."""
        epoch = self.epoch + 1
        for slot in slots:
            self._epochs[slot] = epoch
            if lossy:
                self._loss_epochs[slot] = epoch
        logger.warning("aiolock: Redis Cluster: %s; the holds there are checked now", why)
        self._tell(why)
        for routed in list(self._routed.values()):
            if key_slot(routed.key) in slots:
                routed.listener.on_reset(routed.listening)

    def _link_closed(self, node: Node) -> None:
        """A node's command link closed: while anything is held, open it again at once (a
        restart is noticed then, by its run_id) for as long as the node serves slots."""
        if self._closed or node.name in self._reopening:
            return
        if any(watcher.needs_server() for watcher in self._watchers):
            self._reopening[node.name] = self._spawn(self._reopen(node))

    async def _reopen(self, node: Node) -> None:
        try:
            while not self._closed:
                link = node.link
                if link is not None and not link.closed:
                    return
                if not any(watcher.needs_server() for watcher in self._watchers):
                    return
                if not self._serves_slots(node.name):
                    return  # failed over (told by the map), or not a master any more
                try:
                    await node.connector.connect(None)  # backs off after a failure
                except NotSent as exc:
                    logger.debug("aiolock: opening the link to %s again: %s", node.name, exc)
                    await asyncio.shield(self.refresh())  # failed over?
        except Exception:  # never expected; the next command opens a link anyway
            logger.exception("aiolock: opening the link to %s again failed", node.name)
        finally:
            self._reopening.pop(node.name, None)

    async def _watch_topology(self) -> None:
        """Every second (or ``ping_interval`` if shorter), while anything is held, waited on
        or in flight, reload the slot map: a failover, or a slot migrated, is told then even
        if no command of this client meets it (a frozen master that thaws answers a command
        sent before its failover: that reply must be known to come from a deposed master)."""
        interval = min(self.config.ping_interval, TOPOLOGY_CHECK)
        within = min(self.config.command_timeout, TOPOLOGY_CHECK_BOUND)
        while not self._closed:
            await asyncio.sleep(interval)
            try:
                if self._busy():
                    await asyncio.shield(self.refresh(within))
            except Exception:  # never expected; this task must not die silently
                logger.exception("aiolock: checking the Redis Cluster's slot map failed")

    def _busy(self) -> bool:
        """Whether anything is held, waited on, or in flight."""
        if self._routed:
            return True
        for node in self._nodes.values():
            link = node.link
            if link is not None and not link.closed and link.in_flight:
                return True
        return any(watcher.needs_server() for watcher in self._watchers)

    def _master(self, slot: int) -> ClusterNode | None:
        nodes = self.cluster.nodes_manager.slots_cache.get(slot)
        return nodes[0] if nodes else None

    def _node_for(self, key: str | None) -> Node | None:
        """The node serving ``key``'s slot (any master for None); None before the map is
        loaded. A master that is not the one last told (the map changed since, here or in
        the user's own use of the RedisCluster) is told first (:meth:`_check_map`)."""
        if key is None:
            masters = [
                nodes[0] for nodes in self.cluster.nodes_manager.slots_cache.values() if nodes
            ]
            found = masters[0] if masters else None
        else:
            slot = key_slot(key)
            found = self._master(slot)
            if found is not None and self._owners.get(slot) != found.name and self._ready:
                self._check_map()
        if found is None:
            return None
        return self._node(found)

    def _node(self, found: ClusterNode) -> Node:
        node = self._nodes.get(found.name)
        if node is None:
            settings = ServerSettings.from_kwargs(found.connection_class, found.connection_kwargs)
            node = self._nodes[found.name] = self._new_node(found.name, settings)
        return node

    def _node_at(self, host: str, port: int) -> Node:
        name = f"{host}:{port}"
        node = self._nodes.get(name)
        if node is None:
            known = self.cluster.nodes_manager.get_node(host, port)
            if known is not None:
                return self._node(known)
            base = next(iter(self._nodes.values())).settings if self._nodes else None
            settings = base.at(host, port) if base else ServerSettings(host, port)
            node = self._nodes[name] = self._new_node(name, settings)
        return node

    def _new_node(self, name: str, settings: ServerSettings) -> Node:
        return Node(
            name,
            settings,
            self.config,
            sharded=self.sharded,
            on_opened=self._opened,
            on_link_closed=self._link_closed,
        )

    def _serves_slots(self, server: str) -> bool:
        """Whether ``server`` (host:port) is the master of any slot in the slot map."""
        return any(
            nodes and nodes[0].name == server
            for nodes in self.cluster.nodes_manager.slots_cache.values()
        )

    # -- commands -------------------------------------------------------------------------------

    def send_now(self, packed: bytes, *, key: str | None) -> Call | None:
        if not self._ready:
            return None
        node = self._node_for(key)
        if node is None:
            return None
        link = node.ready_link()
        if link is None:
            return None
        if self.sharded:
            packed = to_sharded(packed)
        return self._follow(link.send(packed), packed, key)

    async def send(self, packed: bytes, *, key: str | None, deadline: float | None = None) -> Call:
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self.config.command_timeout
        link = await self._link_for(key, deadline)
        if self.sharded:
            packed = to_sharded(packed)
        return self._follow(link.send(packed), packed, key)

    async def _link_for(self, key: str | None, deadline: float) -> Link:
        """An open link to the node serving ``key``, by ``deadline``. A node that cannot be
        reached has the slot map reloaded (it may have failed over) and is tried again."""
        if self._closed:
            raise NotSent("the client is closed")
        await self._start(deadline)
        loop = asyncio.get_running_loop()
        while True:
            node = self._node_for(key)
            if node is None:
                await self.refresh()
                node = self._node_for(key)
                if node is None:
                    raise NotSent("the Redis Cluster serves no slot for this key")
            link = node.link
            if link is not None and not link.closed:
                if link.paused is not None:
                    await link.drain(deadline)
                return link
            try:
                return await node.connector.connect(deadline)
            except NotSent:
                if self._closed or loop.time() >= deadline:
                    raise
                # Failed over? Reload the map (one reload at a time), and while it still
                # names this node, try again after a backoff within the caller's time.
                await asyncio.shield(self.refresh())
                if self._node_for(key) is node:
                    delay = min(self.config.reconnect_max_delay, deadline - loop.time())
                    if delay <= 0:
                        raise
                    await asyncio.sleep(min(delay, max(self.config.reconnect_delay, 0.1)))

    def _follow(self, first: Call, packed: bytes, key: str | None) -> Call:
        """A call that settles with the reply of ``first`` or, when that is a redirect, of
        the command sent again where the cluster says (see the module docstring), within
        ``command_timeout`` of the first send: a backoff never sleeps past half the time
        left, so a redirect that comes back after it is still followed in time."""
        loop = asyncio.get_running_loop()
        outer = Call(loop.create_future(), first.sent_at, packed)
        outer.epoch = self.epoch  # that of the send whose reply settles it (see resend)
        until = first.sent_at + self.config.command_timeout
        redirects = 0  # MOVED/ASK followed in a row (a loop of them is cut short)
        tries = 0  # sends after the first, of every kind
        seen: dict[str, None] = {}  # the codes answered, in order

        def arrived(future: asyncio.Future[Any]) -> None:
            nonlocal redirects, tries
            reply = future.result()
            if type(reply) is not ErrorReply or self._closed:
                outer.settle(reply)
                return
            code = reply.code
            if code not in _REDIRECTS and code not in _TRY_AGAIN:
                outer.settle(reply)
                return
            seen[code] = None
            redirects = redirects + 1 if code in _REDIRECTS else 0
            if redirects > MAX_REDIRECTS:
                outer.settle(given_up(reply, f"{MAX_REDIRECTS} redirects in a row"))
                return
            if loop.time() >= until:
                ran_out = f"command_timeout ({self.config.command_timeout:g} s) ran out"
                outer.settle(given_up(reply, ran_out))
                return
            tries += 1
            self._redirects += 1
            self._spawn(resend(reply, code))

        def given_up(reply: ErrorReply, why: str) -> ErrorReply:
            """``reply``, saying what happened (its first word, the code, stays)."""
            slot = f"slot {key_slot(key)}" if key is not None else "the command's slot"
            return ErrorReply(
                f"{reply} (the command did not run: the cluster answered "
                f"{', '.join(seen)} for {slot}, which was moving or had no master, over "
                f"{tries + 1} sends in {loop.time() - first.sent_at:.2f} s, until {why})"
            )

        async def resend(reply: ErrorReply, code: str) -> None:
            try:
                command = packed
                if code in _REDIRECTS:
                    _, slot, address = str(reply).split(" ", 2)
                    host, _, port = address.rpartition(":")
                    node = self._node_at(host, int(port))
                    if code == "MOVED":
                        error = MovedError(f"{slot} {address}")
                        with contextlib.suppress(Exception):
                            await self.cluster.nodes_manager.move_slot(error)
                        # Another master serves the slot: told before anything goes there.
                        self._check_map({int(slot): node.name})
                        self.refresh()
                    link = node.link
                    if link is None or link.closed:
                        link = await node.connector.connect(until)
                    elif link.paused is not None:
                        await link.drain(until)
                    if code == "ASK":
                        # One ASKING, then the command, on the same link; a script as
                        # EVAL (the importing node may not have it cached, and a NOSCRIPT
                        # retry would go without the ASKING).
                        link.send(_ASKING)
                        command = eval_fallback(packed) or packed
                else:
                    # Tried again after a backoff, the slot map reloaded first; neither
                    # takes more than half the time left, which leaves the other half for
                    # the reply and a redirect it may bring.
                    half = (until - loop.time()) / 2
                    refreshed = self.refresh()
                    if not refreshed.done():
                        await asyncio.wait([refreshed], timeout=max(0.0, half))
                    delay = self.config.reconnect_delay * 2 ** min(tries, 6)
                    delay = min(delay, self.config.reconnect_max_delay, half)
                    if delay > 0:
                        await asyncio.sleep(delay)
                    link = await self._link_for(key, until)
                call = link.send(command)
                outer.epoch = self.epoch
            except (NotSent, ValueError) as exc:
                # Not sent again: the last reply stands (the command did not run).
                logger.debug("aiolock: following %s failed: %r", code, exc)
                outer.settle(given_up(reply, f"it could not be sent again ({exc})"))
                return
            except BaseException:
                outer.settle(reply)  # closing: not sent again
                raise
            call.future.add_done_callback(arrived)

        first.future.add_done_callback(arrived)
        return outer

    async def fence(self, lost: OutcomeUnknown, deadline: float | None) -> bool:
        identity = lost.link
        if identity is None:
            return False
        if identity in self._fenced:
            return True
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self.config.command_timeout
        host, _, port = identity.server.rpartition(":")
        node = self._node_at(host, int(port))
        fenced = False
        if identity.client_id is not None:
            command: tuple[object, ...] = ("CLIENT", "KILL", "ID", identity.client_id)
            if identity.addr:
                command += ("ADDR", identity.addr)
            try:
                link = node.link
                if link is None or link.closed:
                    link = await node.connector.connect(deadline)
                run_id = link.identity.run_id
                if identity.run_id is not None and run_id not in (None, identity.run_id):
                    # The node restarted: the process the lost link went to is gone, and
                    # what it was still to run with it (an id there now is another's).
                    fenced = True
                else:
                    reply = await wait_call(link.send(pack(command)), deadline)
                    fenced = isinstance(reply, int)
            except (NotSent, TimeoutError):
                pass
        if not fenced:
            # Unreachable: fenced by failover once it serves no slot any more.
            await asyncio.shield(self.refresh())
            fenced = self._ready and not self._serves_slots(identity.server)
        if fenced:
            self._fences += 1
            self._fenced[identity] = None
            while len(self._fenced) > _FENCES_KEPT:
                del self._fenced[next(iter(self._fenced))]
        return fenced

    # -- pub/sub --------------------------------------------------------------------------------

    def subscribe(self, channel: bytes, listener: Listener, *, key: str) -> asyncio.Future[None]:
        if self._closed:
            raise NotSent("the client is closed")
        node = self._node_for(key) if self._ready else None
        if node is None:
            raise NotSent("the Redis Cluster's slot map is not loaded yet")
        routed = self._routed.get(channel)
        if routed is not None:
            routed.node.subscriber_for(channel).unsubscribe(channel)
        routed = self._routed[channel] = Routed(channel, key, listener, node)
        routed.reroute = self._reroute
        return node.subscriber_for(channel).subscribe(channel, routed)

    def unsubscribe(self, channel: bytes, *, key: str) -> None:
        routed = self._routed.pop(channel, None)
        if routed is not None:
            routed.node.subscriber_for(channel).unsubscribe(channel)

    def _reroute(self) -> None:
        if self._rerouting is None and not self._closed:
            self._rerouting = self._spawn(self._reroute_lost())

    async def _reroute_lost(self) -> None:
        """While some channel's pub/sub connection is lost: reload the slot map and move
        each such channel to the master now serving its slot."""
        delay = self.config.reconnect_delay
        try:
            while not self._closed and any(not r.listening for r in self._routed.values()):
                await self.refresh()
                for channel, routed in list(self._routed.items()):
                    if routed.listening:
                        continue
                    node = self._node_for(routed.key)
                    if node is None or node is routed.node:
                        continue
                    routed.node.subscriber_for(channel).unsubscribe(channel)
                    routed.node = node
                    confirmed = node.subscriber.subscribe(channel, routed)
                    confirmed.add_done_callback(moved(routed))
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.reconnect_max_delay)
        finally:
            self._rerouting = None

    # -- the rest -------------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def statistics(self) -> TransportStatistics:
        links = in_flight = channels = opened = pubsub_opened = reconnects = 0
        for node in self._nodes.values():
            link = node.link
            if link is not None and not link.closed:
                links += 1
                in_flight += link.in_flight
            channels += sum(subscriber.channels for subscriber in node.subscribers())
            opened += node.connector.opened
            pubsub_opened += sum(s.connections_opened for s in node.subscribers())
            reconnects += sum(s.reconnects for s in node.subscribers())
        return TransportStatistics(
            links=links,
            commands_in_flight=in_flight,
            subscriptions=channels,
            links_opened=opened,
            pubsub_connections_opened=pubsub_opened,
            fences=self._fences,
            pubsub_reconnects=reconnects,
            server_changes=self.epoch,
        )

    @property
    def redirects(self) -> int:
        """Replies followed to another node or tried again (MOVED, ASK, TRYAGAIN, ...)."""
        return self._redirects

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for node in list(self._nodes.values()):
            await node.aclose()
        self._routed.clear()


__all__ = ["ClusterTransport", "to_sharded"]
