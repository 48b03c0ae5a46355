"""The suite's own bookkeeping: what the fast subset (``pytest -m "not slow"``) leaves out
exists, so a renamed slow test does not quietly slow the fast subset down."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import SLOW_MODULES, SLOW_TESTS

ROOT = Path(__file__).resolve().parent.parent


def test_every_slow_module_and_test_exists() -> None:
    for module in SLOW_MODULES:
        assert (ROOT / module).is_file(), module
    for test in SLOW_TESTS:
        path, _, name = test.partition("::")
        tree = ast.parse((ROOT / path).read_text())
        functions = {
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        assert name in functions, test


def test_the_slow_marker_is_registered() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"slow: ' in pyproject
    assert "--strict-markers" in pyproject
