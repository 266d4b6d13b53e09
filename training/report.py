"""The results tables of the README, from model cards: ours beside the paper's figures.

    python -m training report checkpoints                      # every checkpoint's card, one row each
    python -m training report results/pcam_subset --intervals  # binary tasks: metrics with 95 % intervals
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["PAPER_TEST_ERROR", "results_table", "interval_table"]

# Test error (%) as published: the paper's Table 1 for rot-MNIST (Z2CNN: Cohen & Welling 2016, Table 1).
PAPER_TEST_ERROR = {
    ("rot_mnist", "z2cnn"): 5.03,
    ("rot_mnist", "p4cnn"): 2.05,
    ("rot_mnist", "fa_p4cnn"): 1.80,
    ("rot_mnist", "a_p4cnn"): 1.70,
    # Table 3, on PCam's own test set (32,768 patches); pcam_subset cards are set beside it, not compared.
    ("pcam", "densenet"): 15.93,
    ("pcam", "p4m_densenet"): 11.64,
    ("pcam", "fa_p4m_densenet"): 10.88,
}


def _paper_error(dataset: str, arch: str) -> float | None:
    return PAPER_TEST_ERROR.get(("pcam" if dataset == "pcam_subset" else dataset, arch))


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
        paper = _paper_error(dataset, card["arch"])
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


def _with_interval(entry: dict, percent: bool = False) -> str:
    """``value [low, high]``: percentages with one decimal, other metrics with three."""
    scale, places = (100, 1) if percent else (1, 3)
    value, low, high = (scale * entry[k] for k in ("value", "low", "high"))
    return f"{value:.{places}f} [{low:.{places}f}, {high:.{places}f}]"


def _valid(metrics: dict) -> str:
    auc = metrics.get("valid_auc")
    return f"{metrics['valid_nll']:.3f} / {'-' if auc is None else f'{auc:.3f}'}"


def interval_table(folder: str | Path) -> str:
    """Cards with ``metrics.test_intervals`` (binary tasks), one row each: metrics with their 95 % intervals.

    Reads every ``*.json`` card in ``folder`` (weights need not be there), sorted by file name.
    """
    rows = [
        "| model | card | valid NLL / AUC (selection) | test patches | accuracy % | error % "
        "| paper's error % (Table 3, PCam test set) | AUC | NLL | ECE | selected at epoch |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for card_file in sorted(Path(folder).glob("*.json")):
        card = json.loads(card_file.read_text())
        intervals = (card.get("metrics") or {}).get("test_intervals")
        if not intervals:
            continue
        paper = _paper_error(card["dataset"]["name"], card["arch"])
        rows.append(
            f"| {card['arch']} | `{card_file.stem}` | {_valid(card['metrics'])} | {card['metrics']['test_count']} "
            f"| {_with_interval(intervals['accuracy'], percent=True)} | {_with_interval(intervals['error'], True)} "
            f"| {'-' if paper is None else f'{paper:.2f}'} | {_with_interval(intervals['auc'])} "
            f"| {_with_interval(intervals['nll'])} | {_with_interval(intervals['ece'])} "
            f"| {card['training']['best_epoch']} of {card['training']['epochs_completed']} |"
        )
    return "\n".join(rows)
