"""What the subcommands share: the Redis URL, the connection, errors, and formatting."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.exceptions import RedisError

from ..default import environment_url

OK = 0
FAILED = 1
"""Exit code: the command ran but did not do what was asked (nothing to unlock, declined)."""
ERROR = 2
"""Exit code: bad arguments, or Redis unreachable or answering with an error."""

CONNECT_TIMEOUT = 5.0
COMMAND_TIMEOUT = 30.0


class CliError(Exception):
    """A failure the user can act on; printed as ``aiolock: <message>``, exit code 2."""


def url_parent() -> argparse.ArgumentParser:
    """A parent parser with ``--url``, for every subcommand that talks to Redis."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--url",
        metavar="URL",
        help="Redis URL (default: $AIOLOCK_URL, else $REDIS_URL, else redis://localhost:6379/0)",
    )
    return parent


def resolve_url(url: str | None) -> str:
    """``--url``, else the library's default rule (:func:`aiolock.default.environment_url`)."""
    return url or environment_url()


def redact(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))


@contextmanager
def connect(url: str) -> Iterator[redis.Redis]:
    """A synchronous client on ``url``, PINGed first; :class:`CliError` if it does not answer."""
    try:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=COMMAND_TIMEOUT
        )
    except ValueError as exc:
        raise CliError(f"bad Redis URL {redact(url)!r}: {exc}") from exc
    try:
        try:
            client.ping()
        except redis.ResponseError as exc:  # it answered: AUTH or SELECT refused
            raise CliError(f"Redis at {redact(url)} refused the connection: {exc}") from exc
        except (RedisError, OSError) as exc:
            raise CliError(f"cannot reach Redis at {redact(url)}: {exc}") from exc
        yield client
    finally:
        client.close()


def report_errors(url: str, run: Callable[[], int]) -> int:
    """Run ``run()``; turn a :class:`CliError` or a Redis error into a message and exit code 2."""
    try:
        return run()
    except CliError as exc:
        print(f"aiolock: {exc}", file=sys.stderr)
    except (RedisError, OSError) as exc:
        print(f"aiolock: Redis at {redact(url)} failed: {exc}", file=sys.stderr)
    return ERROR


def decode(raw: bytes | str) -> str:
    """A key, field or member for people: UTF-8, undecodable bytes as ``\\xNN``."""
    if isinstance(raw, str):
        return raw
    return raw.decode("utf-8", errors="backslashreplace")


def to_int(raw: bytes | str | int | None) -> int | None:
    """A Redis integer reply or decimal string as an int; None if it is not one."""
    if raw is None:
        return None
    if isinstance(raw, int):
        return raw
    try:
        return int(raw)
    except ValueError:
        return None


def seconds(ms: int | None) -> str:
    """Milliseconds for a table cell: ``27.3s``, ``-`` for none, ``no expiry`` for -1."""
    if ms is None:
        return "-"
    if ms < 0:
        return "no expiry"
    return f"{ms / 1000:.1f}s"


def server_time_ms(client: redis.Redis) -> int:
    """The server's clock (TIME) in Unix milliseconds."""
    secs, micros = client.time()
    return int(secs) * 1000 + int(micros) // 1000


def clock() -> str:
    """The local time of day with milliseconds, for ``watch`` lines."""
    now = time.time()
    return time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
