"""The campaign's history checker on hand-made histories: each violation it must find, and
the near misses it must let pass (a checker that cannot fail proves nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.chaos.checker import Limits, Report, check
from tests.chaos.history import Event, Recorder, read_events

LIMITS = Limits(command_timeout=0.5, cleanup_timeout=1.0)


class Worker:
    """Writes the events of one worker process, as tests.chaos.worker does."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.events: list[Event] = [{"e": "start", "pid": pid, "worker": 0, "gen": 0, "t": 0.0}]
        self.cids = 0
        self.hids = 0

    def call(
        self,
        op: str,
        obj: str,
        t0: float,
        t1: float | None,
        out: str | None,
        *,
        bound: float | None = None,
        cancel_at: float | None = None,
        hid: int | None = None,
        actor: int = 0,
        why: str | None = None,
    ) -> int:
        self.cids += 1
        inv: Event = {
            "e": "inv",
            "c": self.cids,
            "op": op,
            "o": obj,
            "k": "lock",
            "t": t0,
            "b": bound,
            "a": actor,
        }
        if cancel_at is not None:
            inv["x"] = cancel_at
        if hid is not None:
            inv["h"] = hid
        self.events.append(inv)
        if t1 is not None:
            self.events.append({"e": "ret", "c": self.cids, "t": t1, "out": out, "why": why})
        return self.cids

    def hold(
        self,
        obj: str,
        granted: float,
        deadline: float | list[float | None] | None,
        *,
        asked: float | None = None,
        res: list[list[str]] | None = None,
        mode: str = "x",
        cap: int = 1,
        members: list[str] | None = None,
        rule: str = "one",
        quorum: int = 1,
        token: int | None = None,
        kind: str = "lock",
        actor: int = 0,
    ) -> int:
        """A grant of ``obj`` (``name@server``) at ``granted``, valid until ``deadline``."""
        name, _, server = obj.partition("@")
        asked = granted - 0.001 if asked is None else asked
        cid = self.call("try_lock", obj, asked, granted, "granted", bound=asked + 10, actor=actor)
        self.hids += 1
        members = members or [server]
        event: Event = {
            "e": "hold",
            "h": self.hids,
            "c": cid,
            "k": kind,
            "o": obj,
            "t": granted,
            "res": res or [[server, name]],
            "mode": mode,
            "cap": cap,
            "members": members,
            "rule": rule,
            "q": quorum,
        }
        if token is not None:
            event["tok"] = token
        self.events.append(event)
        if deadline is not None:
            self.lease(self.hids, granted, deadline)
        return self.hids

    def lease(self, hid: int, t: float, deadline: float | list[float | None]) -> None:
        d = deadline if isinstance(deadline, list) else [deadline]
        self.events.append({"e": "lease", "h": hid, "t": t, "d": d})

    def lost(self, hid: int, t: float, why: str = "its lease ran out") -> None:
        self.events.append({"e": "lost", "h": hid, "t": t, "why": why})

    def release(
        self, hid: int, t0: float, t1: float | None = None, out: str = "ok", obj: str = "L0@s0"
    ) -> int:
        t1 = t0 + 0.001 if t1 is None else t1
        return self.call("unlock", obj, t0, t1, out, bound=1.0, hid=hid)

    def finish(self, t: float = 100.0) -> None:
        self.events.append({"e": "end", "t": t})


def judge(*workers: Worker, orchestrator: list[Event] | None = None) -> Report:
    for worker in workers:
        if not any(e["e"] == "end" for e in worker.events):
            worker.finish()
    return check({w.pid: w.events for w in workers}, orchestrator or [], LIMITS)


def kinds(report: Report) -> list[str]:
    return sorted({v.kind for v in report.violations})


def test_holds_one_after_the_other_pass() -> None:
    a, b = Worker(1), Worker(2)
    h = a.hold("L0@s0", 1.0, 31.0)
    a.release(h, 2.0)
    h = b.hold("L0@s0", 2.01, 32.0)
    b.release(h, 3.0)
    assert judge(a, b).violations == []


