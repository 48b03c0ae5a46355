"""The one process helper of :mod:`aiolock.testing`: :class:`ServerProcess`, a ``redis-server``
child (a data server, a cluster node or a Sentinel) on free ports with its own directory, and
the plumbing of every process the package starts (they die with the test process and are
reaped), with the socket helpers (a free port, a PING over a plain socket).

:class:`~aiolock.testing.RedisServer`, :class:`~aiolock.testing.LocalCluster` and
:class:`~aiolock.testing.LocalSentinel` start, signal and stop their processes only through it.
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Final

from ._discovery import LOCALHOST, STOP_TIMEOUT, redis_server_version

_CONFIG_FILE: Final = "redis.conf"
_LOG_FILE: Final = "redis.log"
_PORT_ATTEMPTS: Final = 3  # a first start that loses its port to another process: new ports
_CLUSTER_PORT_OFFSET: Final = 10000  # the cluster bus port before Redis 7's --cluster-port


# --------------------------------------------------------------------------------------------
# Sockets
# --------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCALHOST, 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    """True if ``127.0.0.1:port`` can be bound right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOCALHOST, port))
        except OSError:
            return False
        return True


def ping(host: str, port: int, timeout: float) -> bool:
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


def answers_within(
    host: str, port: int, timeout: float, running: Callable[[], bool] = lambda: True
) -> bool:
    """PING until the server answers (True), or ``timeout`` seconds pass or ``running()``
    turns False (False)."""
    deadline = time.monotonic() + timeout
    while running():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if ping(host, port, min(0.5, remaining)):
            return True
        time.sleep(0.01)
    return False


# --------------------------------------------------------------------------------------------
# Spawning and reaping
# --------------------------------------------------------------------------------------------


live_processes: set[subprocess.Popen[bytes]] = set()
"""Every child process started by this package and not yet reaped."""


def _die_with_parent_prefix() -> list[str]:
    """``setpriv --pdeathsig KILL`` (Linux, util-linux), or nothing where that is missing."""
    if not sys.platform.startswith("linux"):
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv is not None else []


_spawn_requests: queue.SimpleQueue[
    tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]
] = queue.SimpleQueue()
_spawner_lock = threading.Lock()
_spawner: threading.Thread | None = None


def _spawn_forever() -> None:
    while True:
        start, result = _spawn_requests.get()
        try:
            result.set_result(start())
        except BaseException as exc:
            result.set_exception(exc)


