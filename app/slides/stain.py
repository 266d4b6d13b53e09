"""A slide's stain: its Macenko estimate from its tissue, once per file, and its pixels normalised to PCam's.

Every tile of a slide maps alike: the viewer's tiles and the engine's chunks are normalised with the SLIDE's
estimate as source (:func:`slide_stain`), never each tile's own (a tile of mostly nuclei would otherwise be mapped
as if its haematoxylin were the slide's average), and with PCam's reference stain from the model's card as target
(:func:`card_reference`). The estimate is made from the slide's thumbnail (:data:`STAIN_SIDE` pixels on its longer
side, 1 MP at most: the plan's own thumbnail size) over its tissue mask (:mod:`app.slides.tissue`, glass and pen
left out), so it reads the slide's coarse levels only, in bounded time whatever the slide's size; and it is kept per
file (its path, size and modification time), a failure's sentence too, so that a slide's tiles ask for it once.

The maths is :mod:`models.stain_normalise`'s; this module only says which pixels of a slide it is given.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.card import stain_reference
from models.stain_normalise import METHODS, StainError, StainEstimate, estimate_stain, normalise, pcam_reference

from .reader import open_slide
from .scale import slide_scale
from .tissue import tissue_mask

__all__ = ["slide_stain", "known_slide_stain", "card_reference", "SlideStain", "stain_of", "check_method", "STAIN_SIDE",
           "METHODS", "StainError", "StainEstimate", "pcam_target"]

STAIN_SIDE = 1024  # the thumbnail's longer side: 1 MP at most, the size of the plan's tissue mask (app.slides.run)
MIN_TISSUE_PIXELS = 1024  # of the thumbnail: about 0.26 mm^2 at 16 um/px, a small biopsy's tissue
KEPT = 64  # estimates kept in memory (a few hundred bytes each), the least recently used let go first

_kept: OrderedDict[tuple, StainEstimate | str] = OrderedDict()  # key -> the estimate, or the sentence it failed with
_locks: dict[tuple, threading.Lock] = {}  # one per key being estimated: the tiles of one slide wait for one estimate
_guard = threading.Lock()


def check_method(method: str) -> str:
    """``method`` if it is one of :data:`METHODS`; else a :class:`StainError` naming them."""
    if method not in METHODS:
        raise StainError(f"{str(method)[:40]!r} is no stain normalisation: one of {', '.join(METHODS)}")
    return method


@functools.lru_cache(maxsize=1)
def pcam_target() -> StainEstimate:
    """PCam's reference stain (:func:`models.stain_normalise.pcam_reference`), read from its card once per process:
    the tiles and every run of the Slide page ask for it (5 ms a read of the card, here)."""
    return pcam_reference()


def card_reference(card: dict) -> StainEstimate:
    """The reference stain the model of ``card`` was trained on (its card's ``stain_reference``,
    :func:`models.card.stain_reference`), else PCam's (:func:`pcam_target`, read once)."""
    return stain_reference(card) or pcam_target()


def slide_stain(path_or_reader, thumbnail: np.ndarray | None = None) -> StainEstimate:
    """The slide's Macenko estimate from its tissue (:func:`models.stain_normalise.estimate_stain` over the tissue
    mask's pixels of its :data:`STAIN_SIDE` thumbnail), kept per file: by path, size and modification time for a
    path; by OpenSlide's quickhash and dimensions for an open slide (uncached for an image, which has none).
    ``thumbnail``: the slide's ``thumbnail(STAIN_SIDE)`` where the caller has read it already (a plan has: reading it
    is most of the cost, 3 s of the CMU slide's 4.7 s on this loaded 2-core AMD EPYC), used if not kept yet.

    The tissue mask is sized by the slide's own recorded scale (a scale the user gives does not change it), so that
    the page, the tile routes and the engine's workers, which know only the file, find the same estimate.

    Raises:
        StainError: too little tissue, or pixels without stain (grey): its sentence names the slide.
        SlideError: the slide cannot be read.
    """
    if isinstance(path_or_reader, (str, Path)):
        path = Path(path_or_reader)
        key = _file_key(path)

        def estimate() -> StainEstimate:
            with open_slide(path) as slide:
                return _estimate(slide, thumbnail)
    else:
        slide = path_or_reader
        quick = slide.properties.get("openslide.quickhash-1")
        if not quick:
            return _estimate(slide, thumbnail)
        key = ("quickhash", quick, tuple(slide.dimensions))

        def estimate() -> StainEstimate:
            return _estimate(slide, thumbnail)
    return _kept_or(key, estimate)


