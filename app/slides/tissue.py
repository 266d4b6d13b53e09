"""Where the tissue is on a slide: Otsu's threshold on optical density at low resolution, pen ink and glass left out,
then a morphological opening and closing (as TIAToolbox's and histolab's tissue masks do).

Only tissue is analysed, so this mask decides which chunks of cells the engine evaluates at all; each cell is then
judged on its own pixels at the model's scale, as region mode judges them (:func:`app.cells.evaluation.cell_tissue`).

The steps, on an RGB thumbnail of a few micrometres per pixel:
1. optical density (:func:`models.stain.optical_density`), its largest over R, G, B per pixel, averaged over
   :data:`NEIGHBOURHOOD_UM` (the pale cytoplasm between nuclei is tissue, as in region mode);
2. Otsu's threshold of that over the slide, but never below :data:`models.stain.TISSUE_OD` (0.15; glass is below
   0.05): on a slide that is nearly all glass, Otsu alone would split the glass's noise;
3. pen ink left out by its hue: H&E is pink to purple (hue above 250 or below 70 degrees), the blue, green and
   turquoise markers pathologists draw with are in between; and anything nearly black (dust, black ink, folds);
4. a closing (the pale gaps between fibres fill) then an opening (specks of dust go), each with a square of
   :data:`SMOOTHING_UM` micrometres.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from models.stain import TISSUE_OD, optical_density

__all__ = ["tissue_mask", "otsu_threshold", "pen_mask", "PEN_HUES", "SMOOTHING_UM"]

PEN_HUES = (70.0, 250.0)  # degrees: green, turquoise, blue; H&E stains lie outside
PEN_SATURATION = 0.2  # below it a colour is too grey to call ink
NEARLY_BLACK = 40  # every channel below it: dust, black ink, a fold
SMOOTHING_UM = 30.0  # the closing's and opening's square, about one 32-pixel cell at PCam's scale
NEIGHBOURHOOD_UM = 10.0  # optical density is averaged over about a cell's width before the threshold


def otsu_threshold(values: np.ndarray, bins: int = 256) -> float:
    """Otsu's threshold of ``values``: the split of their histogram with the largest between-class variance."""
    values = np.asarray(values, dtype=np.float64).ravel()
    low, high = float(values.min()), float(values.max())
    if high <= low:
        return high
    counts, edges = np.histogram(values, bins=bins, range=(low, high))
    centres = (edges[:-1] + edges[1:]) / 2
    weight = np.cumsum(counts)  # (bins,): pixels at or below each bin
    mass = np.cumsum(counts * centres)
    total, total_mass = weight[-1], mass[-1]
    below, above = weight[:-1], total - weight[:-1]
    valid = (below > 0) & (above > 0)
    mean_below = np.divide(mass[:-1], below, out=np.zeros_like(centres[:-1]), where=valid)
    mean_above = np.divide(total_mass - mass[:-1], above, out=np.zeros_like(centres[:-1]), where=valid)
    between = np.where(valid, below * above * (mean_below - mean_above) ** 2, -1.0)
    return float(edges[1:][np.argmax(between)])


def pen_mask(rgb: np.ndarray) -> np.ndarray:
    """Boolean ``(H, W)``: pixels of pen ink by hue (:data:`PEN_HUES`) or nearly black.

    In integers, without a hue: with ``d = max - min``, hue is 60 (b - r) / d + 120 where green is largest (red
    not), 60 (r - g) / d + 240 where blue is (red and green not), and within 60 degrees of red where red is, so it
    lies in [70, 250) exactly where green is largest and 6 (b - r) >= -5 d, or blue and 6 (r - g) < d; saturation
    ``d / max`` is above 0.2 where 5 d > max. Exact: a float formula (hue and saturation divided out) differs on
    3,600 of the 16.7 million 8-bit colours, every one a tie (hue exactly 70 or 250, saturation exactly 0.2) that its
    rounding decided either way; and a fifteenth of its time (0.37 -> 0.024 s on a 1,024-pixel thumbnail)."""
    pixels = np.asarray(rgb)
    r, g, b = (pixels[..., k].astype(np.int16) for k in range(3))
    high, low = np.maximum(np.maximum(r, g), b), np.minimum(np.minimum(r, g), b)
    spread = high - low
    green = (g == high) & (r != high)
    blue = (b == high) & (r != high) & (g != high)
    in_hues = (green & (6 * (b - r) >= -5 * spread)) | (blue & (6 * (r - g) < spread))
    assert PEN_HUES == (70.0, 250.0) and PEN_SATURATION == 0.2  # the integer bounds above are these
    return (in_hues & (5 * spread > high)) | (high < NEARLY_BLACK)


