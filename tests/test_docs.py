"""The documentation: its code compiles, names only what aiolock has, and its self-contained
examples run and print what their comments say; the site builds (``mkdocs build --strict``)
and its API reference shows no raw Sphinx role and no internal member."""

from __future__ import annotations

import ast
import asyncio
import html
import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import aiolock
import aiolock.testing
from aiolock.testing import external_redis_url, find_redis_server_binary

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks() -> list[tuple[str, str]]:
    """(page, code) of every ```python block of the README and the docs."""
    return [
        (page.relative_to(ROOT).as_posix(), block)
        for page in PAGES
        if page.is_file()
        for block in FENCE.findall(page.read_text())
    ]


BLOCKS = python_blocks()

# -- code in the pages ------------------------------------------------------------------------

#: The self-contained examples (they start their own redis-server): a line of each, and what
#: it prints.
EXPECTED = {
    'locks.fair_lock("printer")': ["[0, 1, 2, 3, 4]"],
    'locks.read_write_lock("config")': ["['blue', 'blue', 'blue'", "refused: config"],
    'locks.semaphore("downloads")': ["at most 2 at once", "0 left"],
    'locks.permit_expirable_semaphore("gpus")': [
        "another one gets: None",
        "the dead holder's permit came back after 0.",
    ],
    'locks.countdown_latch("workers-ready")': ["all ready: True", "count: 0"],
}
SELF_CONTAINED = [b for _, b in BLOCKS if "from aiolock.testing import RedisServer" in b]


def test_every_self_contained_example_is_checked() -> None:
    assert len(SELF_CONTAINED) == len(EXPECTED)
    for marker in EXPECTED:
        assert sum(marker in block for block in SELF_CONTAINED) == 1, marker


@pytest.mark.slow
@pytest.mark.parametrize("marker", sorted(EXPECTED))
async def test_self_contained_example_runs(marker: str) -> None:
    if find_redis_server_binary() is None or external_redis_url() is not None:
        pytest.skip("the examples start their own redis-server")
    (block,) = [b for b in SELF_CONTAINED if marker in b]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-W",
        "error",  # a warning (an unclosed client, a deprecation) fails the example
        "-c",
        block,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=ROOT,
    )
    async with asyncio.timeout(60):
        out, _ = await proc.communicate()
    text = out.decode()
    assert proc.returncode == 0, text
    for expected in EXPECTED[marker]:
        assert expected in text, text


#: The FastAPI apps of docs/integrations.md: whole programs a reader copies and runs.
FASTAPI_APPS = [b for p, b in BLOCKS if p == "docs/integrations.md" and "app = FastAPI(" in b]


@pytest.mark.slow  # the @locked endpoint waits its wait_time=2 before answering busy
async def test_the_fastapi_apps_of_the_docs_answer_busy_and_close_their_client(
    redis_url: str,
) -> None:
    """Each app, its lifespan run: every endpoint answers 200, then 429 or 409 while another
    client holds the order; when the app stops, the client it used is closed. (The
    lock_dependency app left its module-level client open at shutdown, and the @locked app
    configured none, so it used redis://localhost:6379/0.)"""
    pytest.importorskip("fastapi", reason="the examples extra is not installed")
    httpx = pytest.importorskip("httpx", reason="the examples extra is not installed")
    assert len(FASTAPI_APPS) == 2
    try:
        for block in FASTAPI_APPS:
            assert "redis://localhost:6379/0" in block
            namespace: dict[str, Any] = {}
            exec(block.replace("redis://localhost:6379/0", redis_url), namespace)
            app = namespace["app"]
            paths = [
                p.replace("{order_id}", "42") for p in re.findall(r'\.post\(\s*"([^"]+)"', block)
            ]
            assert paths
            transport = httpx.ASGITransport(app=app)
            async with (
                app.router.lifespan_context(app),
                httpx.AsyncClient(transport=transport, base_url="http://app") as http,
                aiolock.from_url(redis_url) as other,
            ):
                used = namespace.get("locks") or aiolock.default.default_client()
                assert not used.closed
                for path in paths:
                    assert (await http.post(path)).status_code == 200, path
                async with other.lock("order:42"):  # another worker holds the order
                    for path in paths:
                        assert (await http.post(path)).status_code in (409, 429), path
            assert used.closed, "the app left its client open"
    finally:
        aiolock.configure(aiolock.default.DEFAULT_URL)


@pytest.mark.parametrize("page", sorted({page for page, _ in BLOCKS}))
def test_python_blocks_compile(page: str) -> None:
    """Every block is valid Python (top-level ``await`` and ``async with`` allowed: most are
    excerpts of a coroutine)."""
    for number, (_, block) in enumerate(b for b in BLOCKS if b[0] == page):
        compile(block, f"{page}, block {number + 1}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_python_blocks_name_only_what_aiolock_has() -> None:
    """``aiolock.X`` in the pages' code exists (a renamed function fails here, not in a
    reader's hands)."""
    named = 0
    for page, block in BLOCKS:
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "aiolock"
            ):
                named += 1
                assert hasattr(aiolock, node.attr), f"{page}: aiolock.{node.attr}"
    assert named > 20