def test_two_holders_within_their_leases_overlap() -> None:
    a, b = Worker(1), Worker(2)
    h = a.hold("L0@s0", 1.0, 31.0)
    a.release(h, 3.0)
    h = b.hold("L0@s0", 2.0, 32.0)
    b.release(h, 4.0)
    report = judge(a, b)
    assert kinds(report) == ["overlap", "unreported_loss"]
    assert "overlaps for 1.0000 s" in report.of("overlap")[0].message


def test_a_hold_is_valid_until_its_lease_could_have_run_out() -> None:
    """A holder paused past its deadline (recorded when last seen) holds nothing valid after
    it: a grant to another holder then is no overlap, and a reported loss is no violation."""
    a, b = Worker(1), Worker(2)
    h = a.hold("L0@s0", 1.0, 2.5)
    a.lease(h, 1.5, 3.0)  # renewed once
    h2 = b.hold("L0@s0", 3.1, 33.0)
    b.release(h2, 3.5)
    a.lost(h, 5.0)
    a.release(h, 5.1, out="lost")
    assert judge(a, b).violations == []
    # one more renewal seen (deadline 4.0): the same grant overlaps
    a2 = Worker(1)
    h = a2.hold("L0@s0", 1.0, 2.5)
    a2.lease(h, 1.5, 3.0)
    a2.lease(h, 2.0, 4.0)
    a2.lost(h, 5.0)
    a2.release(h, 5.1, out="lost")
    assert kinds(judge(a2, b)) == ["overlap"]


def test_a_lease_seen_run_out_stays_run_out() -> None:
    """Seen again only after its deadline (a process stopped meanwhile), held with a later
    deadline (a background settlement registered a late grant on the same owner): the hold
    ended at its deadline; the later one does not make the past valid."""
    a, b = Worker(1), Worker(2)
    h = a.hold("L0@s0", 1.0, 2.5)
    a.lease(h, 4.0, 5.0)
    a.lost(h, 4.01)
    a.release(h, 4.1, out="lost")
    h2 = b.hold("L0@s0", 3.1, 33.0)
    b.release(h2, 3.5)
    assert judge(a, b).violations == []
    # seen not held any more: ended then
    c = Worker(1)
    h = c.hold("L0@s0", 1.0, 31.0)
    c.lease(h, 2.0, [None])
    c.lost(h, 3.5)
    c.release(h, 3.6, out="lost")
    assert judge(c, b).violations == []


def test_a_loss_reported_ends_validity() -> None:
    a, b = Worker(1), Worker(2)
    h = a.hold("L0@s0", 1.0, 31.0)
    a.lost(h, 2.0, "the watchdog found the lock gone")
    a.release(h, 2.5, out="lost")
    h2 = b.hold("L0@s0", 2.1, 32.0)
    b.release(h2, 3.0)
    assert judge(a, b).violations == []


def test_a_takeover_never_reported_is_an_unreported_loss() -> None:
    a, b = Worker(1), Worker(2)
    h = a.hold("L0@s0", 1.0, 2.5)  # then stopped past its lease, and not told
    h2 = b.hold("L0@s0", 3.0, 33.0)
    b.release(h2, 3.5)
    a.release(h, 5.0, out="ok")
    report = judge(a, b)
    assert kinds(report) == ["unreported_loss"]
    assert "was granted L0@s0 meanwhile" in report.of("unreported_loss")[0].message


def test_a_release_that_denies_a_granted_hold_is_an_unreported_loss() -> None:
    a = Worker(1)
    h = a.hold("P0@s0", 1.0, 31.0, mode="c", cap=2)
    a.release(h, 2.0, out="notowned", obj="P0@s0")
    assert kinds(judge(a)) == ["unreported_loss"]
    # the same, with the loss reported first: told
    b = Worker(2)
    h = b.hold("P0@s0", 1.0, 31.0, mode="c", cap=2)
    b.lost(h, 1.5)
    b.release(h, 2.0, out="notowned", obj="P0@s0")
    assert judge(b).violations == []


