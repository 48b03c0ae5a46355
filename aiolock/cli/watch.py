"""``aiolock watch NAME``: a lock's holder changes and hand-offs, live, one line each.

Driven by what the server tells, not by polling:

* the lock's channels (``redisson_lock__channel:{N}``, its fair waiters'
  ``redisson_lock__channel:{N}:*`` and ``redisson_rwlock:{N}``): every unlock message;
* where the server has them on (``notify-keyspace-events`` with ``K`` and the classes
  ``g``, ``h``, ``x``; ``--keyspace-events`` turns them on for the watch and restores the
  setting after), the keyspace events of the lock's keys: every acquisition, count change,
  release, expiry and fair-queue change.

Each notification makes the watch read the lock (one MULTI/EXEC) and print what changed:
acquired, released (with an unlock message, or without one: the lease ran out or the key was
deleted), handed off, hold counts, read/write mode, fair-queue arrivals and departures. The
read publishes a marker on a channel of the watch's own in the same transaction, so every
notification is counted against the read that saw its change: a hold that begins and ends
between two reads is not lost but counted (``unseen``: with keyspace events every release,
without them the unlock messages of a lock or fenced lock). A slow poll (``--interval``)
and a read when the holder's lease is due to run out are the fallback for what sends
nothing (a lease running out without keyspace events).

The watch subscribes with PSUBSCRIBE only, so ``PUBSUB NUMSUB`` (``aiolock inspect``'s
WAITING) does not count it as a waiter. Ctrl-C (or ``--duration``) ends it.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import redis
from redis.exceptions import RedisError

from . import inspect, layout
from .common import (
    ERROR,
    OK,
    CliError,
    clock,
    connect,
    decode,
    redact,
    report_errors,
    resolve_url,
    seconds,
    url_parent,
)

HANDOFF_WINDOW = 1.0
"""Seconds after a release in which a new holder counts as a hand-off."""
POLL_INTERVAL = 0.5
"""Seconds between reads without keyspace events (acquisitions send no message then)."""
FALLBACK_INTERVAL = 5.0
"""Seconds between reads with keyspace events (every change is notified then)."""
MARKER_TIMEOUT = 10.0
"""Seconds a read's marker may take to come back on the watch's subscription."""
KEYSPACE_NEEDED = "Kghx"
"""``notify-keyspace-events`` classes the watch needs: keyspace channel, generic (DEL,
PEXPIRE), hash, expired. ``e`` (evicted), ``l`` and ``z`` (a fair lock's queue) help."""
KEYSPACE_WANTED = "Kghxelz"
RESTORE_TIMEOUT = 3.0
"""Seconds the watch waits, once stopped, to put ``notify-keyspace-events`` back."""
ALL_CLASSES = "g$lshzxetd"
"""What the class alias ``A`` stands for."""
ENDS = ("del", "expired", "evicted")
"""Keyspace events that end every hold of the lock at once."""

Event = dict[str, Any]
HoldKey = tuple[str, str | None]
"""(owner, mode) of a hold."""


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "watch",
        parents=[url_parent()],
        help="show a lock's holder changes and hand-offs live",
        description="Print a timestamped line for every change of the lock NAME: acquired, "
        "released, handed off, hold counts, mode, fair-queue waiters, and the unlock "
        "messages on its channels. Ctrl-C ends it. Exit status: 0 stopped (Ctrl-C or "
        "--duration), 2 error (Redis unreachable, or the keyspace-events setting could not "
        "be put back: the command to put it back by hand is printed).",
    )
    parser.add_argument("name", metavar="NAME", help="the lock's name (its Redis key)")
    parser.add_argument(
        "--interval",
        type=float,
        help=f"seconds between reads of the lock when nothing is notified (default: "
        f"{FALLBACK_INTERVAL:g} with keyspace events, else {POLL_INTERVAL:g}); every unlock "
        "message and keyspace event triggers one at once",
    )
    parser.add_argument(
        "--keyspace-events",
        action="store_true",
        help="turn on the keyspace events the watch needs (CONFIG SET notify-keyspace-events, "
        f"adding {KEYSPACE_WANTED} to what is set) and restore the setting when it ends; "
        "without this flag the server's configuration is never changed",
    )
    parser.add_argument(
        "--duration", type=float, help="stop after this many seconds (default: until Ctrl-C)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    url = resolve_url(args.url)
    if args.interval is not None and args.interval <= 0:
        raise SystemExit("aiolock watch: --interval must be > 0")
    emit = _print_json if args.json else _print_text
    restore: tuple[str, str] | None = None

    def body(stop: threading.Event, emit: Callable[[Event], None]) -> None:
        with connect(url) as client:
            watch(client, args.name, emit, interval=args.interval, stop=stop)

    def run_watch() -> int:
        nonlocal restore
        if args.keyspace_events:
            try:
                with connect(url) as client:
                    restore = enable_keyspace_events(client)
            except KeyboardInterrupt:  # Ctrl-C before the watch began (Redis slow to answer)
                return OK
        return until_interrupted(body, emit, args.name, args.duration)

    code = ERROR
    try:
        code = report_errors(url, run_watch)
    finally:
        # Here, in the main thread: the watching thread is a daemon, left running at exit.
        if restore is not None and not put_back_keyspace_events(url, restore):
            code = ERROR
    return code


def until_interrupted(
    body: Callable[[threading.Event, Callable[[Event], None]], None],
    emit: Callable[[Event], None],
    name: str,
    duration: float | None,
) -> int:
    """Run ``body(stop, emit)`` in a thread of its own until it returns, ``duration`` passes or
    Ctrl-C; then emit ``stopped`` (if ``watching`` was emitted) and return at once.

    Ctrl-C must not depend on a KeyboardInterrupt finding its way out of redis-py: raised
    while an object's ``__del__`` runs (redis-py's Pipeline and PubSub close themselves
    there), it is printed as "Exception ignored" and swallowed, and the watch went on. Here
    the main thread, which receives every signal, only waits; the watching thread never
    sees one, and it is a daemon: whatever call it is in, it does not keep the process.
    An error in the body is raised here.
    """
    stop = threading.Event()
    done = threading.Event()
    guard = threading.Lock()
    started = False
    failure: list[BaseException] = []

    def guarded_emit(event: Event) -> None:
        nonlocal started
        with guard:
            if not stop.is_set():
                started = True
                emit(event)

    def target() -> None:
        try:
            body(stop, guarded_emit)
        except BaseException as exc:  # handed to the main thread, which raises it
            failure.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=target, name="aiolock-watch", daemon=True)
    end = None if duration is None else time.monotonic() + duration
    try:
        thread.start()
        # Short waits: a signal's handler runs between them whatever the platform's waits do.
        while not done.wait(0.1 if end is None else max(0.0, min(0.1, end - time.monotonic()))):
            if end is not None and time.monotonic() >= end:
                break
    except KeyboardInterrupt:
        pass
    with guard:
        stop.set()
        if failure:
            raise failure[0]
        if started:
            emit({"event": "stopped", "name": name, "time": _now()})
    return OK


