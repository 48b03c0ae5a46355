"""Child process of the multi-process scenarios: ``python -m benchmarks._worker '<json>'``.

It talks to the parent in lines: it sends ``READY {...}`` once connected, takes its orders on
stdin, and finally sends ``RESULT {...}`` (JSON) on stdout.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from .runner import CLOSE_HANGS, ParentLink, run_on


async def _main(params: dict[str, Any]) -> None:
    link = await ParentLink.open()
    role = params["role"]
    if role == "contended":
        from . import contended

        result = await contended.worker(params, link)
    elif role == "handoff":
        from . import handoff

        result = await handoff.worker(params, link)
    elif role == "semaphore-handoff":
        from . import semaphores

        result = await semaphores.handoff_worker(params, link)
    elif role == "latch-wait":
        from . import latch

        result = await latch.worker(params, link)
    elif role == "floor-handoff":
        from . import floor

        result = await floor.handoff_worker(params, link)
    else:
        raise SystemExit(f"unknown role {role!r}")
    result["close_hangs"] = list(CLOSE_HANGS)
    link.send("RESULT", result)


def main() -> None:
    params = json.loads(sys.argv[1])
    run_on(params["loop"], _main(params))


if __name__ == "__main__":
    main()
