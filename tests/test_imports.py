"""The project's imports, read from the source: they follow the layering rule, close no loop, and the
architecture diagram in ``docs/architecture.md`` is the one they draw. Planted violations prove the checks bite."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO
from tools.architecture_diagram import BEGIN, END, diagram, longest_chain
from tools.import_rules import describe_loop, import_cycles, rule_violations
from tools.imports import PACKAGES, project_imports, project_modules


def _loops(imports) -> list[str]:
    return [describe_loop(loop) for loop in import_cycles(imports)]


def test_every_import_follows_the_rule():
    violations = rule_violations(project_imports(REPO))
    assert not violations, "imports against the rule of tools/import_rules.py:\n" + "\n".join(violations)


def test_no_import_loops_anywhere():
    loops = _loops(project_imports(REPO))
    assert not loops, "import loops:\n" + "\n".join(loops)


def test_regions_and_slides_import_one_way_over_the_cells_below_both():
    """One path (issue 68): region mode may read through the slide reader, the slides never import region mode, and
    the cells' evaluator both run imports neither."""
    imports = [imp for imp in project_imports(REPO) if imp.internal]
    upwards = [f"{imp.where()}: {imp.source} imports {imp.target}" for imp in imports
               if imp.source.startswith(("app.slides.", "app.cells.")) and imp.target.startswith("app.region")
               or imp.source.startswith("app.cells.") and imp.target.startswith("app.slides")]
    assert not upwards, "\n".join(upwards)
    assert ("app.slides.engine", "app.cells.evaluation") in {(imp.source, imp.target) for imp in imports}
    assert ("app.region.cli", "app.slides.reader") in {(imp.source, imp.target) for imp in imports}


def _stale(root: Path) -> list[tuple[str, str]]:
    """(where, named) of each import naming a project module or package that does not exist under ``root``."""
    modules = project_modules(root)
    known = {".".join(name.split(".")[:k]) for name in modules for k in range(1, name.count(".") + 2)}
    return [(imp.where(), imp.named) for imp in project_imports(root) if imp.internal and imp.named not in known]


def test_every_project_import_names_a_module_that_exists():
    stale = [f"{where}: {named}" for where, named in _stale(REPO)]
    assert not stale, "imports of project modules that do not exist:\n" + "\n".join(stale)


def test_the_reader_sees_the_imports_the_app_is_known_to_have():
    imports = {(imp.source, imp.target) for imp in project_imports(REPO)}
    # Relative, absolute, under TYPE_CHECKING, inside a function, a package's __init__, a sibling in tests/.
    assert ("app.pictures.arrows", "app.analysis.compute") in imports
    assert ("app.main", "app.ui.page") in imports and ("app.ui.page", "app.ui.views") in imports
    assert ("app.ui.comparison", "app.ui.inputs") in imports
    assert ("app.region.cli", "app.region.figures") in imports
    assert ("app.cells.mosaic", "app.gallery") in imports
    assert ("app.ui.views", "streamlit") in imports
    assert ("tests.test_models", "tests.equivariance_helpers") in imports
    assert ("experiments.table3", "training.sweep") in imports
    assert not [pair for pair in imports if pair[0].startswith("training") and pair[1].startswith("experiments")]


def _copy_project(root: Path) -> Path:
    """The project's Python files (only they are read) in a scratch tree."""
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if "__pycache__" not in path.parts:
                target = root / path.relative_to(REPO)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
    return root


def _plant(path: Path, line: str) -> int:
    """Append ``line`` to ``path``; its line number."""
    text = path.read_text()
    path.write_text(text + line + "\n")
    return text.count("\n") + 1


def test_a_planted_loop_is_named_with_its_files_and_lines(tmp_path):
    root = _copy_project(tmp_path)
    # app.analysis.angles imports app.analysis.compute; compute importing angles back closes a loop.
    line = _plant(root / "app" / "analysis" / "compute.py", "from . import angles  # noqa")
    loops = _loops(project_imports(root))
    assert len(loops) == 1, loops
    assert f"app/analysis/compute.py:{line} app.analysis.compute imports app.analysis.angles" in loops[0]
    assert re.search(r"app/analysis/angles\.py:\d+ app\.analysis\.angles imports app\.analysis\.compute", loops[0])
    assert not rule_violations(project_imports(root))  # within one package: only the loop test sees it


def test_planted_imports_against_the_rule_are_named(tmp_path):
    root = _copy_project(tmp_path)
    upwards = _plant(root / "app" / "analysis" / "padding.py", "from ..pictures.plots import image_rgb")
    streamlit = _plant(root / "app" / "pictures" / "plots.py", "import streamlit as st")
    training = _plant(root / "app" / "cells" / "evaluation.py", "from training.metrics import roc_auc")
    library = _plant(root / "models" / "registry.py", "import app.analysis.compute")
    picture = _plant(root / "app" / "cells" / "mosaic.py", "from ..region.figures import render_region_png")
    region = _plant(root / "app" / "slides" / "engine.py", "from ..region.overlays import probability_field")
    experiment = _plant(root / "training" / "loop.py", "from experiments.table3 import MODELS")
    violations = rule_violations(project_imports(root))
    expected = [f"app/analysis/padding.py:{upwards}: app.analysis.padding imports app.pictures.plots",
                f"app/pictures/plots.py:{streamlit}: app.pictures.plots imports streamlit",
                f"app/cells/evaluation.py:{training}: app.cells.evaluation imports training.metrics",
                f"models/registry.py:{library}: models.registry imports app.analysis.compute",
                f"app/cells/mosaic.py:{picture}: app.cells.mosaic imports app.region.figures",
                f"app/slides/engine.py:{region}: app.slides.engine imports app.region.overlays",
                f"training/loop.py:{experiment}: training.loop imports experiments.table3"]
    for start in expected:
        assert sum(v.startswith(start) for v in violations) == 1, (start, violations)
    assert len(violations) == len(expected), violations


def test_a_stale_module_path_is_named(tmp_path):
    root = _copy_project(tmp_path)
    line = _plant(root / "benchmarks" / "region.py", "from app.region_cli import main  # noqa")
    assert _stale(root) == [(f"benchmarks/region.py:{line}", "app.region_cli")]


def test_the_architecture_diagram_is_current():
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text[text.index(BEGIN):text.index(END) + len(END)]
    assert block == diagram(REPO), "docs/architecture.md is out of date: run python -m tools.architecture_diagram"


def test_longest_chain():
    assert longest_chain({("a", "b"), ("b", "c"), ("a", "c"), ("d", "c")}) == 3
    assert longest_chain(set()) == 0
    with pytest.raises(ValueError, match="loop"):
        longest_chain({("a", "b"), ("b", "a")})