def known_slide_stain(path: str | Path) -> StainEstimate | str | None:
    """What :func:`slide_stain` has found for the file at ``path`` so far, without estimating: its estimate, the
    sentence it failed with, or None (not estimated yet). What a page that must not wait for it asks."""
    path = Path(path)
    try:
        key = _file_key(path)
    except OSError:
        return None
    with _guard:
        return _kept.get(key)


def _file_key(path: Path) -> tuple:
    stat = path.stat()
    return ("file", str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def _kept_or(key: tuple, estimate) -> StainEstimate:
    """The estimate kept under ``key``, else ``estimate()`` kept (one thread estimates, others wait for it)."""
    with _guard:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        with _guard:
            found = _kept.get(key)
            if found is not None:
                _kept.move_to_end(key)
        if found is None:
            try:
                found = estimate()
            except StainError as err:
                found = str(err)
            with _guard:
                _kept[key] = found
                while len(_kept) > KEPT:
                    _kept.popitem(last=False)
                _locks.pop(key, None)
    if isinstance(found, str):
        raise StainError(found)
    return found


def _estimate(slide, thumbnail: np.ndarray | None = None) -> StainEstimate:
    thumbnail = slide.thumbnail(STAIN_SIDE) if thumbnail is None else thumbnail
    mpp = slide_scale(slide.properties).microns_per_pixel
    thumbnail_mpp = mpp * slide.dimensions[0] / thumbnail.shape[1] if mpp else None
    tissue, _ = tissue_mask(thumbnail, thumbnail_mpp)
    found = int(tissue.sum())
    if found < MIN_TISSUE_PIXELS:
        raise StainError(f"{slide.name} has too little tissue to estimate its stain ({found:,} pixels of its "
                         f"{thumbnail.shape[1]:,} x {thumbnail.shape[0]:,} thumbnail, at least "
                         f"{MIN_TISSUE_PIXELS:,} needed)")
    pixels = thumbnail[tissue][:, None, :]  # (N, 1, 3): the tissue's pixels, an image of one column
    try:
        return estimate_stain(pixels)
    except StainError as err:
        said = str(err)
        raise StainError(f"{slide.name}: {said[:1].lower()}{said[1:]}") from None


@dataclass(frozen=True)
class SlideStain:
    """How a slide's pixels are normalised: ``method`` (``"macenko"`` or ``"reinhard"``), from the slide's own
    estimate ``source`` to the model's reference ``target``."""

    method: str
    source: StainEstimate
    target: StainEstimate

    def apply(self, rgb: np.ndarray) -> np.ndarray:
        """``rgb`` (uint8, ``(..., 3)``) normalised: each pixel's colour alone, the same map for every tile."""
        return normalise(rgb, self.method, self.target, self.source)

    def to_dict(self) -> dict:
        """JSON-safe, exact: what a chunk's task is sent (:meth:`from_dict` gives it back)."""
        return dict(method=self.method, source=self.source.to_dict(), target=self.target.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> SlideStain:
        source, target = StainEstimate.from_dict(d["source"]), StainEstimate.from_dict(d["target"])
        return cls(check_method(d["method"]), source, target)


def stain_of(method: str, slide_path: str | Path, card: dict, thumbnail: np.ndarray | None = None) -> SlideStain | None:
    """The normalisation ``method`` of the slide at ``slide_path`` to the reference stain of the model of ``card``
    (:func:`card_reference`); None for ``"none"``, the pixels as scanned, which needs neither. ``thumbnail`` as
    :func:`slide_stain`'s.

    Raises:
        StainError: an unknown method, a slide without enough tissue to estimate its stain, or no reference stain.
    """
    if check_method(method) == "none":
        return None
    return SlideStain(method, slide_stain(slide_path, thumbnail), card_reference(card))
