"""``aiolock inspect [PATTERN]``: the locks and synchronizers in a database, by type.

Safe on a large production database: keys are found with SCAN (``MATCH *PATTERN*``, ``COUNT``
per call; never KEYS), their types read with TYPE in one pipeline per SCAN batch, and only the
keys that can belong to a lock are read further (hashes of at most :data:`MAX_LOCK_FIELDS`
fields, the side keys of Redisson's layout). Nothing is written.

How a key is recognised (Redisson's layout, :mod:`aiolock.cli.layout`):

* a **hash** whose fields are all owner ids ``<uuid>:<n>`` with integer values is a lock; with
  ``redisson_lock_token:{N}`` beside it a fenced lock, with ``redisson_lock_queue:{N}`` /
  ``redisson_lock_timeout:{N}`` a fair lock. A hash with ``mode`` = ``read``/``write`` and
  owner fields (``:write`` for the writer) is a read-write lock. The side keys alone (no hash)
  are a free fenced lock (its token counter lives on) or a free fair lock with waiters.
* a **string** is only a number: nothing in it tells a semaphore from a latch or from any
  counter. It is listed as a permit-expirable semaphore when ``{N}:timeout`` (a zset) is
  beside it; as a semaphore or a countdown latch when a client is subscribed to
  ``redisson_sc:{N}`` or ``redisson_countdownlatch__channel__{N}`` (someone waits on it: PUBSUB
  CHANNELS, one call); and otherwise only when asked: ``--strings-as semaphore|latch`` lists
  every integer string matching PATTERN as that type.

Waiting: the fair lock's queue (owners and their deadlines), else the number of connections
subscribed to the object's channel (PUBSUB NUMSUB; one aiolock client waits on one connection,
however many of its tasks wait).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from . import layout
from .common import (
    connect,
    decode,
    report_errors,
    resolve_url,
    seconds,
    server_time_ms,
    to_int,
    url_parent,
)

LOCK = "lock"
FENCED_LOCK = "fenced_lock"
FAIR_LOCK = "fair_lock"
READ_WRITE_LOCK = "read_write_lock"
SEMAPHORE = "semaphore"
PERMIT_EXPIRABLE_SEMAPHORE = "permit_expirable_semaphore"
COUNTDOWN_LATCH = "countdown_latch"
TYPES = (
    LOCK,
    FENCED_LOCK,
    FAIR_LOCK,
    READ_WRITE_LOCK,
    SEMAPHORE,
    PERMIT_EXPIRABLE_SEMAPHORE,
    COUNTDOWN_LATCH,
)

MAX_LOCK_FIELDS = 1000
"""A hash with more fields is not read (a lock has one owner; a read-write lock its readers)."""
MAX_LISTED = 100
"""At most this many fair-lock waiters or semaphore permits are listed per object."""
SCAN_COUNT = 1000


@dataclass
class Holder:
    owner: str
    count: int
    mode: str | None = None
    """``read`` or ``write`` for a read-write lock's holders, else None."""


@dataclass
class Waiter:
    owner: str
    deadline_in_ms: int | None
    """Until the fair lock drops this waiter unless it acquires (None: no deadline)."""


@dataclass
class Permit:
    id: str
    """Hex, as Redisson shows it."""
    lease_ms: int | None
    """Until the permit expires (None: taken without a lease)."""


