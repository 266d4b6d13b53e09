"""The README stays a few screens long, and every file it links to exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
MAX_CHARACTERS = 15_000  # the picture, the two commands and the tour; reference material lives in docs/


def test_the_readme_fits_on_a_few_screens():
    assert len(README) <= MAX_CHARACTERS, f"README.md has {len(README)} characters; move reference material to docs/"


def test_every_link_of_the_readme_names_a_file_that_exists():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert local, "the README links to its docs"
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
