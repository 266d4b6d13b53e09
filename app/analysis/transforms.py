"""Group elements and arbitrary rotations applied to image arrays ``(..., X, Y)``.

Group elements use the library's action (:meth:`models.Group.act_on_plane`):
element ``g = k + 4 m`` rotates by ``k * 90`` degrees counter-clockwise as
displayed (``torch.rot90(x, k, dims=(-2, -1))``), then flips the rows if m.
Indices 0..3 are p4; p4m adds 4..7. Arbitrary angles turn the same way, so
that 90, 180 and 270 degrees reproduce elements 1, 2 and 3; only those are
exact, any other angle resamples the pixels and the network's outputs are
then only approximately equivariant.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from models import P4M

__all__ = ["apply_element", "rotate_by_angle", "element_name", "arrow_direction"]


def apply_element(image: np.ndarray, g: int) -> np.ndarray:
    """Move the pixels of the last two axes by group element g (0..7, p4m numbering; p4 uses 0..3)."""
    return P4M.act_on_plane(torch.from_numpy(np.ascontiguousarray(image)), g).numpy().copy()


def element_name(g: int) -> str:
    """Human-readable name, e.g. ``"rot 90°"`` or ``"rot 180° + flip"``."""
    return P4M.describe(g)


def arrow_direction(g: int) -> tuple[float, float]:
    """Where element g sends a unit arrow pointing right, as ``(d_row, d_col)`` in image coordinates.

    Derived from the action itself: a bright pixel right of the centre of a 3 x 3
    image is moved by g and its new offset from the centre read back. Rotation k
    points the arrow 90 k degrees counter-clockwise as displayed (rows grow
    downwards): right, up, left, down; the mirrored elements reflect that in
    the horizontal axis.
    """
    probe = np.zeros((3, 3), dtype=np.float32)
    probe[1, 2] = 1
    row, col = np.argwhere(apply_element(probe, g) == 1)[0]
    return float(row - 1), float(col - 1)


def rotate_by_angle(image: np.ndarray, degrees: float) -> np.ndarray:
    """Rotate the last two axes about the centre by any angle, counter-clockwise as displayed.

    Bilinear interpolation; pixels whose source lies outside the image are 0.
    The direction is that of ``torch.rot90(x, 1, dims=(-2, -1))``: with centred
    coordinates (u, v) = (row, column) - centre, rot90 maps out(u, v) = in(v, -u),
    and this function samples in(u cos t + v sin t, -u sin t + v cos t), which is
    the same at t = 90 degrees.

    Args:
        image: float array ``(..., X, Y)``.
        degrees: angle; multiples of 90 on a square image match :func:`apply_element`
            to round-off.

    Returns:
        float32 array of the same shape.
    """
    rows, cols = image.shape[-2:]
    theta = math.radians(degrees)
    cos, sin = math.cos(theta), math.sin(theta)
    # Snap round-off (cos 90 degrees = 6e-17) so that quarter turns read whole pixels.
    cos, sin = (0.0 if abs(c) < 1e-12 else c for c in (cos, sin))
    cr, cc = (rows - 1) / 2, (cols - 1) / 2
    u, v = np.meshgrid(np.arange(rows) - cr, np.arange(cols) - cc, indexing="ij")  # (X, Y) each
    src_r = u * cos + v * sin + cr
    src_c = -u * sin + v * cos + cc
    return _bilinear(image.astype(np.float32, copy=False), src_r, src_c)


def _bilinear(image: np.ndarray, src_r: np.ndarray, src_c: np.ndarray) -> np.ndarray:
    """Sample ``image[..., r, c]`` at fractional positions, zero outside."""
    rows, cols = image.shape[-2:]
    r0, c0 = np.floor(src_r).astype(np.int64), np.floor(src_c).astype(np.int64)
    fr, fc = (src_r - r0).astype(np.float32), (src_c - c0).astype(np.float32)
    out = np.zeros(image.shape, dtype=np.float32)
    for dr, wr in ((0, 1 - fr), (1, fr)):
        for dc, wc in ((0, 1 - fc), (1, fc)):
            rr, cc = r0 + dr, c0 + dc
            inside = (rr >= 0) & (rr < rows) & (cc >= 0) & (cc < cols)
            values = image[..., np.clip(rr, 0, rows - 1), np.clip(cc, 0, cols - 1)]  # (..., X, Y)
            out += values * (wr * wc * inside)
    return out