def test_a_server_that_lost_its_data_ends_validity_but_must_be_reported() -> None:
    wipe = [{"e": "wipe", "server": "s0", "t": 2.0}]
    a, b = Worker(1), Worker(2)
    h = a.hold("L0@s0", 1.0, 31.0)
    h2 = b.hold("L0@s0", 2.5, 32.5)  # the new, empty server let b in: not an overlap
    b.release(h2, 2.8)
    a.lost(h, 3.0, "the watchdog found the lock gone")
    a.release(h, 3.1, out="lost")
    assert judge(a, b, orchestrator=wipe).violations == []
    # never told: the release said "ok" after the server forgot the hold
    c = Worker(3)
    h = c.hold("L0@s0", 1.0, 31.0)
    c.release(h, 2.2, out="ok")
    report = judge(c, orchestrator=wipe)
    assert kinds(report) == ["unreported_loss"]
    assert "lost their data" in report.violations[0].message


def test_a_failover_may_lose_a_hold_but_never_excuses_a_later_grant() -> None:
    """Replication is asynchronous: a hold granted before a failover may be gone on the new
    master (no overlap; but a holder whose lock another was then granted must be told), and
    two grants after it (one by the deposed master) overlap."""
    failover = [{"e": "failover", "server": "sn", "t": 2.0}]
    a, b = Worker(1), Worker(2)
    h = a.hold("N0@sn", 1.0, 31.0)
    h2 = b.hold("N0@sn", 2.5, 32.5)
    b.release(h2, 2.8, obj="N0@sn")
    a.release(h, 3.0, obj="N0@sn")
    assert kinds(judge(a, b, orchestrator=failover)) == ["unreported_loss"]
    e = Worker(1)
    h = e.hold("N0@sn", 1.0, 31.0)
    e.release(h, 3.0, obj="N0@sn")
    assert judge(e, orchestrator=failover).violations == []  # it may well have survived
    c, d = Worker(3), Worker(4)
    h = c.hold("N0@sn", 2.1, 32.1)  # granted by the deposed master, after the failover began
    c.release(h, 3.0, obj="N0@sn")
    h = d.hold("N0@sn", 2.5, 32.5)
    d.release(h, 2.8, obj="N0@sn")
    assert "overlap" in kinds(judge(c, d, orchestrator=failover))


def test_a_grant_whose_acquisition_straddled_a_restart_is_not_trusted() -> None:
    """Recorded after the server was killed, its grant may still come from the old server
    (its script ran just before): a hold of the new server then is no overlap."""
    wipe = [{"e": "wipe", "server": "s0", "t": 2.0}]
    a, b = Worker(1), Worker(2)
    h = a.hold("L0@s0", 2.01, 32.0, asked=1.9)
    a.lost(h, 3.0)
    a.release(h, 3.1, out="lost")
    h2 = b.hold("L0@s0", 2.5, 32.5, asked=2.3)
    b.release(h2, 2.8)
    assert judge(a, b, orchestrator=wipe).violations == []


def test_readers_share_writers_exclude() -> None:
    a, b, c = Worker(1), Worker(2), Worker(3)
    for worker in (a, b):
        h = worker.hold("W0@s0", 1.0, 31.0, mode="s", kind="read_lock")
        worker.release(h, 3.0, obj="W0@s0")
    assert judge(a, b).violations == []
    h = c.hold("W0@s0", 2.0, 32.0, mode="x", kind="write_lock")
    c.release(h, 2.5, obj="W0@s0")
    report = judge(a, b, c)
    assert [v.kind for v in report.violations].count("overlap") == 1


def test_permits_are_counted_against_their_capacity() -> None:
    workers = [Worker(pid) for pid in (1, 2, 3)]
    for i, worker in enumerate(workers[:2]):
        h = worker.hold("P0@s0", 1.0 + i * 0.1, 31.0, mode="c", cap=2)
        worker.release(h, 3.0, obj="P0@s0")
    assert judge(*workers[:2]).violations == []
    h = workers[2].hold("P0@s0", 2.0, 32.0, mode="c", cap=2)
    workers[2].release(h, 2.5, obj="P0@s0")
    assert "overlap" in kinds(judge(*workers))


