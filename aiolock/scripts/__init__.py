"""The Lua scripts, one ``.lua`` file per atomic operation, loaded once at import.

Each file starts with a header naming its KEYS, ARGV and reply. Scripts are plain (no
``#!lua`` shebang) so that release and renewal still run on a server out of memory, and every
script touches keys of one hash slot only (the caller passes them; aiolock.keys names them).

Code that several scripts share is written once, as a *fragment* in ``fragments/<name>.lua``
(its header says what it expects and what it defines), and a script takes it in with a line
``--@include <name>``: :func:`compose` replaces that line with the fragment's code (its
header left out) when the script is loaded, so Redis receives one whole script as before.

:meth:`Script.command` encodes one run as ``EVALSHA``; every script is registered with the
transport, which sends it whole (``EVAL``) instead when the server answers NOSCRIPT (a
script cache emptied by a restart, a failover or SCRIPT FLUSH). Nothing here retries: a
lost reply is settled above.
"""

from __future__ import annotations

import hashlib
import re
from importlib import resources
from typing import Any

import hiredis

from ..transport import register_script

__all__ = ["Script", "compose", "load"]

_INCLUDE = re.compile(r"^--@include (?P<name>[a-z_]+)[ \t]*$", re.MULTILINE)


class Script:
    """One Lua script: its name, source and SHA1, and the encoding of its runs."""

    __slots__ = ("name", "sha", "source")

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        register_script(self.sha, source)

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"

    def command(self, keys: tuple[str, ...], args: tuple[Any, ...]) -> bytes:
        """The encoded EVALSHA command; raises if an argument cannot be encoded."""
        packed: bytes = hiredis.pack_command(("EVALSHA", self.sha, len(keys), *keys, *args))
        return packed


def fragment(name: str) -> str:
    """The code of the fragment ``fragments/<name>.lua``, without its header (the comment
    lines it starts with)."""
    text = resources.files(__name__).joinpath("fragments", f"{name}.lua").read_text("utf-8")
    lines = text.splitlines(keepends=True)
    start = 0
    while start < len(lines) and lines[start].startswith("--"):
        start += 1
    return "".join(lines[start:])


def compose(source: str) -> str:
    """``source`` with each ``--@include <name>`` line replaced by that fragment's code; a
    fragment may include others, and each is taken in once (the first time it is named)."""
    seen: set[str] = set()

    def expand(text: str) -> str:
        def include(match: re.Match[str]) -> str:
            name = match["name"]
            if name in seen:
                return ""
            seen.add(name)
            return expand(fragment(name)).rstrip("\n")

        return _INCLUDE.sub(include, text)

    return expand(source)


def load(name: str) -> Script:
    """The script ``<name>.lua`` of this package, its fragments composed in."""
    source = resources.files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return Script(name, compose(source))


LOCK_ACQUIRE = load("lock_acquire")
LOCK_RELEASE = load("lock_release")
LOCK_FORCE_UNLOCK = load("lock_force_unlock")
LOCK_RENEW = load("lock_renew")
LOCK_PURGE = load("lock_purge")
FENCED_LOCK_ACQUIRE = load("fenced_lock_acquire")
SPIN_LOCK_RELEASE = load("spin_lock_release")
SPIN_LOCK_PURGE = load("spin_lock_purge")
SPIN_LOCK_FORCE_UNLOCK = load("spin_lock_force_unlock")
FAIR_LOCK_ACQUIRE = load("fair_lock_acquire")
FAIR_LOCK_RELEASE = load("fair_lock_release")
FAIR_LOCK_PURGE = load("fair_lock_purge")
FAIR_LOCK_GIVE_UP = load("fair_lock_give_up")
FAIR_LOCK_FORCE_UNLOCK = load("fair_lock_force_unlock")
FAIR_LOCK_RENEW = load("fair_lock_renew")
READ_LOCK_ACQUIRE = load("read_lock_acquire")
READ_LOCK_RELEASE = load("read_lock_release")
READ_LOCK_PURGE = load("read_lock_purge")
READ_LOCK_RENEW = load("read_lock_renew")
READ_LOCK_FORCE_UNLOCK = load("read_lock_force_unlock")
WRITE_LOCK_ACQUIRE = load("write_lock_acquire")
WRITE_LOCK_RELEASE = load("write_lock_release")
WRITE_LOCK_PURGE = load("write_lock_purge")
WRITE_LOCK_FORCE_UNLOCK = load("write_lock_force_unlock")
WRITE_LOCK_RENEW = load("write_lock_renew")
SEMAPHORE_ACQUIRE = load("semaphore_acquire")
SEMAPHORE_RELEASE = load("semaphore_release")
SEMAPHORE_TRY_SET = load("semaphore_try_set")
SEMAPHORE_ADD = load("semaphore_add")
SEMAPHORE_DRAIN = load("semaphore_drain")
PERMIT_ACQUIRE = load("permit_acquire")
PERMIT_RELEASE = load("permit_release")
PERMIT_RENEW = load("permit_renew")
LATCH_TRY_SET = load("latch_try_set")
LATCH_COUNT_DOWN = load("latch_count_down")
LATCH_DELETE = load("latch_delete")
PERMIT_COUNTS = load("permit_counts")
