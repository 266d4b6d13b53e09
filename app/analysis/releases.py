"""Ours against the paper's: which shipped checkpoint to put beside a release of the paper's code, and what the
two say about one image. Pure: cards, entries and analyses in, names and sentences out.

A release (its card's ``source`` is :data:`models.reference_import.RELEASE_SOURCE`) is compared with our shipped
checkpoints trained on the same kind of data and taking the same images: for the paper's PCam DenseNet, our
PCam models; for its rot-MNIST models, ours (their inputs differ only in the transposition the cards state,
which :func:`app.analysis.compute.analyse` applies).
"""

from __future__ import annotations

from dataclasses import dataclass

from models.reference_import import RELEASE_SOURCE

from .checkpoints import CheckpointEntry
from .compute import Analysis
from .pathology import dataset_name
from .variants import attention_kind

__all__ = ["is_release", "data_family", "counterparts", "Verdict", "verdict"]

# Dataset names -> the data they are drawn from: PCam's public copies and subset are PCam patches too.
FAMILIES = {"pcam": "pcam", "pcam_public": "pcam", "pcam_subset": "pcam", "patchcamelyon": "pcam",
            "rot_mnist": "rot_mnist"}


def is_release(card: dict) -> bool:
    """A checkpoint released with the paper's code, imported (its card made by ``reference_card``)."""
    return str(card.get("source", "")).startswith(RELEASE_SOURCE)


def data_family(card: dict) -> str:
    """``"pcam"``, ``"rot_mnist"``, or the card's dataset name for any other data."""
    name = dataset_name(card).lower()
    return FAMILIES.get(name, name)


def counterparts(card: dict, entries: list[CheckpointEntry]) -> list[CheckpointEntry]:
    """Our readable checkpoints on the release's kind of data that take its image size and channels.

    Ordered: the release's group first (p4m beside p4m), attentive before plain (what the app is about; the
    paper's PCam release has no attention), the release's own architecture next, then by name.
    """
    spec = card["input"]

    def takes(entry: CheckpointEntry) -> bool:
        other = entry.card["input"]
        return (other["size"], other["channels"]) == (spec["size"], spec["channels"])

    found = [e for e in entries if not e.error and e.card and not is_release(e.card)
             and data_family(e.card) == data_family(card) and takes(e)]
    return sorted(found, key=lambda e: (e.group != card["group"], attention_kind(e.card) == "none",
                                        e.arch != card["arch"], e.name))


@dataclass(frozen=True)
class Verdict:
    """What the release and ours predict for one image.

    Attributes:
        release, ours: each one's predicted class name.
        release_p, ours_p: the probability each gives its prediction.
        agree: the same class.
    """

    release: str
    release_p: float
    ours: str
    ours_p: float

    @property
    def agree(self) -> bool:
        return self.release == self.ours

    @property
    def text(self) -> str:
        if self.agree:
            return (f"Both predict **{self.ours}** (the paper's release p = {self.release_p:.3f}, "
                    f"ours p = {self.ours_p:.3f}).")
        return (f"They disagree: the paper's release predicts **{self.release}** (p = {self.release_p:.3f}), "
                f"ours **{self.ours}** (p = {self.ours_p:.3f}).")


def verdict(release: Analysis, ours: Analysis) -> Verdict:
    """The two predictions for the image both analysed (transform 0 of each analysis)."""
    first, second = release.probabilities[0], ours.probabilities[0]
    a, b = int(first.argmax()), int(second.argmax())
    return Verdict(release.class_names[a], float(first[a]), ours.class_names[b], float(second[b]))
