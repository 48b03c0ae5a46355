"""The ``aiolock`` command line (also ``python -m aiolock``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from . import __version__
from .demo import cli as demo_cli


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), run the subcommand, return its exit code."""
    parser = argparse.ArgumentParser(
        prog="aiolock", description="asyncio-native distributed locks on Redis"
    )
    parser.add_argument("--version", action="version", version=f"aiolock {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    demo_cli.add_parser(commands)
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
