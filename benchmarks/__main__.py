"""``python -m benchmarks [--quick] [--loop asyncio|uvloop|both] [--redis URL] [--only ...]``

Starts a private redis-server (``aiolock.testing.RedisServer``) unless ``--redis`` is given,
runs the scenarios on each event loop, prints the tables and writes
``benchmarks/results/latest.json`` and ``latest.png``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import Any

from rich.console import Console
from rich.markup import escape

from . import (
    cluster,
    composite,
    contended,
    fair,
    handoff,
    latch,
    report,
    rwlock,
    scale,
    semaphores,
    uncontended,
)
from .runner import (
    CLOSE_HANGS,
    LOOPS,
    RESULTS_DIR,
    LoopName,
    ScenarioResult,
    ServerProbe,
    Settings,
    environment,
    write_json,
)

#: the benchmarks run from a clone: what installs their extra there
BENCH_HINT = "pip install -e '.[bench]'"

SCENARIOS: dict[str, ModuleType] = {
    "uncontended": uncontended,
    "contended": contended,
    "handoff": handoff,
    "scale": scale,
    "fair": fair,
    "rwlock": rwlock,
    "semaphores": semaphores,
    "latch": latch,
    "composite": composite,
    "cluster": cluster,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="aiolock benchmarks, side by side with redis-py's Lock and the physical floor.",
    )
    parser.add_argument("--redis", metavar="URL", help="use this server instead of starting one")
    parser.add_argument("--quick", action="store_true", help="shorter and smaller (~1.5 min)")
    parser.add_argument("--loop", choices=("asyncio", "uvloop", "both"), default="both")
    parser.add_argument(
        "--only",
        metavar="SCENARIO",
        action="append",
        choices=list(SCENARIOS),
        help="run only this scenario (repeatable); default: all",
    )
    parser.add_argument(
        "--output-dir", type=Path, default=RESULTS_DIR, help="where latest.json/.png go"
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=max(160, Console().width))
    loops: list[LoopName] = list(LOOPS) if args.loop == "both" else [args.loop]
    if "uvloop" in loops:
        try:
            import uvloop  # noqa: F401
        except ImportError:
            console.print("[red]uvloop is not installed:[/red]", escape(BENCH_HINT))
            return 2
    server: Any = None
    started = time.monotonic()
    if args.redis:
        url = args.redis
    else:
        from aiolock.testing import RedisServer

        server = RedisServer()
        server.start()
        url = server.url
    try:
        settings = Settings.for_run(url, args.quick)
        probe = ServerProbe(url)
        env = environment(probe, url, loops)
        report.print_header(console, env, asdict(settings))
        results: list[ScenarioResult] = []
        for name in args.only or list(SCENARIOS):
            for loop in loops:
                probe.flush()
                console.print(f"[dim]running {name} on {loop} ...[/dim]", end=" ")
                load0 = os.getloadavg()
                t0 = time.monotonic()
                try:
                    res: ScenarioResult = SCENARIOS[name].run(settings, loop)
                except Exception as exc:
                    res = ScenarioResult(name, loop, [], {}, error=f"{exc!r}")
                    console.print(f"[red]failed: {escape(repr(exc))}")
                    console.print(traceback.format_exc(), style="dim", markup=False)
                res.seconds = time.monotonic() - t0
                res.loadavg_before, res.loadavg_after = load0, os.getloadavg()
                console.print(f"[dim]{res.seconds:.1f} s[/dim]")
                results.append(res)
        probe.flush()
        probe.close()
        env["loadavg_at_end"] = os.getloadavg()
        env["total_seconds"] = time.monotonic() - started
        hangs = list(CLOSE_HANGS) + [
            h
            for res in results
            for d in res.details.values()
            if isinstance(d, dict)
            for h in (d.get("close_hangs") or d.get("worker", {}).get("close_hangs") or [])
        ]
        out = {
            "environment": env,
            "settings": {k: v for k, v in asdict(settings).items() if k != "url"},
            "results": [
                {
                    "scenario": r.scenario,
                    "loop": r.loop,
                    "seconds": r.seconds,
                    "loadavg_before": r.loadavg_before,
                    "loadavg_after": r.loadavg_after,
                    "error": r.error,
                    "rows": [row.to_json() for row in r.rows],
                    "details": r.details,
                }
                for r in results
            ],
            "targets": [
                {"scenario": r.scenario, "loop": r.loop, **t.to_json()}
                for r in results
                for row in r.rows
                for t in row.targets
            ],
            "aclose_hangs": hangs,
        }
        args.output_dir.mkdir(parents=True, exist_ok=True)
        json_path = args.output_dir / "latest.json"
        write_json(json_path, out)
        report.print_tables(console, results)
        report.print_issue_table(console, results)
        report.print_summary(console, results, hangs)
        if not args.no_plot:
            png_path = args.output_dir / "latest.png"
            report.write_plot(png_path, results, env)
            console.print(f"wrote {json_path} and {png_path}")
        else:
            console.print(f"wrote {json_path}")
        end_load = ", ".join(f"{x:.2f}" for x in env["loadavg_at_end"])
        console.print(f"total {env['total_seconds']:.0f} s; load average at end {end_load}")
        return 1 if any(r.error for r in results) else 0
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
