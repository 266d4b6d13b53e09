"""Every import of the project, read from the source with :mod:`ast`: which module imports which, where.

Nothing is imported or executed, so a module that would fail to import (or would start Streamlit) is still read.
An import counts wherever it stands: at the top, inside a function, or under ``if TYPE_CHECKING``; a
dependency that only a type checker follows is still a dependency of the design.

Module names are dotted from the repository root (``app/ui/views.py`` is ``app.ui.views``, a package's
``__init__.py`` its package). ``tests/`` is not a package (pytest puts it on ``sys.path``), so its files are
named ``tests.<stem>`` and a bare import of a sibling (``from equivariance_helpers import ...``) resolves to it.
``from P import x`` is an import of ``P.x`` where that is a module of the project, else of ``P``; the parent
packages Python imports along the way are not counted (an ``__init__`` that imports nothing cannot close a loop).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Import", "PACKAGES", "module_name", "project_modules", "read_imports", "project_imports"]

# The top-level folders whose Python files make up the project.
PACKAGES = ("models", "training", "experiments", "app", "benchmarks", "tools", "tests")


@dataclass(frozen=True)
class Import:
    """One imported name's module, as written in one file.

    Attributes:
        source: the importing module (``app.ui.views``).
        target: the imported module: a project module where it resolves to one (``app.analysis.compute``),
            else the top-level name of a third-party or standard module (``streamlit``, ``numpy``).
        path: the importing file, relative to the repository root (POSIX separators).
        line: the line of the import statement in that file.
        named: the module the statement names, made absolute (``from ..analysis import compute`` names
            ``app.analysis``; ``import numpy.linalg``, ``numpy.linalg``), to tell a stale path from a live one.
    """

    source: str
    target: str
    path: str
    line: int
    named: str = ""

    @property
    def internal(self) -> bool:
        """Whether the target is a module of the project."""
        return self.target.split(".")[0] in PACKAGES

    def where(self) -> str:
        """``path:line``, for messages."""
        return f"{self.path}:{self.line}"


def module_name(path: Path, root: Path) -> str:
    """The dotted name of the file ``path`` under ``root``: ``app/ui/views.py`` -> ``app.ui.views``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: str | Path) -> dict[str, Path]:
    """Every Python file of :data:`PACKAGES` under ``root``, by module name, in a stable order."""
    root = Path(root)
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                modules[module_name(path, root)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path], tests: set[str]) -> str:
    """The module that ``import name`` loads: ``name`` itself, a sibling in ``tests/``, or the top-level name."""
    if name in modules:
        return name
    if name.split(".")[0] in tests:
        return f"tests.{name}"
    if name.split(".")[0] in PACKAGES:
        # A project name that is not a module (a class re-exported by a package): its longest module prefix.
        parts = name.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        return ".".join(parts) or name
    return name.split(".")[0]


def _base(node: ast.ImportFrom, source: str, is_package: bool) -> str:
    """The absolute module of ``from <base> import ...``, relative levels resolved against ``source``."""
    if not node.level:
        return node.module or ""
    package = source.split(".") if is_package else source.split(".")[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def read_imports(path: Path, source: str, modules: dict[str, Path], root: Path) -> list[Import]:
    """The imports of one file, in the order they are written.

    Args:
        path: the file.
        source: its module name (:func:`module_name`).
        modules: every project module by name (:func:`project_modules`), to tell modules from names in them.
        root: the repository root, for the relative path in each :class:`Import`.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    relative = path.relative_to(root).as_posix()
    tests = {name.removeprefix("tests.") for name in modules if name.startswith("tests.")}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named = [alias.name for alias in node.names]
            targets = [_resolve(name, modules, tests) for name in named]
        elif isinstance(node, ast.ImportFrom):
            base = _base(node, source, path.name == "__init__.py")
            named = [base] * len(node.names)
            targets = [_resolve(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base,
                                modules, tests) for alias in node.names]
        else:
            continue
        named = [f"tests.{name}" if name.split(".")[0] in tests else name for name in named]
        pairs = dict.fromkeys(zip(targets, named, strict=True))
        found.extend(Import(source, target, relative, node.lineno, name) for target, name in pairs)
    return sorted(found, key=lambda imp: (imp.line, imp.target))


def project_imports(root: str | Path) -> list[Import]:
    """Every import of every project file under ``root`` (:data:`PACKAGES`), file by file."""
    root = Path(root)
    modules = project_modules(root)
    return [imp for name, path in modules.items() for imp in read_imports(path, name, modules, root)]
