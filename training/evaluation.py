"""Evaluating a network on a split: probabilities, metrics, and equivariance measured on real images."""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import nn

from models import get_group
from models.equivariance import equivariance_errors
from models.gconv import forget_filter_banks

from .data import DatasetSpec, Split, load_dataset
from .distributed import Context, shard, unshard
from .metrics import classification_metrics

__all__ = ["Normaliser", "predict", "evaluate", "measure_equivariance", "evaluate_checkpoint"]


class Normaliser:
    """[0, 1] images (numpy) -> ``(x - mean) / std`` on the device, transposed first if the card says so."""

    def __init__(self, mean, std, device: torch.device, transposed: bool = False):
        self.mean = torch.tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        self.device = device
        self.transposed = transposed

    @classmethod
    def for_spec(cls, spec: DatasetSpec, device: torch.device) -> Normaliser:
        return cls(spec.mean, spec.std, device)

    @classmethod
    def for_card(cls, card: dict, device: torch.device) -> Normaliser:
        spec = card["input"]
        return cls(spec["mean"], spec["std"], device, bool(spec["transposed"]))

    def __call__(self, images: np.ndarray | torch.Tensor) -> torch.Tensor:
        images = torch.as_tensor(images).to(self.device, non_blocking=True)
        if self.transposed:
            images = images.transpose(-1, -2)
        return (images - self.mean) / self.std


def predict(
    model: nn.Module, split: Split, normalise: Normaliser, ctx: Context, *, batch_size: int, max_batches: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Class probabilities ``(N, K)`` and labels ``(N,)`` for a split (its first ``max_batches`` batches if set).

    Under torchrun every rank predicts its share and all ranks return the whole.
    """
    total = len(split)
    if max_batches:
        total = min(total, max_batches * batch_size)
    mine = shard(np.arange(total), ctx)
    # The weights have changed since the last evaluation, and not always visibly to the kept filter banks: an
    # EMA's update on CUDA does not bump the version counter that keys them (models.gconv.filter_bank).
    forget_filter_banks(model)
    was_training = model.training
    model.eval()
    probs, labels = [], []
    with torch.inference_mode():
        for start in range(0, len(mine), batch_size):
            images, batch_labels = split.get_batch(mine[start : start + batch_size])
            probs.append(torch.softmax(model(normalise(images)).float(), dim=1))
            labels.append(torch.as_tensor(batch_labels, device=normalise.device))
    model.train(was_training)
    probs = unshard(torch.cat(probs), total, ctx)
    labels = unshard(torch.cat(labels), total, ctx)
    return probs.cpu().double().numpy(), labels.cpu().numpy()


def evaluate(model, split, normalise, ctx, *, batch_size, max_batches=0, calibration=False) -> dict:
    probs, labels = predict(model, split, normalise, ctx, batch_size=batch_size, max_batches=max_batches)
    return classification_metrics(probs, labels, calibration=calibration)


def measure_equivariance(model: nn.Module, split: Split, normalise: Normaliser, count: int) -> dict:
    """Largest relative change of the logits over every group element, on the first ``count`` images of a split.

    Measured in float32 (what users run) and float64 (which shows the network
    itself is exact: what remains is round-off).
    """
    group = model.group or get_group("p4")
    count = min(count, len(split))
    images, _ = split.get_batch(np.arange(count))
    x = normalise(images).cpu()
    probe = copy.deepcopy(model).cpu().eval()
    errors = {}
    for dtype in (torch.float32, torch.float64):
        probe = probe.to(dtype)
        errors[dtype] = max(
            max(equivariance_errors(probe, chunk.to(dtype), group, out_transforms=False).values())
            for chunk in x.split(32)
        )
    where = f"the first {count} test images, every element of {group.name}, float32 and float64"
    if model.group is None:
        where += "; a planar CNN, not invariant by design: this is how much its logits change under rotation"
    return {
        "max_relative_logit_error": errors[torch.float32],
        "max_relative_logit_error_float64": errors[torch.float64],
        "measured_on": where,
    }


def evaluate_checkpoint(path, data_dir, *, split: str = "test", limit: int = 0, batch_size: int = 256) -> dict:
    """Re-measure a saved checkpoint on its dataset: what the card claims, checked.

    Args:
        path: ``.safetensors`` file written by training.
        data_dir: the dataset folder.
        split: ``train``, ``valid`` or ``test``.
        limit: evaluate the first ``limit`` images only (0: all).
    """
    from models import load_checkpoint

    from .distributed import setup

    model, card = load_checkpoint(path)
    dataset = card.get("dataset", {})
    if not isinstance(dataset, dict) or "name" not in dataset:
        raise ValueError(f"{path}: its card names no dataset this code can read (card 'dataset': {dataset!r})")
    splits = load_dataset(dataset["name"], data_dir)
    ctx = setup("cpu")
    normalise = Normaliser.for_card(card, ctx.device)
    chosen = getattr(splits, split)
    max_batches = math.ceil(limit / batch_size) if limit else 0
    probs, labels = predict(model, chosen, normalise, ctx, batch_size=batch_size, max_batches=max_batches)
    if limit:
        probs, labels = probs[:limit], labels[:limit]
    return classification_metrics(probs, labels, calibration=splits.spec.num_classes == 2)
