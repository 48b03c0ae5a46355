"""``aiolock demo``: the arguments of the flash-sale demo (:mod:`aiolock.demo`).

The demo's console output needs ``rich``, which only the ``demo`` extra installs: without it,
the command says what to install and exits with :data:`MISSING_EXTRA`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from ..demo.strategies import NAMES
from ..extras import install_hint

INSTALL_HINT = install_hint("demo")
MISSING_EXTRA = 3
"""Exit code when the demo's extra is not installed."""

DESCRIPTION = """\
A flash sale (seckill) of COUPONS coupons, one per user, across several worker processes
against Redis, sold three ways: naive (read, check, write back: oversells), lock (the same
steps under aiolock locks) and lua (one atomic script; the orders go through a Redis Stream
consumer group into a database). Ends with a table comparing them. Needs the demo extra
(rich): pip install -e '.[demo]' in a clone of aiolock.
"""


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the ``demo`` subcommand."""
    parser = commands.add_parser(
        "demo", help="run the flash-sale demo (the demo extra)", description=DESCRIPTION
    )
    parser.add_argument(
        "--strategy",
        choices=[*NAMES, "all"],
        default="all",
        help="which way(s) to sell (default: %(default)s)",
    )
    parser.add_argument(
        "--coupons", type=_count(0), default=200, help="coupons on sale (default: %(default)s)"
    )
    parser.add_argument(
        "--users", type=_count(1), default=500, help="distinct buyers (default: %(default)s)"
    )
    parser.add_argument(
        "--attempts",
        type=_count(1),
        default=2000,
        help="purchase attempts; users try again (default: %(default)s)",
    )
    parser.add_argument(
        "--workers", type=_count(1), default=4, help="worker processes (default: %(default)s)"
    )
    parser.add_argument(
        "--concurrency",
        type=_count(1),
        default=64,
        help="buyers at once per worker process (default: %(default)s)",
    )
    parser.add_argument(
        "--url",
        "--redis",
        dest="redis",
        metavar="URL",
        help="Redis to use (default: AIOLOCK_URL, REDIS_URL or redis://localhost:6379/0 if "
        "it answers, else a private redis-server)",
    )
    parser.add_argument(
        "--embedded", action="store_true", help="always start a private redis-server"
    )
    parser.add_argument(
        "--db",
        metavar="URL",
        help="orders database of the lua strategy: a SQLite path or sqlite:///path, or "
        "postgresql://... (needs the postgres extra; default: SQLite in a temporary directory)",
    )
    parser.add_argument("--seed", type=int, help="seed of the buyers' order (default: random)")
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write results here")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo, or say which extra it needs."""
    try:
        import rich  # noqa: F401  (only checks that the demo extra is installed)
    except ImportError:
        print(
            f"aiolock demo needs the demo extra (rich), which is not installed:\n"
            f"    {INSTALL_HINT}",
            file=sys.stderr,
        )
        return MISSING_EXTRA
    from ..demo import console

    return console.run(args)


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an int >= ``minimum``."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse
