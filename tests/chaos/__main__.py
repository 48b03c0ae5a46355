"""``python -m tests.chaos``: run a fault campaign and print its figures and violations.

    python -m tests.chaos --minutes 10 --seed 7
    python -m tests.chaos --seconds 60 --workers 6 --out /tmp/chaos   # keep the histories
    python -m tests.chaos --check /tmp/chaos                          # judge them again
    python -m tests.chaos --minutes 10 --sentinel                     # and Sentinel failovers

Exits 1 if any violation was found (see ``docs/faults.md``).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from .campaign import Settings, judge, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos", description=__doc__.split("\n")[0]
    )
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, help="minutes of faults")
    length.add_argument("--seconds", type=float, help="seconds of faults (default 60)")
    parser.add_argument("--seed", type=int, help="the random seed (default: a new one, printed)")
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--out", type=Path, help="keep the histories in this directory")
    parser.add_argument(
        "--tolerance", type=float, default=0.0, help="seconds a call may end past its bound"
    )
    parser.add_argument(
        "--sentinel",
        action="store_true",
        help="add a Sentinel-managed master with lock actors and failovers (about 5 more "
        "processes)",
    )
    parser.add_argument("--show", type=int, default=5, help="violations shown per kind")
    parser.add_argument("--check", type=Path, help="judge the histories kept in this directory")
    args = parser.parse_args(argv)
    seconds = args.minutes * 60 if args.minutes is not None else args.seconds or 60.0
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    settings = Settings(
        seed=seed,
        duration=seconds,
        workers=args.workers,
        out=args.out,
        tolerance=args.tolerance,
        sentinel=args.sentinel,
    )
    report = judge(args.check, settings) if args.check is not None else run(settings)
    print(report.summary())
    for kind in sorted({v.kind for v in report.violations}):
        print()
        print(report.describe(kind, limit=args.show))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
