"""Uploaded image bytes -> a float image in [0, 1], and fitting it to a model's input.

Uploads are untrusted: only the decoders of the formats we accept are tried
(PNG, JPEG, TIFF, BMP, WebP), sizes are checked before pixels are decoded, and
every way a file can be bad (empty, truncated, corrupt, not an image, too many
bytes, too many pixels, a decompression bomb) raises one :class:`ImageError`
whose message can be shown to the user as is.

Arrays follow the library's image convention: channels first, then rows (X)
and columns (Y). :func:`read_image` returns ``(C, X, Y)`` with C = 1 (grey) or
3 (RGB).
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

__all__ = [
    "ImageError",
    "FitInfo",
    "FittedImage",
    "MAX_UPLOAD_BYTES",
    "MAX_PIXELS",
    "FORMATS",
    "read_image",
    "read_image_rgb8",
    "to_channels",
    "fit_to_model",
]

MAX_UPLOAD_BYTES = 20 * 2**20
MAX_PIXELS = 40_000_000  # e.g. 8000 x 5000; far below Pillow's own bomb threshold (about 179 MP)
FORMATS = ("PNG", "JPEG", "TIFF", "BMP", "WEBP")
# ITU-R 601-2 luma, the weights Pillow's convert("L") uses.
LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


class ImageError(ValueError):
    """An upload that cannot be used as an image; the message is meant for the user."""


def read_image(data: bytes, max_bytes: int = MAX_UPLOAD_BYTES, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """Decode an uploaded image into floats in [0, 1].

    Modes: L, 1, I;16 (divided by 65535), I (clipped to [0, 65535], divided by
    65535), F (clipped to [0, 1]), RGB, CMYK, YCbCr, P, and those with alpha (LA,
    PA, RGBA), which are composited on white. The EXIF orientation tag is
    applied, so photos come out the way viewers show them. Multi-frame files
    give their first frame.

    Args:
        data: the file's bytes.
        max_bytes: largest accepted file.
        max_pixels: largest accepted width * height, checked from the header
            before any pixel is decoded.

    Returns:
        float32 array ``(C, X, Y)``, C = 1 for grey-level images and 3 for colour ones.

    Raises:
        ImageError: the message says what is wrong with the upload.
    """
    return _decoded(data, max_bytes, max_pixels, _to_float)


def read_image_rgb8(data: bytes, max_bytes: int, max_pixels: int) -> tuple[np.ndarray, bool]:
    """Decode an image as :func:`read_image` does (the same formats, checks, EXIF orientation and compositing on
    white) into 8-bit RGB ``(X, Y, 3)``, the form every whole slide's pixels take (:mod:`app.slides.reader`), and
    whether it is colour (False: grey levels, repeated in the three channels).

    8-bit images are converted by Pillow without a float copy (a 20,000-pixel-square image holds 1.2 GB, not 4.8);
    the rest (16-bit, float, with alpha) go through :func:`read_image`'s floats, rounded to the nearest level.
    """
    def rgb8(img: Image.Image) -> tuple[np.ndarray, bool]:
        grey = img.mode in ("1", "L", "LA", "I", "F") or img.mode.startswith("I;16")
        if img.mode in ("1", "L", "RGB", "CMYK", "YCbCr") or (img.mode == "P" and "transparency" not in img.info):
            pixels = np.asarray(img.convert("RGB"))
            if img.mode == "P":
                grey = bool((pixels[..., 0] == pixels[..., 1]).all() and (pixels[..., 1] == pixels[..., 2]).all())
            return pixels, not grey
        floats = _to_float(img)
        pixels = np.round(np.repeat(floats, 3 // floats.shape[0], axis=0) * 255).astype(np.uint8).transpose(1, 2, 0)
        return np.ascontiguousarray(pixels), floats.shape[0] == 3

    return _decoded(data, max_bytes, max_pixels, rgb8)


def _decoded(data: bytes, max_bytes: int, max_pixels: int, convert):
    """``convert`` of the decoded, EXIF-oriented image in ``data``, every failure an :class:`ImageError`."""
    if not data:
        raise ImageError("The file is empty (0 bytes).")
    if len(data) > max_bytes:
        raise ImageError(f"The file has {len(data) / 2**20:.1f} MB; the limit is {max_bytes / 2**20:.0f} MB.")
    with warnings.catch_warnings():
        # Pillow warns (DecompressionBombWarning) between its two bomb thresholds: refuse those too.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data), formats=list(FORMATS)) as img:
                width, height = img.size
                if width * height > max_pixels:
                    raise ImageError(
                        f"The image is {width} x {height} pixels ({width * height / 1e6:.0f} MP); "
                        f"the limit is {max_pixels / 1e6:.0f} MP."
                    )
                img.load()
                img = ImageOps.exif_transpose(img)
                return convert(img)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise ImageError(
                "The image declares more pixels than can be decoded safely (a decompression bomb); "
                f"the limit is {max_pixels / 1e6:.0f} MP."
            ) from None
        except Image.UnidentifiedImageError:
            raise ImageError(
                f"This is not an image in a supported format ({', '.join(FORMATS)})."
            ) from None
        except (OSError, SyntaxError, ValueError, EOFError) as err:
            if isinstance(err, ImageError):
                raise
            # Pillow reports truncated and corrupt data as OSError (or SyntaxError for broken headers).
            raise ImageError(f"The image file is truncated or corrupt ({err}).") from None


def _to_float(img: Image.Image) -> np.ndarray:
    """Pixels of a decoded image as float32 ``(C, X, Y)`` in [0, 1]."""
    mode = img.mode
    if mode.startswith("I;16"):
        grey = np.asarray(img, dtype=np.float32) / 65535.0
        return grey[None]
    if mode == "I":
        return (np.clip(np.asarray(img, dtype=np.float64), 0, 65535) / 65535.0).astype(np.float32)[None]
    if mode == "F":
        return np.clip(np.asarray(img, dtype=np.float32), 0, 1)[None]
    if mode in ("1", "L"):
        return (np.asarray(img.convert("L"), dtype=np.float32) / 255.0)[None]
    has_alpha = mode in ("LA", "PA", "RGBA", "RGBa") or (mode == "P" and "transparency" in img.info)
    if has_alpha:
        rgba = np.asarray(img.convert("RGBA"), dtype=np.float32) / 255.0  # (X, Y, 4)
        alpha = rgba[..., 3:]
        rgb = rgba[..., :3] * alpha + (1 - alpha)  # composited on white
        grey_source = mode in ("LA",)
        out = rgb.transpose(2, 0, 1)  # (3, X, Y)
        return out[:1] if grey_source else out
    if mode == "P":
        # A palette of greys stays grey; anything else is colour.
        rgb = np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0
        out = rgb.transpose(2, 0, 1)  # (3, X, Y)
        return out[:1] if np.array_equal(out[0], out[1]) and np.array_equal(out[1], out[2]) else out
    rgb = np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0  # CMYK, YCbCr, RGB, ...
    return rgb.transpose(2, 0, 1)  # (3, X, Y)


def to_channels(image: np.ndarray, channels: int) -> np.ndarray:
    """Convert ``(C, X, Y)`` to 1 or 3 channels: RGB -> L by ITU-R 601-2 luma (as Pillow), L -> RGB by repetition."""
    have = image.shape[0]
    if have == channels:
        return image.astype(np.float32, copy=False)
    if have == 3 and channels == 1:
        return np.tensordot(LUMA, image, axes=1)[None].astype(np.float32)
    if have == 1 and channels == 3:
        return np.repeat(image, 3, axis=0).astype(np.float32)
    raise ValueError(f"cannot convert an image with {have} channels to {channels}")


@dataclass(frozen=True)
class FitInfo:
    """What :func:`fit_to_model` did, for the UI to show.

    Attributes:
        mode: ``"resize"`` or ``"crop"``.
        source_size: ``(X, Y)`` of the uploaded image.
        region: ``(top, left, height, width)`` of the part of the upload used.
        size: side of the model input.
        channels: ``(uploaded channels, model channels)``.
        text: one sentence saying all of the above.
    """

    mode: str
    source_size: tuple[int, int]
    region: tuple[int, int, int, int]
    size: int
    channels: tuple[int, int]
    text: str


@dataclass(frozen=True)
class FittedImage:
    """The array the model sees (before normalisation) and how it was made.

    Attributes:
        pixels: float32 ``(channels, size, size)`` in [0, 1].
        info: the :class:`FitInfo`.
    """

    pixels: np.ndarray
    info: FitInfo


def fit_to_model(
    image: np.ndarray, size: int, channels: int, mode: str = "resize", crop_origin: tuple[int, int] | None = None
) -> FittedImage:
    """Fit an image to a model's square input.

    ``"resize"`` scales the largest centred square of the image to ``size``
    (Pillow's antialiased bicubic on each channel, clipped to [0, 1]), so the
    content keeps its aspect ratio. ``"crop"`` cuts a ``size`` x ``size``
    window at native resolution, e.g. a 96 x 96 patch of a large H&E image at
    the scanner's micrometres per pixel; the origin is clamped into the image.

    Args:
        image: float ``(C, X, Y)`` in [0, 1], as :func:`read_image` returns.
        size: side of the model input.
        channels: channels of the model input (1 or 3).
        mode: ``"resize"`` or ``"crop"``.
        crop_origin: ``(row, column)`` of the crop's top-left corner; None centres it.

    Raises:
        ImageError: a crop larger than the image.
        ValueError: unknown mode.
    """
    _, rows, cols = image.shape
    if mode == "resize":
        side = min(rows, cols)
        top, left = (rows - side) // 2, (cols - side) // 2
        square = image[:, top:top + side, left:left + side]
        pixels = square if side == size else np.stack([_resize_plane(plane, size) for plane in square])
        region = (top, left, side, side)
        what = f"the centred {side} x {side} square" if (side, side) != (rows, cols) else "the whole image"
        text = f"Scaled {what} of the {rows} x {cols} upload to {size} x {size}."
        if side == size:
            text = f"Used {what} of the {rows} x {cols} upload as is ({size} x {size})."
    elif mode == "crop":
        if rows < size or cols < size:
            raise ImageError(
                f"The image is {rows} x {cols} pixels, smaller than the {size} x {size} crop; use resize instead."
            )
        top, left = crop_origin if crop_origin is not None else ((rows - size) // 2, (cols - size) // 2)
        top, left = int(np.clip(top, 0, rows - size)), int(np.clip(left, 0, cols - size))
        pixels = image[:, top:top + size, left:left + size]
        region = (top, left, size, size)
        text = f"Cropped {size} x {size} at row {top}, column {left} of the {rows} x {cols} upload (native scale)."
    else:
        raise ValueError(f"mode must be 'resize' or 'crop', got {mode!r}")
    converted = to_channels(pixels, channels)
    if image.shape[0] != channels:
        how = "ITU-R 601-2 luma" if channels == 1 else "repeating the grey level"
        text += f" Converted {image.shape[0]} channel(s) to {channels} by {how}."
    info = FitInfo(mode, (rows, cols), region, size, (image.shape[0], channels), text)
    return FittedImage(np.ascontiguousarray(converted, dtype=np.float32), info)


def _resize_plane(plane: np.ndarray, size: int) -> np.ndarray:
    """One float plane resized to ``size`` x ``size`` by Pillow (mode F keeps full precision)."""
    resized = Image.fromarray(plane.astype(np.float32)).resize((size, size), Image.Resampling.BICUBIC)
    return np.clip(np.asarray(resized, dtype=np.float32), 0, 1)
