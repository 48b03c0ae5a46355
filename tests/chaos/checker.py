"""The history checker of the fault campaign: what every process recorded, judged.

It reads the workers' histories and the orchestrator's (see :mod:`tests.chaos.history`) and
reports violations of these kinds:

``overlap``
    Two holders of one resource at once, each within a valid lease: a lock or write lock held
    twice, a reader with a writer, more than ``cap`` permits. A hold is *valid* from its grant
    (the moment the holder learnt it) until the earliest of: its release started; its loss was
    reported (``on_lost``, a guard); its lease could have run out unrenewed (the deadline the
    client held for it when last seen, per member, combined by the hold's rule: the earliest
    member for a multi-lock, the quorum-th latest for a red lock); the server of a member lost
    its data (a restart empty: nothing can keep a lease the server forgot, but the holder must
    still be told, see ``unreported_loss``), or may have (a Sentinel failover: replication is
    asynchronous; a hold granted by the deposed master after the failover began is not
    excused).
``unreported_loss``
    A holder that believed it held what it did not, and was never told: no ``on_lost``, no
    LockLostError, yet its release said LockNotOwnedError (the client denied a hold it had
    granted), or its release reported success although, while it believed it held it, another
    holder was validly granted what it held (taken over) or its server(s) lost their data
    (a quorum of them for a red lock).
``bound``
    A call that returned later than its documented bound (``try_lock(W)`` within ``W +
    command_timeout``, a release, an ``async with`` exit and ``aclose`` within
    ``cleanup_timeout``; a cancelled call within ``cleanup_timeout`` of its cancellation),
    after subtracting the time its process was stopped (SIGSTOP) or its event loop ran late.
``token``
    A fencing token handed out twice, or one not greater than that of a hold that had ended
    before the acquisition began, across the server's restarts empty too (a lost counter
    starts again from the server's clock, above the tokens before it).
``latch``
    A latch wait that returned "open" while the latch was provably closed all along (a
    count-down whose caller left before its outcome was known may land until its client's
    background work is done).
``permits``
    A plain semaphore that ended with more permits than it was given, or fewer than its
    holders can account for.
``onlost_refused``
    ``on_lost`` refused (raised) on a hold that had just been granted.
``abandoned``
    A hold given back because the task that took it ended, although the caller it was handed
    to still held it (a permit taken in a child task: a permit id is a handle).
``lost_on_acquire``
    An acquisition raised LockLostError although its caller had released (or been told it
    lost) every hold it had taken of that object: a loss that was not the caller's.
``unexpected``
    A call raised an exception that is not an aiolock error (a bug in the library).
``leftover``
    After the campaign, with every fault healed and the clients closed: keys, subscriptions,
    connections, holds, renewals, waiters or tasks left behind, or a process that did not
    finish.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .history import Event

KINDS = (
    "overlap",
    "unreported_loss",
    "bound",
    "token",
    "latch",
    "permits",
    "onlost_refused",
    "abandoned",
    "lost_on_acquire",
    "unexpected",
    "leftover",
)

#: outcomes of a release that mean nothing is known of it (the hold may still be there)
_SETTLED = ("ok", "lost", "notowned")


@dataclass
class Call:
    pid: int
    cid: int
    op: str
    obj: str
    t0: float
    bound: float | None
    cancel_at: float | None
    hid: int | None
    actor: int | None = None
    t1: float | None = None
    out: str | None = None
    why: str | None = None

    def describe(self) -> str:
        took = "no return" if self.t1 is None else f"{self.t1 - self.t0:.4f} s"
        bound = "" if self.bound is None else f", bound {self.bound:.3f} s"
        cancel = "" if self.cancel_at is None else f", cancelled at +{self.cancel_at - self.t0:.3f}"
        who = f"{self.op} {self.obj} (pid {self.pid}, call {self.cid})"
        return f"{who}: {self.out}, {took}{bound}{cancel}"


@dataclass
class Hold:
    pid: int
    hid: int
    kind: str
    obj: str
    t: float
    res: list[tuple[str, str]]
    mode: str
    cap: int
    members: list[str]
    rule: str
    quorum: int
    token: int | None
    acquire: Call | None
    #: (when seen, the lease deadline of each member then; None: that member not held)
    samples: list[tuple[float, list[float | None]]]
    lost_at: float | None = None
    lost_why: str | None = None
    onlost_error: str | None = None
    release: Call | None = None
    valid_end: float = math.inf
    end_reason: str = ""

    @property
    def reported(self) -> bool:
        return self.lost_at is not None or (self.release is not None and self.release.out == "lost")

    def describe(self) -> str:
        rel = "never released" if self.release is None else self.release.describe()
        lost = "" if self.lost_at is None else f", loss reported at {self.lost_at:.4f}"
        token = "" if self.token is None else f", token {self.token}"
        return (
            f"{self.kind} {self.obj} hold {self.hid} of pid {self.pid}: granted at "
            f"{self.t:.4f}, valid until {self.valid_end:.4f} ({self.end_reason}){token}{lost}; "
            f"{rel}"
        )


@dataclass(frozen=True)
class Violation:
    kind: str
    message: str


@dataclass
class Report:
    violations: list[Violation] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def of(self, kind: str) -> list[Violation]:
        return [v for v in self.violations if v.kind == kind]

    def describe(self, kind: str | None = None, limit: int = 10) -> str:
        chosen = self.violations if kind is None else self.of(kind)
        lines = [f"{len(chosen)} violation(s)" + ("" if kind is None else f" of kind {kind}")]
        for violation in chosen[:limit]:
            lines.append(f"- [{violation.kind}] {violation.message}")
        if len(chosen) > limit:
            lines.append(f"  ... and {len(chosen) - limit} more")
        return "\n".join(lines)

    def summary(self) -> str:
        figures = self.figures
        lines = [
            f"seed {figures.get('seed')}: {figures.get('duration', 0):.0f} s of faults, "
            f"{figures.get('processes', 0)} worker processes",
            f"operations: {figures.get('calls', 0)} calls, {figures.get('holds', 0)} holds "
            f"granted, {figures.get('losses_reported', 0)} losses reported, "
            f"{figures.get('cancellations', 0)} cancellations",
        ]
        for title, key in (
            ("holds by type", "holds_by_type"),
            ("outcomes", "outcomes"),
            ("faults injected", "faults"),
        ):
            counted: dict[str, int] = figures.get(key, {})
            items = ", ".join(f"{k} {v}" for k, v in sorted(counted.items()))
            lines.append(f"{title}: {items or 'none'}")
        by_kind = Counter(v.kind for v in self.violations)
        items = ", ".join(f"{k} {by_kind[k]}" for k in KINDS if by_kind[k])
        lines.append(f"violations: {items or 'none'}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Limits:
    """The client configuration the bounds are documented against (seconds)."""

    command_timeout: float
    cleanup_timeout: float
    #: how much past a bound a call may end before it counts (0: the bound is the bound)
    tolerance: float = 0.0


# -- reading the histories ----------------------------------------------------------------------


@dataclass
class Campaign:
    """Everything recorded, parsed."""

    calls: list[Call]
    holds: list[Hold]
    #: server -> times it lost its data (a restart empty), or may have (a failover: what
    #: the replica had not received yet)
    wipes: dict[str, list[float]]
    #: server -> times it certainly lost its data
    certain_wipes: dict[str, list[float]]
    #: pid -> intervals it was stopped (SIGSTOP) or its event loop ran late
    paused: dict[int, list[tuple[float, float]]]
    #: pid -> when it was killed
    killed: dict[int, float]
    #: (pid, server) -> when that client's background work began (True) or ended (False)
    background: dict[tuple[int, str], list[tuple[float, bool]]]
    #: pid -> the worker's own events that are about its end (stats, tasks, end)
    endings: dict[int, list[Event]]
    orchestrator: list[Event]


def parse(workers: dict[int, list[Event]], orchestrator: Sequence[Event]) -> Campaign:
    calls: list[Call] = []
    holds: list[Hold] = []
    paused: dict[int, list[tuple[float, float]]] = defaultdict(list)
    endings: dict[int, list[Event]] = defaultdict(list)
    background: dict[tuple[int, str], list[tuple[float, bool]]] = defaultdict(list)
    for pid, events in workers.items():
        by_cid: dict[int, Call] = {}
        by_hid: dict[int, Hold] = {}
        for event in events:
            kind = event["e"]
            if kind == "inv":
                call = Call(
                    pid,
                    event["c"],
                    event["op"],
                    event["o"],
                    event["t"],
                    event.get("b"),
                    event.get("x"),
                    event.get("h"),
                    event.get("a"),
                )
                by_cid[call.cid] = call
                calls.append(call)
                if call.hid is not None and call.hid in by_hid:
                    hold = by_hid[call.hid]
                    if hold.release is None:
                        hold.release = call
            elif kind == "ret":
                call = by_cid[event["c"]]
                call.t1 = event["t"]
                call.out = event["out"]
                call.why = event.get("why")
            elif kind == "hold":
                members = list(event["members"])
                hold = Hold(
                    pid,
                    event["h"],
                    event["k"],
                    event["o"],
                    event["t"],
                    [(server, name) for server, name in event["res"]],
                    event["mode"],
                    event.get("cap", 1),
                    members,
                    event["rule"],
                    event.get("q", len(members)),
                    event.get("tok"),
                    by_cid.get(event["c"]),
                    [],
                )
                by_hid[hold.hid] = hold
                holds.append(hold)
            elif kind == "lease":
                by_hid[event["h"]].samples.append((event["t"], list(event["d"])))
            elif kind == "lost":
                hold = by_hid[event["h"]]
                if hold.lost_at is None:
                    hold.lost_at = event["t"]
                    hold.lost_why = event.get("why")
            elif kind == "onlost":
                by_hid[event["h"]].onlost_error = event["err"]
            elif kind == "stall":
                paused[pid].append((event["t0"], event["t1"]))
            elif kind == "bg":
                background[(pid, event["s"])].append((event["t"], event["busy"]))
            elif kind in ("stats", "tasks", "end", "start", "ready"):
                endings[pid].append(event)
    wipes: dict[str, list[float]] = defaultdict(list)
    certain: dict[str, list[float]] = defaultdict(list)
    killed: dict[int, float] = {}
    for event in orchestrator:
        kind = event["e"]
        if kind == "wipe":
            wipes[event["server"]].append(event["t"])
            certain[event["server"]].append(event["t"])
        elif kind == "failover":
            wipes[event["server"]].append(event["t"])
        elif kind == "stop":
            paused[event["pid"]].append((event["t0"], event["t1"]))
        elif kind == "kill":
            killed[event["pid"]] = event["t"]
    for times in (*wipes.values(), *certain.values()):
        times.sort()
    for hold in holds:
        _validity(hold, wipes)
    return Campaign(
        calls, holds, wipes, certain, paused, killed, dict(background), endings, list(orchestrator)
    )


def _first_after(times: Iterable[float], start: float) -> float:
    return min((t for t in times if t > start), default=math.inf)


def _lease_end(hold: Hold, member: int) -> float:
    """When a member's lease could first have run out unrenewed, as its holder saw it.

    The samples are walked in order: the deadline only grows while the member is seen held;
    once an observation comes at or after the deadline (it passed unrenewed in between), or
    finds the member not held, the lease ended there. What is seen after that (a background
    settlement registering a late grant on the same owner, say) is another generation and
    does not make the past valid again. The first sample is taken right at the grant."""
    deadline: float | None = None
    for seen, deadlines in hold.samples:
        if deadline is not None and seen >= deadline:
            return deadline
        current = deadlines[member]
        if current is None:
            return seen if deadline is None else min(seen, deadline)
        deadline = current if deadline is None else max(deadline, current)
    return hold.t if deadline is None else deadline


def _validity(hold: Hold, wipes: dict[str, list[float]]) -> None:
    """Set ``hold.valid_end`` and the reason it ends there."""
    ends: list[float] = []
    # A server that lost its data after the acquisition began may have granted it just before
    # (the grant is recorded when its reply arrives): which instance granted it is unknown.
    began = _began(hold)
    for index, server in enumerate(hold.members):
        lease_end = math.inf if hold.rule == "none" else _lease_end(hold, index)
        ends.append(min(lease_end, _first_after(wipes.get(server, ()), began)))
    if not ends:
        lease = math.inf
    elif hold.rule == "quorum":
        lease = sorted(ends, reverse=True)[hold.quorum - 1]
    elif hold.rule in ("all", "one", "none"):
        lease = min(ends)
    else:
        raise ValueError(f"unknown rule {hold.rule!r}")
    candidates = [(lease, "lease or server data")]
    if hold.release is not None:
        candidates.append((hold.release.t0, "release started"))
    if hold.lost_at is not None:
        candidates.append((hold.lost_at, "loss reported"))
    hold.valid_end, hold.end_reason = min(candidates)
    if hold.end_reason == "lease or server data":
        wiped = any(_first_after(wipes.get(s, ()), hold.t) == hold.valid_end for s in hold.members)
        hold.end_reason = "server lost its data" if wiped else "lease could have run out"


# -- the checks ---------------------------------------------------------------------------


def check(
    workers: dict[int, list[Event]],
    orchestrator: Sequence[Event],
    limits: Limits,
    *,
    figures: dict[str, Any] | None = None,
) -> Report:
    """Judge a campaign: every violation found, and its figures."""
    campaign = parse(workers, orchestrator)
    report = Report(figures=dict(figures or {}))
    report.violations.extend(check_overlaps(campaign.holds))
    report.violations.extend(check_unreported_losses(campaign.holds, campaign.certain_wipes))
    report.violations.extend(check_bounds(campaign, limits))
    report.violations.extend(check_tokens(campaign.holds))
    report.violations.extend(check_latch(campaign.calls, campaign.wipes, campaign.background))
    report.violations.extend(check_permits(campaign))
    report.violations.extend(
        Violation("onlost_refused", f"on_lost raised {h.onlost_error!r}: {h.describe()}")
        for h in campaign.holds
        if h.onlost_error is not None
    )
    report.violations.extend(
        Violation("abandoned", h.describe()) for h in campaign.holds if _abandoned(h)
    )
    report.violations.extend(check_lost_on_acquire(campaign))
    report.violations.extend(
        Violation("unexpected", f"{c.describe()}: {c.why}")
        for c in campaign.calls
        if c.out is not None and c.out.startswith("bug:")
    )
    report.violations.extend(check_leftovers(campaign, workers))
    report.figures.update(_figures(campaign))
    return report


def _conflicts(mode: str, cap: int, active: Sequence[Hold], modes: dict[int, str]) -> bool:
    """Whether a hold of ``mode`` conflicts with the ``active`` ones."""
    if mode == "x":
        return bool(active)
    if mode == "s":
        return any(modes[id(other)] == "x" for other in active)
    return len(active) + 1 > cap  # "c": one of cap permits


def check_overlaps(holds: Sequence[Hold]) -> list[Violation]:
    violations: list[Violation] = []
    for resource, entries in _by_resource(holds).items():
        modes = {id(hold): mode for hold, mode in entries}
        ordered = sorted((h for h, _ in entries if h.valid_end > h.t), key=lambda h: h.t)
        active: list[Hold] = []
        for hold in ordered:
            active = [other for other in active if other.valid_end > hold.t]
            mode = modes[id(hold)]
            if _conflicts(mode, hold.cap, active, modes):
                others = [o for o in active if mode != "s" or modes[id(o)] == "x"]
                overlap = min(min(o.valid_end for o in others), hold.valid_end) - hold.t
                lines = "; ".join(o.describe() for o in others)
                violations.append(
                    Violation(
                        "overlap",
                        f"{resource[1]}@{resource[0]}: {hold.describe()} overlaps for "
                        f"{overlap:.4f} s with {len(others)} valid holder(s): {lines}",
                    )
                )
            active.append(hold)
    return violations


def _by_resource(holds: Iterable[Hold]) -> dict[tuple[str, str], list[tuple[Hold, str]]]:
    result: dict[tuple[str, str], list[tuple[Hold, str]]] = defaultdict(list)
    for hold in holds:
        for resource in hold.res:
            result[resource].append((hold, hold.mode))
    return result


def check_unreported_losses(
    holds: Sequence[Hold], wipes: dict[str, list[float]]
) -> list[Violation]:
    violations: list[Violation] = []
    by_resource = _by_resource(holds)
    for hold in holds:
        if hold.reported or hold.release is None or hold.rule == "none":
            continue  # told, never released, or a plain permit (it cannot be lost)
        if hold.release.out == "notowned":
            violations.append(
                Violation(
                    "unreported_loss",
                    f"{hold.describe()}: its release said LockNotOwnedError, and no loss "
                    "was reported",
                )
            )
            continue
        if hold.release.out != "ok":
            continue
        believed = (hold.t, hold.release.t0)
        wiped = [
            s for s in hold.members if _first_after(wipes.get(s, ()), believed[0]) < believed[1]
        ]
        limit = 1 if hold.rule != "quorum" else len(hold.members) - hold.quorum + 1
        if len(wiped) >= limit:
            violations.append(
                Violation(
                    "unreported_loss",
                    f"{hold.describe()}: released 'successfully' although server(s) "
                    f"{', '.join(wiped)} lost their data while it was held",
                )
            )
            continue
        for resource in hold.res:
            taker = _taken_over(hold, by_resource[resource], believed)
            if taker is not None:
                violations.append(
                    Violation(
                        "unreported_loss",
                        f"{hold.describe()}: released 'successfully' although "
                        f"{taker.describe()} was granted {resource[1]}@{resource[0]} meanwhile",
                    )
                )
                break
    return violations


def _taken_over(
    hold: Hold, entries: Sequence[tuple[Hold, str]], window: tuple[float, float]
) -> Hold | None:
    """A hold granted after ``hold``, validly, what ``hold`` held, at an instant in
    ``window``, such that ``hold`` could not have held it too (for permits: the others alone
    used every permit then); None if none."""
    start, end = window
    others = [
        (other, mode)
        for other, mode in entries
        if other is not hold
        and other.t < end
        and other.valid_end > start
        and other.valid_end > other.t
    ]
    later = [(other, mode) for other, mode in others if other.t > hold.t]
    if hold.mode == "x":
        return later[0][0] if later else None
    if hold.mode == "s":
        return next((other for other, mode in later if mode == "x"), None)
    for point in sorted({max(start, other.t) for other, _ in later}):
        at = [other for other, _ in others if other.t <= point < other.valid_end]
        if len(at) >= hold.cap:
            return max(at, key=lambda other: other.t)
    return None


def _excused(pauses: Sequence[tuple[float, float]], t0: float, t1: float) -> float:
    """Seconds of [t0, t1] that the process was stopped or its loop late (their union)."""
    total = 0.0
    reached = t0
    for a, b in sorted(pauses):
        a, b = max(a, reached), min(b, t1)
        if b > a:
            total += b - a
            reached = b
    return total


def check_bounds(campaign: Campaign, limits: Limits) -> list[Violation]:
    violations: list[Violation] = []
    for call in campaign.calls:
        if call.t1 is None:
            continue  # killed during the call (a hang shows as an unfinished worker)
        if call.out == "cancelled" and call.cancel_at is not None:
            limit = call.cancel_at + limits.cleanup_timeout
            what = f"cancellation + cleanup_timeout {limits.cleanup_timeout}"
        elif call.bound is not None:
            limit = call.t0 + call.bound
            what = f"bound {call.bound:.3f} s"
        else:
            continue
        over = call.t1 - limit
        if over <= limits.tolerance:
            continue
        excused = _excused(campaign.paused.get(call.pid, ()), call.t0, call.t1)
        if over - excused > limits.tolerance:
            violations.append(
                Violation(
                    "bound",
                    f"{call.describe()}: {over * 1000:.1f} ms past its {what}"
                    + (f" ({excused * 1000:.1f} ms of it stopped or late)" if excused else ""),
                )
            )
    return violations


def _began(hold: Hold) -> float:
    """When the acquisition that granted ``hold`` began (its script ran after that)."""
    return hold.acquire.t0 if hold.acquire is not None else hold.t


def _ended(hold: Hold) -> float:
    """When ``hold`` had certainly ended, token and all: its validity's end, or its grant
    if that came later (the token was handed out at some point before the grant)."""
    return max(hold.valid_end, hold.t)


def check_tokens(holds: Sequence[Hold]) -> list[Violation]:
    violations: list[Violation] = []
    fenced: dict[tuple[str, str], list[tuple[int, Hold]]] = defaultdict(list)
    for hold in holds:
        if hold.token is not None:
            fenced[hold.res[0]].append((hold.token, hold))
    for (server, name), group in fenced.items():
        seen: dict[int, Hold] = {}
        for token, hold in sorted(group, key=lambda item: item[1].t):
            if token in seen:
                violations.append(
                    Violation(
                        "token",
                        f"{name}@{server}: token {token} handed out twice: "
                        f"{seen[token].describe()}; {hold.describe()}",
                    )
                )
            seen[token] = hold
        # A hold ended at the end of its validity, but never before its grant: a lease
        # that ran out while the reply was on its way ends the hold's validity before it
        # was granted, not before the token was handed out (at some point up to the grant)
        ended = sorted(group, key=lambda item: _ended(item[1]))
        index = 0
        best: tuple[int, Hold] | None = None
        for token, hold in sorted(group, key=lambda item: _began(item[1])):
            while index < len(ended) and _ended(ended[index][1]) <= _began(hold):
                if best is None or ended[index][0] > best[0]:
                    best = ended[index]
                index += 1
            if best is not None and token <= best[0]:
                violations.append(
                    Violation(
                        "token",
                        f"{name}@{server}: {hold.describe()} got token {token}, not above "
                        f"{best[0]} of {best[1].describe()}, which had ended before the "
                        "acquisition began",
                    )
                )
    return violations


def check_latch(
    calls: Sequence[Call],
    wipes: dict[str, list[float]],
    background: dict[tuple[int, str], list[tuple[float, bool]]] | None = None,
) -> list[Violation]:
    """A wait that saw the latch open while it was provably closed: some close C (a
    ``try_set_count`` that set it) had returned before the wait began, and nothing that may
    open it (a count-down to 0, one whose outcome is unknown, a server losing its data) can
    have run after C and before the wait returned. The latest-starting such C is the one to
    try: a later close leaves fewer openers after it.

    A count-down whose caller left before its outcome was known (cancelled, or told it is
    unknown) is finished by the client in the background: it may land until that client's
    background work is next seen done (``background``, see ``BackgroundWatch``), or at any
    time if the process recorded none of that."""
    violations: list[Violation] = []
    background = background or {}
    by_latch: dict[str, list[Call]] = defaultdict(list)
    for call in calls:
        if call.op.startswith("latch_"):
            by_latch[call.obj].append(call)
    for obj, group in by_latch.items():
        server = obj.partition("@")[2]
        closes = sorted(
            (c for c in group if c.op == "latch_set" and c.out == "set" and c.t1 is not None),
            key=lambda c: c.t1 or 0.0,
        )
        openers = [
            c
            for c in group
            if c.op == "latch_down"
            and c.out != "err:LockStateError"  # refused: it was open
            and not (c.out is not None and c.out.startswith("count:") and c.out != "count:0")
        ]  # a count-down of a killed process (no return) may have run too
        openers.sort(key=lambda c: c.t0)
        starts = [o.t0 for o in openers]
        latest_end: list[float] = []  # prefix maximum of when the openers ended
        for opener in openers:
            end = _may_land_until(opener, background.get((opener.pid, server)))
            latest_end.append(max(end, latest_end[-1]) if latest_end else end)
        close_ends = [c.t1 or 0.0 for c in closes]
        best_start: list[tuple[float, Call]] = []  # prefix maximum of the closes' starts
        for close in closes:
            if not best_start or close.t0 > best_start[-1][0]:
                best_start.append((close.t0, close))
            else:
                best_start.append(best_start[-1])
        for wait in group:
            if wait.op != "latch_wait" or wait.out != "open" or wait.t1 is None:
                continue
            i = bisect.bisect_right(close_ends, wait.t0)
            if i == 0:
                continue  # no close had returned: it may never have been closed
            start, close = best_start[i - 1]
            j = bisect.bisect_left(starts, wait.t1)
            opened = j > 0 and latest_end[j - 1] > start
            wiped = _first_after(wipes.get(server, ()), start) < wait.t1
            if not opened and not wiped:
                violations.append(
                    Violation(
                        "latch",
                        f"{wait.describe()} returned open, but {close.describe()} had closed "
                        "the latch and nothing could have opened it since",
                    )
                )
    return violations


def _may_land_until(call: Call, background: Sequence[tuple[float, bool]] | None) -> float:
    """Until when the write of ``call`` may take effect on the server: its return if its
    outcome was known then; else the end of its client's background work under way then
    (``background``: when it began and ended; None: not recorded, so any time)."""
    if call.t1 is None:
        return math.inf  # killed during the call
    if call.out is not None and call.out.startswith("count:"):
        return call.t1  # it ran, and said so
    if not background:
        return math.inf
    index = bisect.bisect_right(background, (call.t1, True))
    if index and not background[index - 1][1]:
        return call.t1  # nothing in the background: it was finished before it returned
    return next((t for t, busy in background[index:] if not busy), math.inf)


def _abandoned(hold: Hold) -> bool:
    """Given back because the task that took it ended: so its loss says; or taken in a child
    task (which ends as it hands the permit over) and lost at once (no fault of a campaign
    ends a 1.5 s lease within 0.1 s of its grant)."""
    if hold.lost_why is not None and "task ended" in hold.lost_why:
        return True
    return (
        hold.acquire is not None
        and hold.acquire.op == "try_lock_child"
        and hold.lost_at is not None
        and hold.lost_at - hold.t < 0.1
    )


#: the calls that take something
ACQUIRES = ("try_lock", "lock", "try_lock_child", "with_enter", "guard_enter")


def check_lost_on_acquire(campaign: Campaign) -> list[Violation]:
    """Acquisitions that raised LockLostError although the actor held nothing of the object:
    every hold it had taken of it ended with a settled release (or a reported loss)."""
    violations: list[Violation] = []
    holds_by_call = {(h.pid, h.acquire.cid): h for h in campaign.holds if h.acquire is not None}
    history: dict[tuple[int, int | None, str], list[Call]] = defaultdict(list)
    for call in campaign.calls:
        if call.op in ACQUIRES:
            history[(call.pid, call.actor, call.obj)].append(call)
    for calls in history.values():
        for index, call in enumerate(calls):
            if call.out != "lost":
                continue
            earlier = [holds_by_call.get((c.pid, c.cid)) for c in calls[:index]]
            unsettled = [
                h
                for h in earlier
                if h is not None and not (h.release is not None and h.release.out in _SETTLED)
            ]
            if not unsettled:
                violations.append(
                    Violation(
                        "lost_on_acquire",
                        f"{call.describe()}: {call.why}; every earlier hold of this caller on "
                        "it had been released",
                    )
                )
    return violations


def check_permits(campaign: Campaign) -> list[Violation]:
    violations: list[Violation] = []
    for event in campaign.orchestrator:
        if event["e"] != "semaphore":
            continue
        obj, available, cap = event["name"], event["available"], event["cap"]
        if available > cap:
            violations.append(
                Violation("permits", f"{obj} ended with {available} permits, given {cap}")
            )
            continue
        unknown = sum(
            1
            for hold in campaign.holds
            if hold.obj == obj and (hold.release is None or hold.release.out not in _SETTLED)
        ) + sum(
            1
            for call in campaign.calls
            if call.obj == obj
            and call.op == "acquire"
            and (call.out is None or call.out == "cancelled" or call.out.startswith("err:"))
        )
        if cap - available > unknown:
            violations.append(
                Violation(
                    "permits",
                    f"{obj} ended with {available} of {cap} permits, but only {unknown} "
                    "holder(s) or acquisitions could have kept theirs",
                )
            )
    return violations


#: client statistics that must be zero once every actor has finished (and after closing)
_IDLE_ZERO = (
    "commands_in_flight",
    "subscriptions",
    "tasks_waiting",
    "renewals",
    "background_tasks",
)


def check_leftovers(campaign: Campaign, workers: dict[int, list[Event]]) -> list[Violation]:
    violations = [
        Violation("leftover", f"{e['what']}: {e['detail']}")
        for e in campaign.orchestrator
        if e["e"] == "leftover"
    ]
    for pid in workers:
        if pid in campaign.killed:
            continue
        endings = campaign.endings.get(pid, [])
        if not any(e["e"] == "end" for e in endings):
            violations.append(Violation("leftover", f"worker pid {pid} did not finish cleanly"))
        for event in endings:
            if event["e"] == "stats":
                stats = event["stats"]
                bad = {k: stats[k] for k in _IDLE_ZERO if stats.get(k)}
                holds = {k: v for k, v in stats.get("holds", {}).items() if v and k != "released"}
                if event["phase"] == "closed" and stats.get("links"):
                    bad["links"] = stats["links"]
                if bad or holds:
                    violations.append(
                        Violation(
                            "leftover",
                            f"pid {pid}, client of {event['server']} ({event['phase']}): "
                            f"{bad} holds {holds}",
                        )
                    )
            elif event["e"] == "tasks" and event["n"]:
                violations.append(
                    Violation(
                        "leftover",
                        f"pid {pid}: {event['n']} asyncio task(s) left after closing: "
                        f"{event['names']}",
                    )
                )
    return violations


def _figures(campaign: Campaign) -> dict[str, Any]:
    outcomes = Counter(
        (c.out or "no return").split(":")[0] for c in campaign.calls if c.op != "aclose"
    )
    faults = Counter(e["kind"] for e in campaign.orchestrator if e["e"] == "fault")
    return {
        "calls": len(campaign.calls),
        "holds": len(campaign.holds),
        "holds_by_type": dict(Counter(h.kind for h in campaign.holds)),
        "losses_reported": sum(1 for h in campaign.holds if h.reported),
        "cancellations": sum(1 for c in campaign.calls if c.out == "cancelled"),
        "outcomes": dict(outcomes),
        "faults": dict(faults),
    }
