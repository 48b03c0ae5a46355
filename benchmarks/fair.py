"""Scenario "fair" - the fair lock beside the reentrant lock, in one run.

* Hand-off: release in this process -> acquired in a worker process, exactly as
  ``handoff.py`` measures the lock (same rounds, gaps and CLOCK_MONOTONIC stamps); the fair
  lock's release publishes to the first waiter's own channel.
* Contended: ``contended.py``'s setup (2 processes x 25 tasks on one lock, each holding 1 ms),
  plus order violations: grants that overtook a request made at least 1 ms earlier that was
  still waiting (first come, first served would have served that one first); Jain's index over
  the tasks' acquisition counts.

Ratios are fair lock / lock: above 1 for a time means the fair lock is slower.
"""

from __future__ import annotations

from typing import Any

from . import contended, handoff
from .runner import LoopName, Row, ScenarioResult, Settings, ratio, run_on

FAIR, LOCK = "fair lock", "lock"
RATIO = f"{FAIR}/{LOCK}"


async def _run(settings: Settings, loop: LoopName) -> dict[str, Any]:
    rounds = settings.handoff_rounds_aiolock
    gap = handoff.GAPS_S["aiolock"]
    return {
        "handoff": {
            FAIR: await handoff.measure(settings, loop, FAIR, "aiolock-fair", rounds, gap),
            LOCK: await handoff.measure(settings, loop, LOCK, "aiolock", rounds, gap),
        },
        "contended": {
            FAIR: await contended.measure(
                settings, loop, "fair_lock", {"lib": "aiolock", "kind": "fair"}
            ),
            LOCK: await contended.measure(settings, loop, "lock", {"lib": "aiolock"}),
        },
    }


def run(settings: Settings, loop: LoopName) -> ScenarioResult:
    data = run_on(loop, _run(settings, loop))
    rows: list[Row] = []

    def add(
        metric: str, unit: str, values: dict[str, float | None], better: Any, note: str = ""
    ) -> None:
        rows.append(
            Row(
                "fair",
                loop,
                metric,
                unit,
                values,
                {RATIO: ratio(values[FAIR], values[LOCK])},
                better=better,
                note=note,
            )
        )

    hand, cont = data["handoff"], data["contended"]
    for stat in ("p50", "p99"):
        add(
            f"hand-off {stat}",
            "ms",
            {v: hand[v]["handoff_ms"][stat] for v in (FAIR, LOCK)},
            "lower",
            "release in one process -> acquired in another" if stat == "p50" else "",
        )
    note = (
        f"{settings.contended_processes} processes x {settings.contended_tasks} tasks, one "
        f"lock, hold {settings.contended_hold * 1000:g} ms, {settings.contended_seconds:g} s"
    )
    add("acquisitions/s", "acq/s", {v: cont[v]["acquisitions_per_s"] for v in (FAIR, LOCK)},
        "higher", note)  # fmt: skip
    add("Jain fairness", "", {v: cont[v]["jain"] for v in (FAIR, LOCK)}, "higher",
        "over the tasks' acquisition counts (1 = all equal)")  # fmt: skip
    add(
        "order violations",
        "%",
        {v: _percent(cont[v]["order_violations"]["fraction"]) for v in (FAIR, LOCK)},
        "lower",
        "grants that overtook a request made >= 1 ms earlier",
    )
    add("wait p50", "ms", {v: cont[v]["wait_ms"]["p50"] for v in (FAIR, LOCK)}, "lower")
    add("wait p99", "ms", {v: cont[v]["wait_ms"]["p99"] for v in (FAIR, LOCK)}, "lower")
    add(
        "commands per acquisition",
        "commands",
        {v: cont[v]["round_trips_per_acquisition"] for v in (FAIR, LOCK)},
        "lower",
    )
    add("overlaps (guard)", "", {v: cont[v]["overlaps"] for v in (FAIR, LOCK)}, "lower",
        "must be 0")  # fmt: skip
    return ScenarioResult("fair", loop, rows, data)


def _percent(fraction: float | None) -> float | None:
    return None if fraction is None else 100 * fraction
