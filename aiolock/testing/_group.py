"""What :class:`~aiolock.testing.LocalCluster` and :class:`~aiolock.testing.LocalSentinel`
share: :class:`ServerGroup`, a set of :class:`~aiolock.testing.RedisServer` processes started,
waited for and stopped together; a control connection per process; polling until a condition
holds, with every process's view (and the log of one that died) when it does not."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

if TYPE_CHECKING:
    from ._server import RedisServer

_COMMAND_TIMEOUT: Final = 5.0
_POLL: Final = 0.05
_LOG_TAIL: Final = 20  # lines of a dead process's log in a timeout's message
_T = TypeVar("_T")


class NotYet(Exception):
    """A condition being waited for does not hold yet; the message says what is missing."""


class ControlClient:
    """A plain synchronous client for one server, strings decoded, no retries. It connects on
    first use, and again after a connection error or once the server is another process (it
    was killed or restarted meanwhile)."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self._client: redis.Redis | None = None
        self._pid: int | None = None

    def execute(self, *args: Any) -> Any:
        """Run one command; raw replies, except those redis-py parses (``INFO`` -> dict)."""
        if self._client is not None and self._pid != self.server.pid:
            self.close()
        if self._client is None:
            self._client = redis.Redis(
                host=self.server.host,
                port=self.server.port,
                decode_responses=True,
                socket_timeout=_COMMAND_TIMEOUT,
                socket_connect_timeout=_COMMAND_TIMEOUT,
                retry=Retry(NoBackoff(), 0),
            )
            self._pid = self.server.pid
        try:
            return self._client.execute_command(*args)  # type: ignore[no-untyped-call]
        except (redis.ConnectionError, redis.TimeoutError):
            self.close()
            raise

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                client.close()


def pairs(reply: list[Any] | dict[str, Any]) -> dict[str, Any]:
    """A map reply as a dict, whether it came as a flat ``[key, value, ...]`` list or (as
    redis-py with hiredis gives ``SENTINEL MASTER``'s) already as a dict."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


def wait_until(
    check: Callable[[], _T], timeout: float, what: str, diagnostics: Callable[[], str]
) -> _T:
    """Call ``check`` every 50 ms until it returns (rather than raising :class:`NotYet`, a
    Redis error, an ``OSError`` or a ``LookupError``); return what it returned.

    Raises:
        TimeoutError: not within ``timeout`` seconds; says what was last missing, then
            ``diagnostics()``.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except (NotYet, redis.RedisError, OSError, LookupError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no {what} within {timeout:g} s; last: {why}\n{diagnostics()}")
        time.sleep(_POLL)


def answering(process: RedisServer) -> bool:
    """Running and not paused: it can answer."""
    return process.is_running and not process.is_paused


class ServerGroup:
    """Processes started, waited for and stopped together. A subclass says which processes it
    has (:meth:`_processes`), how it builds itself from them (:meth:`_create`) and what a
    process sees (:meth:`_describe`, for the message of a wait that timed out)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._controls: dict[RedisServer, ControlClient] = {}
        self._started = False

    def _processes(self) -> list[RedisServer]:
        """Every process of the group, in the order they are stopped."""
        raise NotImplementedError

    def _create(self) -> None:
        """Start the processes, connect them, wait until they are healthy."""
        raise NotImplementedError

    def _describe(self, process: RedisServer) -> str:
        """What a running process says about the group, for diagnostics."""
        raise NotImplementedError

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Self:
        """Start every process, connect them, wait until they are healthy. No-op if started.

        Raises:
            RuntimeError: a process did not start (the message has its log).
            TimeoutError: things did not settle within ``startup_timeout``.

        On either, what was started is stopped again.
        """
        if self._started:
            return self
        self._started = True
        try:
            self._create()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every process (SIGKILL: the data is thrown away anyway), reap it, remove its
        directory. Idempotent."""
        for control in self._controls.values():
            control.close()
        for process in self._processes():
            process.kill()
            process.stop()
        self._started = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- for subclasses -----------------------------------------------------------------------

    def _control(self, server: RedisServer) -> ControlClient:
        control = self._controls.get(server)
        if control is None:
            control = self._controls[server] = ControlClient(server)
        return control

    def _execute(self, server: RedisServer, *args: Any) -> Any:
        return self._control(server).execute(*args)

    def _resume_paused(self) -> None:
        for process in self._processes():
            if process.is_paused:
                process.resume()

    def _check_replication(self, server: RedisServer, master: RedisServer) -> None:
        """``server`` says it is the master, if it is ``master``; else that it is a replica
        of ``master`` with the link up and no sync under way."""
        info = self._execute(server, "INFO", "replication")
        if server is master:
            if info.get("role") != "master":
                raise NotYet(f"{server!r} does not say it is a master")
        elif (
            info.get("role") != "slave"
            or info.get("master_port") != master.port
            or info.get("master_link_status") != "up"
            or info.get("master_sync_in_progress") != 0
        ):
            raise NotYet(f"{server!r} is not a replica of {master!r} in sync")

    def _wait(self, check: Callable[[], _T], timeout: float | None, what: str) -> _T:
        return wait_until(
            check, self.timeout if timeout is None else timeout, what, self._diagnostics
        )

    def _diagnostics(self) -> str:
        lines = []
        for process in self._processes():
            lines.append(f"--- {process!r}")
            if answering(process):
                try:
                    lines.append(self._describe(process))
                except (redis.RedisError, OSError, ValueError) as exc:
                    lines.append(f"<no answer: {exc!r}>")
            elif process.returncode is not None:
                tail = process.log().splitlines()[-_LOG_TAIL:]
                lines.append(f"exited by itself (status {process.returncode}); log ends:")
                lines.extend(tail)
        return "\n".join(lines)
