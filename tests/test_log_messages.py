"""Every line the library logs is for an operator: it says what happened in the words of the
docs (lock, hold, lease, connection, reply), never in the implementation's (fencing,
settling, grants, ``LinkIdentity(...)`` or other object reprs)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import aiolock

PACKAGE = Path(aiolock.__file__).parent
LEVELS = {"debug", "info", "warning", "error", "exception", "critical", "log"}
INTERNAL = re.compile(r"fenc|settl|grant|taint|LinkIdentity|\bturn\b|\brule\b|runtime", re.I)
"""Words of the implementation, not of the docs."""
OBJECTS = {"identity", "link", "hold", "member", "rule", "rt", "self", "call", "entry", "lost"}
"""Names of internal objects: logged, they print their repr."""
ATTRIBUTES = OBJECTS | {"owner"}
"""The same as attributes (a bare ``owner`` is an owner id string; ``x.owner`` an Owner)."""


def logger_calls() -> list[tuple[str, int, ast.Call]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "testing" in path.relative_to(PACKAGE).parts:
            continue  # test helpers talk to test authors
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in LEVELS
                and isinstance(node.func.value, ast.Name)
                and "log" in node.func.value.id.lower()
            ):
                found.append((str(path.relative_to(PACKAGE)), node.lineno, node))
    return found


def test_there_are_log_lines_to_check() -> None:
    assert len(logger_calls()) > 30


def test_every_log_line_speaks_to_an_operator() -> None:
    bad = []
    for where, line, call in logger_calls():
        args = call.args[1:] if call.func.attr == "log" else call.args  # type: ignore[attr-defined]
        first = args[0] if args else None
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            bad.append(f"{where}:{line}: the message is not a literal format string")
            continue
        text = first.value
        if not text.startswith("aiolock"):
            bad.append(f"{where}:{line}: does not say it comes from aiolock: {text!r}")
        if INTERNAL.search(text):
            bad.append(f"{where}:{line}: internal terms: {text!r}")
        for arg in args[1:]:
            if isinstance(arg, ast.Attribute):
                internal = arg.attr in ATTRIBUTES
            else:
                internal = getattr(arg, "id", None) in OBJECTS
            if internal:
                bad.append(f"{where}:{line}: logs the object {ast.unparse(arg)!r} (its repr)")
    assert not bad, "\n".join(bad)