def keyspace_flags(client: redis.Redis) -> str | None:
    """The server's ``notify-keyspace-events`` (None if CONFIG GET is refused, e.g. by ACL)."""
    try:
        reply = client.config_get("notify-keyspace-events")
    except RedisError:
        return None
    value = reply.get("notify-keyspace-events")
    return None if value is None else decode(value)


def keyspace_covers(flags: str | None, classes: str = KEYSPACE_NEEDED) -> bool:
    """Whether ``flags`` (a ``notify-keyspace-events`` value) includes every class."""
    if flags is None:
        return False
    expanded = flags.replace("A", ALL_CLASSES)
    return all(c in expanded for c in classes)


def enable_keyspace_events(client: redis.Redis) -> tuple[str, str] | None:
    """Turn on the keyspace events the watch wants (adding :data:`KEYSPACE_WANTED` to the
    server's ``notify-keyspace-events``); return (the value set, the value before) to restore
    later, or None if nothing needed changing."""
    flags = keyspace_flags(client)
    if keyspace_covers(flags, KEYSPACE_WANTED):
        return None
    if flags is None:
        raise CliError("--keyspace-events: the server refused CONFIG GET notify-keyspace-events")
    have = flags.replace("A", ALL_CLASSES)
    client.config_set(
        "notify-keyspace-events", flags + "".join(c for c in KEYSPACE_WANTED if c not in have)
    )
    return keyspace_flags(client) or "", flags


