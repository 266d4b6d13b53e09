"""How a layer's maps are coloured: the values shown, their colour range, and the blend over the image.

Three ranges, all from the maps themselves and shared by every orientation and transform of the layer, so that
a colour means one value everywhere (and g.x's panels are g.x's panels moved):

- ``"robust"``: the 2nd to 98th percentile of the layer's values;
- ``"equalised"``: each value replaced by its quantile among the layer's values (0 to 1), so that every colour
  covers as many pixels: a map that is nearly flat, or crowded at one end of its range (attention close to 1
  over most of an H&E patch), still shows where it is relatively high and low;
- ``"deviation"``: each orientation's map minus the mean over orientations (which orientation is preferred
  where), on a symmetric range of +- the 98th percentile of its size;
- ``"full"``: attention on its whole [0, 1] scale, response strength from 0 to its maximum.

Percentiles are taken inside the padding border (:mod:`app.analysis.padding`) when an inside is left, so the frame the
zero padding leaves does not set the colours. Over the image, each pixel's colour is blended with an opacity
that grows with the value (with its size, for deviations): where the map is low the image shows through, H&E
in its own colours.
"""

from __future__ import annotations

import functools

import numpy as np

from ..analysis.compute import LayerMaps
from ..analysis.padding import border_left_out

__all__ = ["RANGE_MODES", "MPL_COLOUR_MAPS", "display_maps", "as_displayed", "colour_range", "overlay", "colour_lut",
           "DIVERGING", "inside"]

RANGE_MODES = {
    "robust": "2nd-98th percentile",
    "equalised": "equalised: each colour covers as many pixels",
    "deviation": "deviation from the mean over orientations",
    "full": "full scale",
}
# The page's colour maps (plotly's names) and matplotlib's names for the same maps, for blending and export.
MPL_COLOUR_MAPS = {"Viridis": "viridis", "Inferno": "inferno", "Magma": "magma", "Cividis": "cividis",
                   "Hot": "hot", "Jet": "jet", "Greys": "gray"}
DIVERGING = "RdBu_r"  # blue below the orientations' mean, red above; plotly and matplotlib both know it
PERCENTILES = (2.0, 98.0)
QUANTILES = 201  # points of the equalising table: quantiles every half percent
SHADE_FLOOR = 0.35  # the darkest pixel of the image still shows its map colour at 35 % brightness


def display_maps(layer: LayerMaps, size: int, mode: str, border: int = 0, transform: int | None = None) -> np.ndarray:
    """``(T, H, S, S)`` (or ``(H, S, S)`` of one ``transform``): the layer's maps upsampled to the image, as the
    range ``mode`` shows them.

    ``"equalised"`` maps are quantiles of the values inside ``border`` of the untransformed image's maps (every
    orientation), one table for every transform: the maps of g.x are those of x moved, so they share it.
    """
    maps = layer.upsampled(size)
    return as_displayed(maps if transform is None else maps[transform], layer, mode, border)


def as_displayed(maps: np.ndarray, layer: LayerMaps, mode: str, border: int = 0) -> np.ndarray:
    """Upsampled maps ``(..., H, S, S)`` of ``layer`` (its own, or of a turned image: the page's animation) as the
    range ``mode`` shows them: the equalising table is always the untransformed image's."""
    if mode == "deviation":
        return maps - maps.mean(axis=-3, keepdims=True)
    if mode == "equalised":
        levels = np.linspace(0.0, 1.0, QUANTILES)
        table = np.quantile(inside(layer.upsampled(maps.shape[-1])[0], border).astype(np.float64), levels)
        return np.interp(maps, table, levels).astype(np.float32)
    return maps


def inside(values: np.ndarray, border: int) -> np.ndarray:
    """The pixels of ``(..., S, S)`` at least ``border`` from every edge (all of them when too little would be
    left: :func:`app.analysis.padding.border_left_out`)."""
    size = values.shape[-1]
    border = border_left_out(border, size)
    if not border:
        return values
    return values[..., border:size - border, border:size - border]


def colour_range(values: np.ndarray, mode: str, border: int = 0, attention: bool = True) -> tuple[float, float]:
    """``(low, high)`` of the colours for ``values`` from :func:`display_maps` (every transform and orientation)."""
    if mode not in RANGE_MODES:
        raise ValueError(f"unknown colour range {mode!r}; choose one of {', '.join(RANGE_MODES)}")
    core = inside(values, border)
    if mode == "deviation":
        bound = float(np.percentile(np.abs(core), PERCENTILES[1]))
        bound = bound if bound > 0 else float(np.abs(core).max()) or 1e-6
        return -bound, bound
    if mode == "full":
        return (0.0, 1.0) if attention else (0.0, max(float(values.max()), 1e-6))
    if mode == "equalised":
        return 0.0, 1.0
    low, high = (float(v) for v in np.percentile(core, PERCENTILES))
    return (low, high) if high > low else (low, low + 1e-6)


@functools.lru_cache(maxsize=16)
def colour_lut(name: str) -> np.ndarray:
    """``(256, 3)`` float RGB in [0, 1] of a matplotlib colour map."""
    from matplotlib import colormaps

    return colormaps[name](np.linspace(0.0, 1.0, 256))[:, :3]


def overlay(image_rgb: np.ndarray, values: np.ndarray, low: float, high: float, cmap: str, opacity: float,
            signed: bool = False) -> np.ndarray:
    """uint8 ``(S, S, 3)``: ``values`` ``(S, S)`` coloured by ``cmap`` over ``image_rgb`` uint8 ``(S, S, 3)``.

    A pixel's opacity is ``opacity`` times its position in the range (``signed``: its distance from the middle,
    for deviations), so low values leave the image visible and high ones colour it; the colour is shaded by the
    pixel's lightness, so the image's structure shows through the colour too.
    """
    t = np.clip((values - low) / (high - low), 0.0, 1.0)
    colours = colour_lut(cmap)[np.round(t * 255).astype(np.intp)]  # (S, S, 3)
    weight = np.abs(2.0 * t - 1.0) if signed else t
    alpha = (opacity * weight)[..., None]
    image = image_rgb.astype(np.float64) / 255.0
    # The colour is shaded by the image's own lightness, so nuclei and strokes stay visible under a strong map.
    lightness = image.mean(axis=-1, keepdims=True)
    shaded = colours * (SHADE_FLOOR + (1.0 - SHADE_FLOOR) * lightness)
    blended = (1.0 - alpha) * image + alpha * shaded
    return np.round(np.clip(blended, 0.0, 1.0) * 255).astype(np.uint8)

