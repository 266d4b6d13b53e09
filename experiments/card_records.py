"""A card and its per-patch test record, kept bound through edits; the card's 95 % intervals recorded again from it.

    python -m experiments intervals checkpoints/fa_p4m_densenet_pcam.json results/pcam_table3/*-seed0.json [--dry-run]

The intervals (``metrics.test_intervals``, :func:`training.metrics.confidence_intervals`) are computed from the
tumour probabilities of the card's record: ``results/pcam_test_predictions/NAME.json`` for a shipped checkpoint
``checkpoints/NAME.json``, ``FOLDER/test_predictions/NAME.json`` for a sweep's card ``FOLDER/NAME.json``. A record
names what it measured by sha256 (the checkpoint file, or the card kept in a results folder), and rewriting the
card changes that file; so the record must name the card as it is before anything is written, and is bound again
to the new file afterwards. The weights do not change: a checkpoint is written again with the same tensors
(its ``weights_sha256`` is compared before and after). Both the old and the new intervals are returned, so that
the change of the draws can be reported.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from models import load_checkpoint, save_checkpoint
from models.checkpoint import card_text
from training.atomic import write_atomic
from training.data import load_dataset
from training.provenance import sha256_file

from .patch_records import read_record, read_test_labels, tumour_intervals, tumour_probability, write_record

__all__ = ["record_of", "edit_card", "as_trained", "rerecord_intervals", "interval_changes"]

SHIPPED_RECORDS = Path("results/pcam_test_predictions")


def record_of(card: Path) -> Path:
    """Where the per-patch test record of ``card`` is kept (see the module docstring)."""
    card = Path(card)
    if card.parent.name == "checkpoints":
        return card.parent.parent / SHIPPED_RECORDS / card.name
    return card.parent / "test_predictions" / card.name


def _bound_file(card: Path, record: dict) -> tuple[Path, str]:
    """The file the record binds (the checkpoint or the card) and the record's key for its sha256."""
    if "card_sha256" in record:
        return card, "card_sha256"
    return card.with_suffix(".safetensors"), "sha256"


def _check_bound(card: Path, record_file: Path, record: dict) -> tuple[Path, str]:
    """:func:`_bound_file`, once the record is found to name it as it is now."""
    bound, key = _bound_file(card, record)
    if record.get(key) != sha256_file(bound):
        raise ValueError(f"{record_file} does not name {bound} as it is now (its {key} differs): record it again")
    return bound, key


def as_trained(card: dict) -> dict:
    """``card`` without what is measured into it after training (:func:`edit_card`'s uses): the test intervals,
    recorded again from the record, the attention-on-nuclei measurement and the data's reference stain
    (``experiments/pcam_stain.py``). What names the run is left."""
    trained = {key: value for key, value in card.items() if key not in ("attention_on_nuclei", "stain_reference")}
    trained["metrics"] = {key: value for key, value in card.get("metrics", {}).items() if key != "test_intervals"}
    return trained


def edit_card(card: Path, change: Callable[[dict], None]) -> None:
    """Apply ``change`` to ``card`` (a dict edited in place; never the weights) and keep its record bound to it.

    A shipped checkpoint's card is written with its ``.safetensors`` (the same tensors, checked by their digest);
    a results card alone. Where the card has a record, the record must name it as it is before the edit, and names
    the new file after it.

    Raises:
        ValueError: the record does not name the card as it is now.
    """
    card = Path(card)
    record_file = record_of(card)
    record = json.loads(record_file.read_text()) if record_file.is_file() else None
    if record is not None:
        bound, key = _check_bound(card, record_file, record)
    weights = card.with_suffix(".safetensors")
    if weights.is_file():
        model, embedded = load_checkpoint(weights)
        before = embedded["weights_sha256"]
        change(embedded)
        if save_checkpoint(model, weights, embedded)["weights_sha256"] != before:
            raise RuntimeError(f"{card}: the weights changed on saving")  # save_checkpoint writes the same tensors
    else:
        data = json.loads(card.read_text())
        change(data)
        write_atomic(card, card_text(data).encode())
    if record is not None:
        record[key] = sha256_file(bound)
        write_record(record_file, record)


def rerecord_intervals(card: Path, *, write: bool = True) -> tuple[dict, dict]:
    """``(old, new)`` test intervals of ``card``; with ``write``, the new ones stored (:func:`edit_card`).

    From the card's record; a retired checkpoint's card without one is measured from the weights beside it, on the
    test split of the data it names.

    Raises:
        FileNotFoundError: the card has neither a record nor weights beside it.
        ValueError: the record does not name the card as it is, or its labels are not the card's test count.
        DataError: the card's data set cannot be read (e.g. a retired reader's).
    """
    card = Path(card)
    record_file = record_of(card)
    if record_file.is_file():
        record, tumour = read_record(record_file)
        _check_bound(card, record_file, record)
        _, labels = read_test_labels(record["data"]["dir"])
    elif card.with_suffix(".safetensors").is_file():
        tumour, labels = _measured(card.with_suffix(".safetensors"))
    else:
        raise FileNotFoundError(f"{card}: no per-patch record at {record_file} and no weights beside it")
    metrics = json.loads(card.read_text())["metrics"]
    if len(labels) != metrics.get("test_count", len(labels)):
        raise ValueError(f"{card}: {len(labels)} test labels, the card's test count is {metrics['test_count']}")
    new = tumour_intervals(tumour, labels)
    old = metrics.get("test_intervals", {})
    if write:
        edit_card(card, lambda data: data["metrics"].__setitem__("test_intervals", new))
    return old, new


def _measured(weights: Path) -> tuple[np.ndarray, np.ndarray]:
    """The checkpoint's tumour probability on every patch of its data's test split, and their labels."""
    model, card = load_checkpoint(weights)
    test = load_dataset(card["dataset"]["name"], card["training"]["config"]["data_dir"]).test
    return tumour_probability(model, card, test), np.asarray(test.labels)


def interval_changes(old: dict, new: dict) -> str:
    """One line: how far each bootstrapped bound moved (the Wilson intervals do not depend on the draws)."""
    moved = []
    for name in ("auc", "nll", "ece"):
        if name in old:
            shift = max(abs(new[name]["low"] - old[name]["low"]), abs(new[name]["high"] - old[name]["high"]))
            moved.append(f"{name} {old[name]['low']:.4f}-{old[name]['high']:.4f} -> "
                         f"{new[name]['low']:.4f}-{new[name]['high']:.4f} (bound moved {shift:.4f})")
    return "; ".join(moved) or "no earlier intervals"