def put_back_keyspace_events(
    url: str, restore: tuple[str, str], within: float = RESTORE_TIMEOUT
) -> bool:
    """:func:`restore_keyspace_events`, waited for at most ``within`` seconds (a server that
    stopped answering must not keep the watch from ending after Ctrl-C: its connection's
    timeouts are 30 s) or until a second Ctrl-C; True if done. Otherwise say so, with the
    command that puts the setting back by hand, on stderr."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            restore_keyspace_events(url, restore)
            outcome.append(None)
        except BaseException as exc:  # told below, by the main thread
            outcome.append(exc)

    thread = threading.Thread(target=target, name="aiolock-watch-restore", daemon=True)
    end = time.monotonic() + within
    why = f"Redis did not answer within {within:g} s"
    try:
        thread.start()
        while not outcome and time.monotonic() < end:
            thread.join(0.1)  # short waits: Ctrl-C is handled between them
    except KeyboardInterrupt:
        why = "interrupted"
    if outcome and outcome[0] is None:
        return True
    if outcome:
        why = str(outcome[0]) or type(outcome[0]).__name__
    before = restore[1]
    print(
        f"aiolock watch: could not put notify-keyspace-events back to {before!r} on "
        f"{redact(url)} ({why}); to do it by hand: CONFIG SET notify-keyspace-events "
        f'"{before}"',
        file=sys.stderr,
    )
    return False


def restore_keyspace_events(url: str, restore: tuple[str, str]) -> int:
    """Put ``notify-keyspace-events`` back as it was, unless someone changed it since."""
    with connect(url) as client:
        if keyspace_flags(client) == restore[0]:
            client.config_set("notify-keyspace-events", restore[1])
    return OK


def watch(
    client: redis.Redis,
    name: str,
    emit: Callable[[Event], None],
    *,
    interval: float | None = None,
    stop: threading.Event,
) -> None:
    """Emit events about the lock ``name`` until ``stop`` is set.

    Keyspace events are used when the server has them on (:func:`keyspace_covers`);
    ``interval`` is the fallback poll (default :data:`FALLBACK_INTERVAL` with keyspace
    events, :data:`POLL_INTERVAL` without).
    """
    _watch(client, name, emit, interval, stop, keyspace_covers(keyspace_flags(client)))


Notification = tuple[str, str]
"""(channel, message) of a pattern subscription's message."""


def _watch(
    client: redis.Redis,
    name: str,
    emit: Callable[[Event], None],
    interval: float | None,
    stop: threading.Event,
    keyspace: bool,
) -> None:
    if interval is None:
        interval = FALLBACK_INTERVAL if keyspace else POLL_INTERVAL
    db = int(client.connection_pool.connection_kwargs.get("db") or 0)
    marker = f"aiolock:watch:{uuid.uuid4().hex}"
    main_events = f"__keyspace@{db}__:{name}"
    # PSUBSCRIBE only: PUBSUB NUMSUB (inspect's WAITING) counts channel subscribers alone,
    # so the watch is never taken for a waiter.
    patterns = [
        layout.escape_glob(layout.lock_channel(name)),
        layout.escape_glob(layout.lock_channel(name)) + ":*",
        layout.escape_glob(layout.rwlock_channel(name)),
        layout.escape_glob(marker),
    ]
    if keyspace:
        patterns += [
            layout.escape_glob(f"__keyspace@{db}__:{key}")
            for key in (name, layout.fair_queue(name), layout.fair_timeout(name))
        ]
    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    try:
        pubsub.psubscribe(*patterns)
        # Wait until the subscriptions are confirmed, so no message is missed from here on.
        confirmed = 0
        while confirmed < len(patterns):
            reply = pubsub.parse_response(block=True, timeout=MARKER_TIMEOUT)
            if reply is None:
                raise TimeoutError(f"the subscriptions were not confirmed in {MARKER_TIMEOUT:g} s")
            confirmed += 1
        reads = 0

        def read() -> tuple[inspect.SyncObject | None, list[Notification]]:
            """Read the lock; return it with the notifications of the changes it saw (all
            received before the marker that the read published)."""
            nonlocal reads
            reads += 1
            lock = inspect.lookup(client, name, publish=(marker, str(reads)))
            batch: list[Notification] = []
            deadline = time.monotonic() + MARKER_TIMEOUT
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"the watch's own marker message did not come back in {MARKER_TIMEOUT:g} s"
                    )
                message = pubsub.get_message(timeout=left)
                if message is None or message["type"] != "pmessage":
                    continue
                channel, data = _text(message["channel"]), _text(message["data"])
                if channel != marker:
                    batch.append((channel, data))
                elif data == str(reads):
                    return lock, batch

        tracker = _Tracker(name, emit, main_events if keyspace else None)
        lock, _ = read()
        tracker.start(lock, keyspace=keyspace, interval=interval)
        next_read = tracker.next_read(interval)
        while not stop.is_set():
            message = pubsub.get_message(timeout=max(0.0, next_read - time.monotonic()))
            notified = message is not None and message["type"] == "pmessage"
            if notified or time.monotonic() >= next_read:
                batch = []
                if message is not None and notified:
                    batch.append((_text(message["channel"]), _text(message["data"])))
                lock, more = read()
                tracker.update(lock, batch + more)
                next_read = tracker.next_read(interval)
    finally:
        pubsub.close()


