"""The README's self-contained examples (the ones that start their own redis-server with
aiolock.testing) run as written and print what their comments say."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest

from aiolock.testing import external_redis_url, find_redis_server_binary

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = [
    block
    for block in re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    if "from aiolock.testing import RedisServer" in block
]
EXPECTED = {
    'locks.fair_lock("printer")': ["[0, 1, 2, 3, 4]"],
    'locks.read_write_lock("config")': ["['blue', 'blue', 'blue'", "refused: config"],
}


def test_every_example_is_checked() -> None:
    assert len(BLOCKS) == len(EXPECTED)
    assert all(any(marker in block for block in BLOCKS) for marker in EXPECTED)


@pytest.mark.parametrize("marker", sorted(EXPECTED))
async def test_readme_example_runs(marker: str) -> None:
    if find_redis_server_binary() is None or external_redis_url() is not None:
        pytest.skip("the examples start their own redis-server")
    (block,) = [b for b in BLOCKS if marker in b]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        block,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(60):
        out, _ = await proc.communicate()
    text = out.decode()
    assert proc.returncode == 0, text
    for expected in EXPECTED[marker]:
        assert expected in text, text
