"""The page's arrow field as one SVG: every transform of the image side by side, arrows over a faded copy of it.

Why SVG and not a plotly figure: the arrows have no hover and no zoom worth having (they are drawn polygons over a
picture), and the plotly chart was the only one on the default page, so the browser fetched and compiled plotly.js
(4.7 MB) for it: 0.6 s of a cold first page and 0.1 s of every reload with AVX2 code on a Xeon (issue 58,
``benchmarks.browser_latency``). An SVG is drawn by the browser's own image decoder, and its arrows stay sharp at
any zoom. The geometry is :mod:`app.pictures.arrows`' (:class:`PanelMosaic`, :func:`arrow_polygons`), so this
picture, the export's PNG and the Fig. 5 panels draw the same arrows.

Coordinates are the mosaic's pixels, (column, row) with pixel centres at integers, as in :func:`arrow_polygons`;
the background keeps its pixels square and unsmoothed (``image-rendering: pixelated``).
"""

from __future__ import annotations

from html import escape

import numpy as np

from .arrows import ArrowField, PanelMosaic, arrow_polygons
from .encode import png_data_url
from .figures import ORIENTATION_COLOURS

__all__ = ["arrow_panels_svg"]

DECIMALS = 2  # a hundredth of an image pixel: far below what a screen shows at the page's scale


def arrow_panels_svg(field: ArrowField, images: np.ndarray, titles: list[str], *, columns: int = 4) -> str:
    """The arrow field of every transform side by side (rows of ``columns``), as SVG markup.

    Each orientation is one ``<path>`` of all its arrows over all panels, in that orientation's colour: filled for
    rotations, outlined for the mirrored orientations of p4m. A full-length arrow reaches half a cell.

    Args:
        field: from :func:`app.pictures.arrows.arrow_field`, T transforms.
        images: ``(T, C, S, S)`` in [0, 1], the transformed images.
        titles: one per transform.
    """
    count, size = len(titles), field.image_size
    mosaic = PanelMosaic(count, size, columns)
    grey = np.round(mosaic.background(list(images)) * 255).astype(np.uint8)  # (height, width)
    width, height = mosaic.width, mosaic.height
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="-0.5 -0.5 {width} {height}" '
             f'width="{width * 2}" height="{height * 2}" font-family="sans-serif">',
             f'<image x="-0.5" y="-0.5" width="{width}" height="{height}" preserveAspectRatio="none" '
             f'style="image-rendering:pixelated" href="{png_data_url(grey)}"/>']
    for h in range(len(field.directions)):
        polygons = [arrow_polygons(field, t, h, origin) for t, origin in enumerate(mosaic.origins)]
        path = _path(np.concatenate(polygons))
        if not path:
            continue
        colour = ORIENTATION_COLOURS[int(field.orientation_ids[h]) % len(ORIENTATION_COLOURS)]
        style = (f'fill="none" stroke="{colour}" stroke-width="1" vector-effect="non-scaling-stroke"'
                 if field.mirrored[h] else f'fill="{colour}"')
        parts.append(f'<path {style} d="{path}"/>')
    font = mosaic.band * 0.5
    for (top, left), title in zip(mosaic.origins, titles, strict=True):
        parts.append(f'<text x="{left + size / 2 - 0.5:g}" y="{top - mosaic.band * 0.2 - 0.5:g}" '
                     f'font-size="{font:g}" text-anchor="middle">{escape(title)}</text>')
    return "".join(parts + ["</svg>"])


def _path(polygons: np.ndarray) -> str:
    """Path data of closed polygons ``(N, 8, 2)`` (the eighth vertex repeats the first): an absolute move to the
    first vertex, then relative lines, which keeps the numbers short."""
    if not len(polygons):
        return ""
    rounded = np.round(polygons[:, :7].astype(np.float64), DECIMALS)  # (N, 7, 2)
    steps = np.round(np.diff(rounded, axis=1), DECIMALS)  # (N, 6, 2)
    shapes = []
    for start, moves in zip(rounded[:, 0], steps, strict=True):
        lines = " ".join(f"{dx:g} {dy:g}" for dx, dy in moves)
        shapes.append(f"M{start[0]:g} {start[1]:g}l{lines}z")
    return "".join(shapes)
