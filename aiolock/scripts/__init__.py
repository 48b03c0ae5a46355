"""The Lua scripts, one ``.lua`` file per atomic operation, loaded once at import.

Each file starts with a header naming its KEYS, ARGV and reply. Scripts are plain (no
``#!lua`` shebang) so that release and renewal still run on a server out of memory.

:func:`run` sends one EVALSHA on the client's pipelined connection (aiolock.connection),
falling back to EVAL on NOSCRIPT (a script cache emptied by a restart or a failover), and never
retries anything else: a retry policy would re-run a script whose reply was lost, and a re-run
acquire counts a hold twice. A lost reply raises :class:`OutcomeUnknown`; the caller resolves
it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.exceptions import ResponseError

from ..connection import NotSent, OutcomeUnknown, Pipeline

__all__ = ["NotSent", "OutcomeUnknown", "Script", "load", "run"]


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str


def load(name: str) -> Script:
    """The script ``<name>.lua`` of this package."""
    source = resources.files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())


LOCK_ACQUIRE = load("lock_acquire")
LOCK_RELEASE = load("lock_release")
LOCK_FORCE_UNLOCK = load("lock_force_unlock")
LOCK_RENEW = load("lock_renew")
FENCED_LOCK_ACQUIRE = load("fenced_lock_acquire")


async def run(
    pipeline: Pipeline, script: Script, keys: tuple[str, ...], args: tuple[Any, ...]
) -> Any:
    """Run ``script`` once on the client's pipelined connection and return its raw reply.

    Redis error replies raise ``ResponseError``; a lost reply raises :class:`OutcomeUnknown`;
    :class:`NotSent` means no connection could be opened.
    """
    try:
        return await pipeline.call("EVALSHA", script.sha, len(keys), *keys, *args)
    except ResponseError as exc:
        if not str(exc).startswith("NOSCRIPT"):
            raise
    # Not run: the server did not know the script. EVAL runs it and caches it.
    return await pipeline.call("EVAL", script.source, len(keys), *keys, *args)
