"""``aiolock unlock --force NAME``: delete a stuck lock, whoever holds it, and wake its waiters.

It shows the lock (type, holders, lease, waiters) and asks before acting, unless ``--yes``.
Only the holders shown lose the lock: the script compares the lock's owners with them and
deletes nothing if they changed (the lock is then shown and asked about again). The script
(``force_unlock.lua`` beside this module) deletes the lock's hash and publishes what
Redisson's own ``forceUnlock`` publishes, so aiolock's and Redisson's waiters alike wake
at once: ``0`` on ``redisson_lock__channel:{N}`` for a lock or fenced lock, ``1`` (wake all)
on ``redisson_rwlock:{N}`` for a read-write lock, ``0`` to the first live waiter's own channel
``redisson_lock__channel:{N}:<owner>`` for a fair lock. A fenced lock's token counter stays.

The holder is not told: aiolock's watchdog finds the lock gone at its next renewal and reports
the hold lost (``on_lost``, ``guard()``); a holder with a fixed lease finds out at ``unlock()``.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources

import redis

from ..scripts import compose
from . import inspect, layout
from .common import (
    FAILED,
    OK,
    connect,
    report_errors,
    resolve_url,
    seconds,
    server_time_ms,
    url_parent,
)

SCRIPT = resources.files(__name__.rpartition(".")[0]).joinpath("force_unlock.lua")

CHANGED, DELETED_LOCK, DELETED_RWLOCK, DELETED_FAIR = -1, 1, 2, 3
ATTEMPTS = 5
"""With ``--yes``: how often the lock is read again when its holders changed meanwhile."""


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "unlock",
        parents=[url_parent()],
        help="force-unlock a stuck lock (asks first)",
        description="Delete the lock NAME whoever holds it and wake its waiters (what "
        "Redisson's forceUnlock does). Shows the lock and asks for confirmation unless --yes. "
        "Works on locks, fenced locks, fair locks and read-write locks. Only the holders "
        "shown lose the lock: if they changed before the answer (the holder released and "
        "another took it), nothing is deleted and the lock is shown and asked about again. "
        "Exit status: 0 unlocked (or already free: a lock nobody holds has no key), 1 not "
        "done (declined, or NAME is another kind of key), 2 error.",
    )
    parser.add_argument("name", metavar="NAME", help="the lock's name (its Redis key)")
    parser.add_argument(
        "--force",
        action="store_true",
        required=True,
        help="required: the holder loses the lock without being asked",
    )
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    url = resolve_url(args.url)

    def body() -> int:
        with connect(url) as client:
            return force_unlock(client, args.name, confirm=not args.yes)

    return report_errors(url, body)


def describe(lock: inspect.SyncObject) -> str:
    """One line about a lock, for the confirmation question."""
    held = inspect.holders_cell(lock) if lock.holders else "nobody"
    text = f"{lock.type.replace('_', ' ')} {lock.name!r}: held by {held}"
    if lock.holders:
        text += (
            ", no expiry" if lock.lease_ms is not None and lock.lease_ms < 0
            else f", lease {seconds(lock.lease_ms)} left"
        )  # fmt: skip
    text += f"; waiting: {lock.waiting}"
    details = inspect.details_cell(lock)
    return f"{text}; {details}" if details else text


def hash_fields(lock: inspect.SyncObject) -> list[str]:
    """The lock hash's owner fields behind ``lock.holders`` (a writer's ends in ``:write``)."""
    return [h.owner + (":write" if h.mode == "write" else "") for h in lock.holders]


def force_unlock(client: redis.Redis, name: str, *, confirm: bool) -> int:
    """Unlock ``name`` (asking on stdin first when ``confirm``); returns the exit code.

    Only the holders shown are unlocked: the script deletes the lock only if its owners are
    still exactly those (compare and delete, one script). If they changed meanwhile (the
    holder released and someone else took the lock), nothing is deleted and the lock is
    shown, and asked about, again; with ``--yes`` at most :data:`ATTEMPTS` times.
    """
    script = client.register_script(compose(SCRIPT.read_text(encoding="utf-8")))
    keys = [
        name,
        layout.lock_channel(name),
        layout.rwlock_channel(name),
        layout.fair_queue(name),
        layout.fair_timeout(name),
        layout.fair_alive(name),
    ]
    for attempt in range(ATTEMPTS if not confirm else sys.maxsize):
        if attempt:
            print("Its holders changed since it was shown; nothing was deleted. Now:")
        kind = client.type(name)
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        if kind not in ("hash", "none"):
            print(f"{name!r} is a Redis {kind}, not a lock: left as it is.")
            return FAILED
        lock = inspect.lookup(client, name)
        if lock is None and kind == "none":
            print(f"{name!r} is free (no such key): nothing to unlock.")
            return OK
        if lock is None:
            print(f"{name!r} is not a lock: its hash fields are not lock owners (<uuid>:<n>). "
                  "Left as it is.")  # fmt: skip
            return FAILED
        if not lock.holders:
            print(f"{describe(lock)}\nNothing to unlock.")
            return OK
        print(describe(lock))
        if confirm and not _ask(
            "Force-unlock it? Its holder loses the lock without notice. [y/N] "
        ):
            print("Not unlocked.")
            return FAILED
        result = int(script(keys=keys, args=[server_time_ms(client), *hash_fields(lock)]))
        if result == CHANGED:
            continue
        if result == DELETED_RWLOCK:
            print(f"Unlocked {name!r}: deleted it, published 1 on {layout.rwlock_channel(name)}.")
        elif result == DELETED_FAIR:
            print(f"Unlocked {name!r}: deleted it, woke the first waiter in its queue.")
        else:
            print(f"Unlocked {name!r}: deleted it, published 0 on {layout.lock_channel(name)}.")
        return OK
    print(f"Not unlocked: its holders changed {ATTEMPTS} times while it was being read.")
    return FAILED


def _ask(question: str) -> bool:
    try:
        answer = input(question)
    except EOFError:
        print()
        return False
    return answer.strip().lower() in ("y", "yes")
