"""``aiolock acl --user USER --prefix PREFIX``: the least-privilege ``ACL SETUSER`` line for an
application whose lock names all start with ``PREFIX``.

What a client of aiolock sends, and so what the rule allows:

* on every connection: ``PING`` (health checks), ``CLIENT INFO`` (the connection's id, so that
  a connection whose reply was lost can be fenced), ``INFO`` (the server's ``run_id``: a server
  restarted empty is noticed at the reconnect and every hold checked there at once),
  ``CLIENT SETNAME`` (with a client name),
  ``ROLE`` (Sentinel: is this still the master?), ``SELECT`` (a database other than 0),
  ``WAIT`` (``replica_acks``) and ``CLIENT KILL`` (fencing a connection whose reply was lost:
  without it, see :data:`FENCING`);
* ``EVALSHA`` and ``EVAL`` (the lock scripts), and the commands the scripts of each type call:
  read from the scripts themselves (``aiolock/scripts/*.lua``), so the rule follows them;
* ``PUBLISH`` (inside the scripts), ``SUBSCRIBE`` and ``UNSUBSCRIBE`` (waiters);
* a few plain reads (``EXISTS``, ``PTTL``, ``GET``, ``HGET``, ``HGETALL``, ``ZSCORE``).

Keys and channels: Redisson's layout (:mod:`aiolock.keys`) puts an object's side keys and
channels under fixed prefixes with the name inside (``redisson_lock__channel:{N}``), and its
scripts take the channel names as KEYS, so a channel needs both a key pattern (``~``) and a
channel pattern (``&``). A name that already holds a ``{`` is not wrapped again
(``redisson_lock__channel:N``), hence two patterns per prefix.

The rule is for a standalone server or Sentinel (classic pub/sub). On a cluster, aiolock also
uses sharded pub/sub (``SPUBLISH``, ``SSUBSCRIBE``, ``SUNSUBSCRIBE``) and redis-py's cluster
client its topology commands; add those.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from importlib import resources

from .. import keys
from ..scripts import compose
from . import inspect as _inspect

SCRIPTS = resources.files("aiolock").joinpath("scripts")

TYPES = _inspect.TYPES
"""Every lock and synchronizer type, by the names ``aiolock inspect`` uses."""

TYPE_SCRIPTS: dict[str, tuple[str, ...]] = {
    _inspect.LOCK: ("lock_",),
    _inspect.FENCED_LOCK: ("lock_", "fenced_lock_"),
    _inspect.FAIR_LOCK: ("fair_lock_", "lock_"),
    _inspect.READ_WRITE_LOCK: ("read_lock_", "write_lock_"),
    _inspect.SEMAPHORE: ("semaphore_",),
    _inspect.PERMIT_EXPIRABLE_SEMAPHORE: ("permit_", "semaphore_"),
    _inspect.COUNTDOWN_LATCH: ("latch_",),
}
"""The script files (by name prefix under ``aiolock/scripts``) each type runs."""

CONNECTION = ("ping", "client|info", "info", "client|setname", "role", "select", "wait")
"""What every connection may send besides the scripts (see the module docstring)."""
FENCING = "client|kill"
"""Fences a connection whose reply was lost (its own, by id). Without it a lock script whose
reply was lost is never sent again: what it may have taken is released or expires."""
SCRIPTING = ("evalsha", "eval")
PUBSUB = ("publish", "subscribe", "unsubscribe")
READS = ("exists", "pttl", "get", "hget", "hgetall", "zscore")

_SUFFIXED = {
    _inspect.LOCK: (keys.LOCK_CHANNEL_PREFIX,),
    _inspect.FENCED_LOCK: (keys.LOCK_CHANNEL_PREFIX, keys.TOKEN_PREFIX),
    _inspect.FAIR_LOCK: (
        keys.LOCK_CHANNEL_PREFIX,
        keys.FAIR_QUEUE_PREFIX,
        keys.FAIR_TIMEOUT_PREFIX,
        keys.FAIR_ALIVE_PREFIX,
    ),
    _inspect.READ_WRITE_LOCK: (keys.RWLOCK_CHANNEL_PREFIX,),
    _inspect.SEMAPHORE: (keys.SEMAPHORE_CHANNEL_PREFIX,),
    _inspect.PERMIT_EXPIRABLE_SEMAPHORE: (keys.SEMAPHORE_CHANNEL_PREFIX,),
    _inspect.COUNTDOWN_LATCH: (),
}
"""Each type's ``prefix:{N}`` keys and channels."""
_CHANNELS = {
    keys.LOCK_CHANNEL_PREFIX,
    keys.RWLOCK_CHANNEL_PREFIX,
    keys.SEMAPHORE_CHANNEL_PREFIX,
}
_BRACED = {
    _inspect.READ_WRITE_LOCK,  # {N}:<owner>:rwlock_timeout:<k>
    _inspect.SEMAPHORE,  # {N}:aiolock_requests:<client id>
    _inspect.PERMIT_EXPIRABLE_SEMAPHORE,  # {N}:timeout, {N}:aiolock_requests:<client id>
    _inspect.COUNTDOWN_LATCH,  # {N}:aiolock_requests:<client id>
}
"""Types with ``{N}:suffix`` keys."""