def test_a_plain_permit_of_a_killed_holder_is_held_for_ever() -> None:
    """A plain semaphore's permit has no lease: a holder killed with it leaks it, so it
    still counts against the capacity afterwards."""
    a, b, c = Worker(1), Worker(2), Worker(3)
    a.hold("S0@s3", 1.0, None, mode="c", cap=2, rule="none", kind="semaphore")
    kill = [{"e": "kill", "pid": 1, "t": 1.5}]
    h = b.hold("S0@s3", 2.0, None, mode="c", cap=2, rule="none", kind="semaphore")
    b.release(h, 3.0, obj="S0@s3")
    assert judge(a, b, orchestrator=kill).violations == []
    h = c.hold("S0@s3", 2.5, None, mode="c", cap=2, rule="none", kind="semaphore")
    c.release(h, 2.7, obj="S0@s3")
    assert kinds(judge(a, b, c, orchestrator=kill)) == ["overlap"]


def test_a_red_lock_stays_valid_while_a_quorum_of_members_is() -> None:
    red: dict[str, Any] = {
        "res": [["red", "RL"]],
        "members": ["s0", "s1", "s2"],
        "rule": "quorum",
        "quorum": 2,
        "kind": "red_lock",
    }
    one_wipe = [{"e": "wipe", "server": "s1", "t": 2.0}]
    a, b = Worker(1), Worker(2)
    h = a.hold("RL@red", 1.0, [31.0, 31.0, 31.0], **red)
    a.release(h, 4.0, obj="RL@red")
    h2 = b.hold("RL@red", 3.0, [33.0, 33.0, 33.0], **red)
    b.release(h2, 3.5, obj="RL@red")
    assert "overlap" in kinds(judge(a, b, orchestrator=one_wipe))
    two_wipes = [*one_wipe, {"e": "wipe", "server": "s2", "t": 2.5}]
    report = judge(a, b, orchestrator=two_wipes)
    assert "overlap" not in kinds(report)
    assert kinds(report) == ["unreported_loss"]  # a released "ok" after losing its quorum


def test_a_multi_lock_excludes_direct_holders_of_its_members() -> None:
    multi: dict[str, Any] = {
        "res": [["s0", "M-a"], ["s1", "M-b"]],
        "members": ["s0", "s1"],
        "rule": "all",
        "quorum": 2,
        "kind": "multi_lock",
    }
    a, b = Worker(1), Worker(2)
    h = a.hold("M-a@s0+M-b@s1", 1.0, [31.0, 5.0], **multi)
    a.release(h, 4.0, obj="M-a@s0+M-b@s1")
    h2 = b.hold("M-a@s0", 2.0, 32.0)
    b.release(h2, 2.5, obj="M-a@s0")
    assert "overlap" in kinds(judge(a, b))
    # valid only while every member is: member M-b's lease ended at 1.5
    c = Worker(1)
    h = c.hold("M-a@s0+M-b@s1", 1.0, [31.0, 1.5], **multi)
    c.lost(h, 1.6)
    c.release(h, 4.0, out="lost", obj="M-a@s0+M-b@s1")
    assert judge(c, b).violations == []


def test_calls_past_their_bound_unless_stopped_or_late() -> None:
    a = Worker(1)
    a.call("try_lock", "L0@s0", 1.0, 2.2, "busy", bound=1.0)
    report = judge(a)
    assert kinds(report) == ["bound"]
    assert "200.0 ms past" in report.violations[0].message
    # the process was stopped for 0.3 s meanwhile: excused
    stopped = [{"e": "stop", "pid": 1, "t0": 1.5, "t1": 1.8}]
    assert judge(a, orchestrator=stopped).violations == []
    # its loop ran late for 0.1 s only: not enough
    b = Worker(1)
    b.call("try_lock", "L0@s0", 1.0, 2.2, "busy", bound=1.0)
    b.events.append({"e": "stall", "t0": 1.5, "t1": 1.6})
    assert kinds(judge(b)) == ["bound"]


