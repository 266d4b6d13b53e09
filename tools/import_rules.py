"""Which part of the project may import which, and the loops that no part may close.

The rule is an allow-list by module prefix: a module may import the project modules under the prefixes its
entry lists (the longest entry that names it applies), and a third-party module only where
:data:`THIRD_PARTY` allows it. Together they say: the library (``models``) stands alone, its CPU fast paths
(``models.cpu``) below everything else in it; ``training`` and the app build on it and never on each other;
``experiments`` (the paper's tables from the runs) builds on ``training`` and ``models``, and no package below
imports it (``python -m training`` runs the commands that moved there as a process of ``python -m experiments``);
inside the app, imports run ``ui -> region -> pictures -> analysis -> models`` and ``ui -> region -> slides ->
cells -> analysis`` (region's command reads through the slide reader; no module of ``app.slides`` imports
``app.region``: the cell evaluator both run is ``app.cells``, below both), the gallery sits beside the pictures,
and only ``app.ui`` (and the entries ``app/main.py``, ``app/server.py``) touches Streamlit.
Benchmarks and tests may use everything, but nothing imports them.

A cycle is a loop of imports among project modules, whatever the rule allows; each is reported with the file
and line of every import that closes it.
"""

from __future__ import annotations

from collections import defaultdict

from .imports import Import

__all__ = ["ALLOWED", "THIRD_PARTY", "allowed_prefixes", "rule_violations", "import_cycles", "describe_loop"]

_APP_BELOW_UI = ("app.region", "app.slides", "app.cells", "app.pictures", "app.gallery", "app.analysis",
                 "models")

# Importing module prefix -> the project prefixes it may import (besides itself, where listed).
ALLOWED: dict[str, tuple[str, ...]] = {
    "models": ("models",),
    # The optional CPU fast paths, the library's bottom layer: the concepts import them, never the other way.
    "models.cpu": ("models.cpu",),
    "training": ("training", "models"),
    "experiments": ("experiments", "training", "models"),
    "app": (),
    "app.analysis": ("app.analysis", "models"),
    "app.pictures": ("app.pictures", "app.analysis", "models"),
    "app.gallery": ("app.gallery", "app.analysis"),
    # One path for regions and slides (issue 68): the cells below both, slides below region, never the other way.
    # The cell evaluator and the scored PCam mosaic: numbers, no pictures, over the analysis and the library.
    "app.cells": ("app.cells", "app.gallery", "app.analysis", "models"),
    "app.cells.evaluation": ("app.analysis", "models"),
    # Whole slides' pure part: reading, scale, tissue, the engine over the cells' evaluator; numbers, no pictures,
    # and nothing of region mode.
    "app.slides": ("app.slides", "app.cells", "app.analysis", "models"),
    # The demo images beside the demo slides: the gallery's region and the scored mosaic.
    "app.slides.demos": ("app.slides", "app.cells", "app.gallery", "app.analysis", "models"),
    # Region mode: the cells' evaluator with its pictures; its command reads its image through the slide reader.
    "app.region": ("app.region", "app.cells", "app.pictures", "app.gallery", "app.analysis", "models"),
    "app.region.cli": ("app.region", "app.slides.reader", "app.cells", "app.pictures", "app.gallery", "app.analysis",
                       "models"),
    "app.ui": ("app.ui",) + _APP_BELOW_UI,
    "app.main": ("app.ui",) + _APP_BELOW_UI,
    # The server around the page: prepares the first visit (app.ui.first_visit) before it answers.
    "app.server": ("app.ui", "app.slides.tiles"),
    # The start-up warm-up: computes what the page reads, draws nothing.
    "app.warm": ("app.analysis", "models"),
    "benchmarks": ("benchmarks", "app", "experiments", "training", "models"),
    "tools": ("tools",),
    "tests": ("tests", "tools", "benchmarks", "app", "experiments", "training", "models"),
}

# Third-party top-level module -> the module prefixes that may import it (any other third party: anyone).
THIRD_PARTY: dict[str, tuple[str, ...]] = {
    "streamlit": ("app.ui", "app.main", "app.server", "benchmarks", "tests"),
}


def _longest(prefixes, module: str) -> str | None:
    """The longest of ``prefixes`` that is ``module`` or a package above it."""
    matches = [p for p in prefixes if module == p or module.startswith(p + ".")]
    return max(matches, key=len, default=None)


def allowed_prefixes(module: str) -> tuple[str, ...]:
    """The project prefixes ``module`` may import (:data:`ALLOWED`); a module no entry names may import none."""
    entry = _longest(ALLOWED, module)
    return ALLOWED[entry] if entry is not None else ()


def rule_violations(imports: list[Import]) -> list[str]:
    """One message per import against the rule, ``path:line: a imports b, ...``, in file order."""
    messages = []
    for imp in imports:
        if imp.internal:
            if imp.target == imp.source or _longest(allowed_prefixes(imp.source), imp.target) is not None:
                continue
            may = ", ".join(allowed_prefixes(imp.source))
            may = f"only {may}" if may else "no project module"
            messages.append(f"{imp.where()}: {imp.source} imports {imp.target}, against the rule: {imp.source} "
                            f"may import {may}")
        elif imp.target in THIRD_PARTY and _longest(THIRD_PARTY[imp.target], imp.source) is None:
            messages.append(f"{imp.where()}: {imp.source} imports {imp.target}; only "
                            f"{', '.join(THIRD_PARTY[imp.target])} may")
    return messages


def _components(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of ``graph`` (Tarjan's algorithm, iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph.get(nxt, []))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    found.append(sorted(component))
    return found


def _loop(component: list[str], edges: dict[tuple[str, str], Import]) -> list[Import]:
    """One loop through ``component``'s first module, as the imports that make it (breadth-first: shortest)."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for (source, target) in edges:
                if source != node or target not in members:
                    continue
                if target == start:
                    path = [edges[(node, start)]]
                    while node != start:
                        path.append(edges[(previous[node], node)])
                        node = previous[node]
                    return path[::-1]
                if target not in previous:
                    previous[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"{component} is not a loop")


def import_cycles(imports: list[Import]) -> list[list[Import]]:
    """Every loop of imports among project modules: one loop per strongly connected group, as its imports."""
    edges: dict[tuple[str, str], Import] = {}
    graph: dict[str, list[str]] = defaultdict(list)
    for imp in imports:
        if imp.internal and imp.target != imp.source and (imp.source, imp.target) not in edges:
            edges[(imp.source, imp.target)] = imp
            graph[imp.source].append(imp.target)
    return [_loop(c, edges) for c in _components(dict(graph)) if len(c) > 1]


def describe_loop(loop: list[Import]) -> str:
    """A loop from :func:`import_cycles` as one line: ``path:line a imports b; path:line b imports a``."""
    return "; ".join(f"{imp.where()} {imp.source} imports {imp.target}" for imp in loop)
