"""Measuring equivariance: how far F(g.x) is from g.F(x), for every element g.

Used by the tests (every layer, every registered model), by checkpoint cards
and by the app's live proof. Errors are relative: max |F(g.x) - g.F(x)|
divided by max |g.F(x)|.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from .groups import Group

__all__ = ["relative_error", "equivariance_errors", "logit_invariance_error"]


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected| (absolute error where expected is all zero)."""
    if actual.shape != expected.shape:
        raise ValueError(f"shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    scale = expected.abs().max().item()
    diff = (actual - expected).abs().max().item()
    return diff / scale if scale > 0 else diff


def equivariance_errors(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    group: Group,
    in_axes: tuple[int, ...] = (),
    out_axes: tuple[int, ...] = (2,),
    out_transforms: bool = True,
) -> dict[int, float]:
    """Relative error of F(g.x) against g.F(x) for every element g.

    Args:
        fn: the map F.
        x: an input; its last two axes are the plane.
        group: the group acting.
        in_axes: the group axes of x (``()`` for images, ``(2,)`` for feature maps).
        out_axes: the group axes of F(x).
        out_transforms: False for invariant outputs (logits), compared unmoved.

    Returns:
        ``{g: error}`` for every element.
    """
    with torch.no_grad():
        reference = fn(x)
        errors = {}
        for g in group.elements():
            moved = fn(group.act(x, g, in_axes))
            expected = group.act(reference, g, out_axes) if out_transforms else reference
            errors[g] = relative_error(moved, expected)
    return errors


def logit_invariance_error(model: torch.nn.Module, x: torch.Tensor) -> float:
    """Largest relative change of a classifier's logits over the group of ``model.group``.

    Runs a copy of the model in eval mode in x's dtype, so the model itself is untouched.
    """
    probe = copy.deepcopy(model).to(x.dtype).eval()
    errors = equivariance_errors(probe, x, model.group, out_transforms=False)
    return max(errors.values())