class _Tracker:
    """Compares successive reads of one lock and emits what changed.

    Each read comes with the notifications sent before it (since the previous read). Every
    release that ends the lock's hash is notified: a ``del``/``expired``/``evicted`` keyspace
    event (with keyspace events), or an unlock message on the lock's channel (a lock or
    fenced lock publishes one per release). Releases the reads explain (a holder seen before
    is gone) are printed as such; the others were of holds that began and ended between two
    reads, and are counted (``unseen``) rather than lost.
    """

    def __init__(self, name: str, emit: Callable[[Event], None], main_events: str | None) -> None:
        self.name = name
        self.emit = emit
        self.main_events = main_events
        self.lock_channel = layout.lock_channel(name)
        self.type: str | None = None
        self.holds: dict[HoldKey, int] = {}
        self.mode: str | None = None
        self.queue: list[str] = []
        self.lease_ms: int | None = None
        self.read_at = time.monotonic()
        self.released_at: float | None = None

    def _emit(self, event: str, **fields: Any) -> None:
        self.emit({"event": event, "name": self.name, "time": _now(), **fields})

    def start(self, lock: inspect.SyncObject | None, *, keyspace: bool, interval: float) -> None:
        self._take(lock)
        self._emit(
            "watching",
            type=None if lock is None else lock.type,
            holders=[_hold_json(key, count) for key, count in self.holds.items()],
            lease_ms=None if lock is None else lock.lease_ms,
            mode=self.mode,
            queue=list(self.queue),
            waiting=0 if lock is None else lock.waiting,
            keyspace_events=keyspace,
            interval=interval,
        )

    def next_read(self, interval: float) -> float:
        """When to read again if nothing is notified: after ``interval``, or just after the
        holder's lease runs out if that is sooner (without keyspace events it sends
        nothing)."""
        due = self.read_at + interval
        if self.holds and self.lease_ms is not None and self.lease_ms >= 0:
            due = min(due, self.read_at + self.lease_ms / 1000 + 0.05)
        return due

    def update(self, lock: inspect.SyncObject | None, notified: list[Notification]) -> None:
        messages = [(c, d) for c, d in notified if c != self.main_events]
        events = [d for c, d in notified if c == self.main_events]
        for channel, data in messages:
            if not channel.startswith("__keyspace@"):
                self._emit("message", channel=channel, data=data)
        unlock_message = any(not c.startswith("__keyspace@") for c, _ in messages)
        expired = any(e in ("expired", "evicted") for e in events)
        if self.main_events is not None:
            ends = sum(e in ENDS for e in events)
        else:
            ends = sum(c == self.lock_channel for c, _ in messages)

        before, before_mode, before_queue = self.holds, self.mode, self.queue
        self._take(lock)
        lease = None if lock is None else lock.lease_ms
        gone = [key for key in before if key not in self.holds]
        new = [key for key in self.holds if key not in before]
        unseen = max(0, ends - (1 if gone else 0))
        if self.type in (None, inspect.LOCK, inspect.FENCED_LOCK) or self.main_events:
            if unseen:
                how = "keyspace events" if self.main_events else "unlock messages"
                self._emit("unseen", count=unseen, told_by=how)
        if len(gone) == 1 and len(new) == 1 and not unseen:
            self._emit(
                "handed_off",
                **{"from": gone[0][0], "to": new[0][0]},
                mode=new[0][1],
                count=self.holds[new[0]],
                lease_ms=lease,
            )
            self.released_at = None
        else:
            for key in gone:
                self._emit(
                    "released",
                    owner=key[0],
                    mode=key[1],
                    unlock_message=unlock_message,
                    expired=expired,
                )
                self.released_at = time.monotonic()
            for key in new:
                after = None
                if self.released_at is not None:
                    elapsed = time.monotonic() - self.released_at
                    after = round(elapsed * 1000) if elapsed <= HANDOFF_WINDOW else None
                self._emit(
                    "acquired",
                    owner=key[0],
                    mode=key[1],
                    count=self.holds[key],
                    lease_ms=lease,
                    after_release_ms=after,
                )
                self.released_at = None
        for key in self.holds.keys() & before.keys():
            if self.holds[key] != before[key]:
                self._emit(
                    "count",
                    owner=key[0],
                    mode=key[1],
                    **{"from": before[key], "to": self.holds[key]},
                )
        if self.mode != before_mode:
            self._emit("mode", **{"from": before_mode, "to": self.mode})
        for owner in self.queue:
            if owner not in before_queue:
                self._emit("queued", owner=owner, position=self.queue.index(owner) + 1)
        for owner in before_queue:
            if owner not in self.queue:
                self._emit("left_queue", owner=owner)

    def _take(self, lock: inspect.SyncObject | None) -> None:
        self.read_at = time.monotonic()
        if lock is None:
            self.holds, self.mode, self.queue, self.lease_ms = {}, None, [], None
            return
        self.type = lock.type
        self.holds = {(h.owner, h.mode): h.count for h in lock.holders}
        self.mode = lock.mode
        self.queue = [w.owner for w in lock.queue]
        self.lease_ms = lock.lease_ms


