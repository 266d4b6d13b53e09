"""The padding border of each layer: how far in from the image's edge its maps are shaped by zero padding.

Measured, not derived from the architecture: the model sees constant images (:func:`constant_images`). Every
layer is translation equivariant, so away from the edges its maps are constant too; where they differ from
their centre value, the zero padding of some layer on the way has reached them. The border is the widest such
band over the four sides and the images (the same on every side, so that it maps to itself under the group),
in image pixels. The page leaves that band out of colour ranges and arrow fields and outlines it, so that
padding artefacts are recognisable as such instead of dominating the picture.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from models import Network
from models.cpu.user_cache import cache_root

from .compute import Analysis, LayerMaps, analyse

__all__ = ["constant_images", "layer_border", "padding_borders", "border_left_out", "measured_borders",
           "stored_borders", "model_digest", "MIN_FREE_SIDE", "RELATIVE_TOLERANCE"]

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


def model_digest(model: Network, card: dict) -> str:
    """SHA-256 of what the borders depend on: every weight and buffer (names, shapes, dtypes, bytes) and the
    card's input convention. Two files of the same weights share it; a retrained model does not."""
    digest = hashlib.sha256(json.dumps(card["input"], sort_keys=True).encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def measured_borders(model: Network, card: dict) -> dict[str, int]:
    """The model's padding borders, from its analyses of the :func:`constant_images`."""
    return padding_borders([analyse(model, card, image, 0, {}) for image in constant_images(card)])


def stored_borders(model: Network, card: dict, folder: Path | None = None) -> dict[str, int]:
    """The model's padding borders, measured once per weights (:func:`measured_borders`, four analyses: 2.6 s
    for the PCam DenseNet on two cores) and kept as JSON under ``folder`` (``cache_root()/padding``), so that a
    restarted server, or a Docker image built with them (``python -m app.warm``), has them before its first
    visitor. A missing, unreadable or read-only store only costs the measurement."""
    path = (folder or cache_root() / "padding") / f"{model_digest(model, card)}.json"
    try:
        return {key: int(value) for key, value in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        pass  # not stored yet, or a damaged file: measured again and replaced
    borders = measured_borders(model, card)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".part", delete=False) as f:
            json.dump(borders, f)
        os.replace(f.name, path)  # atomic: a concurrent reader never sees half a file
    except OSError:
        pass
    return borders
