"""A slide moved by an element of p4m: the same slide turned by quarter turns or mirrored, read as a slide.

The proof that the heatmaps transform exactly with the image, on whole slides: the moved slide is analysed as a
slide of its own by the same engine, and its per-cell maps compared with the original's moved
(:mod:`app.slides.proof`). Nothing is written: :func:`moved_slide` is a view that reads the original's pixels and
moves them with :func:`app.analysis.transforms.apply_element` (element ``g = k + 4 m``: ``torch.rot90`` by ``k``
quarter turns counter-clockwise as displayed, then the rows flipped if ``m``).

Level 0 is exact: ``moved.read_region(left, top, 0, width, height)`` is, pixel for pixel, that crop of
``apply_element(original level 0, g)``, white outside the slide as the reader's. A rectangle of the moved slide is
the image under ``g`` of one rectangle of the original (``g`` permutes and reflects the pixel lattice), so a read is
one read of the original and one move of the pixels it gave.

Levels above 0 are the original's levels moved on their own pixel grids: a read whose level-0 corner is a multiple
of the level's downsample is exactly that crop of the original's level moved (the whole level, say). But a level's
pixel stands for ``downsample`` level-0 pixels counted from the original's top-left corner, and a level's side is
rarely exactly the level-0 side over its downsample: where the moved slide's origin is another corner of the
original, its levels are offset from its level 0 by that remainder, less than one pixel of the level; and a corner
between a level's pixels is OpenSlide's to interpolate. :meth:`thumbnail` is exactly the original's thumbnail moved
(a moved run moves the original's tissue mask too, :func:`app.slides.run.plan_slide`).
Associated images (label, macro) are the original's, not moved: they are other pictures of the glass.
"""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from models import P4M

from ..analysis.transforms import apply_element
from .reader import Slide, SlideLevels

__all__ = ["MovedSlide", "moved_slide", "move_rectangle", "ELEMENTS"]

ELEMENTS = range(P4M.order)  # 0..7: four rotations, then the four mirrored ones


def move_rectangle(rectangle: tuple[float, float, float, float], shape: tuple[float, float],
                   g: int) -> tuple[float, float, float, float]:
    """Where ``g`` sends the rectangle ``(top, bottom, left, right)`` (rows ``top..bottom``, columns
    ``left..right``, continuous coordinates, pixel ``(i, j)`` the unit square at ``(i, j)``) of an image of
    ``shape`` ``(rows, cols)``: the rectangle in the moved image (of ``(cols, rows)`` for odd turns).

    Derived from ``torch.rot90(x, 1, dims=(-2, -1))``, which is ``x`` with its columns reversed and then
    transposed: pixel ``(r, c)`` of an image of ``cols`` columns goes to ``(cols - 1 - c, r)``.
    """
    top, bottom, left, right = rectangle
    rows, cols = shape
    k, mirrored = P4M.parts(g)
    for _ in range(k):  # one quarter turn at a time: rows come from the reversed columns, columns from the rows
        top, bottom, left, right = cols - right, cols - left, top, bottom
        rows, cols = cols, rows
    if mirrored:  # then the rows flipped
        top, bottom = rows - bottom, rows - top
    return top, bottom, left, right


def _move_pixels(pixels: np.ndarray, g: int) -> np.ndarray:
    """RGB ``(H, W, 3)`` moved by ``g`` on its two pixel axes (``apply_element`` acts on the last two)."""
    planes = np.ascontiguousarray(pixels.transpose(2, 0, 1))  # (3, H, W)
    return np.ascontiguousarray(apply_element(planes, g).transpose(1, 2, 0))


