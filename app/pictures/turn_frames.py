"""What the browser needs to turn and mirror the maps without asking the server: the viewer's payload.

A quarter turn or a mirror of the image needs no new forward pass. For an equivariant network the maps of g.x
are the maps of x moved by g: the planes turned with the image and the orientation axis re-indexed by g's
permutation (the proof tab measures the difference, float32 round-off). So the payload holds the image once,
each orientation's map of x once, and for every element g where each panel of g.x comes from; the browser
moves the pixels itself (an exact permutation of the grid) and blends the colours as
:func:`app.pictures.map_style.overlay` does. A planar network is not equivariant: its payload holds the maps the
network computed on every g.x instead, and the browser only moves the image.

Maps travel as 8-bit PNGs of their position in the colour range (0 at the bottom, 255 at the top), the colour
map as 256 RGB triples: a turn is a redraw of a few canvases, and a colour means the same value in every panel.
Numpy in, JSON-ready dict out; no Streamlit.
"""

from __future__ import annotations

import numpy as np

from models import get_group

from ..analysis.compute import Analysis, LayerMaps
from ..analysis.padding import border_left_out
from ..analysis.transforms import apply_element
from .encode import decode_data_url, png_data_url, webp_data_url
from .map_style import SHADE_FLOOR, colour_lut, overlay
from .plots import PanelMarks, image_rgb

__all__ = ["viewer_payload", "animation_payload", "quantise", "frame_pixels"]


def quantise(maps: np.ndarray, low: float, high: float) -> np.ndarray:
    """uint8 positions of ``maps`` in the colour range ``[low, high]``: 0 at ``low`` or below, 255 at ``high`` or
    above (the colour index :func:`app.pictures.map_style.overlay` takes)."""
    t = np.clip((maps.astype(np.float64) - low) / (high - low), 0.0, 1.0)
    return np.round(t * 255).astype(np.uint8)


def viewer_payload(analysis: Analysis, layer: LayerMaps, maps: np.ndarray, titles: list[str], *,
                   zrange: tuple[float, float], colormap: str, opacity: float, signed: bool, style: str,
                   colour_title: str, marks: PanelMarks | None = None, border: int = 0,
                   outlines: np.ndarray | None = None, viewer: str = "maps") -> dict:
    """The turn viewer's data for one layer as the page shows it.

    Args:
        analysis: the image's analysis (transform 0 is the image as given).
        layer: the layer shown (its :attr:`~app.analysis.compute.LayerMaps.orientations` panels).
        maps: the layer's maps as coloured (:func:`app.pictures.map_style.display_maps`): ``(1, H, S, S)``, the
            image's alone, for an equivariant network (the browser moves them); ``(T, H, S, S)``, every
            transform's, for a planar one.
        titles: one per orientation.
        zrange: the colour range, shared by every panel and transform.
        colormap: matplotlib's name of the colour map (the LUT the browser blends with).
        opacity, signed, style: as :func:`app.pictures.plots.map_panels` takes them.
        colour_title: the colour bar's title.
        marks: pathology marks (centre square, scale bar) of every panel.
        border: the padding border, outlined when left out of the range.
        outlines: bool ``(S, S)`` nuclei of the image as given (moved with it by the browser), or None.
        viewer: names the viewer on its page: each keeps its own turn across reruns.
    """
    low, high = zrange
    size = maps.shape[-1]
    equivariant = analysis.equivariant
    group = get_group(analysis.group)
    orientations = layer.orientations
    quantised = quantise(maps, low, high)
    moves = []
    for t, g in enumerate(analysis.elements):
        if equivariant:
            perm = group.permutation(g).tolist() if orientations == group.order else list(range(orientations))
            moves.append(dict(source=0, element=int(g), orientations=perm))
        else:
            moves.append(dict(source=t, element=0, orientations=list(range(orientations))))
    centre, bar = (None, None) if marks is None else (marks.centre, marks.bar_px)
    return dict(
        viewer=viewer,
        size=size,
        image=png_data_url(image_rgb(analysis.images[0])),
        maps=[[png_data_url(q) for q in per_transform] for per_transform in quantised],
        moves=moves,
        elementNames=list(analysis.element_names),
        elements=[int(g) for g in analysis.elements],
        mirrors=group.order == 8,
        probabilities=np.round(analysis.probabilities, 4).tolist(),
        classNames=list(analysis.class_names),
        titles=list(titles),
        low=float(low),
        high=float(high),
        colormap=colormap,
        lut=colour_lut(colormap).ravel().tolist(),
        opacity=float(opacity),
        signed=bool(signed),
        style=style,
        shadeFloor=SHADE_FLOOR,
        colourTitle=colour_title,
        centre=None if centre is None else [int(v) for v in centre],
        bar=None if not bar else dict(px=float(bar), label=marks.bar_label),
        border=int(border_left_out(border, size)),
        outlines=None if outlines is None else png_data_url(outlines.astype(np.uint8) * 255),
        exact=equivariant,
    )


def frame_pixels(payload: dict, t: int, h: int) -> np.ndarray:
    """uint8 ``(S, S, 3)``: what the viewer draws in panel ``h`` of transform ``t`` (overlay style), computed here
    the way the browser computes it (:func:`app.pictures.map_style.overlay` of the quantised positions); the browser
    test compares the two pixel for pixel."""
    move = payload["moves"][t]
    image = decode_data_url(payload["image"]).transpose(2, 0, 1)  # (3, S, S)
    moved_image = apply_element(image, payload["elements"][t]).transpose(1, 2, 0)  # (S, S, 3)
    q = decode_data_url(payload["maps"][move["source"]][move["orientations"][h]])
    q = apply_element(q, move["element"])
    return overlay(moved_image, q / 255.0, 0.0, 1.0, payload["colormap"], payload["opacity"], payload["signed"])


def animation_payload(sequence, maps: np.ndarray, zrange: tuple[float, float], key: str, start: int = 0) -> dict:
    """The turn animation's frames for the viewer, or a chunk of them from frame ``start``: each step's turned
    image and its maps (side by side in one picture, in the viewer's colour range), its deviation from the turned
    maps of the image and its probabilities. At quarter turns the viewer draws its exact frames instead: those are
    group elements.

    Args:
        sequence: a :class:`app.analysis.turning.TurnSequence`, or a chunk of one (``turning_chunks``).
        maps: ``(N, H, S, S)`` its maps as the page colours them (:func:`app.pictures.map_style.as_displayed`).
        zrange: the viewer's colour range.
        key: names what was turned (model, image, layer, reading, colours): the viewer plays a new one once.
        start: the index of the chunk's first frame in the whole animation.
    """
    quantised = quantise(maps, *zrange)  # (N, H, S, S)
    n, h, s, _ = quantised.shape
    side_by_side = quantised.transpose(0, 2, 1, 3).reshape(n, s, h * s)  # (N, S, H*S): panel h at columns h*S
    return dict(
        key=key,
        start=int(start),
        degrees=[float(d) for d in sequence.degrees],
        images=[webp_data_url(image_rgb(image)) for image in sequence.images],
        maps=[webp_data_url(row) for row in side_by_side],
        deviations=[float(d) for d in sequence.deviations],
        typicalDeviations=[float(d) for d in sequence.typical_deviations],
        probabilities=np.round(sequence.probabilities, 4).tolist(),
    )
