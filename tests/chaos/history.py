"""The histories a fault campaign writes and its checker reads.

Every process of a campaign appends JSON lines to a file of its own: one object per event,
its kind under ``"e"``, times in seconds on ``time.monotonic()`` (CLOCK_MONOTONIC, one clock
for every process of a Linux machine, so events of different processes compare). A line is
written with one ``write`` call as soon as the event happens, so a process killed with
SIGKILL loses nothing it had recorded.

A worker's events (``c``: a call id, ``h``: a hold id; both unique within the process)::

    start   pid worker gen t                  the process started
    ready   t                                 its clients are open, its actors start
    inv     c op o t [b] [x] [h] [w] [l]      a call started: operation, object, bound
                                              (seconds; none: undocumented), when a
                                              cancellation of it is due (x), the hold it
                                              is about (h), wait time (w), lease (l)
    ret     c t out [tok] [why]               it returned: granted | busy | ok | lost |
                                              notowned | cancelled | err:<Type> |
                                              bug:<Type> (an exception no caller expects),
                                              or a value (a latch count, open, closed)
    hold    h c o t res mode cap members rule q [tok]
                                              a grant: resources [[server, name], ...]
                                              held in mode x (exclusive), s (shared) or
                                              c (one of cap permits); the member servers
                                              whose leases make it, and the rule over them:
                                              one, all (multi-lock), quorum q (red lock)
    lease   h t d                             the hold's lease deadlines now, one per
                                              member (null: that member is not held)
    lost    h t why                           the loss was reported (on_lost, a guard)
    onlost  h t err                           registering on_lost on it raised
    stall   t0 t1                             the event loop ran late (or was stopped)
    bg      s busy t                          the client of server s has background work
                                              (busy: true) or none left (false); the
                                              first one, at the start, says none
    stats   phase server stats                a client's statistics() at the end
    tasks   n names                           asyncio tasks left after every client closed
    end     t                                 the process finished cleanly

The orchestrator's events::

    proc    pid worker gen t                  a worker process was started
    kill    pid t                             it was killed (SIGKILL)
    stop    pid t0 t1                         it was stopped (SIGSTOP .. SIGCONT)
    exit    pid t rc                          it ended (rc: its exit status)
    wipe    server t                          a server lost its data (killed)
    fault   kind target t0 t1 [detail]        a fault, from injection to healing
    leftover what detail                      something left after the campaign
    semaphore name available cap              a plain semaphore's permits at the end
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

Event = dict[str, Any]


def now() -> float:
    """The campaign's clock (CLOCK_MONOTONIC: the same for every process of the machine)."""
    return time.monotonic()


class Recorder:
    """Appends events to a history file, one line per event, written at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = path.open("a", buffering=1, encoding="utf-8")

    def write(self, event: Event) -> None:
        if self._file is not None:
            self._file.write(json.dumps(event, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_events(path: Path) -> list[Event]:
    """The events of one history file; a last line cut short by SIGKILL is skipped."""
    events: list[Event] = []
    with path.open(encoding="utf-8") as file:
        for line in file:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by SIGKILL
    return events


def worker_files(directory: Path) -> Iterator[Path]:
    return iter(sorted(directory.glob("worker-*.jsonl")))
