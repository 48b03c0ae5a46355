"""The Lua scripts, one ``.lua`` file per atomic operation, loaded once at import.

Each file starts with a header naming its KEYS, ARGV and reply. Scripts are plain (no
``#!lua`` shebang) so that release and renewal still run on a server out of memory.

:func:`run` sends one EVALSHA on a connection of its own from the pool, falling back to EVAL
on NOSCRIPT (a script cache emptied by a restart or a failover), and never retries anything
else: redis-py's retry policy would re-run a script whose reply was lost, and a re-run acquire
counts a hold twice. A lost reply raises :class:`OutcomeUnknown`; the caller resolves it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.asyncio import ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str


def _load(name: str) -> Script:
    source = resources.files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())


LOCK_ACQUIRE = _load("lock_acquire")
LOCK_RELEASE = _load("lock_release")
LOCK_FORCE_UNLOCK = _load("lock_force_unlock")
LOCK_RENEW = _load("lock_renew")
FENCED_LOCK_ACQUIRE = _load("fenced_lock_acquire")


class OutcomeUnknown(Exception):
    """The script was possibly sent but its reply was lost: it may or may not have run."""


async def run(
    pool: ConnectionPool, script: Script, keys: tuple[str, ...], args: tuple[Any, ...]
) -> Any:
    """Run ``script`` once and return its raw reply (Redis errors raise ``ResponseError``)."""
    conn = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        try:
            await conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            return await conn.read_response()
        except NoScriptError:
            # Not run: the server did not know the script. EVAL runs it and caches it.
            await conn.send_command("EVAL", script.source, len(keys), *keys, *args)
            return await conn.read_response()
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        raise OutcomeUnknown(f"reply to {script.name} lost: {exc}") from exc
    finally:
        await pool.release(conn)
