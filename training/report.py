"""The results table of the README, from the cards in a checkpoints folder: ours beside the paper's figures.

    python -m training report checkpoints
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["PAPER_TEST_ERROR", "results_table"]

# Test error (%) as published: the paper's Table 1 for rot-MNIST (Z2CNN: Cohen & Welling 2016, Table 1).
PAPER_TEST_ERROR = {
    ("rot_mnist", "z2cnn"): 5.03,
    ("rot_mnist", "p4cnn"): 2.05,
    ("rot_mnist", "fa_p4cnn"): 1.80,
    ("rot_mnist", "a_p4cnn"): 1.70,
}


def _percent(value) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def _scientific(value) -> str:
    return "-" if value is None else f"{value:.0e}"


def results_table(folder: str | Path) -> str:
    """A markdown table with one row per card (``*.json`` beside a ``.safetensors``) in ``folder``."""
    rows = [
        "| checkpoint | dataset | epochs (recipe) | test error % | paper % | test NLL | AUC | ECE "
        "| logit equivariance error fp32 / fp64 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for card_file in sorted(Path(folder).glob("*.json")):
        if not card_file.with_suffix(".safetensors").is_file():
            continue
        card = json.loads(card_file.read_text())
        metrics, training, equivariance = card["metrics"], card["training"], card["equivariance_error"]
        dataset = card["dataset"]["name"]
        paper = PAPER_TEST_ERROR.get((dataset, card["arch"]))
        auc = metrics.get("test_auc")
        ece = metrics.get("test_ece")
        rows.append(
            f"| `{card_file.stem}` | {dataset} ({metrics['test_count']:,} test) "
            f"| {training['epochs_completed']} ({training['recipe_epochs']}) "
            f"| {_percent(metrics['test_error'])} | {'-' if paper is None else f'{paper:.2f}'} "
            f"| {metrics['test_nll']:.3f} | {'-' if auc is None else f'{auc:.3f}'} "
            f"| {'-' if ece is None else f'{ece:.3f}'} "
            f"| {'planar CNN, not invariant: ' if card['group'] is None else ''}"
            f"{_scientific(equivariance['max_relative_logit_error'])} / "
            f"{_scientific(equivariance.get('max_relative_logit_error_float64'))} |"
        )
    return "\n".join(rows)
