"""A local Redis Cluster made of ``redis-server`` processes: :class:`LocalCluster`."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, Final, Literal

import redis
import redis.asyncio.cluster
from redis.crc import key_slot

from ._group import ControlClient, NotYet, ServerGroup, answering
from ._server import RedisServer

SLOTS: Final = 16384
_MIGRATE_BATCH: Final = 100
_MIGRATE_TIMEOUT_MS: Final = 5000

Role = Literal["master", "replica"]


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One line of ``CLUSTER NODES``: a node as some node sees it."""

    node_id: str
    flags: frozenset[str]
    master_id: str | None
    slots: tuple[tuple[int, int], ...]  # inclusive ranges; migrating/importing marks skipped

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failing(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "handshake", "noaddr"})


def _parse_nodes(text: str) -> dict[str, _Entry]:
    entries: dict[str, _Entry] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        node_id, _address, flags, master = fields[:4]
        slots: list[tuple[int, int]] = []
        for field in fields[8:]:
            if field.startswith("["):
                continue
            low, _, high = field.partition("-")
            slots.append((int(low), int(high or low)))
        entries[node_id] = _Entry(
            node_id=node_id,
            flags=frozenset(flags.replace("myself,", "").split(",")),
            master_id=None if master == "-" else master,
            slots=tuple(slots),
        )
    return entries


def _owns(ranges: Iterable[tuple[int, int]], slot: int) -> bool:
    return any(low <= slot <= high for low, high in ranges)


def _owner(view: dict[str, _Entry], slot: int) -> str | None:
    for entry in view.values():
        if entry.is_master and _owns(entry.slots, slot):
            return entry.node_id
    return None


class LocalClusterNode:
    """One ``redis-server`` of a :class:`LocalCluster`. Its role can change (failover), its
    identity (:attr:`node_id`, port, directory) does not, across kills and restarts too."""

    def __init__(
        self, server: RedisServer, index: int, control: ControlClient | None = None
    ) -> None:
        self.server = server
        """The process: :meth:`RedisServer.kill`, ``.pause()`` etc. work on it directly too."""
        self.index = index
        """Position in :attr:`LocalCluster.nodes` (the first ``masters`` started as masters)."""
        self.node_id = ""
        """The cluster node id (``CLUSTER MYID``), known once the cluster has started."""
        self._control = control if control is not None else ControlClient(server)
        self._slots: tuple[tuple[int, int], ...] = ()  # last slots seen owned, for failovers

    @property
    def host(self) -> str:
        return self.server.host

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def address(self) -> tuple[str, int]:
        return self.server.address

    @property
    def url(self) -> str:
        """``redis://HOST:PORT/0`` of this node alone (a plain client sees MOVED/ASK errors)."""
        return self.server.url

    @property
    def bus_port(self) -> int | None:
        return self.server.bus_port

    @property
    def pid(self) -> int | None:
        return self.server.pid

    @property
    def is_running(self) -> bool:
        return self.server.is_running

    @property
    def is_paused(self) -> bool:
        return self.server.is_paused

    def role(self) -> Role:
        """What the node itself says now (``INFO replication``); it must be running."""
        role = self.execute("INFO", "replication")["role"]
        return "master" if role == "master" else "replica"

    def execute(self, *args: Any) -> Any:
        """Run one command on this node over a plain control connection (strings decoded;
        raw replies except the few redis-py parses, e.g. ``INFO`` gives a dict)."""
        return self._control.execute(*args)

    def __repr__(self) -> str:
        state = "paused" if self.is_paused else "running" if self.is_running else "stopped"
        node_id = self.node_id[:8] or "?"
        return f"<LocalClusterNode #{self.index} {self.host}:{self.port} id={node_id} {state}>"


