"""``python -m training provenance CARD...``: whether each card's commit is the code that ran.

    python -m training provenance checkpoints                      # every card in the folder
    python -m training provenance results/pcam_table3/densenet-seed0.json ../runs/x/best.safetensors

For the card and for each piece of its run (``invocation_hardware``), the recorded commit's files of models/ and
training/ are hashed from git history and compared with the recorded ``code_sha256``
(:func:`training.provenance.check_commit`); where they differ, the commit whose files do match is named when
HEAD's history holds one. Cards trained before code hashes say so and pass. Exit status 1 when a commit does not
match the code that ran, 2 when a card cannot be read.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from models.checkpoint import card_path

from .provenance import CODE_HASH_SINCE, REPO, SHOWN, check_commit, find_code_commit

__all__ = ["add_arguments", "run", "check_card", "card_files"]

MISMATCH = "does not match the code that ran"
# Pieces that kept only their machine.
UNRECORDED = f"no commit or code hash recorded (made before code hashes, {CODE_HASH_SINCE})"


def card_files(paths: list[str]) -> list[Path]:
    """The JSON cards named: a ``.json`` file, the card beside a ``.safetensors`` file, or every ``*.json`` in a
    folder (not its subfolders), in the order given, each folder's sorted."""
    found = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(path.glob("*.json"))
        else:
            found.append(card_path(path) if path.suffix == ".safetensors" else path)
    return found


def _check(record: dict, root: Path, found: dict[str, str | None]) -> str:
    """:func:`check_commit` of one record (the card's training dict or a piece), naming the commit that matches
    where the recorded one does not; ``found`` caches those searches by code hash."""
    verdict = check_commit(record.get("commit"), record.get("code_sha256"), root)
    if MISMATCH in verdict:
        code_hash = record["code_sha256"]
        if code_hash not in found:
            found[code_hash] = find_code_commit(code_hash, root)
        match = found[code_hash]
        verdict += (f"; the code that ran is commit {match[:SHOWN]}'s" if match
                    else "; no commit in HEAD's history has these files")
    return verdict


def check_card(card: dict, root: Path = REPO, found: dict[str, str | None] | None = None) -> list[str]:
    """One line for the card's commit and one for each piece of its run, each a :func:`check_commit` verdict.

    ``card`` is a model card (its ``training`` dict is read) or a record with a top-level ``commit`` (test
    predictions, benchmarks)."""
    found = {} if found is None else found
    training = card.get("training") if isinstance(card.get("training"), dict) else card
    if "commit" not in training:
        return ["no commit recorded"]
    lines = [f"card: {_check(training, root, found)}"]
    for number, piece in enumerate(training.get("invocation_hardware") or [], 1):
        if not isinstance(piece, dict):
            lines.append(f"piece {number}: no machine or commit recorded")
            continue
        where = f"piece {number} (from epoch {piece.get('from_epoch')}, {piece.get('hardware')})"
        lines.append(f"{where}: {_check(piece, root, found) if 'commit' in piece else UNRECORDED}")
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cards", nargs="+", help="card (.json), checkpoint (.safetensors) or folder of cards")
    parser.add_argument("--repo", default=str(REPO), help="the git repository whose history holds the commits "
                                                          "(default: this checkout)")


def run(args: argparse.Namespace, log=print) -> int:
    """Print each card's verdicts; 1 if a commit does not match the code that ran, 2 if a card is unreadable."""
    paths = card_files(args.cards)
    if not paths:
        log(f"error: no card (.json) in {', '.join(args.cards)}")
        return 2
    status, found = 0, {}
    for path in paths:
        try:
            card = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            log(f"{path}: cannot be read ({error})")
            status = 2
            continue
        if not isinstance(card, dict):
            log(f"{path}: not a JSON object")
            status = 2
            continue
        lines = check_card(card, Path(args.repo), found)
        log("\n    ".join([str(path), *lines]))
        if status == 0 and any(MISMATCH in line for line in lines):
            status = 1
    return status
