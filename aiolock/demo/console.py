"""``aiolock demo`` on the console: progress bars and the summary (``rich``, the demo extra).

The arguments are parsed by :mod:`aiolock.cli.demo`, which imports this module only once it
knows that ``rich`` is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from redis.exceptions import RedisError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .db import temporary_sqlite
from .errors import DemoError
from .report import StrategyResult, database_line, summary_table
from .runner import DemoOptions, ProgressStart, run_demo
from .server import redis_for_demo
from .strategies import NAMES

RESULTS_WRONG = 1
"""Exit code when a strategy that must be correct (lock, lua) was not."""
FAILED = 2
"""Exit code when the demo could not run."""
INTERRUPTED = 130


def run(args: argparse.Namespace) -> int:
    """Run the demo as ``args`` say; print progress and the summary. Returns the exit code."""
    console = Console()
    strategies = NAMES if args.strategy == "all" else (args.strategy,)
    seed = args.seed if args.seed is not None else secrets.randbelow(10**6)
    try:
        with ExitStack() as stack:
            redis_url = stack.enter_context(
                redis_for_demo(args.redis, embedded=args.embedded, say=_plain(console))
            )
            db_url = args.db
            if db_url is None and "lua" in strategies:
                db_url = stack.enter_context(temporary_sqlite())
            options = DemoOptions(
                strategies=strategies,
                redis_url=redis_url,
                db_url=db_url,
                coupons=args.coupons,
                users=args.users,
                attempts=args.attempts,
                workers=args.workers,
                concurrency=args.concurrency,
                seed=seed,
            )
            console.print(
                f"Flash sale: {options.coupons:,} coupons, {options.attempts:,} attempts by "
                f"{options.users:,} users, {options.workers} processes x "
                f"{options.concurrency} buyers\nRedis: {escape(redis_url)}, seed {seed}"
            )
            with _progress(console) as on_start:
                results = asyncio.run(run_demo(options, on_start))
    except (DemoError, RedisError, OSError) as exc:
        console.print(f"[red]The demo failed:[/] {escape(str(exc))}")
        return FAILED
    except KeyboardInterrupt:
        console.print("Interrupted; the run's keys were deleted.")
        return INTERRUPTED
    _print_summary(console, results)
    if args.json is not None:
        args.json.write_text(json.dumps([r.to_json() for r in results], indent=2) + "\n")
    must_be_correct = [r for r in results if r.strategy != "naive"]
    return 0 if all(r.correct for r in must_be_correct) else RESULTS_WRONG


def _plain(console: Console) -> Callable[[str], None]:
    """Print text as it is: an error or a URL may hold brackets (``[postgres]``, ``[::1]``)
    that rich would take for markup and drop."""
    return lambda text: console.print(escape(text))


@contextmanager
def _progress(console: Console) -> Iterator[ProgressStart]:
    """Rich progress bars, one per strategy; yields ``start(strategy, total) -> update``."""
    columns = (
        TextColumn("{task.description:>5}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("attempts"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:

        def start(strategy: str, total: int) -> Callable[[int], None]:
            task = progress.add_task(strategy, total=total)
            return lambda done: progress.update(task, completed=done)

        yield start


def _print_summary(console: Console, results: list[StrategyResult]) -> None:
    console.print(summary_table(results))
    for result in results:
        if result.database is not None:
            console.print(database_line(result))
    if any(r.strategy == "naive" and not r.correct for r in results):
        console.print(
            "naive: buyers read the same stock, and each wrote back that stock minus one."
        )
