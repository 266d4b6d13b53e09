"""A slide's scale in micrometres per pixel, where it comes from, and a sentence saying so.

The rules, in order (issue 59):
1. the slide's own record: OpenSlide's ``openslide.mpp-x`` and ``openslide.mpp-y`` (Aperio's ``MPP``, a TIFF's
   resolution tags, DICOM's pixel spacing, ...);
2. else its objective power, with the assumption said on screen: 10 um/px divided by the power (20x: 0.5 um/px,
   40x: 0.25 um/px), the usual scale of scanners' 20x and 40x modes, which differs by a few per cent between
   scanners;
3. else the user's (``--mpp``, or the page's field); a scale the user gives also overrides 1 and 2;
4. else none: the slide is shown but not analysed, and the sentence says why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Scale", "slide_scale", "MPP_AT_1X", "MPP_RANGE"]

MPP_AT_1X = 10.0  # um per pixel at objective power 1: a 20x scan at 0.5 um/px
MPP_RANGE = (0.05, 20.0)  # from beyond 100x objectives to heavily downsampled levels (as region mode)


@dataclass(frozen=True)
class Scale:
    """``microns_per_pixel`` of level 0 (None: unknown), ``source`` (``slide``, ``objective``, ``user`` or
    ``none``) and a sentence for the page."""

    microns_per_pixel: float | None
    source: str
    sentence: str


def slide_scale(properties: Mapping[str, str], user_mpp: float | None = None) -> Scale:
    """The scale of a slide with OpenSlide ``properties``, by the rules of the module docstring.

    Raises:
        ValueError: a user's scale outside :data:`MPP_RANGE` or not a finite number.
    """
    if user_mpp is not None:
        if not (math.isfinite(user_mpp) and MPP_RANGE[0] <= user_mpp <= MPP_RANGE[1]):
            raise ValueError(f"a scale of {user_mpp} um/px is outside {MPP_RANGE[0]} to {MPP_RANGE[1]} um/px")
        return Scale(float(user_mpp), "user", f"{user_mpp:.3f} um/px, as given")
    mpp_x, mpp_y = _number(properties.get("openslide.mpp-x")), _number(properties.get("openslide.mpp-y"))
    if mpp_x and mpp_y:
        if abs(mpp_x - mpp_y) > 0.01 * max(mpp_x, mpp_y):
            return Scale(None, "none", f"the slide records {mpp_x} x {mpp_y} um/px, not square pixels: give the "
                                       "scale to analyse it")
        return Scale(mpp_x, "slide", f"{mpp_x:.3f} um/px, recorded in the slide")
    power = _number(properties.get("openslide.objective-power"))
    if power:
        mpp = MPP_AT_1X / power
        return Scale(mpp, "objective", f"{mpp:.3f} um/px, assumed from its {power:g}x objective (no scale is "
                                        "recorded; scanners differ by a few per cent: give the scale if known)")
    return Scale(None, "none", "the slide records neither its scale nor its objective power: it is shown, but "
                               "not analysed until its scale (um per pixel) is given")


def _number(text: str | None) -> float | None:
    """A positive finite number from a property's text, else None."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None
