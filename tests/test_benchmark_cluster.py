"""The cluster benchmark scenario runs end to end (quick settings); figures not judged, but
the spread of names over the masters is (hash slots, not timing)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from aiolock.testing import find_redis_server_binary

for module in ("rich", "matplotlib", "uvloop"):
    pytest.importorskip(module, reason="the bench extra is not installed: pip install '.[bench]'")

ROOT = Path(__file__).resolve().parent.parent


async def test_cluster_scenario_writes_its_rows(tmp_path: Path) -> None:
    if find_redis_server_binary() is None:
        pytest.skip("the scenario starts its own redis-server processes")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks",
        "--quick",
        "--loop",
        "asyncio",
        "--only",
        "cluster",
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
    assert result["scenario"] == "cluster" and result["error"] is None
    rows = {row["metric"]: row for row in result["rows"]}
    cycles = rows["uncontended cycles/s"]["values"]
    assert set(cycles) == {"one server", "cluster, 3 masters"}
    assert all(value > 0 for value in cycles.values())
    assert rows["hand-off p50"]["values"]["cluster, 3 masters"] > 0
    (spread,) = [row for row in result["rows"] if row["metric"].startswith("script calls")]
    assert len(spread["values"]) == 3 and all(t["met"] for t in spread["targets"])
