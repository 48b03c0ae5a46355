"""The README is a first read: short, its two first-screen commands are what CI runs, its
links lead somewhere, and its web handler does what the text says."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

import aiolock

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
FIRST_SCREEN = README.split("\n## Install\n")[0]
LINKED_FROM = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "examples" / "README.md",
    *sorted((ROOT / "examples").glob("*/README.md")),
    ROOT / "benchmarks" / "README.md",
]


def ci_extras() -> str:
    """The extras .ci/run installs: everything the full suite needs."""
    match = re.search(r"^EXTRAS='\.\[([a-z,-]+)\]'$", (ROOT / ".ci" / "run").read_text(), re.M)
    assert match is not None
    return match[1]


def test_the_readme_is_a_first_read() -> None:
    assert len(README.splitlines()) <= 300
    assert len(FIRST_SCREEN.splitlines()) <= 45


def test_the_first_screen_has_the_two_commands() -> None:
    """See it (the demo) and test it (the whole suite, with every extra its tests need, the
    same as CI), each one line to copy into a fresh clone; and how long the suite takes."""
    commands = re.findall(r"```bash\n(.*?)\n```", FIRST_SCREEN, flags=re.DOTALL)
    venv = "python3 -m venv .venv && . .venv/bin/activate && "
    assert commands == [
        f"{venv}pip install -e '.[demo]' && aiolock demo",
        f"{venv}pip install -e '.[{ci_extras()}]' && pytest",
    ]
    assert re.search(r"the whole suite takes \*\*about \d+ minutes\*\*", FIRST_SCREEN)
    assert "postgres" in ci_extras().split(",")  # the PostgreSQL test's driver


def test_the_readme_says_where_it_is_installed_from() -> None:
    install = README.split("\n## Install\n")[1].split("\n## ")[0]
    assert "not on PyPI yet" in install
    commands = [
        shlex.split(line.split("#")[0])
        for block in re.findall(r"```bash\n(.*?)\n```", install, re.DOTALL)
        for line in block.splitlines()
    ]
    assert ["pip", "install", "-e", "."] in commands
    wheel = f"dist/aiolock_redis-{aiolock.__version__}-py3-none-any.whl"
    assert ["pip", "wheel", "--no-deps", "--wheel-dir", "dist", "."] in commands
    assert ["pip", "install", f"{wheel}[otel]"] in commands


LINK = re.compile(r"\]\(([^)\s]+)\)")


def slugs(markdown: str) -> set[str]:
    """The anchors of a page's headings, as MkDocs and GitHub make them."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, re.M):
        text = re.sub(r"[`*]", "", heading).strip().lower()
        found.add(re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", text)))
    return found


@pytest.mark.parametrize("page", LINKED_FROM, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_lead_somewhere(page: Path) -> None:
    if not page.is_file():
        pytest.skip("no such page")
    text = page.read_text()
    for link in LINK.findall(text):
        if re.match(r"[a-z]+:", link):
            continue  # https://, mailto:
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{page.name}: {link}"
        if anchor and path.suffix == ".md":
            assert anchor in slugs(path.read_text()), f"{page.name}: {link}"


def fastapi_block() -> str:
    match = re.search(r"## In a web app\n.*?```python\n(.*?)```", README, re.DOTALL)
    assert match is not None
    return match[1]


async def test_the_fastapi_handler_answers_429_while_the_order_is_locked(redis_url: str) -> None:
    pytest.importorskip("fastapi", reason="the examples extra is not installed")
    httpx = pytest.importorskip("httpx", reason="the examples extra is not installed")
    namespace: dict[str, Any] = {}
    exec(fastapi_block().replace("redis://localhost:6379/0", redis_url), namespace)
    app = namespace["app"]
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://app") as http,
        aiolock.from_url(redis_url) as other,
    ):
        response = await http.post("/orders/42/pay")
        assert (response.status_code, response.json()) == (200, {"order": "42"})
        async with other.lock("order:42"):  # another worker holds the order
            response = await http.post("/orders/42/pay")
            assert response.status_code == 429
            assert response.headers["retry-after"] == "1"
            assert (await http.post("/orders/43/pay")).status_code == 200
        assert (await http.post("/orders/42/pay")).status_code == 200


def test_no_page_installs_from_pypi() -> None:
    """aiolock is not on PyPI yet: a page that says ``pip install 'aiolock-redis[otel]'`` sends
    a reader to a command that finds nothing (docs/operations.md and docs/testing.md did).
    Only the sentences that say so, or what will work once it is published, may name it."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = []
    for page in pages:
        for sentence in re.split(r"(?<=\.)\s", page.read_text()):
            if re.search(r"pip install ['\"]?aiolock-redis", sentence) and not re.search(
                r"PyPI|published|finds nothing", sentence
            ):
                found.append(f"{page.name}: {' '.join(sentence.split())}")
    assert not found, found
