"""PCam's reference stain, estimated once from pcam_public's training split and written into the PCam cards.

    python -m experiments.pcam_stain [--data-dir ../shared/data/pcam_public] [--patches 4000] [--seed 0] [--dry-run]

(``python -m tools.pcam_stain`` runs this as a process: tools import nothing of the code they read.)

The estimate is :func:`models.stain_normalise.estimate_stain` of ``--patches`` training patches drawn at random
(a seeded permutation of the split's 29,822) and pooled: their tissue pixels count as one image's, so the vectors
are Macenko's over some 15 million tissue pixels and the ranges and l-alpha-beta statistics theirs. A sample, not
the whole split: the pooled pixels of all of it would take about 1 GB of memory, and the next ``--patches`` patches
of the same permutation (disjoint from the first) give the same estimate to within what the card records under
``estimated.disjoint_sample`` (0.3 degrees, 0.5 % when this was written). The estimate
goes into every PCam card (``checkpoints/*_pcam.json``) under ``stain_reference`` with
:func:`experiments.card_records.edit_card`, which writes the weights again unchanged and keeps each card's test
record bound to it.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import numpy as np

from models.stain import TISSUE_OD, optical_density
from models.stain_normalise import StainEstimate, estimate_stain
from training.data.pcam_public import PatchRecord, decode_all, read_labels

from .card_records import edit_card

__all__ = ["PCAM_CARDS", "training_records", "sample_estimate", "reference_entry", "main"]

PCAM_CARDS = ("fa_p4m_densenet_pcam", "fa_p4_densenet_pcam", "p4m_densenet_pcam")
REPO = Path(__file__).resolve().parents[1]


def training_records(root: Path) -> list[PatchRecord]:
    """The training split's rows of ``root/labels.csv``, in its order."""
    return [r for r in read_labels(root) if r.split == "train"]


def sample_estimate(root: Path, patches: int, seed: int, skip: int = 0,
                    train: list[PatchRecord] | None = None) -> tuple[StainEstimate, int]:
    """The pooled estimate of patches ``skip .. skip + patches`` of a seeded permutation of the training split
    (``train``, read from ``root`` when None), and how many tissue pixels it pooled."""
    train = training_records(root) if train is None else train
    order = np.random.default_rng(seed).permutation(len(train))[skip:skip + patches]
    chosen = [train[i] for i in sorted(order)]  # file order: the estimate does not depend on it
    images = decode_all(root, chosen).transpose(0, 2, 3, 1)  # (N, 96, 96, 3)
    tissue = int((optical_density(np.arange(256))[images.max(axis=-1)] > TISSUE_OD).sum())  # estimate_stain's
    return estimate_stain(images), tissue


def _angles(a: StainEstimate, b: StainEstimate) -> list[float]:
    cosines = np.clip((a.vectors * b.vectors).sum(axis=1), -1, 1)
    return [round(float(x), 3) for x in np.degrees(np.arccos(cosines))]


def reference_entry(root: Path, patches: int = 4000, seed: int = 0, train: list[PatchRecord] | None = None) -> dict:
    """The card's ``stain_reference``: the estimate, how it was made, and how far a disjoint sample moves it."""
    train = training_records(root) if train is None else train
    estimate, tissue = sample_estimate(root, patches, seed, train=train)
    other, _ = sample_estimate(root, patches, seed, skip=patches, train=train)
    entry = estimate.to_dict()
    entry["estimated"] = {
        "from": f"{patches} patches of pcam_public's train split (a permutation seeded {seed}: its first {patches}), "
                "pooled: their tissue pixels as one image's",
        "method": "models.stain_normalise.estimate_stain (Macenko vectors and 99th-percentile ranges; Reinhard "
                  "l-alpha-beta mean and std of the tissue)",
        "patches": patches,
        "seed": seed,
        "tissue_pixels": tissue,
        "date": datetime.date.today().isoformat(),
        "command": f"python -m tools.pcam_stain --patches {patches} --seed {seed}",
        "disjoint_sample": {
            "what": f"the next {patches} patches of the same permutation, estimated alike",
            "vector_angles_degrees": _angles(estimate, other),
            "max_concentrations_relative_change": [round(float(x), 5) for x in
                                                   np.abs(other.max_concentrations / estimate.max_concentrations - 1)],
            "lab_mean_change": [round(float(x), 5) for x in np.abs(other.lab_mean - estimate.lab_mean)],
        },
    }
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.pcam_stain", description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data" / "pcam_public")
    parser.add_argument("--patches", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dry-run", action="store_true", help="print the estimate, write no card")
    args = parser.parse_args(argv)
    entry = reference_entry(args.data_dir, args.patches, args.seed)
    print(f"PCam reference stain from {entry['estimated']['from']}:")
    print(f"  H {entry['vectors'][0]}  E {entry['vectors'][1]}  ranges {entry['max_concentrations']}")
    print(f"  a disjoint sample: {entry['estimated']['disjoint_sample']}")
    if args.dry_run:
        return 0
    for name in PCAM_CARDS:
        card = REPO / "checkpoints" / f"{name}.json"
        edit_card(card, lambda data: data.__setitem__("stain_reference", entry))
        print(f"wrote stain_reference into {card.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
