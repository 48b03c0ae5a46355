"""A Griffe extension for the API reference (mkdocstrings, ``docs/api.md``).

aiolock's docstrings use Sphinx's roles (``:meth:`aclose```, ``:class:`~aiolock.Lock```), which
read well in ``help()`` and an editor. mkdocstrings renders Markdown, where a role would be
printed as text, so this extension rewrites them when the site is built:

* a role whose target is on the API page (a name in ``aiolock.__all__``, or a documented member
  of one) becomes a Markdown cross-reference, ``[`aclose()`][aiolock.AioLock.aclose]``;
  Sphinx's rules apply: a target is looked up in the docstring's class, then its module, then
  ``aiolock``; ``~`` shows the last component only; methods and functions get ``()``;
* any other role (an internal module or class) becomes plain code, ```name```.

It also hides what the layers use but users do not: a member whose docstring holds the line
``:meta private:`` (Sphinx autodoc's marker) is left out of the reference.

Loaded from ``mkdocs.yml`` (``plugins: mkdocstrings: handlers: python: options:
extensions``); ``tests/test_docs.py`` builds the site and checks the page it produces.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import griffe

PACKAGE = "aiolock"
PRIVATE_MARKER = ":meta private:"
ROLE = re.compile(
    r":(?:py:)?(?P<role>meth|class|func|attr|mod|data|exc|obj|const|ref):"
    r"`(?P<text>[^`]+)`"
)
CALLABLE_ROLES = {"meth", "func"}


def is_private(obj: griffe.Object | griffe.Alias) -> bool:
    """Whether ``obj``'s docstring marks it ``:meta private:``."""
    try:
        docstring = obj.docstring
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return False
    return docstring is not None and PRIVATE_MARKER in docstring.value


class AiolockReference(griffe.Extension):
    """Sphinx roles to Markdown cross-references; ``:meta private:`` members hidden."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path != PACKAGE:
            return
        hidden = self._hide_private(pkg)
        self.public = self._public_paths(pkg)
        self.package = pkg
        for obj in self._walk(pkg):
            if obj.docstring is not None and obj.path not in hidden:
                obj.docstring.value = ROLE.sub(partial(self._rewrite, obj), obj.docstring.value)

    # -- what the page shows ------------------------------------------------------------

    def _walk(self, obj: griffe.Object) -> list[griffe.Object]:
        found = [obj]
        for member in obj.members.values():
            if not member.is_alias:
                assert isinstance(member, griffe.Object)
                found.extend(self._walk(member))
        return found

    def _hide_private(self, pkg: griffe.Module) -> set[str]:
        """Remove the members marked ``:meta private:``; their paths."""
        hidden: set[str] = set()
        for obj in self._walk(pkg):
            for name, member in list(obj.members.items()):
                if not member.is_alias and is_private(member):
                    hidden.add(member.path)
                    del obj.members[name]
        return hidden

    def _public_paths(self, pkg: griffe.Module) -> dict[str, str]:
        """Every path of an object on the API page (its own, and the one of its definition)
        -> the path of its anchor there (``aiolock.Name`` or ``aiolock.Name.member``)."""
        public: dict[str, str] = {}
        for export in pkg.exports or ():
            name = str(export)
            alias = pkg.members.get(name)
            if alias is None:
                continue
            target = alias.final_target if alias.is_alias else alias
            anchor = f"{PACKAGE}.{name}"
            public[anchor] = public[target.path] = anchor
            for member_name, member in target.members.items():
                if member_name.startswith("_") or member.is_alias:
                    continue
                public[f"{anchor}.{member_name}"] = f"{anchor}.{member_name}"
                public[f"{target.path}.{member_name}"] = f"{anchor}.{member_name}"
        return public

    # -- rewriting a role ---------------------------------------------------------------

    def _rewrite(self, obj: griffe.Object, match: re.Match[str]) -> str:
        role, text = match["role"], match["text"].strip()
        title = None
        explicit = re.fullmatch(r"(?P<title>.*?)\s*<(?P<target>[^>]+)>", text)
        if explicit:
            title, text = explicit["title"], explicit["target"]
        link = not text.startswith("!")
        text = text.lstrip("!")
        short = text.startswith("~")
        target = text.lstrip("~").removesuffix("()")
        shown = title or (target.rsplit(".", 1)[-1] if short else target)
        if role in CALLABLE_ROLES and not title:
            shown += "()"
        anchor = self._resolve(obj, target) if link else None
        return f"[`{shown}`][{anchor}]" if anchor else f"`{shown}`"

    def _resolve(self, obj: griffe.Object, target: str) -> str | None:
        """The anchor of ``target`` as written in ``obj``'s docstring (Sphinx's order: the
        current class, the current module, the package, then the name as given)."""
        scopes: list[str] = []
        if obj.is_class:
            scopes.append(obj.path)
        elif obj.parent is not None and obj.parent.is_class:
            scopes.append(obj.parent.path)
        module = obj if obj.is_module else obj.module
        scopes += [module.path, PACKAGE]
        for candidate in [f"{scope}.{target}" for scope in scopes] + [target]:
            if candidate in self.public:
                return self.public[candidate]
        return None
