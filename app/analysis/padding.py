"""The padding border of each layer: how far in from the image's edge its maps are shaped by zero padding.

Measured, not derived from the architecture: the model sees constant images (:func:`constant_images`). Every
layer is translation equivariant, so away from the edges its maps are constant too; where they differ from
their centre value, the zero padding of some layer on the way has reached them. The border is the widest such
band over the four sides and the images (the same on every side, so that it maps to itself under the group),
in image pixels. The page leaves that band out of colour ranges and arrow fields and outlines it, so that
padding artefacts are recognisable as such instead of dominating the picture.
"""

from __future__ import annotations

import numpy as np

from .compute import Analysis, LayerMaps

__all__ = ["constant_images", "layer_border", "padding_borders", "border_left_out", "MIN_FREE_SIDE",
           "RELATIVE_TOLERANCE"]

# Interior positions of a constant image's map agree to float32 round-off (about 1e-7 relative); padding effects
# are orders of magnitude larger.
RELATIVE_TOLERANCE = 1e-4

# The page leaves a layer's border out only while what it leaves is at least this fraction of the image's side.
# alpha_F attends to a 28-pixel digit with a 7 x 7 filter dilated by 4, so its padding reaches 13 pixels in:
# leaving that out would set the colours by the central 2 x 2 pixels and draw a single cell of arrows.
MIN_FREE_SIDE = 1 / 3


def border_left_out(border: int, size: int) -> int:
    """The band the page leaves out of colour ranges and arrow fields (and outlines): ``border`` while at least
    ``MIN_FREE_SIDE`` of the side stays free of it, else 0 (every position counts, and the captions say why)."""
    return border if border > 0 and size - 2 * border >= MIN_FREE_SIDE * size else 0


def constant_images(card: dict) -> list[np.ndarray]:
    """``(C, S, S)`` images in [0, 1] at the model's input size, each one constant: black, mid-grey, white, and
    ``1 - mean`` of the training set.

    Several levels, because what the padding changes depends on the level (a ReLU can hide it at one level, and
    a network without biases maps an input that normalises to 0 to 0 everywhere, edges included).
    """
    spec = card["input"]
    shape = (spec["channels"], spec["size"], spec["size"])
    levels = [np.full((spec["channels"], 1, 1), value, dtype=np.float32) for value in (0.0, 0.5, 1.0)]
    levels.append(1.0 - np.asarray(spec["mean"], dtype=np.float32).reshape(-1, 1, 1))
    return [np.broadcast_to(level, shape).copy() for level in levels]


def layer_border(layer: LayerMaps, size: int) -> int:
    """Width in image pixels of the band of ``layer``'s maps (of a constant image) that differs from the centre.

    0 when the maps are constant everywhere; ``size // 2`` when nothing is free of the padding.
    """
    maps = layer.upsampled(size)[0].astype(np.float64)  # (H, S, S), the untransformed constant image
    centre = maps[:, size // 2, size // 2][:, None, None]
    scale = max(float(np.abs(maps).max()), 1e-12)
    affected = (np.abs(maps - centre) > RELATIVE_TOLERANCE * scale).any(axis=0)  # (S, S)
    if not affected.any():
        return 0
    rows, cols = np.nonzero(affected)
    # Distance of each affected pixel from the nearest edge; the band must reach past the deepest one.
    depth = np.minimum.reduce([rows, cols, size - 1 - rows, size - 1 - cols])
    return int(min(depth.max() + 1, size // 2))


def padding_borders(constants: list[Analysis]) -> dict[str, int]:
    """``"attention/NAME"`` / ``"features/NAME"`` -> padding border in pixels: the widest over the analyses of
    the :func:`constant_images`."""
    size = constants[0].images.shape[-1]
    return {f"{kind}/{name}": max(layer_border(getattr(constant, kind)[name], size) for constant in constants)
            for kind in ("attention", "features") for name in getattr(constants[0], kind)}
