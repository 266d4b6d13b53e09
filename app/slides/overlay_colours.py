"""The colours of a slide's overlay tiles (:mod:`app.slides.overlay_tiles`), numpy in, RGBA out.

- A value of an evaluated cell: viridis over a fixed range, opaque (the viewer sets the layer's opacity).
  Every reading has the range [0, 1], its own: P(tumour) is a probability, and each reading of attention (α_s, a
  sigmoid; α⁻ = α_c·α_s, a product of two; α⁺ = 1 − α⁻) is a share between 0 and 1. A range taken from the values
  (the old whole-slide picture's 2nd to 98th percentile) would change as chunks finish, so that a tile made early
  would not match its neighbour made late.
- A chunk with tissue not yet evaluated: diagonal grey stripes, half see-through ("waiting").
- Glass, a cell with too little tissue, outside the grid: transparent black (a WebGL drawer blends premultiplied,
  where any other transparent colour would tint).
- The tissue outline: cyan.

A tile of every reading at once (:func:`values_tile`) holds the 8-bit index each colour above is looked up at, and
the state, so that the viewer colours the overlay chosen itself (``app/ui/slide_viewer.js``, with :func:`palette`'s
table) and a switch of overlay fetches nothing: red P(tumour), green α_s, blue α⁻ (α⁺ is index 255 − α⁻'s, here as in
the coloured tiles), alpha :data:`EVALUATED` for a value, :data:`WAITING_MARK` for not yet evaluated (drawn as the
stripes), 0 for nothing. The indices of a pixel that is not evaluated are 0: a browser's canvas keeps colours
exactly only where alpha is 255 (it stores them premultiplied).
"""

from __future__ import annotations

import numpy as np
from matplotlib import colormaps

__all__ = ["RANGE", "VIRIDIS", "WAITING", "WAITING_STRIPE", "OUTLINE", "EVALUATED", "WAITING_MARK", "CHANNELS",
           "REVERSED", "index", "coloured", "waiting_pattern", "values_tile", "palette"]

RANGE = (0.0, 1.0)  # of every overlay: see the module's docstring
VIRIDIS = np.round(colormaps["viridis"](np.linspace(0, 1, 256)) * 255).astype(np.uint8)  # (256, 4) RGBA
WAITING = np.array([128, 128, 128, 150], dtype=np.uint8)  # a stripe of a chunk not yet evaluated
WAITING_GAP = np.array([128, 128, 128, 45], dtype=np.uint8)  # between its stripes
WAITING_STRIPE = 6  # pixels of the tile across a stripe and across a gap
OUTLINE = np.array([0, 229, 255, 255], dtype=np.uint8)
EVALUATED, WAITING_MARK = 255, 128  # a values tile's alpha (its docstring)
CHANNELS = ("tumour", "spatial", "removed")  # a values tile's red, green and blue
REVERSED = {"kept": "removed"}  # an overlay drawn as another's index reversed (α⁺ = 1 − α⁻)


def index(values: np.ndarray, low: float = RANGE[0], high: float = RANGE[1]) -> tuple[np.ndarray, np.ndarray]:
    """``values``' viridis index over ``[low, high]`` (clipped), uint8, 0 where NaN; and where they are NaN."""
    missing = ~np.isfinite(values)
    if (low, high) == (0.0, 1.0):  # every overlay's range: the same numbers in two passes fewer (a tile's 8 %)
        scaled = np.clip(values * 255, 0, 255)
    else:
        scaled = np.clip((np.where(missing, low, values) - low) / max(high - low, 1e-12), 0, 1) * 255
    scaled[missing] = 0
    return np.round(scaled).astype(np.uint8), missing


def coloured(values: np.ndarray, low: float = RANGE[0], high: float = RANGE[1], reverse: bool = False) -> np.ndarray:
    """``(..., 4)`` uint8: ``values`` in viridis over ``[low, high]`` (clipped), transparent black where NaN;
    ``reverse``: at index 255 − their index (α⁺ from α⁻, as the viewer colours a values tile)."""
    indices, missing = index(values, low, high)
    colours = VIRIDIS[255 - indices if reverse else indices]
    colours[missing] = 0
    return colours


def values_tile(values: dict[str, np.ndarray], waiting: np.ndarray) -> np.ndarray:
    """``(h, w, 4)`` uint8: the values tile (the module's docstring) of a tile's ``(h, w)`` ``values`` of each of
    :data:`CHANNELS` (``"tumour"`` there; a reading missing is index 0) and where it is not yet evaluated."""
    rgba = np.zeros((*waiting.shape, 4), dtype=np.uint8)
    evaluated = np.isfinite(values["tumour"])
    for channel, name in enumerate(CHANNELS):
        if values.get(name) is not None:
            rgba[..., channel] = np.where(evaluated, index(values[name])[0], 0)
    rgba[..., 3] = np.where(waiting, WAITING_MARK, np.where(evaluated, EVALUATED, 0))
    return rgba


def palette() -> dict:
    """What the viewer colours a values tile with, as JSON: this module's colours, and each overlay's channel (the
    ones of :data:`REVERSED` at the reversed index)."""
    channels = {name: channel for channel, name in enumerate(CHANNELS)}
    channels.update({name: channels[source] for name, source in REVERSED.items()})
    return dict(viridis=VIRIDIS.tolist(), waiting=WAITING.tolist(), gap=WAITING_GAP.tolist(), stripe=WAITING_STRIPE,
                evaluated=EVALUATED, waitingMark=WAITING_MARK, channels=channels, reversed=list(REVERSED))


_stripes: list[np.ndarray] = []  # the pattern over (2 * WAITING_STRIPE + n) x n pixels, grown as asked


def waiting_pattern(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``(len(rows), len(cols), 4)`` uint8: the stripes of "not yet evaluated" at the pixels ``rows`` x ``cols``
    of a level (global pixel indices, so that the stripes run on from one tile to the next). For ranges (a tile's),
    a read-only view of one pattern made once: the stripes depend on ``(row + col) mod 2 * WAITING_STRIPE`` only."""
    rows, cols = np.asarray(rows), np.asarray(cols)
    period = 2 * WAITING_STRIPE
    ranges = all(len(a) < 2 or bool((np.diff(a) == 1).all()) for a in (rows, cols))
    if not ranges or not len(rows) or not len(cols):
        stripe = ((rows[:, None] + cols[None, :]) // WAITING_STRIPE) % 2 == 0
        return np.where(stripe[..., None], WAITING, WAITING_GAP)
    side = max(len(rows), len(cols))
    if not _stripes or _stripes[0].shape[1] < side:
        i = np.arange(period + side)
        stripe = ((i[:, None] + i[None, :side]) // WAITING_STRIPE) % 2 == 0
        pattern = np.where(stripe[..., None], WAITING, WAITING_GAP)
        pattern.flags.writeable = False
        _stripes[:] = [pattern]
    shift = int(rows[0] + cols[0]) % period
    return _stripes[0][shift:shift + len(rows), :len(cols)]