class MovedSlide(SlideLevels):
    """A :class:`app.slides.reader.Slide` moved by element ``element`` (1..7), with the slide's interface; its
    coordinates are the moved slide's. Closing it closes the original.

    Attributes:
        original: the slide it reads.
        element: the element of p4m it is moved by.
    """

    def __init__(self, original: Slide, element: int):
        if element not in ELEMENTS:
            raise ValueError(f"a slide is moved by an element of p4m, 0 to 7, not {element}")
        self.original = original
        self.element = element
        self.name = original.name
        self.vendor = original.vendor
        self.level_downsamples = original.level_downsamples
        self.associated = original.associated
        self.colour = original.colour
        odd = P4M.parts(element)[0] % 2
        self.level_dimensions = tuple((h, w) if odd else (w, h) for w, h in original.level_dimensions)
        self.properties = MappingProxyType(_moved_properties(original.properties, original.dimensions, element))

    def read_region(self, left: int, top: int, level: int, width: int, height: int) -> np.ndarray:
        """RGB uint8 ``(height, width, 3)`` of level ``level`` whose top-left corner is the moved slide's level-0
        pixel ``(left, top)``; outside the slide, white. At level 0 exactly that crop of the whole original moved.

        Raises:
            SlideError: as :meth:`app.slides.reader.Slide.read_region`.
        """
        if not 0 <= level < self.level_count or width < 0 or height < 0:
            return self.original.read_region(left, top, level, width, height)  # its sentence for the user
        downsample = self.level_downsamples[level]
        moved_cols, moved_rows = self.level_dimensions[level]
        # The rectangle in the level's pixels, then the original's rectangle the inverse element sends it to.
        rectangle = (top / downsample, top / downsample + height, left / downsample, left / downsample + width)
        o_top, o_bottom, o_left, o_right = move_rectangle(rectangle, (moved_rows, moved_cols),
                                                          P4M.inverse(self.element))
        pixels = self.original.read_region(round(o_left * downsample), round(o_top * downsample), level,
                                           round(o_right - o_left), round(o_bottom - o_top))
        return _move_pixels(pixels, self.element)

    def best_level(self, downsample: float) -> int:
        """The level with the largest downsample at most ``downsample``: the original's."""
        return self.original.best_level(downsample)

    def thumbnail(self, longest: int) -> np.ndarray:
        """The original's thumbnail moved: exactly, pixel for pixel."""
        return _move_pixels(self.original.thumbnail(longest), self.element)

    def associated_image(self, name: str) -> np.ndarray:
        """The original's associated image ``name``, not moved (a label or a photograph of the glass)."""
        return self.original.associated_image(name)

    def close(self) -> None:
        self.original.close()


def moved_slide(slide: Slide, element: int) -> Slide | MovedSlide:
    """``slide`` moved by ``element`` (0..7, p4m's numbering, :func:`app.analysis.transforms.element_name`): the
    slide itself for 0, else a :class:`MovedSlide` over it.

    Raises:
        ValueError: an element outside 0..7.
    """
    if element == 0:
        return slide
    return MovedSlide(slide, element)


def _moved_properties(properties, dimensions: tuple[int, int], g: int) -> dict:
    """The slide's properties as they read on the moved slide: OpenSlide's per-axis keys swapped by odd turns (the
    scale ``mpp-x``/``mpp-y``, the levels' sizes and tiles) and the scanned area's bounds moved (Deep Zoom draws
    only that). The rest is the original's, OpenSlide's ``quickhash-1`` of the original's pixels among it (the
    store's key adds the element)."""
    moved = dict(properties)
    if P4M.parts(g)[0] % 2:
        pairs = [("openslide.mpp-x", "openslide.mpp-y")]
        level = 0
        while f"openslide.level[{level}].width" in properties:
            pairs += [(f"openslide.level[{level}].width", f"openslide.level[{level}].height"),
                      (f"openslide.level[{level}].tile-width", f"openslide.level[{level}].tile-height")]
            level += 1
        for a, b in pairs:
            moved.pop(a, None)
            moved.pop(b, None)
            if a in properties:
                moved[b] = properties[a]
            if b in properties:
                moved[a] = properties[b]
    bounds = ("openslide.bounds-x", "openslide.bounds-y", "openslide.bounds-width", "openslide.bounds-height")
    if all(key in properties for key in bounds):
        x, y, width, height = (int(properties[key]) for key in bounds)
        top, bottom, left, right = move_rectangle((y, y + height, x, x + width), dimensions[::-1], g)
        for key, value in zip(bounds, (left, top, right - left, bottom - top), strict=True):
            moved[key] = str(int(value))
    return moved
