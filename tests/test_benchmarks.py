"""The benchmark command runs end to end (small settings); its figures are not judged here."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


async def test_benchmark_command_writes_results(redis_url: str, tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks",
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
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode()[-3000:]
    report = json.loads((tmp_path / "latest.json").read_text())
    assert (tmp_path / "latest.png").stat().st_size > 0
    scenarios = {result["scenario"]: result for result in report["results"]}
    assert set(scenarios) == {"uncontended", "contended"}
    for result in scenarios.values():
        assert result["error"] is None
    rows = {row["metric"]: row for row in scenarios["contended"]["rows"]}
    assert set(rows["overlaps (guard)"]["values"].values()) == {0}
    cycles = {row["metric"]: row for row in scenarios["uncontended"]["rows"]}
    assert set(cycles["acquire+release cycles/s"]["values"]) >= {"aiolock", "raw", "redis-py"}
