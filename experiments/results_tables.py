"""The results tables of the README, from model cards: ours beside the paper's figures.

    python -m experiments report checkpoints                      # every checkpoint's card, one row each
    python -m experiments report results/pcam_public --intervals  # binary tasks: metrics with 95 % intervals
    python -m experiments report results/rot_mnist --seeds        # one row per model: mean +- std over seeds
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from training.config import DATA_SOURCE_FIELDS, config_differences, config_from_dict
from training.presets import PRESETS, recipe

__all__ = ["PAPER_TEST_ERROR", "PAPER_TABLE1", "results_table", "interval_table", "seed_table", "recipe_changes",
           "cards_by_seed", "mean_std", "table1_summary", "spread_text"]

# Test error (%) as published: the paper's Table 1 for rot-MNIST (Z2CNN: Cohen & Welling 2016, Table 1).
PAPER_TEST_ERROR = {
    ("rot_mnist", "z2cnn"): 5.03,
    ("rot_mnist", "p4cnn"): 2.05,
    ("rot_mnist", "fa_p4cnn"): 1.80,
    ("rot_mnist", "a_p4cnn"): 1.70,
    # Table 3, on PCam's own test set (32,768 patches). pcam_public's cards (1,944 of those test patches, as JPEG)
    # are compared with it through their intervals; pcam_subset's are set beside it, not compared.
    ("pcam", "densenet"): 15.93,
    ("pcam", "p4m_densenet"): 11.64,
    ("pcam", "fa_p4m_densenet"): 10.88,
}


# The paper's Table 1 (rot-MNIST test error %, mean +- std over seeds) where its figures were reachable here;
# Z2CNN from Cohen & Welling (2016). The other rows' figures (arh_, ach_, asp_, big11/15/19_p4cnn) were not.
PAPER_TABLE1: dict[str, tuple[float, float | None] | None] = {
    "z2cnn": (5.03, None),
    "p4cnn": (2.048, 0.045),
    "arh_p4cnn": None,
    "big19_p4cnn": None,
    "a_p4cnn": (1.696, 0.021),
    "big15_p4cnn": None,
    "ach_p4cnn": None,
    "asp_p4cnn": None,
    "big11_p4cnn": None,
    "fa_p4cnn": (1.795, 0.028),
}


def _paper_error(dataset: str, arch: str) -> float | None:
    return PAPER_TEST_ERROR.get(("pcam" if dataset in ("pcam_subset", "pcam_public") else dataset, arch))


def _percent(value) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def _scientific(value) -> str:
    return "-" if value is None else f"{value:.0e}"


# Config fields that say what was trained on where, or how it was measured, not how it was trained (the epochs
# have their own column).
_NOT_RECIPE = DATA_SOURCE_FIELDS | {"model", "dataset", "seed", "epochs", "eval_batch_size", "equivariance_images",
                                    "max_steps", "max_eval_batches"}


def recipe_changes(training: dict) -> str:
    """A card's departures from its preset's recipe, e.g. ``cosine, augment=rotate`` (``-`` when it has none)."""
    if training["preset"] not in PRESETS:  # a retired card's preset (pcam_subset, he_demo) lives in git history
        return f"preset {training['preset']} retired"
    config = config_from_dict(training["config"])
    preset = recipe(training["preset"], config.model)
    changes = [name if value is True else f"{name}={value}"
               for name, (_, value) in config_differences(preset, config, ignore=_NOT_RECIPE).items()]
    return ", ".join(changes) or "-"


def results_table(folder: str | Path) -> str:
    """A markdown table with one row per card (``*.json`` beside a ``.safetensors``) in ``folder``."""
    rows = [
        "| checkpoint | dataset | epochs (recipe) | changes to the recipe | test error % | paper % | test NLL | AUC "
        "| ECE | logit equivariance error fp32 / fp64 |",
        "|---|---|---|---|---|---|---|---|---|---|",
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
            f"| {training['epochs_completed']} ({training['recipe_epochs']}) | {recipe_changes(training)} "
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


def _equivariance(card: dict) -> str:
    """The card's float32 logit equivariance error; a planar network is not invariant, which the cell says."""
    error = (card.get("equivariance_error") or {}).get("max_relative_logit_error")
    return ("planar: " if card.get("group") is None else "") + _scientific(error)


