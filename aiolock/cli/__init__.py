"""The ``aiolock`` command line (also ``python -m aiolock``).

Subcommands, one module each:

* :mod:`~aiolock.cli.inspect`: ``aiolock inspect [PATTERN]``, the locks and synchronizers in a
  database, by type, with holders, leases and waiters (a table or ``--json``);
* :mod:`~aiolock.cli.unlock`: ``aiolock unlock --force NAME``, delete a stuck lock and wake its
  waiters;
* :mod:`~aiolock.cli.watch`: ``aiolock watch NAME``, holder changes and hand-offs, live;
* :mod:`~aiolock.cli.acl`: ``aiolock acl --user U --prefix P``, a least-privilege
  ``ACL SETUSER`` line for an application's locks;
* :mod:`~aiolock.cli.demo`: ``aiolock demo``, the flash-sale demo (the ``demo``
  extra).

They read Redisson's key layout (:mod:`~aiolock.cli.layout`), so they work on objects made by
Redisson (Java) as well as by aiolock. The Redis URL is ``--url``, else ``AIOLOCK_URL``, else
``REDIS_URL``, else ``redis://localhost:6379/0``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from .. import __version__
from . import acl as _acl
from . import demo as _demo
from . import inspect as _inspect
from . import unlock as _unlock
from . import watch as _watch

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``aiolock`` argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="aiolock",
        description="asyncio-native distributed locks on Redis: inspect, unlock and watch "
        "locks (aiolock's or Redisson's), print an ACL rule for them, or run the demo.",
        epilog="The Redis URL is --url, else $AIOLOCK_URL, else $REDIS_URL, else "
        "redis://localhost:6379/0. 'aiolock COMMAND --help' describes a command.",
    )
    parser.add_argument("--version", action="version", version=f"aiolock {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    _inspect.add_parser(commands)
    _unlock.add_parser(commands)
    _watch.add_parser(commands)
    _acl.add_parser(commands)
    _demo.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), run the subcommand, return its exit code."""
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
