"""``aiolock unlock --force NAME``: delete a stuck lock, whoever holds it, and wake its waiters.

It shows the lock (type, holders, lease, waiters) and asks before acting, unless ``--yes``.
One script (``force_unlock.lua`` beside this module) deletes the lock's hash and publishes
what Redisson's own ``forceUnlock`` publishes, so aiolock's and Redisson's waiters alike wake
at once: ``0`` on ``redisson_lock__channel:{N}`` for a lock or fenced lock, ``1`` (wake all)
on ``redisson_rwlock:{N}`` for a read-write lock, ``0`` to the first live waiter's own channel
``redisson_lock__channel:{N}:<owner>`` for a fair lock. A fenced lock's token counter stays.

The holder is not told: aiolock's watchdog finds the lock gone at its next renewal and reports
the hold lost (``on_lost``, ``guard()``); a holder with a fixed lease finds out at ``unlock()``.
"""

from __future__ import annotations

import argparse
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

DELETED_LOCK, DELETED_RWLOCK, DELETED_FAIR = 1, 2, 3


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "unlock",
        parents=[url_parent()],
        help="force-unlock a stuck lock (asks first)",
        description="Delete the lock NAME whoever holds it and wake its waiters (what "
        "Redisson's forceUnlock does). Shows the lock and asks for confirmation unless --yes. "
        "Works on locks, fenced locks, fair locks and read-write locks. Exit status: 0 "
        "unlocked (or already free), 1 not done (declined, or NAME is not a lock), 2 error.",
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
        text += f", lease {seconds(lock.lease_ms)} left"
    text += f"; waiting: {lock.waiting}"
    details = inspect.details_cell(lock)
    return f"{text}; {details}" if details else text


def force_unlock(client: redis.Redis, name: str, *, confirm: bool) -> int:
    """Unlock ``name`` (asking on stdin first when ``confirm``); returns the exit code."""
    kind = client.type(name)
    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    if kind not in ("hash", "none"):
        print(f"{name!r} is a Redis {kind}, not a lock: left as it is.")
        return FAILED
    lock = inspect.lookup(client, name)
    if lock is None:
        print(f"{name!r} is not a lock: " + ("no such key." if kind == "none" else
              "its hash fields are not lock owners (<uuid>:<n>). Left as it is."))  # fmt: skip
        return FAILED
    if not lock.holders:
        print(f"{describe(lock)}\nNothing to unlock.")
        return OK
    print(describe(lock))
    if confirm and not _ask("Force-unlock it? Its holder loses the lock without notice. [y/N] "):
        print("Not unlocked.")
        return FAILED
    script = client.register_script(compose(SCRIPT.read_text(encoding="utf-8")))
    keys = [
        name,
        layout.lock_channel(name),
        layout.rwlock_channel(name),
        layout.fair_queue(name),
        layout.fair_timeout(name),
        layout.fair_alive(name),
    ]
    result = int(script(keys=keys, args=[server_time_ms(client)]))
    if result == 0:
        print(f"{name!r} was released meanwhile; nothing done.")
    elif result == DELETED_RWLOCK:
        print(f"Unlocked {name!r}: deleted it, published 1 on {layout.rwlock_channel(name)}.")
    elif result == DELETED_FAIR:
        print(f"Unlocked {name!r}: deleted it, woke the first waiter in its queue.")
    else:
        print(f"Unlocked {name!r}: deleted it, published 0 on {layout.lock_channel(name)}.")
    return OK


def _ask(question: str) -> bool:
    try:
        answer = input(question)
    except EOFError:
        print()
        return False
    return answer.strip().lower() in ("y", "yes")
