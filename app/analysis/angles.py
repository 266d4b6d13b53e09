"""How far the network is from equivariant for a rotation by an arbitrary angle.

Only group elements (quarter turns, and mirrors for p4m) move pixels exactly;
any other angle resamples the image (bilinear, corners filled with zeros), so
maps(R x) and R maps(x) differ by more than round-off. This module measures
that difference so the app can show it beside the exact proof.

R acts on a map by rotating its (upsampled) planes by the same angle and
re-indexing the orientation axis by the nearest quarter turn: orientation h
of the rotated image is compared with orientation ``r^-k h`` of the original,
k = round(angle / 90). Errors are taken inside the disc inscribed in the image,
less a one-pixel margin, where neither rotation had to fill in zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from models import Group, get_group

from .compute import Analysis
from .reductions import upsample
from .transforms import rotate_by_angle

__all__ = ["AngleDeviation", "angle_deviation", "disc_deviation"]


@dataclass(frozen=True)
class AngleDeviation:
    """maps(R x) against R maps(x) for one angle.

    Attributes:
        degrees: the angle, counter-clockwise as displayed.
        quarter_turns: k, the rotation element whose re-indexing of orientations was used.
        exact: the angle is a multiple of 90 degrees (then errors are round-off).
        probability_error: max over classes of |p(R x) - p(x)|.
        layer_errors: ``"kind/layer"`` -> max |maps(R x) - R maps(x)| / max |R maps(x)| in the disc.
    """

    degrees: float
    quarter_turns: int
    exact: bool
    probability_error: float
    layer_errors: dict[str, float]


def angle_deviation(original: Analysis, rotated: Analysis, degrees: float) -> AngleDeviation:
    """Compare the analysis of an image with that of the image rotated by ``degrees``.

    Args:
        original: ``analyse(model, card, image)``.
        rotated: ``analyse(model, card, rotate_by_angle(image, degrees))``, same model and selection.
        degrees: the angle used.

    Returns:
        An :class:`AngleDeviation`, from the identity transform of each analysis.
    """
    size = original.images.shape[-1]
    group = get_group(original.group)
    errors = {}
    for kind, layers in (("attention", original.attention), ("features", original.features)):
        for name, layer in layers.items():
            before = upsample(torch.from_numpy(layer.maps[:1]), size)[0].numpy()  # (H, S, S)
            after = upsample(torch.from_numpy(getattr(rotated, kind)[name].maps[:1]), size)[0].numpy()
            errors[f"{kind}/{name}"] = disc_deviation(before, after, degrees, group)[0]
    return AngleDeviation(
        degrees=float(degrees),
        quarter_turns=int(round(degrees / 90)) % 4,
        exact=bool(np.isclose(degrees % 90, 0) or np.isclose(degrees % 90, 90)),
        probability_error=float(np.abs(rotated.probabilities[0] - original.probabilities[0]).max()),
        layer_errors=errors,
    )


def disc_deviation(before: np.ndarray, after: np.ndarray, degrees: float, group: Group) -> tuple[float, float]:
    """How far maps(R x) are from R maps(x) inside the inscribed disc, less a one-pixel margin: the worst pixel,
    max |maps(R x) - R maps(x)| / max |R maps(x)|, and the typical one, mean |maps(R x) - R maps(x)| / mean
    |R maps(x)| (the worst pixel of a resampled texture can be off by the whole range while the map as a whole
    follows the image).

    Args:
        before: ``(H, S, S)`` maps(x), upsampled to the image.
        after: ``(H, S, S)`` maps(R x), the same layer's of x rotated by ``degrees``.
        degrees: the angle; the orientation axis (when H is the group's order) is re-indexed by the nearest
            quarter turn.
        group: the group whose rotation re-indexes the orientations.

    Returns:
        ``(worst, typical)``.
    """
    size = before.shape[-1]
    if before.shape[0] == group.order:
        before = before[group.permutation(int(round(degrees / 90)) % 4).numpy()]
    radius = size / 2 - 1
    u = np.arange(size) - (size - 1) / 2
    inside = (u[:, None] ** 2 + u[None, :] ** 2) <= radius**2  # (S, S)
    expected = rotate_by_angle(before, degrees)[:, inside]  # (H, pixels in the disc)
    difference = np.abs(after[:, inside] - expected)
    expected = np.abs(expected)

    def relative(reduce) -> float:
        scale, diff = reduce(expected), reduce(difference)
        return float(diff / scale if scale > 0 else diff)

    return relative(np.max), relative(np.mean)
