"""A local Sentinel setup made of ``redis-server`` processes: :class:`LocalSentinel`."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import redis

from ._group import NotYet, ServerGroup, answering, pairs
from ._server import RedisServer


class LocalSentinel(ServerGroup):
    """A monitored master, its replica(s) and three Sentinels, all local processes, for tests.

    The data servers are plain :class:`RedisServer` processes (no persistence, diskless
    replication without delay); the replicas are attached with ``REPLICAOF`` before the
    Sentinels start, and each Sentinel is ``redis-server <dir>/redis.conf --sentinel`` with::

        sentinel monitor <master_name> 127.0.0.1 <port> <quorum>
        sentinel down-after-milliseconds <master_name> 2000
        sentinel failover-timeout <master_name> 3000

    (Why not 1000 ms: a Sentinel reconnects a lost link at most once a second, and a promoted
    replica drops every client link, the other Sentinels' too. With 1000 ms they could find
    the new master "down" before reconnecting to it and fail it over again: it flapped here.)

    :meth:`start` returns once every Sentinel knows the master, the replicas and the other
    Sentinels (they find each other through hello messages every 2 s, so about 2-3 s)::

        with LocalSentinel() as setup:
            sentinel = redis.asyncio.sentinel.Sentinel(setup.sentinel_addresses)
            client = sentinel.master_for(setup.master_name)
            await client.set("k", "v")
            old = setup.kill_master()                  # kill -9
            new = setup.wait_for_new_master()          # ~3-4 s; the replica was promoted
            setup.restart(old)                         # back, as a replica of the new master

    The master moves: :meth:`master` and :meth:`replicas` ask the Sentinels each time, while
    :attr:`servers` and :attr:`sentinels` are fixed. The methods are synchronous; the ones
    that wait poll and raise ``TimeoutError`` with every Sentinel's view if things do not
    settle. From async tests run them with ``await asyncio.to_thread(...)``.
    """

    def __init__(
        self,
        *,
        master_name: str = "aiolock-master",
        replicas: int = 1,
        sentinels: int = 3,
        quorum: int = 2,
        down_after: float = 2.0,
        failover_timeout: float = 3.0,
        extra_args: Sequence[str] = (),
        binary: str | None = None,
        startup_timeout: float = 30.0,
    ) -> None:
        """Prepare (not start) the servers and Sentinels.

        Args:
            master_name: the name the Sentinels monitor the master under.
            replicas: how many replicas the master has (>= 1 for a failover).
            sentinels: how many Sentinels (>= quorum).
            quorum: Sentinels that must agree the master is down.
            down_after: ``down-after-milliseconds``, in seconds; keep it above ~1.5 s (see
                above).
            failover_timeout: ``failover-timeout``, in seconds (a Sentinel retries a failed
                failover of the same master after twice this).
            extra_args: more ``redis-server`` arguments for the data servers.
            binary: the ``redis-server`` to run; default :func:`find_redis_server_binary`.
            startup_timeout: seconds :meth:`start` may take, and the default for the waits.
        """
        if not master_name or any(char.isspace() for char in master_name):
            raise ValueError(f"bad master name {master_name!r}")
        if replicas < 0 or not 1 <= quorum <= sentinels:
            raise ValueError("need replicas >= 0 and 1 <= quorum <= sentinels")
        if isinstance(extra_args, str):
            raise TypeError("extra_args must be a sequence of arguments, not a str")
        super().__init__(startup_timeout)
        self.master_name = master_name
        self._quorum = quorum
        self._down_after_ms = round(down_after * 1000)
        self._failover_timeout_ms = round(failover_timeout * 1000)
        data_args = [
            "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0", *extra_args
        ]  # fmt: skip
        self.servers = [RedisServer(data_args, binary=binary) for _ in range(1 + replicas)]
        """The data servers, in a fixed order; ``servers[0]`` is the first master."""
        self._binary = binary
        self._sentinel_count = sentinels
        self.sentinels: list[RedisServer] = []
        """The Sentinel processes (after :meth:`start`)."""
        self._previous_master: tuple[str, int] | None = None

    # -- addresses ----------------------------------------------------------------------------

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every Sentinel, for ``redis.asyncio.sentinel.Sentinel(...)``."""
        return [sentinel.address for sentinel in self.sentinels]

    def master_address(self) -> tuple[str, int]:
        """The master's address according to the first Sentinel that answers."""
        for sentinel in self._live(self.sentinels):
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                return self._master_address_from(sentinel)
        raise LookupError("no Sentinel answers")

    def master(self) -> RedisServer:
        """The data server that is the master now (according to the Sentinels)."""
        return self._server_at(self.master_address())

    def replicas(self) -> list[RedisServer]:
        """The running data servers other than the master."""
        master = self.master()
        return [server for server in self.servers if server.is_running and server is not master]

    def replica_addresses(self) -> list[tuple[str, int]]:
        """``(host, port)`` of :meth:`replicas`."""
        return [server.address for server in self.replicas()]

    # -- lifecycle ----------------------------------------------------------------------------

    def _create(self) -> None:
        for server in self.servers:
            server.start()
        master, *replicas = self.servers
        for replica in replicas:
            self._execute(replica, "REPLICAOF", master.host, master.port)
        # Before the Sentinels start: they learn the replicas from the master's INFO, which
        # they ask for once at first and then only every 10 s.
        self._wait(lambda: self._replicas_in_sync(master), None, "replicas in sync")
        name = self.master_name
        config = (
            f"sentinel monitor {name} {master.host} {master.port} {self._quorum}\n"
            f"sentinel down-after-milliseconds {name} {self._down_after_ms}\n"
            f"sentinel failover-timeout {name} {self._failover_timeout_ms}\n"
            f"sentinel parallel-syncs {name} 1\n"
        )
        self.sentinels = [
            RedisServer(["--sentinel"], binary=self._binary, config=config)
            for _ in range(self._sentinel_count)
        ]
        for sentinel in self.sentinels:
            sentinel.start()
        self.wait_until_healthy()

    def __repr__(self) -> str:
        running = sum(server.is_running for server in self.servers)
        sentinels = sum(sentinel.is_running for sentinel in self.sentinels)
        return (
            f"<LocalSentinel {self.master_name!r} {running}/{len(self.servers)} servers, "
            f"{sentinels}/{len(self.sentinels)} sentinels running>"
        )

    # -- faults -------------------------------------------------------------------------------

    def kill_master(self) -> RedisServer:
        """SIGKILL the current master; return it. The Sentinels fail it over after
        ``down_after`` (+ election); :meth:`wait_for_new_master` waits for that."""
        master = self.master()
        self._previous_master = master.address
        master.kill()
        return master

    def failover(
        self, *, demote_old_master: bool = True, timeout: float | None = None
    ) -> RedisServer:
        """``SENTINEL FAILOVER``: promote a replica now, without waiting for agreement that the
        master is down. Returns the new master (see :meth:`wait_for_new_master`)."""
        master = self.master()
        self._previous_master = master.address
        sentinel = self._live(self.sentinels)[0]
        self._execute(sentinel, "SENTINEL", "FAILOVER", self.master_name)
        return self.wait_for_new_master(demote_old_master=demote_old_master, timeout=timeout)

    def wait_for_new_master(
        self,
        previous: RedisServer | None = None,
        *,
        demote_old_master: bool = True,
        timeout: float | None = None,
    ) -> RedisServer:
        """Wait until every running Sentinel names a master other than ``previous`` (default:
        the one :meth:`kill_master` or :meth:`failover` acted on) and that server says it is a
        master; return it.

        The Sentinels turn an old master that is still running into a replica only at their
        next ``INFO`` of it, up to 10 s later; until then it also says it is a master (a
        split brain). With ``demote_old_master`` (the default) this sends it ``REPLICAOF`` at
        once and also waits until everything is healthy; pass False to keep that window.
        """
        old = previous.address if previous is not None else self._previous_master
        if old is None:
            raise ValueError("which master is being replaced? pass previous=")

        def promoted() -> RedisServer:
            addresses = {self._master_address_from(s) for s in self._live(self.sentinels)}
            if len(addresses) != 1 or old in addresses:
                raise NotYet(f"the Sentinels name {sorted(addresses)} (old: {old})")
            server = self._server_at(addresses.pop())
            if self._execute(server, "INFO", "replication").get("role") != "master":
                raise NotYet(f"{server!r} does not say it is a master yet")
            return server

        new = self._wait(promoted, timeout, "new master")
        if not demote_old_master:
            return new
        previous_server = self._server_at(old)
        if previous_server.is_running and not previous_server.is_paused:
            role = self._execute(previous_server, "INFO", "replication").get("role")
            if role == "master":
                self._execute(previous_server, "REPLICAOF", new.host, new.port)
        self.wait_until_healthy(timeout)
        return new

    def restart(self, server: RedisServer, *, timeout: float | None = None) -> None:
        """Restart a data server (gracefully stopping it first if it runs); unless it is the
        master, make it a replica of the master at once (the Sentinels would take ~8 s to),
        then wait until everything is healthy. It comes back empty (no persistence)."""
        master_address = self.master_address()
        server.restart()
        if server.address != master_address:
            self._execute(server, "REPLICAOF", *master_address)
        self.wait_until_healthy(timeout)

    def heal(self, *, timeout: float | None = None) -> None:
        """Resume paused processes, restart killed ones, wait until healthy: for a shared
        fixture, so that what a test broke does not break the next one.

        A failover under way (the Sentinels name a master that is down while a replica runs)
        is waited for first; then the dead data servers come back as replicas of the master.
        """
        self._resume_paused()
        for sentinel in self.sentinels:
            if not sentinel.is_running:
                sentinel.restart()  # its rewritten configuration is kept

        def settled() -> RedisServer:
            named = {self._master_address_from(s) for s in self._live(self.sentinels)}
            if len(named) != 1:
                raise NotYet(f"the Sentinels name different masters: {sorted(named)}")
            master = self._server_at(named.pop())
            if not master.is_running and any(s.is_running for s in self.servers):
                raise NotYet(f"the Sentinels name {master!r}, which is down: a failover is due")
            return master

        master = self._wait(settled, timeout, "a master")
        if not master.is_running:  # no data server was left: it comes back, empty
            master.restart()
        for server in self.servers:
            if not server.is_running:
                server.restart()
                self._execute(server, "REPLICAOF", master.host, master.port)
        self.wait_until_healthy(timeout)

    def wait_until_healthy(self, timeout: float | None = None) -> None:
        """Wait until every running Sentinel names the same master, sees it up, sees every
        running replica up, knows every other running Sentinel; the master says it is one,
        and every other running data server is its replica, in sync."""
        self._wait(self._check_healthy, timeout, "healthy Sentinels")

    # -- internals ----------------------------------------------------------------------------

    def _processes(self) -> list[RedisServer]:
        return [*self.sentinels, *self.servers]

    @staticmethod
    def _live(processes: list[RedisServer]) -> list[RedisServer]:
        return [process for process in processes if answering(process)]

    def _master_address_from(self, sentinel: RedisServer) -> tuple[str, int]:
        reply = self._execute(sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)
        if not reply:
            raise LookupError(f"{sentinel!r} does not know {self.master_name!r}")
        host, port = reply
        return str(host), int(port)

    def _server_at(self, address: tuple[str, int]) -> RedisServer:
        for server in self.servers:
            if server.address == address:
                return server
        raise LookupError(f"no data server at {address}")

    def _replicas_in_sync(self, master: RedisServer) -> None:
        for server in self._live(self.servers):
            self._check_replication(server, master)

    def _check_healthy(self) -> None:
        sentinels = self._live(self.sentinels)
        if not sentinels:
            raise NotYet("no Sentinel is running")
        addresses = {self._master_address_from(sentinel) for sentinel in sentinels}
        if len(addresses) != 1:
            raise NotYet(f"the Sentinels name different masters: {sorted(addresses)}")
        master_address = addresses.pop()
        master = self._server_at(master_address)
        if not master.is_running:
            raise NotYet(f"the Sentinels name {master!r}, which is down")
        self._replicas_in_sync(master)
        replica_ports = {s.port for s in self._live(self.servers) if s is not master}
        for sentinel in sentinels:
            state = pairs(self._execute(sentinel, "SENTINEL", "MASTER", self.master_name))
            if state.get("flags") != "master":
                raise NotYet(f"{sentinel!r} sees the master as {state.get('flags')}")
            if int(state.get("num-other-sentinels", 0)) < len(sentinels) - 1:
                raise NotYet(f"{sentinel!r} does not know the other Sentinels yet")
            seen = self._execute(sentinel, "SENTINEL", "REPLICAS", self.master_name)
            up = {
                int(entry["port"])
                for entry in map(pairs, seen)
                if entry.get("flags") == "slave"  # its link state is refreshed only every 10 s
            }
            if not replica_ports <= up:
                raise NotYet(f"{sentinel!r} does not see every replica up yet")

    def _describe(self, process: RedisServer) -> str:
        if process in self.sentinels:
            return repr(pairs(self._execute(process, "SENTINEL", "MASTER", self.master_name)))
        info = self._execute(process, "INFO", "replication")
        return f"role {info.get('role')}, master port {info.get('master_port', '-')}"
