"""Pictures as ``data:`` URLs: how the page ships pixels (a PNG is a fraction of the same pixels as JSON numbers).

Numpy in, strings out; no Streamlit.
"""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

__all__ = ["png_data_url", "webp_data_url", "decode_data_url"]


def png_data_url(pixels: np.ndarray) -> str:
    """A ``data:`` URL of a lossless PNG of uint8 ``(S, S)`` (grey) or ``(S, S, 3)`` (RGB) pixels; no colour
    profile, so a browser's canvas reads back exactly these bytes."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=6)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def webp_data_url(pixels: np.ndarray, quality: int = 90) -> str:
    """A ``data:`` URL of a lossy WebP of uint8 pixels: for pictures that are approximate anyway (about a third of
    a PNG's bytes for an H&E patch)."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="WEBP", quality=quality)
    return "data:image/webp;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_data_url(url: str) -> np.ndarray:
    """The pixels of a :func:`png_data_url` or :func:`webp_data_url` (tests, checks)."""
    with Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as image:
        return np.asarray(image).copy()