# -- the site and its API reference -----------------------------------------------------------

ROLE = re.compile(r":(?:py:)?(?:meth|class|func|attr|mod|data|exc|obj|const|ref):")
#: Members of the client and the metrics that the layers use, not users.
KNOWN_INTERNAL = {"runtime", "rule", "resolve_owner", "holds_of", "acquisition", "hold_ended"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site, built as CI builds it (strict: a warning fails the build)."""
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(
            module, reason="the docs extra is not installed: pip install -e '.[docs]'"
        )
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.fixture(scope="module")
def api_page(site: Path) -> str:
    return (site / "api" / "index.html").read_text()


def visible_text(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def anchors(page: str) -> set[str]:
    return set(re.findall(r'id="(aiolock\.[\w.]+)"', page))


@pytest.mark.slow
def test_every_page_of_the_nav_is_built(site: Path) -> None:
    pages = [p.stem for p in (ROOT / "docs").glob("*.md")]
    assert len(pages) >= 10
    for page in pages:
        built = site / "index.html" if page == "index" else site / page / "index.html"
        assert built.is_file(), page


@pytest.mark.slow
def test_the_api_reference_shows_no_sphinx_role(api_page: str) -> None:
    """The docstrings' ``:meth:`x``` roles become links (or code), never text."""
    text = visible_text(api_page)
    raw = [text[m.start() - 60 : m.end() + 30] for m in ROLE.finditer(text)]
    assert not raw, raw
    # They are links now: the client's docstring names aclose, Lock's lock and unlock.
    for target in ("aiolock.AioLock.aclose", "aiolock.Lock.unlock", "aiolock.from_url"):
        assert f'href="#{target}"' in api_page, target


@pytest.mark.slow
def test_the_api_reference_shows_every_public_name(api_page: str) -> None:
    found = anchors(api_page)
    for name in aiolock.__all__:
        assert f"aiolock.{name}" in found, name
    for member in ("aiolock.Lock.try_lock", "aiolock.AioLock.lock", "aiolock.Semaphore.acquire"):
        assert member in found, member


def internal_classes() -> set[str]:
    """Classes defined in aiolock's modules and not exported (Protocols aside: they describe
    what a public function accepts)."""
    found: set[str] = set()
    for info in pkgutil.walk_packages(aiolock.__path__, "aiolock."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and value.__module__ == info.name
                and name not in aiolock.__all__
                and not getattr(value, "_is_protocol", False)  # a typing.Protocol
            ):
                found.add(name)
    return found


def private_members() -> set[str]:
    """``aiolock.Name.member`` of every member of a public class marked ``:meta private:``."""
    found: set[str] = set()
    for name in aiolock.__all__:
        value = getattr(aiolock, name)
        if not inspect.isclass(value):
            continue
        for member, attribute in vars(value).items():
            doc = inspect.getdoc(attribute) if not isinstance(attribute, str) else None
            if doc and ":meta private:" in doc:
                found.add(f"aiolock.{name}.{member}")
    return found


@pytest.mark.slow
def test_the_api_reference_shows_no_internal_member(api_page: str) -> None:
    """What the layers use is not on the page: the members marked ``:meta private:``, the
    ones known to be internal, anything private, and no signature or heading names an
    internal type (a member that returns one is internal, whatever it is called)."""
    found = anchors(api_page)
    private = private_members()
    assert {f"aiolock.AioLock.{m}" for m in ("runtime", "rule")} <= private
    assert not private & found, private & found
    for anchor in found:
        member = anchor.rsplit(".", 1)[-1]
        assert member not in KNOWN_INTERNAL, anchor
        assert not member.startswith("_"), anchor
    internal = internal_classes()
    assert {"Runtime", "Rule", "Hold", "Leases", "Transport"} <= internal
    signatures = re.findall(
        r'<div class="doc-signature.*?</div>|<h[2-6][^>]*class="doc doc-heading.*?</h[2-6]>',
        api_page,
        re.DOTALL,
    )
    assert len(signatures) > 100
    for signature in signatures:
        text = visible_text(signature)
        named = {word for word in re.findall(r"\b[A-Z]\w+\b", text) if word in internal}
        assert not named, " ".join(text.split())
    text = visible_text(api_page)
    for name in (n for n in KNOWN_INTERNAL if "_" in n):  # not English words ("rule")
        assert not re.search(rf"\b{name}\b", text), name


def test_the_site_uses_the_extension_that_renders_the_roles() -> None:
    """The roles are rewritten by docs/_ext/aiolock_griffe.py, which mkdocs.yml loads."""
    config = (ROOT / "mkdocs.yml").read_text()
    assert "docs/_ext/aiolock_griffe.py" in config
    assert (ROOT / "docs" / "_ext" / "aiolock_griffe.py").is_file()
    sources = "".join(p.read_text() for p in (ROOT / "aiolock").rglob("*.py"))
    assert ROLE.search(sources)  # the docstrings do use roles: the test above means something
