"""The README stays a few screens long, every file it links to exists, and every command the docs name runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.conftest import REPO

README = (REPO / "README.md").read_text()
MAX_CHARACTERS = 15_000  # the picture, the two commands and the tour; reference material lives in docs/
# ``python -m MODULE [WORD]`` of the project; WORD (a subcommand or a first argument) only when a word ends there.
COMMAND = re.compile(r"python -m ((?:models|training|experiments|app|benchmarks|tools)(?:\.\w+)*)"
                     r"(?: ([a-z][a-z0-9_]*)(?![\w/.-]))?")
# Named as history only, beside what replaced them (docs/pathology.md, docs/training.md).
RETIRED = {"training.timed_sweep"}


def _named_commands() -> set[tuple[str, ...]]:
    """Each distinct command the README and docs/ name, and those the committed cards and records name as how
    they were made (which keep the form they were made with), as argv after ``python -m``."""
    texts = [README, *(path.read_text() for path in sorted((REPO / "docs").glob("*.md")))]
    texts += [path.read_text() for folder in ("checkpoints", "results") for path in (REPO / folder).rglob("*.json")]
    commands = set()
    for text in texts:
        for module, word in COMMAND.findall(text):
            if module not in RETIRED:
                commands.add((module, word) if word else (module,))
    return commands


def _help(commands: list[tuple[str, ...]]) -> list[tuple[tuple[str, ...], int, str]]:
    """``python -m COMMAND --help`` of each command: its argv, exit status and the end of its stderr. Each runs in a
    process of its own, forked from one that imported torch once (tests/forked_help.py)."""
    done = subprocess.run([sys.executable, str(REPO / "tests" / "forked_help.py"), json.dumps(commands)], cwd=REPO,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"tests/forked_help.py failed:\n{done.stderr[-2000:]}"
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [tuple(row["argv"]) for row in rows] == commands, "a command's result is missing"
    return [(tuple(row["argv"]), row["code"], row["stderr"]) for row in rows]


def test_the_readme_fits_on_a_few_screens():
    assert len(README) <= MAX_CHARACTERS, f"README.md has {len(README)} characters; move reference material to docs/"


def test_every_link_of_the_readme_names_a_file_that_exists_and_every_named_command_runs():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert local, "the README links to its docs"
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
    commands = sorted(_named_commands())
    assert ("experiments", "table3") in commands and ("training", "train") in commands
    failed = [f"python -m {' '.join(argv)} --help: exit {code}\n{err}"
              for argv, code, err in _help(commands) if code != 0]
    assert not failed, "commands the docs or the committed cards name do not run:\n" + "\n".join(failed)
