"""The code hash beside a card's commit: what it covers, and the check that a commit is the code that ran.

Every git test builds its own tiny repository in ``tmp_path``: nothing here depends on this repo's history.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from training.cli import main as cli_main
from training.provenance import (
    CODE_HASH_SINCE,
    check_commit,
    code_record,
    code_sha256,
    commit_manifest,
    find_code_commit,
    tree_manifest,
)
from training.provenance_check import check_card

FILES = {"models/net.py": "WIDTH = 8\n", "models/cpu/kernel.cpp": "int f() { return 1; }\n",
         "training/loop.py": "EPOCHS = 3\n", "training/data/__init__.py": ""}
VERIFIED = "verified: the commit's files of models/ and training/ are the ones that ran (they hash to code_sha256)"


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def git(root: Path, *args: str) -> str:
    env = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.org", *args], cwd=root,
                          env=env, capture_output=True, text=True, check=True).stdout.strip()


def commit_all(root: Path, message: str) -> str:
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)
    return git(root, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path) -> Path:
    root = write_tree(tmp_path / "repo", FILES)
    git(root, "init", "-q")
    commit_all(root, "first")
    return root


def test_the_hash_is_the_same_for_a_copy_of_the_tree_anywhere(tmp_path):
    here = write_tree(tmp_path / "here", FILES)
    there = tmp_path / "elsewhere" / "deeper"
    shutil.copytree(here, there)
    os.utime(there / "models/net.py", (0, 0))  # modification times do not count
    assert code_sha256(there) == code_sha256(here)
    assert len(code_sha256(here)) == 64


def test_one_byte_of_a_models_file_changes_the_hash(tmp_path):
    root = write_tree(tmp_path, FILES)
    before = code_sha256(root)
    (root / "models/net.py").write_text("WIDTH = 9\n")
    assert code_sha256(root) != before


def test_files_outside_models_and_training_and_caches_do_not_count(tmp_path):
    root = write_tree(tmp_path, FILES)
    before = code_sha256(root)
    write_tree(root, {"app/page.py": "x = 1\n", "setup.py": "", "models/__pycache__/net.py": "",
                      "models/README.md": "notes\n", "training/.hidden.py": "", "models/.cache/net.py": ""})
    assert code_sha256(root) == before
    assert sorted(tree_manifest(root)) == sorted(FILES)


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="no sha256sum here")
def test_the_hash_is_what_sha256sum_lists_for_the_files(tmp_path):
    root = write_tree(tmp_path, FILES)
    listing = subprocess.run(["sha256sum", *sorted(FILES)], cwd=root, capture_output=True, text=True).stdout
    assert code_sha256(root) == hashlib.sha256(listing.encode()).hexdigest()


def test_a_clean_tree_verifies_its_commit(repo):
    head = git(repo, "rev-parse", "HEAD")
    record = code_record(repo)
    assert record == {"commit": head, "code_sha256": code_sha256(repo), "commit_check": VERIFIED}
    assert commit_manifest("HEAD", repo) == tree_manifest(repo)
    assert check_commit(head, record["code_sha256"], repo) == (
        f"commit {head[:12]} verified: its files of models/ and training/ hash to the recorded code_sha256")


def test_a_tree_that_is_not_its_commit_leaves_the_commit_unverified(repo):
    # As a checkout copied with an older .git: the files moved on, the commit did not.
    (repo / "models/net.py").write_text("WIDTH = 16\n")
    (repo / "training/data/__init__.py").unlink()
    write_tree(repo, {"training/new.py": ""})
    record = code_record(repo)
    assert record["commit"].endswith("+dirty")
    assert record["commit_check"] == (
        "unverified: the files of models/ and training/ that ran are not the commit's (changed: models/net.py; "
        "not in the commit: training/new.py; only in the commit: training/data/__init__.py); code_sha256 alone "
        "names the code that ran")


def test_a_commit_whose_files_differ_does_not_match_and_the_one_that_ran_is_found(repo):
    first = git(repo, "rev-parse", "HEAD")
    ran = code_sha256(repo)
    (repo / "training/loop.py").write_text("EPOCHS = 4\n")
    second = commit_all(repo, "second")
    write_tree(repo, {"docs.md": "no code\n"})
    third = commit_all(repo, "third: no code")
    now = code_sha256(repo)
    assert check_commit(third, ran, repo) == (
        f"commit {third[:12]} does not match the code that ran: its files of models/ and training/ hash to "
        f"{now[:12]}, the recorded code_sha256 is {ran[:12]}; the recorded commit is stale")
    assert check_commit(third + "+dirty", ran, repo).endswith(
        "; the code that ran had edits never committed as such, or a stale .git")
    assert check_commit(second, now, repo).startswith(f"commit {second[:12]} verified")
    assert find_code_commit(ran, repo) == first
    assert find_code_commit(now, repo) == second  # the commit that made the files so, not a later one
    assert find_code_commit("0" * 64, repo) is None


def test_unknown_commits_and_old_cards_are_named_not_failed(repo):
    code = code_sha256(repo)
    assert check_commit("d4a1247", None) == f"no code hash recorded (made before code hashes, {CODE_HASH_SINCE})"
    assert CODE_HASH_SINCE == "2026-11-28"
    assert check_commit("0123456789ab", code, repo) == (
        "commit 0123456789ab is not in this repository's history: cannot check it against code_sha256")
    assert check_commit("--all", code, repo).startswith("commit --all is not in this repository's history")
    assert check_commit("unknown", code, repo) == (
        f"no commit recorded; code_sha256 {code[:12]} alone names the code that ran")


def test_outside_git_the_commit_is_unknown_and_unverified(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    root = write_tree(tmp_path / "copy", FILES)
    assert code_record(root) == {
        "commit": "unknown", "code_sha256": code_sha256(root),
        "commit_check": "unverified: no git history here to check the commit against; code_sha256 alone names "
                        "the code that ran"}


def test_the_cli_checks_the_card_and_each_piece(repo, tmp_path, capsys):
    first, ran = git(repo, "rev-parse", "HEAD"), code_sha256(repo)
    (repo / "models/net.py").write_text("WIDTH = 32\n")
    stale = commit_all(repo, "second")
    pieces = [None, {"hardware": "CPU", "from_epoch": 2},
              {"hardware": "NVIDIA H200", "from_epoch": 5, "commit": stale + "+dirty", "code_sha256": ran}]
    card = {"training": {"commit": first, "code_sha256": ran, "invocation_hardware": pieces}}
    path = tmp_path / "cards" / "run.json"
    path.parent.mkdir()
    path.write_text(json.dumps(card))
    old = tmp_path / "cards" / "old.json"
    old.write_text(json.dumps({"training": {"commit": first}}))
    assert cli_main(["provenance", str(path.parent), "--repo", str(repo)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        str(old),
        f"    card: no code hash recorded (made before code hashes, {CODE_HASH_SINCE})",
        str(path),
        f"    card: commit {first[:12]} verified: its files of models/ and training/ hash to the recorded code_sha256",
        "    piece 1: no machine or commit recorded",
        "    piece 2 (from epoch 2, CPU): no commit or code hash recorded "
        f"(made before code hashes, {CODE_HASH_SINCE})",
        f"    piece 3 (from epoch 5, NVIDIA H200): commit {stale[:12]} does not match the code that ran: its files of "
        f"models/ and training/ hash to {code_sha256(repo)[:12]}, the recorded code_sha256 is {ran[:12]}; the code "
        f"that ran had edits never committed as such, or a stale .git; the code that ran is commit {first[:12]}'s"]
    assert check_card({"commit": first, "code_sha256": ran}, repo)[0].startswith("card: commit")  # a flat record
    assert cli_main(["provenance", str(tmp_path / "cards" / "missing.json")]) == 2
    assert "cannot be read" in capsys.readouterr().out