_CALL = re.compile(r"redis\.p?call\(\s*['\"]([A-Za-z]+)['\"]")


def script_commands(type_: str) -> list[str]:
    """The commands the scripts of ``type_`` call (lower case, sorted)."""
    found: set[str] = set()
    for script in SCRIPTS.iterdir():
        if script.name.endswith(".lua") and script.name.startswith(TYPE_SCRIPTS[type_]):
            source = compose(script.read_text(encoding="utf-8"))  # with its shared fragments
            found.update(c.lower() for c in _CALL.findall(source))
    return sorted(found)


def _glob(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def patterns(type_: str, prefix: str) -> tuple[list[str], list[str]]:
    """(key patterns, channel patterns) of the objects of ``type_`` whose names start with
    ``prefix``."""
    p = _glob(prefix)
    key_patterns = [f"{p}*"]
    channels: list[str] = []
    for side in _SUFFIXED[type_]:
        both = [f"{side}:{{{p}*", f"{side}:{p}*"]  # name wrapped in {}, or already tagged
        key_patterns += both
        if side in _CHANNELS:
            channels += both
    if type_ == _inspect.COUNTDOWN_LATCH:
        latch = f"{keys.LATCH_CHANNEL_PREFIX}{{{p}*"  # always wrapped
        key_patterns.append(latch)
        channels.append(latch)
    if type_ in _BRACED:
        key_patterns.append(f"{{{p}*")
    return key_patterns, channels


def rule(
    prefix: str,
    types: list[str] | None = None,
    *,
    password: str | None = None,
    fencing: bool = True,
) -> list[str]:
    """The ``ACL SETUSER <user>`` arguments (after the user name) that let a client use the
    objects of ``types`` (default: every type) named ``prefix...``, and nothing else."""
    if not prefix:
        raise ValueError("the prefix must not be empty (it would allow every key)")
    chosen = list(TYPES) if not types else list(dict.fromkeys(types))
    key_patterns: list[str] = []
    channels: list[str] = []
    commands: list[str] = [*CONNECTION, *SCRIPTING, *PUBSUB, *READS]
    if fencing:
        commands.append(FENCING)
    for type_ in chosen:
        k, c = patterns(type_, prefix)
        key_patterns += k
        channels += c
        commands += script_commands(type_)
    args = ["reset", "on"]
    if password is not None:
        args.append(f">{password}")
    args += ["resetkeys", "resetchannels"]
    args += [f"~{k}" for k in dict.fromkeys(key_patterns)]
    args += [f"&{c}" for c in dict.fromkeys(channels)]
    args.append("-@all")
    args += [f"+{c}" for c in dict.fromkeys(commands)]
    return args


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "acl",
        help="print a least-privilege ACL SETUSER line for an app's locks",
        description="Print the ACL SETUSER line for a Redis user whose locks and "
        "synchronizers are all named PREFIX...: the commands aiolock's scripts and "
        "connections need, and the key and channel patterns of Redisson's layout for those "
        "names (channels are also keys: the scripts take them as KEYS). Another prefix gets "
        "NOPERM. Nothing is sent to Redis: paste the line into redis-cli (Redis 6.2+).",
    )
    parser.add_argument("--user", required=True, help="the ACL user name")
    parser.add_argument(
        "--prefix", required=True, help="every lock name of the user starts with this"
    )
    parser.add_argument(
        "--type",
        dest="types",
        action="append",
        choices=TYPES,
        help="only what this type needs (repeatable; default: every type)",
    )
    parser.add_argument(
        "--password",
        help="the user's password (default: none in the line, so the user cannot log in "
        "until you add >PASSWORD or #SHA256 to it)",
    )
    parser.add_argument(
        "--no-fencing",
        action="store_true",
        help="leave out CLIENT KILL (which also lets the user close other clients' "
        "connections); a lock script whose reply was lost is then never sent again",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not args.prefix:
        raise SystemExit("aiolock acl: --prefix must not be empty (it would allow every key)")
    setuser = rule(args.prefix, args.types, password=args.password, fencing=not args.no_fencing)
    words = ["ACL", "SETUSER", args.user, *setuser]
    print(" ".join(shlex.quote(word) for word in words))
    if args.password is None:
        print(
            "aiolock acl: no --password: add >PASSWORD (or #SHA256) to the line, or the user "
            "cannot log in.",
            file=sys.stderr,
        )
    return 0