def test_a_cancelled_call_must_end_within_cleanup_timeout_of_its_cancellation() -> None:
    a = Worker(1)
    a.call("lock", "L0@s0", 1.0, 2.9, "cancelled", cancel_at=2.0)
    assert judge(a).violations == []
    a.call("lock", "L0@s0", 1.0, 3.1, "cancelled", cancel_at=2.0)
    assert kinds(judge(a)) == ["bound"]


def test_the_bound_is_exact_unless_a_tolerance_is_given() -> None:
    a = Worker(1)
    a.call("unlock", "L0@s0", 1.0, 2.0005, "ok", bound=1.0)
    assert kinds(judge(a)) == ["bound"]
    report = check({1: a.events}, [], Limits(0.5, 1.0, tolerance=0.001))
    assert report.violations == []


def test_fencing_tokens_grow_and_are_never_reused() -> None:
    a, b = Worker(1), Worker(2)
    h = a.hold("F0@s0", 1.0, 31.0, token=5, kind="fenced_lock")
    a.release(h, 2.0, obj="F0@s0")
    h = b.hold("F0@s0", 2.5, 32.5, asked=2.2, token=6, kind="fenced_lock")
    b.release(h, 3.0, obj="F0@s0")
    assert judge(a, b).violations == []
    c = Worker(3)
    h = c.hold("F0@s0", 3.5, 33.5, asked=3.2, token=4, kind="fenced_lock")
    c.release(h, 4.0, obj="F0@s0")
    report = judge(a, b, c)
    assert kinds(report) == ["token"]
    assert "not above 6" in report.violations[0].message
    d = Worker(4)
    h = d.hold("F0@s0", 3.5, 33.5, asked=3.2, token=6, kind="fenced_lock")
    d.release(h, 4.0, obj="F0@s0")
    assert any("handed out twice" in v.message for v in judge(a, b, d).violations)


def test_a_hold_whose_lease_ran_out_before_its_grant_ends_at_its_grant() -> None:
    """A's reply came after its lease could have run out (valid until 1.5, granted at 2.0):
    its token may have been handed out at any time up to 2.0, so B, asked at 1.8, may get a
    lower one. Asked after A's grant, it may not."""
    a, b = Worker(1), Worker(2)
    h = a.hold("F0@s0", 2.0, 1.5, asked=0.5, token=10, kind="fenced_lock")
    a.release(h, 2.1, obj="F0@s0")
    h = b.hold("F0@s0", 2.2, 32.2, asked=1.8, token=9, kind="fenced_lock")
    b.release(h, 2.3, obj="F0@s0")
    assert judge(a, b).violations == []
    c = Worker(3)
    h = c.hold("F0@s0", 2.4, 32.4, asked=2.05, token=8, kind="fenced_lock")
    c.release(h, 2.5, obj="F0@s0")
    report = judge(a, b, c)
    assert kinds(report) == ["token"]
    assert "not above 10" in report.violations[0].message


def test_a_token_counter_wiped_with_its_server_must_still_grow() -> None:
    """A restart empty between two holds: the counter starts again from the server's clock,
    so a token not above the earlier ones is still a violation."""
    wipe = [{"e": "wipe", "server": "s0", "t": 2.5}]
    a, b = Worker(1), Worker(2)
    h = a.hold("F0@s0", 1.0, 31.0, token=5, kind="fenced_lock")
    a.release(h, 2.0, obj="F0@s0")
    h = b.hold("F0@s0", 3.0, 33.0, asked=2.8, token=1, kind="fenced_lock")
    b.release(h, 3.5, obj="F0@s0")
    report = judge(a, b, orchestrator=wipe)
    assert kinds(report) == ["token"]
    assert "not above 5" in report.violations[0].message
    c, d = Worker(1), Worker(2)
    h = c.hold("F0@s0", 1.0, 31.0, token=5, kind="fenced_lock")
    c.release(h, 2.0, obj="F0@s0")
    h = d.hold("F0@s0", 3.0, 33.0, asked=2.8, token=6, kind="fenced_lock")
    d.release(h, 3.5, obj="F0@s0")
    assert judge(c, d, orchestrator=wipe).violations == []


