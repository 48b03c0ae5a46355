"""The shape of the library, checked from its source (issue 18): no module reaches into another
module's private names, the modules import each other without a circle, the lock types
never call up into the client, and no module is over 700 lines."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "aiolock"


def _modules() -> dict[str, tuple[Path, ast.Module]]:
    """Every module under aiolock/, by dotted name, with its parsed source."""
    found: dict[str, tuple[Path, ast.Module]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = (path, ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return found


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined(tree: ast.Module) -> set[str]:
    """The private names a module defines: its top-level and class-level names, attributes it
    assigns through ``self``/``cls``, and names listed in a ``__slots__``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
            for arg in (
                (*node.args.args, *node.args.kwonlyargs)
                if not isinstance(node, ast.ClassDef)
                else ()
            ):
                names.add(arg.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__slots__" for t in targets):
                for const in ast.walk(node):
                    if isinstance(const, ast.Constant) and isinstance(const.value, str):
                        names.add(const.value)
    return {name for name in names if _is_private(name)}


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The dotted name a relative ``from ... import`` refers to."""
    if level == 0:
        return target or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def test_no_private_names_across_modules() -> None:
    """A module never imports, nor reads through another object, a ``_name`` that another
    aiolock module defines (its own names, ``self.``/``cls.``/``super()`` access and dunders are
    fine). Private modules (``testing/_server.py``) may be imported for their public names."""
    modules = _modules()
    defined = {name: _defined(tree) for name, (_, tree) in modules.items()}
    problems: list[str] = []
    for name, (path, tree) in modules.items():
        is_package = path.name == "__init__.py"
        others = set().union(*(names for other, names in defined.items() if other != name))
        where = path.relative_to(PACKAGE.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _resolve(name, is_package, node.level, node.module)
                if source in modules and source != name:
                    problems.extend(
                        f"{where}:{node.lineno}: imports {alias.name} from {source}"
                        for alias in node.names
                        if _is_private(alias.name)
                    )
            elif isinstance(node, ast.Attribute) and _is_private(node.attr):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if (
                    isinstance(owner, ast.Call)
                    and isinstance(owner.func, ast.Name)
                    and owner.func.id == "super"
                ):
                    continue
                if node.attr not in defined[name] and node.attr in others:
                    problems.append(f"{where}:{node.lineno}: reads {ast.unparse(node)}")
    assert not problems, "private names used across modules:\n" + "\n".join(problems)


def _walk(tree: ast.AST, *, into_functions: bool) -> list[ast.AST]:
    """The nodes of ``tree``; without ``into_functions``, those run when the module is
    imported (``if TYPE_CHECKING:`` blocks included, function bodies not)."""
    found: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        for child in ast.iter_child_nodes(node):
            if into_functions or not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                todo.append(child)
    return found


def _imports(
    modules: dict[str, tuple[Path, ast.Module]], *, into_functions: bool
) -> dict[str, set[str]]:
    """Which aiolock modules each module imports (``from . import x`` counts as importing
    the module ``x``): at import time and under TYPE_CHECKING, and with ``into_functions``
    also inside functions."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, tree) in modules.items():
        is_package = path.name == "__init__.py"
        for node in _walk(tree, into_functions=into_functions):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(name, is_package, node.level, node.module)
                # ``from . import x`` imports the module x (its package is only its parent)
                targets = [source] if node.module else []
                targets += [f"{source}.{alias.name}" for alias in node.names]
            for target in targets:
                # the module itself, or the nearest package above it that is an aiolock module
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle() -> None:
    """No circle among the modules' imports, TYPE_CHECKING imports included (a function may
    import lazily what sits above it: ``client.lock_dependency`` imports FastAPI's glue, the
    testing kit looks a patchable function up on its package)."""
    cycles = _cycles(_imports(_modules(), into_functions=False))
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


#: The modules of the lock types and of what lies below them: they are handed the runtime and
#: never import the client, even inside a function or for type checking.
BELOW_THE_CLIENT = (
    "aiolock.rules",
    "aiolock.commands",
    "aiolock.operation",
    "aiolock.settle",
    "aiolock.releases",
    "aiolock.acquire",
    "aiolock.guard",
    "aiolock.extending",
    "aiolock.runtime",
    "aiolock.holds",
    "aiolock.watchdog",
    "aiolock.leases",
    "aiolock.pubsub",
    "aiolock.requests",
    "aiolock.lock",
    "aiolock.fair_lock",
    "aiolock.fenced_lock",
    "aiolock.spin_lock",
    "aiolock.rwlock",
    "aiolock.semaphore",
    "aiolock.permit_semaphore",
    "aiolock.latch",
    "aiolock.members",
    "aiolock.multilock",
    "aiolock.redlock",
    "aiolock.decorator",
)


def test_the_lock_types_never_import_the_client() -> None:
    modules = _modules()
    graph = _imports(modules, into_functions=True)
    below = [name for name in modules if name.startswith(BELOW_THE_CLIENT)]
    assert set(BELOW_THE_CLIENT) <= set(modules)
    importers = [name for name in below if "aiolock.client" in graph[name]]
    assert not importers, f"import aiolock.client: {importers}"
    # nor anything that imports it (the package, the default client, FastAPI's glue)
    above = {name for name in modules if "aiolock.client" in graph[name]} | {"aiolock.client"}
    reaching = {name: sorted(graph[name] & above) for name in below if graph[name] & above}
    assert not reaching, f"import what imports the client: {reaching}"


#: the longest a module under aiolock/ may be (issue 18: a shape a newcomer can read)
MAX_LINES = 700


def test_no_module_is_over_700_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE.parent)): lines
        for path, _ in _modules().values()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"