class LocalCluster(ServerGroup):
    """A Redis Cluster of local ``redis-server`` processes, for tests; no Docker.

    ``masters`` masters with ``replicas_per_master`` replicas each (3 + 3 by default), every
    node on free ``127.0.0.1`` ports with its own temp directory and no persistence
    (``--cluster-node-timeout 2000``, diskless replication without delay). The slots are split
    evenly between the masters with ``CLUSTER ADDSLOTS``, the nodes introduced with ``CLUSTER MEET``
    and the replicas attached with ``CLUSTER REPLICATE`` (what ``redis-cli --cluster create``
    does, without needing redis-cli); :meth:`start` returns once every node reports
    ``cluster_state:ok``, agrees on the slot map, and every replica is in sync (about 2 s: a
    new master waits that long before it calls the cluster ok).

    ::

        with LocalCluster() as cluster:
            client = redis.asyncio.RedisCluster(startup_nodes=cluster.startup_nodes())
            await client.set("k", "v")
            master = cluster.master_for_key("k")
            cluster.kill(master)                                  # kill -9
            promoted = cluster.wait_for_failover_of(master)       # ~3-4 s
            cluster.restart(master)                               # rejoins as a replica

    Roles change: :meth:`masters` and :meth:`replicas` ask the cluster each time, while
    :attr:`nodes` is fixed. The methods are synchronous; the ones that wait (:meth:`failover`,
    :meth:`wait_for_failover_of`, :meth:`restart`, :meth:`heal`, :meth:`migrate_slot`) poll
    until the cluster agrees, and raise ``TimeoutError`` with every node's view if it does not.
    From async tests run them with ``await asyncio.to_thread(...)``. A paused node is left out
    of every check (it cannot answer); with it, its master may be failed over.
    """

    def __init__(
        self,
        masters: int = 3,
        replicas_per_master: int = 1,
        *,
        extra_args: Sequence[str] = (),
        binary: str | None = None,
        node_timeout: float = 2.0,
        startup_timeout: float = 30.0,
    ) -> None:
        """Prepare (not start) a cluster.

        Args:
            masters: how many masters share the 16384 slots (>= 1).
            replicas_per_master: replicas of each master (>= 0).
            extra_args: more ``redis-server`` arguments for every node.
            binary: the ``redis-server`` to run; default :func:`find_redis_server_binary`.
            node_timeout: ``cluster-node-timeout`` in seconds: how long a node must be
                unreachable before it is failed (and its replica promoted).
            startup_timeout: seconds :meth:`start` may take, and the default for the waits.
        """
        if masters < 1 or replicas_per_master < 0:
            raise ValueError("need masters >= 1 and replicas_per_master >= 0")
        if isinstance(extra_args, str):
            raise TypeError("extra_args must be a sequence of arguments, not a str")
        super().__init__(startup_timeout)
        self._masters_count = masters
        args = [
            "--cluster-node-timeout", str(round(node_timeout * 1000)),
            "--repl-diskless-sync", "yes",
            "--repl-diskless-sync-delay", "0",
            *extra_args,
        ]  # fmt: skip
        count = masters * (1 + replicas_per_master)
        servers = [RedisServer(args, binary=binary, cluster=True) for _ in range(count)]
        self._nodes = [
            LocalClusterNode(server, index, self._control(server))
            for index, server in enumerate(servers)
        ]
        self._migrations: dict[int, tuple[LocalClusterNode, LocalClusterNode]] = {}

    # -- addresses ----------------------------------------------------------------------------

    @property
    def nodes(self) -> list[LocalClusterNode]:
        """Every node, in a fixed order (whatever their role now)."""
        return list(self._nodes)

    @property
    def url(self) -> str:
        """``redis://HOST:PORT/0`` of the first running node, for ``RedisCluster.from_url``."""
        return self._live()[0].url

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every node."""
        return [node.address for node in self._nodes]

    def startup_nodes(self) -> list[redis.asyncio.cluster.ClusterNode]:
        """New ``redis.asyncio.cluster.ClusterNode`` objects for every running node, for
        ``redis.asyncio.RedisCluster(startup_nodes=...)``. (The sync client wants
        ``redis.cluster.ClusterNode``: build those from :attr:`addresses`.)"""
        return [
            redis.asyncio.cluster.ClusterNode(node.host, node.port)
            for node in self._nodes
            if node.is_running
        ]

    def node_at(self, port: int) -> LocalClusterNode:
        """The node listening on ``port`` (e.g. from a client's view of the cluster)."""
        for node in self._nodes:
            if node.port == port:
                return node
        raise KeyError(f"no node of this cluster listens on port {port}")

    # -- topology -----------------------------------------------------------------------------

    @staticmethod
    def key_slot(key: str | bytes) -> int:
        """The hash slot of a key (``{hash tags}`` respected)."""
        return key_slot(key.encode() if isinstance(key, str) else key)

    def masters(self) -> list[LocalClusterNode]:
        """The running nodes that are masters now (as the first answering node sees it)."""
        view = self._any_view()
        return [node for node in self._live() if view[node.node_id].is_master]

    def replicas(self, of: LocalClusterNode | None = None) -> list[LocalClusterNode]:
        """The running nodes that are replicas now; only those of master ``of`` if given."""
        view = self._any_view()
        return [
            node
            for node in self._live()
            if not view[node.node_id].is_master
            and (of is None or view[node.node_id].master_id == of.node_id)
        ]

    def master_for_slot(self, slot: int) -> LocalClusterNode:
        """The master serving ``slot`` now (the source, while a migration is under way)."""
        if not 0 <= slot < SLOTS:
            raise ValueError(f"slot must be in 0..{SLOTS - 1}, got {slot!r}")
        owner = _owner(self._any_view(), slot)
        if owner is None:
            raise LookupError(f"no master serves slot {slot}")
        return self._by_id(owner)

    def master_for_key(self, key: str | bytes) -> LocalClusterNode:
        """The master serving ``key``'s slot now."""
        return self.master_for_slot(self.key_slot(key))

    # -- lifecycle ----------------------------------------------------------------------------

    def _create(self) -> None:
        for node in self._nodes:
            node.server.start()
        for node in self._nodes:
            node.node_id = node.execute("CLUSTER", "MYID")
        masters = self._nodes[: self._masters_count]
        for index, master in enumerate(masters):
            low = SLOTS * index // len(masters)
            high = SLOTS * (index + 1) // len(masters)
            master.execute("CLUSTER", "ADDSLOTS", *range(low, high))
            master.execute("CLUSTER", "SET-CONFIG-EPOCH", index + 1)  # before MEET: no clashes
        version = self._nodes[0].server.version
        for index, node in enumerate(self._nodes):
            for other in self._nodes[index + 1 :]:
                bus = [other.bus_port] if version is not None and version >= (7, 0, 0) else []
                node.execute("CLUSTER", "MEET", other.host, other.port, *bus)
        self._wait(self._everyone_met, self.timeout, "every node knows every other")
        for index, replica in enumerate(self._nodes[self._masters_count :]):
            replica.execute("CLUSTER", "REPLICATE", masters[index % len(masters)].node_id)
        self.wait_until_healthy()

    def stop(self) -> None:
        super().stop()
        self._migrations.clear()

    def __repr__(self) -> str:
        running = sum(node.is_running for node in self._nodes)
        return f"<LocalCluster {running}/{len(self._nodes)} nodes running>"

    # -- faults -------------------------------------------------------------------------------

    def kill(self, node: LocalClusterNode) -> None:
        """SIGKILL ``node`` (its directory is kept, so :meth:`restart` rejoins it).

        The slots it served are remembered first, for :meth:`wait_for_failover_of`.
        """
        with contextlib.suppress(redis.RedisError, OSError, LookupError):
            self._remember_slots(self._any_view())
        node.server.kill()

    def pause(self, node: LocalClusterNode) -> None:
        """SIGSTOP ``node``. After ``node_timeout`` the others fail it (and promote a replica
        of it if it was a master); resumed, such a master comes back as a replica."""
        with contextlib.suppress(redis.RedisError, OSError, LookupError):
            self._remember_slots(self._any_view())
        node.server.pause()

    def resume(self, node: LocalClusterNode) -> None:
        """SIGCONT a paused ``node``."""
        node.server.resume()

    def restart(self, node: LocalClusterNode, *, timeout: float | None = None) -> None:
        """Start ``node`` again (gracefully stopping it first if it runs) and wait until the
        cluster is healthy with it. It keeps its id and rejoins: a master whose slots went to
        a replica meanwhile comes back as that replica's replica. No persistence: a master
        restarted before any failover comes back empty, and its replicas resync from it."""
        node.server.restart()
        self.wait_until_healthy(timeout)

    def heal(self, *, timeout: float | None = None) -> None:
        """Resume paused nodes, restart killed ones, wait until the cluster is healthy.

        For a shared cluster fixture: what a test broke does not break the next one. Slot
        migrations left halfway are finished. Roles may differ from the start.
        """
        self._resume_paused()
        for node in self._nodes:
            if not node.is_running:
                node.server.restart()
        for slot in list(self._migrations):
            self.finish_slot_migration(slot)
        self.wait_until_healthy(timeout)

    def failover(
        self, replica: LocalClusterNode, *, force: bool = False, timeout: float | None = None
    ) -> None:
        """``CLUSTER FAILOVER`` on ``replica``; wait until it is a master in every node's view
        and the cluster is healthy again.

        Without ``force`` this is the coordinated manual failover (the master must be up; no
        write is lost); ``force=True`` (``FAILOVER FORCE``) does not ask the master.
        """
        replica.execute("CLUSTER", "FAILOVER", *(["FORCE"] if force else []))

        def promoted() -> None:
            for view in self._views():
                if not view[replica.node_id].is_master or not view[replica.node_id].slots:
                    raise NotYet(f"{replica!r} is not a master with slots in every view yet")
            self._check_healthy()

        self._wait(promoted, timeout, f"failover to {replica!r}")

    def wait_for_failover_of(
        self, master: LocalClusterNode, *, timeout: float | None = None
    ) -> LocalClusterNode:
        """After ``master`` was killed (or paused): wait until another node serves every slot
        it served, in every running node's view, and the cluster is ok; return that node.

        Raises:
            LookupError: the slots ``master`` served are not known (it served none).
            TimeoutError: no failover within ``timeout`` (a master without replicas never
                fails over).
        """
        slots = master._slots
        if not slots:
            with contextlib.suppress(redis.RedisError, OSError, LookupError):
                self._remember_slots(self._any_view())
            slots = master._slots
        if not slots:
            raise LookupError(f"{master!r} is not known to have served any slot")
        ends = [slot for low, high in slots for slot in (low, high)]

        def taken_over() -> LocalClusterNode:
            owners = {_owner(view, slot) for view in self._views() for slot in ends}
            if len(owners) != 1 or None in owners or master.node_id in owners:
                names = sorted(owner or "nobody" for owner in owners)
                raise NotYet(f"its slots are served by {names}, not by one other node")
            self._check_healthy()
            return self._by_id(next(iter(owners)) or "")

        return self._wait(taken_over, timeout, f"failover of {master!r}")

    def wait_until_healthy(self, timeout: float | None = None) -> None:
        """Wait until every running, unpaused node says ``cluster_state:ok``, they all agree
        on which running master serves each of the 16384 slots, and every replica is in sync
        with its master.

        Raises:
            TimeoutError: not within ``timeout`` (default ``startup_timeout``).
        """
        self._wait(self._check_healthy, timeout, "a healthy cluster")

    # -- data ---------------------------------------------------------------------------------

    def flushall(self) -> None:
        """FLUSHALL on every master (the replicas follow)."""
        for node in self.masters():
            node.execute("FLUSHALL")

    def migrate_slot(
        self, slot: int, to: LocalClusterNode, *, timeout: float | None = None
    ) -> None:
        """Move ``slot`` and its keys to master ``to``: the whole resharding procedure
        (:meth:`begin_slot_migration`, then :meth:`finish_slot_migration`)."""
        self.begin_slot_migration(slot, to)
        self.finish_slot_migration(slot, timeout=timeout)

    def begin_slot_migration(
        self, slot: int, to: LocalClusterNode, *, keys: Iterable[str | bytes] = ()
    ) -> LocalClusterNode:
        """Start moving ``slot`` to master ``to`` and stop halfway; return the source master.

        ``CLUSTER SETSLOT <slot> IMPORTING`` on ``to`` and ``MIGRATING`` on the source, then
        ``MIGRATE`` only the given ``keys`` (which must be in the slot). The slot stays
        served by the source: a key that moved is answered with ``-ASK`` (to retry on ``to``
        after ``ASKING``), a new key is too, a key that did not move is served by the source.
        :meth:`finish_slot_migration` completes it.
        """
        source = self.master_for_slot(slot)
        if source is to:
            raise ValueError(f"slot {slot} is already served by {to!r}")
        if slot in self._migrations:
            raise RuntimeError(f"slot {slot} is already being migrated")
        moving = list(keys)
        for key in moving:
            if self.key_slot(key) != slot:
                raise ValueError(f"key {key!r} is not in slot {slot}")
        to.execute("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
        source.execute("CLUSTER", "SETSLOT", slot, "MIGRATING", to.node_id)
        self._migrations[slot] = (source, to)
        if moving:
            self._move_keys(source, to, moving)
        return source

    def finish_slot_migration(self, slot: int, *, timeout: float | None = None) -> None:
        """Move the rest of the keys of a slot being migrated, assign the slot to its new
        master (``SETSLOT NODE`` on the target, the source, then the other masters) and wait
        until every node agrees."""
        source, target = self._migrations.pop(slot)
        while keys := source.execute("CLUSTER", "GETKEYSINSLOT", slot, _MIGRATE_BATCH):
            self._move_keys(source, target, keys)
        target.execute("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
        source.execute("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
        for node in self._live():  # the others would learn it by gossip; this is quicker
            if node not in (source, target):
                with contextlib.suppress(redis.ResponseError):  # replicas refuse SETSLOT
                    node.execute("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)

        def moved() -> None:
            for view in self._views():
                if not _owns(view[target.node_id].slots, slot):
                    raise NotYet(f"not every node sees slot {slot} on {target!r} yet")
            self._check_healthy()

        self._wait(moved, timeout, f"slot {slot} on {target!r}")

    @staticmethod
    def _move_keys(
        source: LocalClusterNode, target: LocalClusterNode, keys: Sequence[str | bytes]
    ) -> None:
        source.execute(
            "MIGRATE", target.host, target.port, "", 0, _MIGRATE_TIMEOUT_MS, "REPLACE",
            "KEYS", *keys,
        )  # fmt: skip

    # -- internals ----------------------------------------------------------------------------

    def _processes(self) -> list[RedisServer]:
        return [node.server for node in self._nodes]

    def _live(self) -> list[LocalClusterNode]:
        """Running, unpaused nodes: the ones that can answer."""
        return [node for node in self._nodes if answering(node.server)]

    def _by_id(self, node_id: str) -> LocalClusterNode:
        for node in self._nodes:
            if node.node_id == node_id:
                return node
        raise LookupError(f"node {node_id} is not part of this cluster")

    def _view(self, node: LocalClusterNode) -> dict[str, _Entry]:
        return _parse_nodes(node.execute("CLUSTER", "NODES"))

    def _views(self) -> list[dict[str, _Entry]]:
        live = self._live()
        if not live:
            raise NotYet("no node is running")
        return [self._view(node) for node in live]

    def _any_view(self) -> dict[str, _Entry]:
        """``CLUSTER NODES`` from the first node that answers."""
        for node in self._live():
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                return self._view(node)
        raise LookupError("no node of the cluster answers")

    def _remember_slots(self, view: dict[str, _Entry]) -> None:
        for node in self._nodes:
            entry = view.get(node.node_id)
            if entry is not None and entry.is_master and entry.slots and not entry.failing:
                node._slots = entry.slots

    def _everyone_met(self) -> None:
        ids = {node.node_id for node in self._nodes}
        for node in self._nodes:
            view = self._view(node)
            known = {entry.node_id for entry in view.values() if not entry.failing}
            if known != ids:
                raise NotYet(f"{node!r} knows {len(known)} of {len(ids)} nodes")

    def _check_healthy(self) -> None:
        live = self._live()
        live_ids = {node.node_id for node in live}
        layouts = set()
        views = []
        for node in live:
            info = node.execute("CLUSTER", "INFO")
            if "cluster_state:ok" not in info:
                raise NotYet(f"{node!r} says cluster_state is not ok")
            view = self._view(node)
            views.append(view)
            slot_map = tuple(
                sorted(
                    (low, high, entry.node_id)
                    for entry in view.values()
                    if entry.is_master
                    for low, high in entry.slots
                )
            )
            covered = sum(high - low + 1 for low, high, _ in slot_map)
            if covered != SLOTS:
                raise NotYet(f"{node!r} sees {covered} of {SLOTS} slots served")
            if not {owner for _, _, owner in slot_map} <= live_ids:
                raise NotYet(f"{node!r} sees slots served by a node that is down")
            roles = tuple(
                sorted(
                    (i, view[i].is_master, view[i].master_id or "") for i in live_ids if i in view
                )
            )
            layouts.add((slot_map, roles))
        if len(layouts) > 1:
            raise NotYet("the nodes do not agree on the slots and roles yet")
        for view in views:
            for node_id in live_ids:
                if node_id not in view or view[node_id].failing:
                    raise NotYet(f"some node sees {self._by_id(node_id)!r} as failing")
        for node in live:
            entry = views[0][node.node_id]
            master = node if entry.is_master else self._by_id(entry.master_id or "")
            self._check_replication(node.server, master.server)
        self._remember_slots(views[0])

    def _describe(self, process: RedisServer) -> str:
        return str(self._execute(process, "CLUSTER", "NODES")).strip()