def interval_table(folder: str | Path) -> str:
    """Cards with ``metrics.test_intervals`` (binary tasks), one row each: metrics with their 95 % intervals.

    Reads every ``*.json`` card in ``folder`` (weights need not be there), sorted by file name.
    """
    rows = [
        "| model | card | valid NLL / AUC (selection) | test patches | accuracy % | error % "
        "| paper's error % (Table 3, PCam test set) | AUC | NLL | ECE | logit equivariance error fp32 "
        "| selected at epoch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
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
            f"| {_equivariance(card)} | {card['training']['best_epoch']} of {card['training']['epochs_completed']} |"
        )
    return "\n".join(rows)


def mean_std(values: list[float]) -> str:
    """``mean +- std`` in percent; std is the sample standard deviation (n - 1), absent for one seed."""
    mean = 100 * statistics.fmean(values)
    return f"{mean:.3f}" if len(values) < 2 else f"{mean:.3f} +- {100 * statistics.stdev(values):.3f}"


def cards_by_seed(folder: str | Path) -> dict[str, dict[int, dict]]:
    """arch -> seed -> card, over every ``*.json`` card in ``folder`` (a later file of the same seed wins)."""
    by_arch: dict[str, dict[int, dict]] = {}
    for card_file in sorted(Path(folder).glob("*.json")):
        card = json.loads(card_file.read_text())
        by_arch.setdefault(card["arch"], {})[card["training"]["config"]["seed"]] = card
    return by_arch


def seed_table(folder: str | Path) -> str:
    """One row per architecture over every card in ``folder``: test error mean +- std over seeds, beside Table 1.

    Rows follow the paper's Table 1 order, then any other architecture by name; a card counts once per seed.
    Each row is :func:`table1_summary`, the entry shipped cards carry as ``table1``.
    """
    by_arch = cards_by_seed(folder)
    order = [arch for arch in PAPER_TABLE1 if arch in by_arch] + sorted(set(by_arch) - set(PAPER_TABLE1))
    rows = [
        "| model | parameters | seeds | epochs | test error % (50k) | valid error % | paper's test error % |",
        "|---|---|---|---|---|---|---|",
    ]
    for arch in order:
        row = table1_summary(folder, arch)
        rows.append(
            f"| {arch} | {row['parameters']:,} | {', '.join(map(str, row['seeds']))} "
            f"| {'/'.join(map(str, row['epochs']))} | {spread_text(row['test_error'])} "
            f"| {spread_text(row['valid_error'])} | {spread_text(row['paper_test_error'], places=3)} |"
        )
    return "\n".join(rows)


def spread_text(spread: dict | None, places: int = 3) -> str:
    """``mean +- sd`` in percent of a :func:`table1_summary` entry (``-`` for None, no sd for one seed)."""
    if spread is None:
        return "-"
    mean = f"{100 * spread['mean']:.{places}f}"
    return mean if spread["sd"] is None else f"{mean} +- {100 * spread['sd']:.{places}f}"


def _spread(values: list[float]) -> dict:
    """Mean and sample standard deviation (n - 1; None for one value), as fractions."""
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else None}


def table1_summary(folder: str | Path, arch: str) -> dict:
    """``arch``'s Table 1 row over the seeds' cards in ``folder``: test and validation error, mean and sd.

    Raises:
        ValueError: no card of ``arch`` in ``folder``.
    """
    by_seed = cards_by_seed(folder).get(arch)
    if not by_seed:
        raise ValueError(f"no card of {arch} in {folder}")
    cards = [by_seed[seed] for seed in sorted(by_seed)]
    paper = PAPER_TABLE1.get(arch)
    return {
        "source": Path(folder).as_posix(),
        "seeds": sorted(by_seed),
        "epochs": sorted({card["training"]["epochs_completed"] for card in cards}),
        "parameters": cards[0]["parameters"],
        "test_error": _spread([card["metrics"]["test_error"] for card in cards]),
        "valid_error": _spread([card["metrics"]["valid_error"] for card in cards]),
        "test_count": cards[0]["metrics"]["test_count"],
        # The paper's figures are in percent; kept as fractions like ours.
        "paper_test_error": None if paper is None else {"mean": paper[0] / 100,
                                                        "sd": None if paper[1] is None else paper[1] / 100},
    }
