"""Arrow fields: at a grid of positions, one arrow per orientation, as long as the response there.

Orientation h of a group feature map is the response of the filter moved by
group element h. Its arrow points where h sends an arrow pointing right
(:func:`app.transforms.arrow_direction`): rotations k = 0..3 point right, up,
left, down as displayed (90 k degrees counter-clockwise, the sense of
``torch.rot90``); the mirrored elements h = 4..7 reflect those in the
horizontal axis and are flagged ``mirrored`` so that a drawing can tell them
apart (h = 0 and h = 4 both point right).

The grid tiles a centred square of the image into cells of ``spacing`` pixels;
each arrow's strength is the mean of the upsampled map over its cell. The grid
is symmetric under quarter turns and flips, so the field of g.x is the field of
x moved by g, like the maps it comes from. Drawing is the UI's job
(:func:`app.figures.render_arrow_field_png` draws one with matplotlib).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .compute import LayerMaps
from .reductions import upsample
from .transforms import arrow_direction

__all__ = ["ArrowField", "arrow_field"]


@dataclass(frozen=True)
class ArrowField:
    """Arrows of one layer for every transform, on a shared scale.

    Attributes:
        positions: ``(P, 2)`` (row, column) of each cell centre, image pixels.
        directions: ``(H, 2)`` unit (d_row, d_column) of each orientation.
        lengths: ``(T, H, P)`` strength / ``scale``, in [0, 1]: 1 is the longest arrow of the layer.
        orientation_ids: ``(H,)`` group element index of each orientation.
        mirrored: ``(H,)`` True for the mirrored orientations of p4m.
        scale: the strength drawn as a full-length arrow (shared by all panels).
        spacing: cell side in pixels; a full-length arrow is half of it.
        image_size: side of the image the positions refer to.
    """

    positions: np.ndarray
    directions: np.ndarray
    lengths: np.ndarray
    orientation_ids: np.ndarray
    mirrored: np.ndarray
    scale: float
    spacing: int
    image_size: int


def arrow_field(
    layer: LayerMaps, image_size: int, spacing: int | None = None, scale: float | None = None
) -> ArrowField:
    """The arrow field of one layer's per-orientation maps (features or attention).

    Args:
        layer: maps with an orientation axis (H > 1).
        image_size: side of the image the maps are shown on.
        spacing: cell side in pixels; default about a twelfth of the image.
        scale: strength of a full-length arrow; default the largest cell strength
            over all transforms and orientations, so panels compare directly.

    Raises:
        ValueError: maps without orientations (planar layers, attention on the image).
    """
    if layer.orientations < 2:
        raise ValueError(f"layer {layer.name} has no orientation axis, so no arrows to draw")
    spacing = spacing or max(2, image_size // 12)
    cells = image_size // spacing
    if (image_size - cells * spacing) % 2:
        cells -= 1  # keep the tiled square centred, so the grid is symmetric under the group
    offset = (image_size - cells * spacing) // 2
    maps = upsample(torch.from_numpy(layer.maps), image_size)  # (T, H, S, S)
    tiled = maps[..., offset:offset + cells * spacing, offset:offset + cells * spacing]
    strength = F.avg_pool2d(tiled, spacing).flatten(2).numpy()  # (T, H, P), cells in row-major order
    centres = offset + spacing * np.arange(cells) + (spacing - 1) / 2
    rows, cols = np.meshgrid(centres, centres, indexing="ij")
    positions = np.stack([rows.ravel(), cols.ravel()], axis=1)  # (P, 2)
    ids = np.arange(layer.orientations)
    if scale is None:
        scale = float(strength.max())
    lengths = strength / scale if scale > 0 else np.zeros_like(strength)
    return ArrowField(
        positions=positions.astype(np.float32),
        directions=np.array([arrow_direction(int(h)) for h in ids], dtype=np.float32),
        lengths=lengths.astype(np.float32),
        orientation_ids=ids,
        mirrored=ids >= 4,
        scale=float(scale),
        spacing=spacing,
        image_size=image_size,
    )
