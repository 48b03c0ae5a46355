"""The benchmark command runs end to end (small settings); its figures are not judged here."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

for module in ("rich", "matplotlib", "uvloop"):
    pytest.importorskip(module, reason="the bench extra is not installed: pip install '.[bench]'")

ROOT = Path(__file__).resolve().parent.parent
# The --quick runs take well under the default 60 s timeout on an idle machine and more on a
# loaded 2-core one: a hang guard of their own.
BENCH_TIMEOUT = 300


async def run_benchmarks(*args: str) -> tuple[int | None, bytes]:
    """``python -m benchmarks *args``: its exit code and output. Killed if the test ends
    first (its timeout), so no running process is left to the tests after it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()
    return proc.returncode, out


@pytest.mark.timeout(BENCH_TIMEOUT)
async def test_benchmark_command_writes_results(redis_url: str, tmp_path: Path) -> None:
    returncode, out = await run_benchmarks(
        "--quick",
        "--loop",
        "asyncio",
        "--only",
        "uncontended",
        "--only",
        "contended",
        "--redis",
        redis_url,
        "--output-dir",
        str(tmp_path),
    )
    assert returncode == 0, out.decode()[-3000:]
    report = json.loads((tmp_path / "latest.json").read_text())
    assert (tmp_path / "latest.png").stat().st_size > 0
    scenarios = {result["scenario"]: result for result in report["results"]}
    assert set(scenarios) == {"uncontended", "contended"}
    for result in scenarios.values():
        assert result["error"] is None
    rows = {row["metric"]: row for row in scenarios["contended"]["rows"]}
    assert set(rows["overlaps (guard)"]["values"].values()) == {0}
    cycles = {row["metric"]: row for row in scenarios["uncontended"]["rows"]}
    assert set(cycles["acquire+release cycles/s"]["values"]) >= {"aiolock", "floor", "redis-py"}


@pytest.mark.timeout(BENCH_TIMEOUT)
async def test_fair_and_rwlock_scenarios_report_ratios(redis_url: str, tmp_path: Path) -> None:
    returncode, out = await run_benchmarks(
        "--quick",
        "--loop",
        "asyncio",
        "--only",
        "fair",
        "--only",
        "rwlock",
        "--no-plot",
        "--redis",
        redis_url,
        "--output-dir",
        str(tmp_path),
    )
    assert returncode == 0, out.decode()[-3000:]
    report = json.loads((tmp_path / "latest.json").read_text())
    scenarios = {result["scenario"]: result for result in report["results"]}
    assert set(scenarios) == {"fair", "rwlock"}
    fair = {row["metric"]: row for row in scenarios["fair"]["rows"]}
    assert set(fair["overlaps (guard)"]["values"].values()) == {0}
    assert fair["order violations"]["ratios"]["fair lock/lock"] is not None
    assert fair["hand-off p50"]["ratios"]["fair lock/lock"] is not None
    rw = {row["metric"]: row for row in scenarios["rwlock"]["rows"]}
    for readers in ("1 reader", "10 readers", "100 readers"):
        assert rw[f"read throughput, {readers}"]["ratios"]["read lock/lock"] is not None
