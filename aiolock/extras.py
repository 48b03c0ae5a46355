"""What to run to install an optional extra, said the same way everywhere.

aiolock is not on PyPI yet: it is installed from a clone (``pip install -e .``) or from a
wheel built there, so a hint gives the clone's command first. Hints are plain text: whatever
prints them through rich must escape them (``[demo]`` would be read as markup).
"""

from __future__ import annotations

DISTRIBUTION = "aiolock-redis"


def install_hint(extra: str) -> str:
    """The commands that install the extra ``extra``, e.g. ``demo``."""
    return (
        f"pip install -e '.[{extra}]' in a clone of aiolock "
        f"(once it is on PyPI: pip install '{DISTRIBUTION}[{extra}]')"
    )