def _hold_json(key: HoldKey, count: int) -> dict[str, Any]:
    return {"owner": key[0], "mode": key[1], "count": count}


def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="milliseconds")


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", errors="backslashreplace") if isinstance(raw, bytes) else raw


# -- output ------------------------------------------------------------------------------


def _print_json(event: Event) -> None:
    print(json.dumps(event), flush=True)


def _hold(owner: str, mode: str | None, count: int | None = None) -> str:
    text = f"{mode} {owner}" if mode else owner
    return text if count is None else f"{text} x{count}"


def describe(event: Event) -> str:
    """One event as text (without the time)."""
    kind = event["event"]
    if kind == "watching":
        if event["type"] is None:
            state = "free (no such lock yet)"
        else:
            held = ", ".join(_hold(h["owner"], h["mode"], h["count"]) for h in event["holders"])
            state = f"{event['type']}, " + (
                f"held by {held}, lease {seconds(event['lease_ms'])}" if held else "free"
            )
            state += f"; waiting: {event['waiting']}"
        return f"watching: {state} (Ctrl-C to stop)"
    if kind == "unseen":
        count = event["count"]
        return (
            f"{count} hold{'s' if count != 1 else ''} began and ended between two reads "
            f"(told by {event['told_by']}; owner not seen)"
        )
    if kind == "message":
        return f"message {event['data']!r} on {event['channel']}"
    if kind == "acquired":
        text = f"acquired by {_hold(event['owner'], event['mode'], event['count'])}"
        text += f", lease {seconds(event['lease_ms'])}"
        if event["after_release_ms"] is not None:
            text += f" (hand-off: {event['after_release_ms']} ms after the release was seen)"
        return text
    if kind == "released":
        if event["unlock_message"]:
            how = ""
        elif event.get("expired"):
            how = " without an unlock message: its lease ran out"
        else:
            how = " without an unlock message (the lease ran out, or the key was deleted)"
        return f"released by {_hold(event['owner'], event['mode'])}{how}"
    if kind == "handed_off":
        return (
            f"handed off: {event['from']} -> {_hold(event['to'], event['mode'], event['count'])}"
            f", lease {seconds(event['lease_ms'])}"
        )
    if kind == "count":
        holder = _hold(event["owner"], event["mode"])
        return f"{holder}: hold count {event['from']} -> {event['to']}"
    if kind == "mode":
        return f"mode {event['from']} -> {event['to']}"
    if kind == "queued":
        return f"queued: {event['owner']} (position {event['position']})"
    if kind == "left_queue":
        return f"left the queue: {event['owner']}"
    if kind == "stopped":
        return "stopped"
    return json.dumps(event)


def _print_text(event: Event) -> None:
    print(f"{clock()}  {event['name']}  {describe(event)}", flush=True)
    if event["event"] == "watching" and not event["keyspace_events"]:
        print(
            "aiolock watch: keyspace events are off on this server, so acquisitions show at "
            f"the next read (every {event['interval']:g} s) or unlock message, and holds "
            "shorter than that are counted from their unlock messages; --keyspace-events "
            "turns them on for the watch.",
            file=sys.stderr,
            flush=True,
        )