@dataclass
class SyncObject:
    """One lock or synchronizer as ``inspect`` reports it (``--json`` prints these)."""

    type: str
    name: str
    holders: list[Holder] = field(default_factory=list)
    lease_ms: int | None = None
    """The main key's PTTL: ms left, -1 for no expiry, None when there is no key."""
    subscribers: int = 0
    """Connections subscribed to the object's channel(s)."""
    queue: list[Waiter] = field(default_factory=list)
    queue_length: int = 0
    mode: str | None = None
    token: int | None = None
    """The last fencing token handed out (a fenced lock)."""
    permits: int | None = None
    """Available permits (semaphores)."""
    acquired: list[Permit] = field(default_factory=list)
    acquired_count: int = 0
    count: int | None = None
    """A countdown latch's count."""

    @property
    def locked(self) -> bool:
        return bool(self.holders)

    @property
    def waiting(self) -> int:
        return self.queue_length if self.type == FAIR_LOCK else self.subscribers

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["locked"] = self.locked
        return data


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "inspect",
        parents=[url_parent()],
        help="list locks and synchronizers: holders, leases, waiters",
        description="List the locks and synchronizers whose names match PATTERN, by type: "
        "holders and hold counts, remaining lease, waiters, read/write mode, permits, latch "
        "counts. Reads Redisson's key layout (aiolock's locks and Redisson's alike) with "
        "SCAN, never KEYS; writes nothing.",
    )
    parser.add_argument(
        "pattern", nargs="?", default="*", help="Redis glob over names (default: %(default)s)"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list instead")
    parser.add_argument(
        "--type",
        dest="types",
        action="append",
        choices=TYPES,
        help="only this type (repeatable)",
    )
    parser.add_argument(
        "--strings-as",
        choices=(SEMAPHORE, COUNTDOWN_LATCH),
        help="also list every integer string matching PATTERN as this type (a plain string "
        "cannot tell a semaphore from a latch or a counter)",
    )
    parser.add_argument(
        "--count",
        type=int,
        default=SCAN_COUNT,
        help="SCAN COUNT: keys examined per call (default: %(default)s)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    url = resolve_url(args.url)

    def body() -> int:
        with connect(url) as client:
            found = inspect(client, args.pattern, strings_as=args.strings_as, count=args.count)
        if args.types:
            found = [each for each in found if each.type in args.types]
        if args.json:
            print(json.dumps([each.to_json() for each in found], indent=2))
        else:
            print(table(found))
        return 0

    return report_errors(url, body)


# -- finding -----------------------------------------------------------------------------


class _Found:
    """What the scan found, by name (names are str; undecodable bytes kept as surrogates).

    A side key names its object ambiguously (``prefix:{a}`` belongs to ``a`` or to ``{a}``),
    so side keys keep every candidate name until the scan is over (:meth:`resolve`).
    """

    def __init__(self) -> None:
        self.lock_hashes: dict[str, dict[str, str]] = {}
        self.side: dict[str, dict[str, list[str]]] = {
            "token": {},
            "fair": {},
            "permit_timeout": {},
        }
        self.strings: set[str] = set()

    def resolve(self, role: str) -> set[str]:
        """The object names of the side keys of ``role``: the candidate that has a lock
        hash, else the likeliest."""
        names = set()
        for candidates in self.side[role].values():
            held = [name for name in candidates if name in self.lock_hashes]
            names.add((held or candidates)[0])
        return names


def _text(raw: bytes | str) -> str:
    if isinstance(raw, str):
        return raw
    return raw.decode("utf-8", errors="surrogateescape")


def _raw(text: str) -> bytes:
    return text.encode("utf-8", errors="surrogateescape")


def _show(text: str) -> str:
    """A name for output: undecodable bytes as ``\\xNN``."""
    return decode(_raw(text))


def scan_keys(client: redis.Redis, match: str, count: int) -> Iterator[list[bytes]]:
    """Batches of keys matching ``match``, one SCAN call each (a key may come twice)."""
    cursor = 0
    while True:
        cursor, keys = client.scan(cursor=cursor, match=match, count=count)
        if keys:
            yield [key if isinstance(key, bytes) else key.encode() for key in keys]
        if cursor == 0:
            return


def inspect(
    client: redis.Redis,
    pattern: str = "*",
    *,
    strings_as: str | None = None,
    count: int = SCAN_COUNT,
) -> list[SyncObject]:
    """The locks and synchronizers whose names match ``pattern``, sorted by name and type."""
    wanted = layout.glob(pattern)
    found = _Found()
    match = "*" if pattern.strip("*") == "" else f"*{pattern}*"
    for batch in scan_keys(client, match, count):
        _classify_batch(client, [_text(key) for key in batch], wanted, found, strings_as)
    subscribed = _subscribed_names(client, wanted)
    return _describe(client, found, subscribed, strings_as)


def _roles(key: str) -> tuple[str, list[str]] | None:
    """The role ``key`` may play in Redisson's layout, and the names it may belong to."""
    if layout.is_internal(key):
        return None
    for prefix, role in (
        (layout.TOKEN, "token"),
        (layout.FAIR_QUEUE, "fair"),
        (layout.FAIR_TIMEOUT, "fair"),
    ):
        names = layout.names_after(prefix, key)
        if names:
            return role, names
    names = layout.names_before(layout.PERMIT_TIMEOUT, key)
    if names:
        return "permit_timeout", names
    return "main", [key]


_SIDE_TYPES = {"token": ("string",), "fair": ("list", "zset"), "permit_timeout": ("zset",)}


def _classify_batch(
    client: redis.Redis,
    keys: list[str],
    wanted: re.Pattern[str],
    found: _Found,
    strings_as: str | None,
) -> None:
    candidates: list[tuple[str, str, list[str]]] = []
    for key in set(keys):
        roles = _roles(key)
        if roles is not None:
            names = [name for name in roles[1] if wanted.match(name)]
            if names:
                candidates.append((key, roles[0], names))
    if not candidates:
        return
    with client.pipeline(transaction=False) as pipe:
        for key, _, _ in candidates:
            pipe.type(_raw(key))
        types = [decode(t) for t in pipe.execute()]
    hashes: list[str] = []
    for (key, role, names), kind in zip(candidates, types, strict=True):
        if role == "main":
            if kind == "hash":
                hashes.append(key)
            elif kind == "string" and strings_as is not None:
                found.strings.add(key)
        elif kind in _SIDE_TYPES[role]:
            found.side[role][key] = names
    if not hashes:
        return
    with client.pipeline(transaction=False) as pipe:
        for key in hashes:
            pipe.hlen(_raw(key))
        sizes = pipe.execute()
    small = [key for key, size in zip(hashes, sizes, strict=True) if 0 < size <= MAX_LOCK_FIELDS]
    with client.pipeline(transaction=False) as pipe:
        for key in small:
            pipe.hgetall(_raw(key))
        contents = pipe.execute()
    for key, raw_fields in zip(small, contents, strict=True):
        fields = {decode(f): decode(v) for f, v in raw_fields.items()}
        if lock_holders(fields) is not None:
            found.lock_hashes[key] = fields


def lock_holders(fields: dict[str, str]) -> list[Holder] | None:
    """The holders a lock hash's fields name, or None if the hash is not a lock's."""
    mode = fields.get("mode")
    if mode is not None and mode not in ("read", "write"):
        return None
    holders: list[Holder] = []
    for field_name, value in fields.items():
        if field_name == "mode":
            continue
        match = layout.OWNER.fullmatch(field_name)
        count = to_int(value)
        if match is None or count is None:
            return None
        if mode is None and match["write"]:
            return None
        holder_mode = None if mode is None else ("write" if match["write"] else "read")
        holders.append(Holder(match["owner"], count, holder_mode))
    return holders


def _subscribed_names(client: redis.Redis, wanted: re.Pattern[str]) -> dict[str, set[str]]:
    """Names of semaphores and latches that someone waits on (PUBSUB CHANNELS)."""
    result: dict[str, set[str]] = {SEMAPHORE: set(), COUNTDOWN_LATCH: set()}
    for kind, prefix, glob in (
        (SEMAPHORE, layout.SEMAPHORE_CHANNEL, layout.SEMAPHORE_CHANNEL + ":*"),
        (COUNTDOWN_LATCH, layout.LATCH_CHANNEL, layout.LATCH_CHANNEL + "*"),
    ):
        for channel in client.pubsub_channels(glob):
            for name in layout.names_of_channel(prefix, _text(channel))[:1]:
                if wanted.match(name):
                    result[kind].add(name)
    return result


# -- describing --------------------------------------------------------------------------


def _describe(
    client: redis.Redis,
    found: _Found,
    subscribed: dict[str, set[str]],
    strings_as: str | None,
) -> list[SyncObject]:
    now = server_time_ms(client)
    objects: list[SyncObject] = []
    tokens, fair = found.resolve("token"), found.resolve("fair")
    permit_timeouts = found.resolve("permit_timeout")
    lock_names = set(found.lock_hashes) | tokens | fair
    for name in sorted(lock_names):
        fields = found.lock_hashes.get(name)
        holders = lock_holders(fields) if fields else []
        if fields and "mode" in fields:
            kind = READ_WRITE_LOCK
        elif name in fair:
            kind = FAIR_LOCK
        elif name in tokens:
            kind = FENCED_LOCK
        else:
            kind = LOCK
        objects.append(
            SyncObject(kind, name, holders or [], mode=fields.get("mode") if fields else None)
        )

    string_names = permit_timeouts | subscribed[SEMAPHORE] | subscribed[COUNTDOWN_LATCH]
    string_names |= found.strings
    for name in sorted(string_names - lock_names):
        if name in permit_timeouts:
            kind = PERMIT_EXPIRABLE_SEMAPHORE
        elif name in subscribed[SEMAPHORE]:
            kind = SEMAPHORE
        elif name in subscribed[COUNTDOWN_LATCH]:
            kind = COUNTDOWN_LATCH
        else:
            assert strings_as is not None
            kind = strings_as
        objects.append(SyncObject(kind, name))

    _read_details(client, objects, now)
    # A string named only by --strings-as that holds no integer is somebody's data, not ours.
    return [
        each
        for each in objects
        if not (each.name in found.strings and each.permits is None and each.count is None)
    ]


def _read_details(client: redis.Redis, objects: list[SyncObject], now: int) -> None:
    """Leases, tokens, queues, permits, counts and subscribers, in one pipeline."""
    with client.pipeline(transaction=False) as pipe:
        for each in objects:
            name = _raw(each.name)
            pipe.pttl(name)
            if each.type == FENCED_LOCK:
                pipe.get(_raw(layout.token_key(each.name)))
            elif each.type == FAIR_LOCK:
                queue = _raw(layout.fair_queue(each.name))
                pipe.llen(queue)
                pipe.lrange(queue, 0, MAX_LISTED - 1)
                pipe.zrange(_raw(layout.fair_timeout(each.name)), 0, -1, withscores=True)
            elif each.type in (SEMAPHORE, COUNTDOWN_LATCH):
                pipe.get(name)
            elif each.type == PERMIT_EXPIRABLE_SEMAPHORE:
                timeouts = _raw(layout.permit_timeout(each.name))
                pipe.get(name)
                pipe.zcard(timeouts)
                pipe.zrange(timeouts, 0, MAX_LISTED - 1, withscores=True)
            pipe.pubsub_numsub(*(_raw(c) for c in _channels(each)))
        replies = iter(pipe.execute())

    for each in objects:
        pttl = int(next(replies))
        each.lease_ms = None if pttl == -2 else pttl
        if each.type == FENCED_LOCK:
            each.token = to_int(next(replies))
        elif each.type == FAIR_LOCK:
            each.queue_length = int(next(replies))
            queued = [decode(owner) for owner in next(replies)]
            deadlines = {decode(m): int(score) for m, score in next(replies)}
            each.queue = [Waiter(o, deadlines[o] - now if o in deadlines else None) for o in queued]
        elif each.type == SEMAPHORE:
            each.permits = to_int(next(replies))
        elif each.type == COUNTDOWN_LATCH:
            each.count = to_int(next(replies))
        elif each.type == PERMIT_EXPIRABLE_SEMAPHORE:
            each.permits = to_int(next(replies))
            each.acquired_count = int(next(replies))
            each.acquired = [
                Permit(
                    member.hex() if isinstance(member, bytes) else str(member),
                    None if int(score) >= layout.NO_LEASE_SCORE else int(score) - now,
                )
                for member, score in next(replies)
            ]
        each.subscribers = sum(int(n) for _, n in next(replies))


def _channels(each: SyncObject) -> list[str]:
    if each.type == READ_WRITE_LOCK:
        return [layout.rwlock_channel(each.name)]
    if each.type in (SEMAPHORE, PERMIT_EXPIRABLE_SEMAPHORE):
        return [layout.semaphore_channel(each.name)]
    if each.type == COUNTDOWN_LATCH:
        return [layout.latch_channel(each.name)]
    return [layout.lock_channel(each.name)]


# -- printing ----------------------------------------------------------------------------


def holders_cell(each: SyncObject) -> str:
    if not each.holders:
        return "-"
    return ", ".join(f"{h.mode + ' ' if h.mode else ''}{h.owner} x{h.count}" for h in each.holders)


def details_cell(each: SyncObject) -> str:
    parts: list[str] = []
    if each.mode is not None:
        parts.append(f"mode {each.mode}")
    if each.token is not None:
        parts.append(f"last token {each.token}")
    if each.type == FAIR_LOCK and each.queue_length:
        shown = ", ".join(
            f"{w.owner} ({seconds(w.deadline_in_ms) if w.deadline_in_ms is not None else '-'})"
            for w in each.queue
        )
        more = each.queue_length - len(each.queue)
        parts.append(f"queue: {shown}" + (f" and {more} more" if more > 0 else ""))
    if each.permits is not None:
        parts.append(f"{each.permits} permits available")
    if each.type == PERMIT_EXPIRABLE_SEMAPHORE:
        shown = ", ".join(
            f"{p.id} ({seconds(p.lease_ms) if p.lease_ms is not None else 'no lease'})"
            for p in each.acquired
        )
        parts.append(f"{each.acquired_count} acquired" + (f": {shown}" if shown else ""))
    if each.count is not None:
        parts.append(f"count {each.count}")
    return "; ".join(parts)


HEADERS = ("TYPE", "NAME", "HOLDERS", "LEASE", "WAITING", "DETAILS")


def table(objects: list[SyncObject]) -> str:
    """A plain-text table, one row per object (or a line saying there is none)."""
    if not objects:
        return "No locks or synchronizers found."
    rows = [
        (
            each.type,
            _show(each.name),
            holders_cell(each),
            seconds(each.lease_ms) if each.holders else "-",
            str(each.waiting),
            details_cell(each),
        )
        for each in objects
    ]
    widths = [max(len(row[i]) for row in [HEADERS, *rows]) for i in range(len(HEADERS) - 1)]
    lines = []
    for row in [HEADERS, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def lookup(
    client: redis.Redis, name: str, *, publish: tuple[str, str] | None = None
) -> SyncObject | None:
    """The lock named ``name`` (any lock type), read directly instead of scanned; None if
    there is neither a lock hash nor a side key of one.

    Everything is read in one transaction (MULTI/EXEC): one moment's state. With
    ``publish=(channel, message)`` the message is published in that same transaction, after
    the reads: a subscriber receives every notification of a change the read saw before that
    message, and those of later changes after it (``aiolock watch``'s marker).
    """
    raw = _raw(name)
    token, queue = _raw(layout.token_key(name)), _raw(layout.fair_queue(name))
    timeouts = _raw(layout.fair_timeout(name))
    with client.pipeline(transaction=False) as pipe:  # no hash too big to read at once
        pipe.type(raw)
        pipe.hlen(raw)
        kind, size = pipe.execute(raise_on_error=False)
    if decode(kind) == "hash" and isinstance(size, int) and size > MAX_LOCK_FIELDS:
        return None
    with client.pipeline(transaction=True) as pipe:
        pipe.type(raw)
        pipe.hgetall(raw)
        pipe.pttl(raw)
        for key in (token, queue, timeouts):
            pipe.type(key)
        pipe.get(token)
        pipe.llen(queue)
        pipe.lrange(queue, 0, MAX_LISTED - 1)
        pipe.zrange(timeouts, 0, -1, withscores=True)
        pipe.time()
        channels = [layout.lock_channel(name), layout.rwlock_channel(name)]
        pipe.pubsub_numsub(*(_raw(c) for c in channels))
        if publish is not None:
            pipe.publish(*publish)
        replies = pipe.execute(raise_on_error=False)
    (kind, fields, pttl, token_kind, queue_kind, timeouts_kind, token_value, queue_length,
     queued, deadlines, now, numsub) = replies[:12]  # fmt: skip
    holders: list[Holder] | None = []
    mode = None
    if decode(kind) == "hash":
        text_fields = {decode(f): decode(v) for f, v in fields.items()}
        holders = lock_holders(text_fields)
        if holders is None:
            return None  # somebody's hash, not a lock
        mode = text_fields.get("mode")
    fair = decode(queue_kind) == "list" or decode(timeouts_kind) == "zset"
    fenced = decode(token_kind) == "string"
    if decode(kind) != "hash" and not fair and not fenced:
        return None
    if mode is not None:
        type_ = READ_WRITE_LOCK
    elif fair:
        type_ = FAIR_LOCK
    elif fenced:
        type_ = FENCED_LOCK
    else:
        type_ = LOCK
    lock = SyncObject(type_, name, holders or [], mode=mode)
    lock.lease_ms = None if int(pttl) == -2 else int(pttl)
    if type_ == FENCED_LOCK:
        lock.token = to_int(token_value)
    if type_ == FAIR_LOCK:
        now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
        scores = (
            {decode(m): int(score) for m, score in deadlines} if isinstance(deadlines, list) else {}
        )
        lock.queue_length = queue_length if isinstance(queue_length, int) else 0
        owners = [decode(o) for o in queued] if isinstance(queued, list) else []
        lock.queue = [Waiter(o, scores[o] - now_ms if o in scores else None) for o in owners]
    if type_ == READ_WRITE_LOCK:
        numsub = numsub[1:]
    lock.subscribers = int(numsub[0][1])
    return lock