def start_process(argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv)``, so that the child dies with this process and is reaped.

    atexit does not run when the test runner is killed (SIGKILL, or SIGTERM from a CI timeout);
    the kernel's parent-death signal (``setpriv --pdeathsig KILL``) still kills the child then.
    That signal fires when the *thread* that forked the child exits, so from any thread but the
    main one the fork is done by one long-lived daemon thread, never by a passing worker thread
    (``asyncio.to_thread``), whose end would kill the child early. The child is also recorded
    for the atexit hook below.
    """
    prefix = _die_with_parent_prefix()

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(prefix + argv, **popen_kwargs)

    if not prefix or threading.current_thread() is threading.main_thread():
        proc = start()
    else:
        global _spawner
        with _spawner_lock:
            if _spawner is None:
                _spawner = threading.Thread(
                    target=_spawn_forever, name="aiolock.testing spawner", daemon=True
                )
                _spawner.start()
        result: Future[subprocess.Popen[bytes]] = Future()
        _spawn_requests.put((start, result))
        proc = result.result()
    live_processes.add(proc)
    return proc


def reap(proc: subprocess.Popen[bytes], sig: signal.Signals | None) -> None:
    """Send ``sig`` (if the process still runs and a signal is given), wait for it to exit
    (SIGKILL after :data:`STOP_TIMEOUT` seconds), and forget it."""
    if proc.poll() is None and sig is not None:
        with contextlib.suppress(ProcessLookupError):
            if sig is not signal.SIGKILL:
                proc.send_signal(signal.SIGCONT)  # a stopped process never handles SIGTERM
            proc.send_signal(sig)
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    live_processes.discard(proc)


@atexit.register
def _kill_leftovers() -> None:
    """Last resort at interpreter exit: SIGKILL and reap every process still running."""
    for proc in list(live_processes):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            reap(proc, signal.SIGKILL)


# --------------------------------------------------------------------------------------------
# One server process
# --------------------------------------------------------------------------------------------


class ServerProcess:
    """One ``redis-server`` child process on ``127.0.0.1``, without persistence, in its own
    temporary directory (``--dir``; its log is ``redis.log`` there).

    Its ports are free ones unless given, chosen again only when its very first start loses
    them to another process (``Address already in use``); from then on they are kept, so a
    restart comes back where clients look for it. The directory lives until :meth:`stop`
    (a :meth:`restart` keeps it, and what the server wrote there: a cluster node's
    ``nodes.conf``, a Sentinel's rewritten configuration).
    """

    def __init__(
        self,
        binary: str,
        args: Sequence[str] = (),
        *,
        port: int | None = None,
        config: str | None = None,
        cluster: bool = False,
    ) -> None:
        self.binary = binary
        self.host = LOCALHOST
        self.version = redis_server_version(binary)
        self._args = list(args)
        self._config = config
        self._cluster = cluster
        self._ports_kept = port is not None
        self.port = port if port is not None else free_port()
        self.bus_port: int | None = None
        self._choose_bus_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self.data_dir: Path | None = None
        self.paused = False

    # -- state --------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status of a process that ended by itself (not killed or stopped here)."""
        return self._proc.poll() if self._proc is not None else None

    def log(self) -> str:
        """Everything the process wrote (stdout and stderr), across restarts."""
        path = self.data_dir / _LOG_FILE if self.data_dir is not None else None
        if path is None or not path.exists():
            return ""
        return path.read_text(errors="replace")

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float) -> None:
        """Launch the process and wait until it answers PING; no-op while it runs.

        Raises:
            RuntimeError: it exited, or did not answer within ``timeout`` seconds; the message
                has its command line and its log. Nothing is left running.
        """
        if self.is_running:
            return
        self.kill()  # reaps one that ended by itself
        attempts = 1 if self._ports_kept else _PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            self._launch()
            if answers_within(self.host, self.port, timeout, lambda: self.is_running):
                self._ports_kept = True
                return
            exited = not self.is_running
            log, argv = self.log(), self._argv()
            self.kill()
            if exited and "already in use" in log and attempt < attempts:
                self._choose_ports()
                (self._directory() / _LOG_FILE).unlink(missing_ok=True)
                continue
            self.stop()
            why = "exited" if exited else f"did not answer PING within {timeout:g} s"
            raise RuntimeError(
                f"redis-server {self.binary} on {self.host}:{self.port} {why}; "
                f"argv={argv!r}\n--- server log ---\n{log}"
            )

    def restart(self, timeout: float) -> None:
        """Stop it gracefully if it runs, then :meth:`start` it again on the same ports, in
        the same directory (unless :meth:`stop` removed it)."""
        self.stop(keep_dir=True)
        self.start(timeout)

    def stop(self, *, keep_dir: bool = False) -> None:
        """SIGTERM (after a SIGCONT, should it be paused), SIGKILL after
        :data:`STOP_TIMEOUT` s; reap it; remove its directory unless ``keep_dir``.
        Idempotent."""
        self._end(signal.SIGTERM)
        if self.data_dir is not None and not keep_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def kill(self) -> None:
        """SIGKILL and reap it (no-op if it is not running); its directory stays."""
        self._end(signal.SIGKILL)

    def pause(self) -> None:
        if not self.is_running:
            raise RuntimeError("redis-server is not running")
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.paused = False

    # -- internals ----------------------------------------------------------------------------

    def _directory(self) -> Path:
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="aiolock-redis-"))
        return self.data_dir

    def _launch(self) -> None:
        directory = self._directory()
        config_path = directory / _CONFIG_FILE
        if self._config is not None and not config_path.exists():
            config_path.write_text(self._config)  # once: a restart keeps what it rewrote
        with (directory / _LOG_FILE).open("ab") as log:
            self._proc = start_process(
                self._argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=directory,
                start_new_session=True,  # terminal signals (Ctrl-C, Ctrl-Z) are not for it
            )
        self.paused = False

    def _argv(self) -> list[str]:
        directory = self._directory()
        argv = [self.binary]
        if self._config is not None:
            argv.append(str(directory / _CONFIG_FILE))  # a config file must come first
        argv += [
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(directory),
            "--daemonize", "no",
        ]  # fmt: skip
        if self._redis_7:
            argv += ["--enable-debug-command", "local"]
        if self._cluster:
            argv += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            if self._redis_7:
                argv += ["--cluster-port", str(self.bus_port)]
        return argv + self._args

    @property
    def _redis_7(self) -> bool:
        """Redis >= 7: ``--enable-debug-command`` and ``--cluster-port`` exist."""
        return self.version is not None and self.version >= (7, 0, 0)

    def _choose_ports(self) -> None:
        self.port = free_port()
        self._choose_bus_port()

    def _choose_bus_port(self) -> None:
        """The cluster bus port: any free one on Redis >= 7 (``--cluster-port``); before that
        it is always ``port + 10000``, so a free pair is needed (port <= 55535)."""
        if not self._cluster:
            return
        if self._redis_7:
            self.bus_port = free_port()
            return
        if not self._ports_kept:
            for _ in range(100):
                bus = self.port + _CLUSTER_PORT_OFFSET
                if bus <= 65535 and port_is_free(bus):
                    break
                self.port = free_port()
        self.bus_port = self.port + _CLUSTER_PORT_OFFSET

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    def _end(self, sig: signal.Signals) -> None:
        if self._proc is not None:
            reap(self._proc, sig)
            self._proc = None
        self.paused = False