def test_a_latch_wait_may_not_see_a_closed_latch_open() -> None:
    a = Worker(1)
    a.call("latch_set", "C0@s3", 1.0, 1.1, "set")
    a.call("latch_wait", "C0@s3", 2.0, 2.1, "open", bound=1.5)
    assert kinds(judge(a)) == ["latch"]
    # a count-down that may have opened it meanwhile: fine
    b = Worker(1)
    b.call("latch_set", "C0@s3", 1.0, 1.1, "set")
    b.call("latch_down", "C0@s3", 1.5, 1.6, "count:0")
    b.call("latch_wait", "C0@s3", 2.0, 2.1, "open", bound=1.5)
    assert judge(b).violations == []
    # one that counted down to 1 could not have opened it
    c = Worker(1)
    c.call("latch_set", "C0@s3", 1.0, 1.1, "set")
    c.call("latch_down", "C0@s3", 1.5, 1.6, "count:1")
    c.call("latch_wait", "C0@s3", 2.0, 2.1, "open", bound=1.5)
    assert kinds(judge(c)) == ["latch"]


def test_a_count_down_left_to_the_background_may_open_the_latch_later() -> None:
    """A count-down whose caller was cancelled (or told its outcome is unknown) is finished
    by its client in the background: it may land until that work is done, not only while
    the call ran; once the client was seen idle, it can no longer open the latch."""

    def campaign(out: str, background: list[tuple[float, bool]] | None) -> Worker:
        w = Worker(1)
        if background is not None:
            w.events += [{"e": "bg", "s": "s3", "busy": b, "t": t} for t, b in background]
        w.call("latch_down", "C0@s3", 0.5, 0.6, out)
        w.call("latch_set", "C0@s3", 1.0, 1.1, "set")
        w.call("latch_wait", "C0@s3", 2.0, 2.1, "open", bound=1.5)
        return w

    for out in ("cancelled", "err:OutcomeUnknownError"):
        # still in the background when the wait returned: it may have opened it
        assert judge(campaign(out, [(0.0, False), (0.55, True), (2.5, False)])).violations == []
        # nothing recorded of the background: it may have landed at any time
        assert judge(campaign(out, None)).violations == []
        # done in the background before the close: it cannot have opened it
        report = judge(campaign(out, [(0.0, False), (0.55, True), (0.9, False), (3.0, True)]))
        assert kinds(report) == ["latch"]
        # finished before the call returned (the client idle then)
        assert kinds(judge(campaign(out, [(0.0, False), (0.52, True), (0.58, False)]))) == ["latch"]
    # a count-down that said what it did ran before it returned (here: before the close),
    # whatever the client did in the background afterwards
    for out in ("count:0", "count:1"):
        report = judge(campaign(out, [(0.0, False), (0.55, True), (2.5, False)]))
        assert kinds(report) == ["latch"]


def test_a_plain_semaphore_keeps_its_permits() -> None:
    final = [{"e": "semaphore", "name": "S0@s3", "available": 3, "cap": 2}]
    assert kinds(judge(Worker(1), orchestrator=final)) == ["permits"]
    a = Worker(1)
    h = a.hold("S0@s3", 1.0, None, mode="c", cap=2, rule="none", kind="semaphore")
    a.release(h, 2.0, obj="S0@s3")
    final = [{"e": "semaphore", "name": "S0@s3", "available": 1, "cap": 2}]
    assert kinds(judge(a, orchestrator=final)) == ["permits"]  # released, yet one is gone
    b = Worker(1)
    b.hold("S0@s3", 1.0, None, mode="c", cap=2, rule="none", kind="semaphore")
    killed = [*final, {"e": "kill", "pid": 1, "t": 1.5}]
    assert judge(b, orchestrator=killed).violations == []  # the killed holder kept it


