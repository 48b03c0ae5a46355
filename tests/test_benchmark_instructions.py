"""``python -m benchmarks.instructions`` produces its figures (tiny runs; never judged)."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed"),
]


@pytest.mark.timeout(600)
async def test_instruction_counts_are_produced(redis_url: str, tmp_path: Path) -> None:
    out_json = tmp_path / "instructions.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks.instructions",
        "--cycles",
        "50",
        "--tasks",
        "5",
        "--variant",
        "floor",
        "--variant",
        "aiolock",
        "--redis",
        redis_url,
        "--json",
        str(out_json),
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
    assert proc.returncode == 0, out.decode()[-3000:]
    figures = json.loads(out_json.read_text())
    assert set(figures) == {"floor", "aiolock"}
    for figure in figures.values():
        assert figure["instructions_per_cycle"] > 0
    text = out.decode()
    assert "instr/cycle" in text and "vs floor" in text
