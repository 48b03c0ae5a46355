"""``aiolock watch NAME``: a lock's holder changes and hand-offs, live, one line each.

It subscribes to the lock's channels (``redisson_lock__channel:{N}``, its fair waiters'
``redisson_lock__channel:{N}:*`` and ``redisson_rwlock:{N}``) and reads the lock every
``--interval`` seconds and at once after each message, printing a timestamped line for every
change it sees: acquired, released (with or without an unlock message: without one, the lease
ran out or the key was deleted), handed off from one owner to another, hold counts, read/write
mode, fair-queue arrivals and departures. Changes that start and end between two reads are not
seen; the unlock messages are. Ctrl-C (or ``--duration``) ends it.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import redis

from . import inspect, layout
from .common import OK, clock, connect, report_errors, resolve_url, seconds, url_parent

HANDOFF_WINDOW = 1.0
"""Seconds after a release in which a new holder counts as a hand-off."""

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
        "messages on its channels. Ctrl-C ends it.",
    )
    parser.add_argument("name", metavar="NAME", help="the lock's name (its Redis key)")
    parser.add_argument(
        "--interval",
        type=float,
        default=0.5,
        help="seconds between reads of the lock (default: %(default)s); each message on its "
        "channels also triggers one",
    )
    parser.add_argument(
        "--duration", type=float, help="stop after this many seconds (default: until Ctrl-C)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    url = resolve_url(args.url)
    if args.interval <= 0:
        raise SystemExit("aiolock watch: --interval must be > 0")
    emit = _print_json if args.json else _print_text

    def body(stop: threading.Event, emit: Callable[[Event], None]) -> None:
        with connect(url) as client:
            watch(client, args.name, emit, interval=args.interval, stop=stop)

    return report_errors(url, lambda: until_interrupted(body, emit, args.name, args.duration))


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


def watch(
    client: redis.Redis,
    name: str,
    emit: Callable[[Event], None],
    *,
    interval: float = 0.5,
    stop: threading.Event,
) -> None:
    """Emit events about the lock ``name`` until ``stop`` is set."""
    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    try:
        pubsub.subscribe(layout.lock_channel(name), layout.rwlock_channel(name))
        pubsub.psubscribe(layout.escape_glob(layout.lock_channel(name)) + ":*")
        # Wait until the subscriptions are confirmed, so no message is missed from here on.
        confirmed = 0
        while confirmed < 3:
            reply = pubsub.parse_response(block=True, timeout=10)
            if reply is None:
                raise TimeoutError("the subscriptions were not confirmed in 10 s")
            confirmed += 1
        tracker = _Tracker(name, emit)
        tracker.start(inspect.lookup(client, name))
        next_read = time.monotonic() + interval
        while not stop.is_set():
            message = pubsub.get_message(timeout=max(0.0, next_read - time.monotonic()))
            if message is not None:
                tracker.message(_text(message["channel"]), _text(message["data"]))
            if message is not None or time.monotonic() >= next_read:
                tracker.update(inspect.lookup(client, name))
                next_read = time.monotonic() + interval
    finally:
        pubsub.close()


class _Tracker:
    """Compares successive reads of one lock and emits what changed."""

    def __init__(self, name: str, emit: Callable[[Event], None]) -> None:
        self.name = name
        self.emit = emit
        self.holds: dict[HoldKey, int] = {}
        self.mode: str | None = None
        self.queue: list[str] = []
        self.message_seen = False
        self.released_at: float | None = None

    def _emit(self, event: str, **fields: Any) -> None:
        self.emit({"event": event, "name": self.name, "time": _now(), **fields})

    def start(self, lock: inspect.SyncObject | None) -> None:
        self._take(lock)
        self._emit(
            "watching",
            type=None if lock is None else lock.type,
            holders=[_hold_json(key, count) for key, count in self.holds.items()],
            lease_ms=None if lock is None else lock.lease_ms,
            mode=self.mode,
            queue=list(self.queue),
            waiting=0 if lock is None else lock.waiting,
        )

    def message(self, channel: str, data: str) -> None:
        self.message_seen = True
        self._emit("message", channel=channel, data=data)

    def update(self, lock: inspect.SyncObject | None) -> None:
        before, before_mode, before_queue = self.holds, self.mode, self.queue
        self._take(lock)
        lease = None if lock is None else lock.lease_ms
        gone = [key for key in before if key not in self.holds]
        new = [key for key in self.holds if key not in before]
        if len(gone) == 1 and len(new) == 1:
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
                self._emit("released", owner=key[0], mode=key[1], unlock_message=self.message_seen)
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
        self.message_seen = False

    def _take(self, lock: inspect.SyncObject | None) -> None:
        if lock is None:
            self.holds, self.mode, self.queue = {}, None, []
            return
        self.holds = {(h.owner, h.mode): h.count for h in lock.holders}
        self.mode = lock.mode
        self.queue = [w.owner for w in lock.queue]


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
    if kind == "message":
        return f"message {event['data']!r} on {event['channel']}"
    if kind == "acquired":
        text = f"acquired by {_hold(event['owner'], event['mode'], event['count'])}"
        text += f", lease {seconds(event['lease_ms'])}"
        if event["after_release_ms"] is not None:
            text += f" (hand-off: {event['after_release_ms']} ms after the release was seen)"
        return text
    if kind == "released":
        how = (
            "" if event["unlock_message"] else
            " without an unlock message (the lease ran out, or the key was deleted)"
        )  # fmt: skip
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