def test_losses_that_are_not_the_holders_business() -> None:
    a = Worker(1)
    h = a.hold("P0@s0", 1.0, 31.0, mode="c", cap=2, kind="permit_semaphore")
    a.lost(h, 1.0, "lock 'P0' held by 1f was lost: its task ended without unlocking it")
    a.release(h, 1.5, out="notowned", obj="P0@s0")
    assert kinds(judge(a)) == ["abandoned"]
    child = Worker(1)
    child.call("try_lock_child", "P0@s0", 0.9, 1.0, "granted", bound=1.0)
    child.events.append(
        {
            "e": "hold",
            "h": 1,
            "c": 1,
            "k": "permit_semaphore",
            "o": "P0@s0",
            "t": 1.0,
            "res": [["s0", "P0"]],
            "mode": "c",
            "cap": 2,
            "members": ["s0"],
            "rule": "one",
            "q": 1,
        }
    )
    child.lost(1, 1.01, "whatever it says")
    child.release(1, 1.5, out="lost", obj="P0@s0")
    assert kinds(judge(child)) == ["abandoned"]
    b = Worker(1)
    h = b.hold("L0@s0", 1.0, 31.0)
    b.events.append({"e": "onlost", "h": h, "t": 1.0, "err": "notowned"})
    b.release(h, 1.5, out="lost")
    assert kinds(judge(b)) == ["onlost_refused"]
    c = Worker(1)
    h = c.hold("M@m", 1.0, 31.0)
    c.release(h, 1.5, obj="M@m")
    c.call("try_lock", "M@m", 2.0, 2.1, "lost", bound=1.0, why="was lost; unlock it")
    assert kinds(judge(c)) == ["lost_on_acquire"]


def test_exceptions_no_caller_expects_are_reported() -> None:
    a = Worker(1)
    a.call("try_lock", "L0@s0", 1.0, 1.1, "bug:KeyError: 'x'", bound=1.0)
    assert kinds(judge(a)) == ["unexpected"]


def test_anything_left_at_the_end_is_reported() -> None:
    a = Worker(1)
    idle = {
        "commands_in_flight": 0,
        "subscriptions": 0,
        "tasks_waiting": 0,
        "renewals": 1,
        "background_tasks": 0,
        "links": 1,
        "holds": {"held": 0, "released": 3},
    }
    a.events.append({"e": "stats", "phase": "idle", "server": "s0", "stats": idle})
    a.events.append({"e": "tasks", "n": 1, "names": ["<coroutine renew>"]})
    b = Worker(2)
    b.events = b.events[:1]  # started, never finished, never killed
    left = [{"e": "leftover", "what": "keys on s0", "detail": {"L0": "hash, pttl -1"}}]
    report = judge(a, orchestrator=left)
    report = check({1: a.events, 2: b.events}, left, LIMITS)
    messages = [v.message for v in report.of("leftover")]
    assert len(messages) == 4, messages
    assert any("renewals" in m for m in messages)
    assert any("did not finish" in m for m in messages)
    # a killed worker need not finish
    killed = check({2: b.events}, [{"e": "kill", "pid": 2, "t": 5.0}], LIMITS)
    assert killed.violations == []


def test_a_history_cut_by_sigkill_is_read_up_to_its_last_whole_line(tmp_path: Path) -> None:
    path = tmp_path / "worker-0-0.jsonl"
    recorder = Recorder(path)
    recorder.write({"e": "start", "pid": 1, "t": 0.0})
    recorder.close()
    with path.open("a") as file:
        file.write('{"e": "inv", "c": 1, "op"')  # cut short
    assert read_events(path) == [{"e": "start", "pid": 1, "t": 0.0}]


@pytest.mark.parametrize("rule", ["quorum", "all", "one", "none"])
def test_every_rule_is_understood(rule: str) -> None:
    a = Worker(1)
    h = a.hold("X@s0", 1.0, [31.0], rule=rule, members=["s0"])
    a.release(h, 2.0, obj="X@s0")
    assert judge(a).violations == []
