"""Any block of a slide at the model's scale, equal to the same block of the whole slide resampled at once.

Region mode resamples a whole region to the model's scale in one call (:func:`app.cells.evaluation.to_model_scale`:
PyTorch's antialiased bilinear interpolation, ``align_corners=False``, in float64, each side rounded to an even
number of pixels). A slide is too large for that, and is read and evaluated a chunk of cells at a time; for the
chunks to agree with each other and with region mode, every output pixel must be the same weighted sum of the same
input pixels whichever block it is read in. So the weights are written out here, per axis, as PyTorch computes
them (``aten/src/ATen/native/cpu/UpSampleKernel.cpp``, the antialiased path): for output pixel ``i`` of ``m`` from
``n`` input pixels, ``scale = n / m``, ``support = scale`` when downsampling (else 1), ``centre = scale (i + 0.5)``,
inputs ``j`` from ``floor(centre - support + 0.5)`` to ``floor(centre + support + 0.5)`` (clipped to the image),
weighted by the triangle ``max(0, 1 - |(j - centre + 0.5) / max(scale, 1)|)`` and normalised. A block is then
``rows_weights @ pixels @ cols_weights.T`` over just the input pixels it needs: the same numbers as the whole
resampling, up to the order of the additions (measured: equal in float32 when downsampling and upsampling, one
float32 ulp, 6e-8, where an odd side is stretched by a pixel).
"""

from __future__ import annotations

import numpy as np

__all__ = ["model_side", "axis_weights", "input_span", "resample_block"]


def model_side(n: int, scale: float) -> int:
    """A side of ``n`` pixels at ``scale`` times the resolution, as region mode rounds it: to an even number (so
    that the grid centres exactly), unless no resampling is needed."""
    return max(2, 2 * round(n * scale / 2)) if scale != 1 or n % 2 else n


def axis_weights(n: int, m: int, start: int, stop: int) -> tuple[int, np.ndarray]:
    """Weights of output pixels ``start..stop-1`` (of ``m``) over input pixels (of ``n``), as ``(first input,
    (stop - start, inputs) float64)``: the inputs are ``first`` onwards, as few as those outputs need."""
    scale = n / m
    support = scale if scale >= 1 else 1.0
    stretch = max(scale, 1.0)
    outputs = np.arange(start, stop, dtype=np.float64)
    centres = scale * (outputs + 0.5)
    lows = np.maximum(np.floor(centres - support + 0.5), 0).astype(np.int64)
    highs = np.minimum(np.floor(centres + support + 0.5), n).astype(np.int64)
    first, last = int(lows.min()), int(highs.max())
    inputs = np.arange(first, last, dtype=np.float64)
    weights = np.maximum(0.0, 1.0 - np.abs((inputs[None] - centres[:, None] + 0.5) / stretch))
    inside = (inputs[None] >= lows[:, None]) & (inputs[None] < highs[:, None])
    weights = np.where(inside, weights, 0.0)
    return first, weights / weights.sum(axis=1, keepdims=True)


def input_span(n: int, m: int, start: int, stop: int) -> tuple[int, int]:
    """``(first, stop)`` of the input pixels that output pixels ``start..stop-1`` of ``m`` read, of ``n``."""
    first, weights = axis_weights(n, m, start, stop)
    return first, first + weights.shape[1]


def resample_block(pixels: np.ndarray, origin: tuple[int, int], size: tuple[int, int], model_size: tuple[int, int],
                   block: tuple[int, int, int, int]) -> np.ndarray:
    """Rows ``top..bottom-1`` and columns ``left..right-1`` (``block``) of an image of ``size`` (rows, cols)
    resampled to ``model_size``, from ``pixels`` ``(C, R, K)``, the image's pixels from ``origin`` (row, col) on,
    which must hold at least :func:`input_span` of the block on each axis. float32 ``(C, bottom - top,
    right - left)`` in [0, 1] for pixels in [0, 1]."""
    top, bottom, left, right = block
    (rows, cols), (model_rows, model_cols) = size, model_size
    if (model_rows, model_cols) == (rows, cols):
        return np.ascontiguousarray(pixels[:, top - origin[0]:bottom - origin[0], left - origin[1]:right - origin[1]],
                                    dtype=np.float32)
    first_row, row_weights = axis_weights(rows, model_rows, top, bottom)
    first_col, col_weights = axis_weights(cols, model_cols, left, right)
    r0, c0 = first_row - origin[0], first_col - origin[1]
    needed = pixels[:, r0:r0 + row_weights.shape[1], c0:c0 + col_weights.shape[1]].astype(np.float64)
    if needed.shape[1:] != (row_weights.shape[1], col_weights.shape[1]) or min(r0, c0) < 0:
        raise ValueError(f"the pixels from {origin} do not hold the inputs of block {block}")
    out = np.einsum("rk,ckl,ql->crq", row_weights, needed, col_weights, optimize=True)
    return np.clip(out, 0, 1).astype(np.float32)
