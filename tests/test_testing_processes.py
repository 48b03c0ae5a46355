"""Processes started by aiolock.testing from worker threads (``asyncio.to_thread``) outlive the
thread, and still die with the test process when that is killed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiolock.testing import external_redis_url, find_redis_server_binary

pytestmark = [
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or shutil.which("setpriv") is None,
        reason="parent-death signal needs Linux and util-linux setpriv",
    ),
    pytest.mark.skipif(
        external_redis_url() is not None or find_redis_server_binary() is None,
        reason="needs its own redis-server",
    ),
]

ORPHAN_FROM_A_THREAD = """
import asyncio, os, signal, time
from aiolock.testing import RedisServer

async def main():
    server = RedisServer()
    await asyncio.to_thread(server.start)  # the worker thread may end: the server must not
    return server

server = asyncio.run(main())  # asyncio.run shuts the worker threads down
time.sleep(0.2)
assert server.ping(), "the server died with the thread that started it"
print(server.pid, server.data_dir, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no teardown, no atexit
"""


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"  # a zombie waiting for init is dead too


def test_a_server_started_from_a_worker_thread_dies_with_the_killed_test_process() -> None:
    result = subprocess.run(
        [sys.executable, "-c", ORPHAN_FROM_A_THREAD],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert result.stdout, result.stderr
    pid_text, data_dir = result.stdout.split()
    pid = int(pid_text)
    try:
        deadline = time.monotonic() + 10
        while not _gone(pid):
            assert time.monotonic() < deadline, f"redis-server {pid} outlived its parent"
            time.sleep(0.02)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
