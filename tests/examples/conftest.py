"""Helpers of the example tests: run an example as its README says, and check it left no key."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent.parent


def keys_left(redis_url: str) -> list[bytes]:
    with redis.Redis.from_url(redis_url) as client:
        return sorted(client.scan_iter(count=1000))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def example_env(redis_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AIOLOCK_URL", "REDIS_URL")}
    return {**env, "REDIS_URL": redis_url, **extra}


def run_example(module: str, redis_url: str, timeout: float = 60) -> str:
    """``python -m MODULE`` from the repository root, as the README runs it; its stdout."""
    proc = subprocess.run(
        [sys.executable, "-m", module],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
        env=example_env(redis_url),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@contextmanager
def serving(
    command: list[str], port: int, redis_url: str, *, ready: str = "/sale", **env: str
) -> Iterator[str]:
    """Run a web server as its README says; yield its base URL once it answers 200 on
    ``ready``; stop it with Ctrl-C (SIGINT) and check that it exited cleanly."""
    httpx = pytest.importorskip("httpx")
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=example_env(redis_url, **env),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                if httpx.get(f"{base}{ready}", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not answer within 30 s"
            time.sleep(0.1)
        yield base
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode in (0, -signal.SIGINT), out
        assert "Traceback" not in out, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
