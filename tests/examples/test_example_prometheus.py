"""examples/prometheus: run as its README says, scrape its /metrics endpoint on 127.0.0.1,
find aiolock's series; stopped with Ctrl-C it exits cleanly and leaves no key, run after run."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import redis

from tests.examples.conftest import ROOT, example_env, free_port, keys_left

for module in ("opentelemetry.sdk", "opentelemetry.exporter.prometheus", "prometheus_client"):
    pytest.importorskip(module, reason="the examples extra is not installed")

COMMAND = [sys.executable, "-m", "examples.prometheus.exporter"]
#: a sample line: name{labels} value
SAMPLE = re.compile(r"^(aiolock_\w+)\{([^}]*)\} (\S+)$")


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """aiolock's samples on the endpoint: (name, labels without otel_scope_*) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match:
            labels = frozenset(
                (key, value)
                for key, value in re.findall(r'(\w+)="([^"]*)"', match.group(2))
                if not key.startswith("otel_scope")
            )
            samples[(match.group(1), labels)] = float(match.group(3))
    return samples


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_the_readme_command_exports_aiolock_series(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as other:
        other.set("someone-else:key", 1)
    for _ in range(2):
        port = free_port()
        proc = subprocess.Popen(
            COMMAND,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=example_env(redis_url, METRICS_PORT=str(port)),
        )
        try:
            deadline = time.monotonic() + 60
            while True:  # until every kind of event it makes has been scraped
                assert proc.poll() is None, proc.communicate()[0]
                try:
                    samples = scrape(port)
                except (urllib.error.URLError, ConnectionError):
                    samples = {}
                if (
                    value(samples, "aiolock_acquisitions_total", lock_type="lock") > 0
                    and value(samples, "aiolock_acquisitions_total", lock_type="semaphore") > 0
                    and value(samples, "aiolock_renewals_total", lock_type="fair_lock") > 0
                    and value(samples, "aiolock_acquire_timeouts_total", lock_type="lock") > 0
                ):
                    break
                assert time.monotonic() < deadline, sorted(samples)
                time.sleep(0.2)
            names = {name for name, _ in samples}
            assert {
                "aiolock_acquire_wait_seconds_bucket",
                "aiolock_acquire_wait_seconds_count",
                "aiolock_hold_duration_seconds_sum",
                "aiolock_pubsub_reconnects_total",
            } <= names
            count = "aiolock_acquire_wait_seconds_count"
            assert value(samples, count, lock_type="lock", outcome="timeout") > 0
            assert value(samples, count, lock_type="fair_lock", outcome="acquired") > 0
            # no lock names unless asked for: one series per lock type, whatever the names
            assert all(key != "lock_name" for _, labels in samples for key, _ in labels)
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=30)
            assert proc.returncode == 0, out
            assert "Traceback" not in out and "stopped" in out, out
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert keys_left(redis_url) == [b"someone-else:key"]
