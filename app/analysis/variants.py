"""Table 1's attention variants side by side: which checkpoints are variants of one another, and what a row says.

The paper's Table 1 compares P4CNNs that differ only in their attention: full (channel x spatial on every
group convolution), alpha_F (on each layer's input), channel only, spatial only and rotation only. The
Variants view puts one image through every such checkpoint of a dataset; this module picks those checkpoints,
orders them as the table does, chooses the layer each row shows and writes the row's facts from the card.
Pure: cards and analyses in, text and names out.
"""

from __future__ import annotations

from dataclasses import dataclass

from .checkpoints import CheckpointEntry
from .compute import Analysis, LayerMaps

__all__ = ["ATTENTION_KINDS", "FIRST_ORIENTED", "Variant", "attention_kind", "variants_of", "baselines_of",
           "variant_layer", "common_layers", "table1_text", "own_error_text"]

# The card's config "attention" -> what the variant attends to, in Table 1's order.
ATTENTION_KINDS = {
    "full": "full: channel x spatial attention on every group convolution",
    "input": "alpha_F: spatial attention on each layer's input",
    "channel": "channel attention only (one value per channel and orientation: no spatial extent)",
    "spatial": "spatial attention only",
    "rotation": "attention over rotations only (co-attentive)",
}
FIRST_ORIENTED = "first with orientations"  # the layer choice that picks, per model, its first oriented map


@dataclass(frozen=True)
class Variant:
    """A checkpoint that is one of the attention variants of the model on the page."""

    entry: CheckpointEntry
    kind: str

    @property
    def description(self) -> str:
        return ATTENTION_KINDS[self.kind]


def attention_kind(card: dict | None) -> str:
    """The card's attention variant (``"none"`` for models without attention or without a config)."""
    return str(((card or {}).get("config") or {}).get("attention") or "none")


def variants_of(card: dict, entries: list[CheckpointEntry]) -> list[Variant]:
    """Every readable checkpoint in ``entries`` with attention, trained on ``card``'s dataset with its input and
    group: the rows of the Variants view, in Table 1's order of attention kinds, then by name."""
    found = [Variant(entry, attention_kind(entry.card)) for entry in _siblings(card, entries)
             if attention_kind(entry.card) in ATTENTION_KINDS and entry.card.get("group") == card.get("group")]
    order = list(ATTENTION_KINDS)
    return sorted(found, key=lambda v: (order.index(v.kind), v.entry.name))


def baselines_of(card: dict, entries: list[CheckpointEntry]) -> list[CheckpointEntry]:
    """The checkpoints without attention trained on ``card``'s dataset with its input (P4CNNs of each attentive
    model's size, the planar Z2CNN) that carry a Table 1 row: what the variants are measured against."""
    found = [entry for entry in _siblings(card, entries)
             if attention_kind(entry.card) == "none" and isinstance(entry.card.get("table1"), dict)]
    return sorted(found, key=lambda entry: entry.card["table1"]["parameters"])


def _siblings(card: dict, entries: list[CheckpointEntry]) -> list[CheckpointEntry]:
    """Readable entries trained on ``card``'s dataset that take its input."""
    def dataset(other: dict) -> str | None:
        return (other.get("dataset") or {}).get("name")

    return [entry for entry in entries if not entry.error and entry.card.get("input") == card.get("input")
            and dataset(entry.card) == dataset(card)]


def common_layers(analyses: list[Analysis]) -> list[str]:
    """Attentive layer names every analysis has, in the first one's forward order."""
    if not analyses:
        return []
    return [name for name in analyses[0].attention if all(name in a.attention for a in analyses[1:])]


def variant_layer(analysis: Analysis, choice: str = FIRST_ORIENTED) -> LayerMaps:
    """The attention layer a row shows: ``choice`` by name, or the first with an orientation axis (alpha_F and
    rotation attention act on the image itself in their lifting layer, one map with no orientations)."""
    if choice != FIRST_ORIENTED:
        return analysis.attention[choice]
    layers = list(analysis.attention.values())
    return next((layer for layer in layers if layer.orientations > 1), layers[0])


def table1_text(card: dict) -> str:
    """``"Table 1: 2.05 ± 0.10 % (3 seeds; paper 1.70 ± 0.02 %)"`` from the card's ``table1``; empty without it."""
    row = card.get("table1")
    if not isinstance(row, dict):
        return ""
    text = f"Table 1: {_spread(row['test_error'])} ({len(row['seeds'])} seeds of the paper's recipe"
    paper = row.get("paper_test_error")
    return text + (f"; paper {_spread(paper)})" if paper else ")")


def own_error_text(card: dict) -> str:
    """This checkpoint's own test error and where its epochs came from, e.g. ``"this checkpoint: 1.56 %"``."""
    error = (card.get("metrics") or {}).get("test_error")
    return "" if error is None else f"this checkpoint: {100 * error:.2f} %"


def _spread(spread: dict) -> str:
    mean = f"{100 * spread['mean']:.2f}"
    return f"{mean} %" if spread.get("sd") is None else f"{mean} ± {100 * spread['sd']:.2f} %"
