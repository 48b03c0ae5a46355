"""The composite benchmark scenario runs end to end (quick settings); figures not judged."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

for module in ("rich", "matplotlib", "uvloop"):
    pytest.importorskip(module, reason="the bench extra is not installed: pip install '.[bench]'")

ROOT = Path(__file__).resolve().parent.parent


async def test_composite_scenario_writes_its_rows(tmp_path: Path) -> None:
    from aiolock.testing import external_redis_url

    if external_redis_url() is not None:
        pytest.skip("the scenario starts its own redis-server processes")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks",
        "--quick",
        "--loop",
        "asyncio",
        "--only",
        "composite",
        "--no-plot",
        "--output-dir",
        str(tmp_path),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode()[-3000:]
    report = json.loads((tmp_path / "latest.json").read_text())
    (result,) = report["results"]
    assert result["scenario"] == "composite" and result["error"] is None
    rows = {row["metric"]: row for row in result["rows"]}
    cycles = rows["acquire+release cycles/s"]["values"]
    assert set(cycles) == {
        "lock",
        "multi-lock, 1 server",
        "multi-lock, 3 servers",
        "red lock, 3 masters",
    }
    assert all(value > 0 for value in cycles.values())
    assert "parallel/sequential" in rows["acquire latency p50, loopback"]["ratios"]
