"""Table 1 in the model cards: each shipped rot-MNIST checkpoint carries its architecture's mean and sd over seeds.

    python -m experiments report results/rot_mnist --seeds --write-cards checkpoints

A shipped checkpoint is one run (often a longer recipe than the paper's); the question Table 1 answers is
about the architecture, over seeds of the paper's recipe. So every card gets a ``table1`` entry computed
from the seeds' cards by :func:`experiments.results_tables.table1_summary`, the numbers
:func:`experiments.results_tables.seed_table` prints, and the app shows it beside the checkpoint's own test error.
"""

from __future__ import annotations

from pathlib import Path

from models import load_checkpoint, save_checkpoint

from .results_tables import cards_by_seed, table1_summary

__all__ = ["write_table1_cards"]


def write_table1_cards(results: str | Path, checkpoints: str | Path) -> list[str]:
    """Put :func:`table1_summary` into every checkpoint in ``checkpoints`` whose architecture has seeds in
    ``results`` and whose dataset is theirs; weights are rewritten unchanged. Returns the files updated."""
    by_arch = cards_by_seed(results)
    written = []
    for path in sorted(Path(checkpoints).glob("*.safetensors")):
        model, card = load_checkpoint(path)
        seeds = by_arch.get(card.get("arch"))
        if not seeds or next(iter(seeds.values()))["dataset"]["name"] != card["dataset"]["name"]:
            continue
        summary = table1_summary(results, card["arch"])
        # In the form the shipped cards have always named (python -m training hands it to experiments.cli).
        summary["command"] = f"python -m training report {Path(results).as_posix()} --seeds --write-cards " \
                             f"{Path(checkpoints).as_posix()}"
        if card.get("table1") != summary:
            save_checkpoint(model, path, {**card, "table1": summary})
            written.append(path.name)
    return written