def tissue_mask(rgb: np.ndarray, microns_per_pixel: float | None = None) -> tuple[np.ndarray, float]:
    """Boolean ``(H, W)`` tissue of an RGB uint8 thumbnail, and the optical density threshold used.

    Args:
        microns_per_pixel: the thumbnail's scale, which sizes the opening and closing; unknown: 8 um/px assumed
            (a 2,000-pixel thumbnail of a 1.6 cm slide).
    """
    scale = microns_per_pixel or 8.0
    pen = pen_mask(rgb)
    # Averaged over about a cell's width first: the pale cytoplasm between nuclei is tissue, not glass.
    density = _box_mean(np.where(pen, 0.0, optical_density(rgb).max(axis=-1)), _side(NEIGHBOURHOOD_UM, scale))
    candidates = density[~pen]
    threshold = max(otsu_threshold(candidates), TISSUE_OD) if candidates.size else TISSUE_OD
    mask = (density > threshold) & ~pen
    side = _side(SMOOTHING_UM, scale)
    return _open(_close(mask, side), side), threshold


def _side(microns: float, microns_per_pixel: float) -> int:
    return max(1, round(microns / microns_per_pixel))


def _box_mean(values: np.ndarray, side: int) -> np.ndarray:
    tensor = torch.from_numpy(values.astype(np.float32))[None, None]
    padded = F.pad(tensor, (side // 2, (side - 1) // 2, side // 2, (side - 1) // 2), mode="replicate")
    return F.avg_pool2d(padded, side, stride=1)[0, 0].numpy()


def _dilate(mask: np.ndarray, side: int) -> np.ndarray:
    """Pixels with any of ``mask`` in the ``side`` x ``side`` square around them: a box count by prefix sums, the
    same cost whatever the side (a max-pool of a 21-pixel square took 4.6 s on a 2,048-pixel thumbnail)."""
    counts = mask.astype(np.int32)
    for axis in (0, 1):
        counts = _box_sum(counts, side, axis)
    return counts > 0


def _box_sum(values: np.ndarray, side: int, axis: int) -> np.ndarray:
    """Sums over windows of ``side`` along ``axis`` (offset as the dilation's square: ``side // 2`` before), cut at
    the edges: differences of the prefix sums, padded with their first and last so that two slices are the window's
    ends (no gathered copies)."""
    before, after = side // 2, (side - 1) // 2
    sums = np.cumsum(values, axis=axis, dtype=np.int32)
    shape = list(sums.shape)
    shape[axis] = 1
    zeros = np.zeros(shape, dtype=np.int32)
    last = np.take(sums, [-1], axis=axis)
    padded = np.concatenate([zeros] * (before + 1) + [sums] + [last] * after, axis=axis)
    n = values.shape[axis]
    ends = [slice(None)] * values.ndim
    starts = [slice(None)] * values.ndim
    ends[axis], starts[axis] = slice(before + after + 1, before + after + 1 + n), slice(0, n)
    return padded[tuple(ends)] - padded[tuple(starts)]


def _erode(mask: np.ndarray, side: int) -> np.ndarray:
    return ~_dilate(~mask, side)


def _open(mask: np.ndarray, side: int) -> np.ndarray:
    return _dilate(_erode(mask, side), side)


def _close(mask: np.ndarray, side: int) -> np.ndarray:
    return _erode(_dilate(mask, side), side)
