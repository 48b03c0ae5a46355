"""The fault campaign in its short configuration, run with the rest of the suite.

One campaign (:data:`SEED`, :data:`SECONDS` of faults, three worker processes) is run once
for the module; each test asserts one property of its history (see tests.chaos.checker).
A second, tiny campaign breaks the lock on purpose and checks that the checker notices.
The long configuration runs on demand: ``python -m tests.chaos --minutes 10`` (docs/faults.md).
"""

from __future__ import annotations

import shutil
import sys

import pytest

from aiolock.testing import external_redis_url, find_redis_server_binary
from tests.chaos.campaign import Settings, run
from tests.chaos.checker import Report

pytestmark = [
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or shutil.which("setpriv") is None,
        reason="kills and stops processes: needs Linux (and setpriv, so they die with us)",
    ),
    pytest.mark.skipif(
        external_redis_url() is not None or find_redis_server_binary() is None,
        reason="needs redis-server binaries of its own (it kills and restarts them)",
    ),
    pytest.mark.timeout(300),
]

SEED = 19
SECONDS = 40.0


@pytest.fixture(scope="module")
def report() -> Report:
    result = run(Settings(seed=SEED, duration=SECONDS, workers=3))
    print(result.summary())
    return result


def _none(report: Report, kind: str) -> None:
    assert not report.of(kind), f"seed {SEED}: " + report.describe(kind)


def test_the_campaign_did_its_work(report: Report) -> None:
    """A campaign that took nothing or injected nothing proves nothing."""
    figures = report.figures
    assert figures["holds"] > 300, report.summary()
    assert figures["losses_reported"] > 5, report.summary()
    assert figures["cancellations"] > 20, report.summary()
    assert len(figures["faults"]) >= 10, report.summary()
    held = set(figures["holds_by_type"])
    assert {
        "lock",
        "fenced_lock",
        "spin_lock",
        "fair_lock",
        "read_lock",
        "permit_semaphore",
        "semaphore",
        "multi_lock",
        "red_lock",
    } <= held, report.summary()


def test_no_overlap_within_a_valid_lease(report: Report) -> None:
    _none(report, "overlap")


def test_no_unreported_loss(report: Report) -> None:
    _none(report, "unreported_loss")


def test_no_call_past_its_bound(report: Report) -> None:
    _none(report, "bound")


def test_fencing_tokens_only_grow(report: Report) -> None:
    _none(report, "token")


def test_latch_waits_see_only_open_latches(report: Report) -> None:
    _none(report, "latch")


def test_a_plain_semaphore_keeps_its_permits(report: Report) -> None:
    _none(report, "permits")


def test_on_lost_accepts_every_granted_hold(report: Report) -> None:
    _none(report, "onlost_refused")


def test_a_permit_outlives_the_task_that_took_it(report: Report) -> None:
    _none(report, "abandoned")


def test_no_loss_is_blamed_on_a_caller_that_held_nothing(report: Report) -> None:
    _none(report, "lost_on_acquire")


def test_no_call_raises_what_no_caller_expects(report: Report) -> None:
    _none(report, "unexpected")


def test_nothing_is_left_after_the_campaign(report: Report) -> None:
    _none(report, "leftover")


def test_the_checker_sees_a_broken_lock() -> None:
    """Delete the locks behind their holders' backs, recording nothing (a lock that lets a
    second holder in): the campaign must report overlaps (and nothing the deletion could
    not cause)."""
    result = run(
        Settings(
            seed=SEED,
            duration=6.0,
            workers=2,
            faults={"sabotage": 1.0},
            fault_gap=(0.3, 0.6),
            log=lambda line: None,
        )
    )
    assert result.of("overlap"), result.summary()
