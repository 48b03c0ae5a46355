"""The Lua scripts as files: a header each, and code that several scripts share written once,
as a fragment composed in when the scripts are loaded (aiolock.scripts.compose)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aiolock import scripts

SCRIPTS = Path(scripts.__file__).parent
FRAGMENTS = SCRIPTS / "fragments"
CLI_SCRIPT = SCRIPTS.parent / "cli" / "force_unlock.lua"
LOADED = {name: value for name, value in vars(scripts).items() if isinstance(value, scripts.Script)}


def test_every_script_file_is_loaded_and_says_what_it_takes_and_returns() -> None:
    files = sorted(path.stem for path in SCRIPTS.glob("*.lua"))
    assert files == sorted(script.name for script in LOADED.values())
    for path in [*SCRIPTS.glob("*.lua"), CLI_SCRIPT]:
        text = path.read_text()
        assert text.startswith("-- "), path
        header = text[: text.index("\n--@include")] if "--@include" in text else text
        assert "-- Returns" in header and ("KEYS[1]" in header or "KEYS[1..n]" in header), path


def test_fragments_say_what_they_expect_and_define() -> None:
    fragments = sorted(FRAGMENTS.glob("*.lua"))
    assert fragments
    for path in fragments:
        text = path.read_text()
        assert re.match(rf"-- fragment {path.stem}: ", text), path
        assert "\n-- Expects " in text and "\n-- Defines " in text, path


@pytest.mark.parametrize("name", sorted(LOADED))
def test_loaded_scripts_are_whole(name: str) -> None:
    source = LOADED[name].source
    assert "--@include" not in source
    for defined in re.findall(r"^local function (\w+)", source, flags=re.MULTILINE):
        assert source.count(f"local function {defined}(") == 1, defined


def test_the_fair_line_is_written_once() -> None:
    """Dropping the waiters presumed gone from the head of a fair lock's line was written out
    in five scripts and the CLI's: now in the fragment only, composed into each."""
    users = [*SCRIPTS.glob("fair_lock_*.lua"), CLI_SCRIPT]
    for path in users:
        text = path.read_text()
        assert "while true do" not in text, path
    composed = {path: scripts.compose(path.read_text()) for path in users}
    for path, text in composed.items():
        if "first_waiter(" in path.read_text():
            assert text.count("local function first_waiter(") == 1, path
    assert "local function first_waiter(" in (FRAGMENTS / "fair_line.lua").read_text()


def test_the_read_lock_release_and_purge_share_their_tail() -> None:
    for name in ("read_lock_release", "read_lock_purge"):
        text = (SCRIPTS / f"{name}.lua").read_text()
        assert "hkeys" not in text and "--@include read_lock_rest" in text, name


def test_compose_takes_each_fragment_in_once() -> None:
    text = scripts.compose("--@include server_ms\n--@include fair_line\n--@include server_ms\n")
    assert text.count("local function server_ms(") == 1
    assert text.count("local function first_waiter(") == 1
    assert "--@include" not in text
