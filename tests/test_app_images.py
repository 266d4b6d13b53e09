"""Reading uploaded images: every format and mode, EXIF orientation, every kind of bad input, fitting."""

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from app.analysis.images import ImageError, fit_to_model, read_image, to_channels

FORMATS = {"PNG": {}, "JPEG": dict(quality=95), "TIFF": {}, "BMP": {}, "WEBP": dict(lossless=True)}
# Which modes each format can store (as Pillow writes them).
MODES = {
    "PNG": ("L", "RGB", "RGBA", "P", "I;16"),
    "JPEG": ("L", "RGB", "CMYK"),
    "TIFF": ("L", "RGB", "RGBA", "P", "I;16", "CMYK"),
    "BMP": ("L", "RGB", "P"),
    "WEBP": ("L", "RGB", "RGBA"),
}
CASES = [(fmt, mode) for fmt, modes in MODES.items() for mode in modes]


def gradient(rows=24, cols=32) -> np.ndarray:
    """An RGB test image (X, Y, 3) in uint8 with distinct rows and columns."""
    r = np.linspace(0, 255, rows)[:, None] * np.ones(cols)[None]
    c = np.ones(rows)[:, None] * np.linspace(255, 0, cols)[None]
    return np.stack([r, c, (r + c) / 2], axis=-1).astype(np.uint8)


def encode(img: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, format=fmt, **{**FORMATS[fmt], **options})
    return buffer.getvalue()


def make(mode: str) -> Image.Image:
    rgb = Image.fromarray(gradient())
    if mode == "I;16":
        grey = np.asarray(rgb.convert("L"), dtype=np.uint16) * 257  # full 16-bit range
        return Image.frombytes("I;16", rgb.size, grey.astype("<u2").tobytes())
    if mode == "RGBA":
        rgba = rgb.convert("RGBA")
        rgba.putalpha(128)
        return rgba
    if mode == "P":
        return rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
    return rgb.convert(mode)


@pytest.mark.parametrize("fmt,mode", CASES, ids=[f"{f}-{m}" for f, m in CASES])
def test_every_format_and_mode_reads_as_floats_in_unit_range(fmt, mode):
    source = make(mode)
    out = read_image(encode(source, fmt))
    assert out.dtype == np.float32 and out.ndim == 3 and out.shape[1:] == (24, 32)
    assert out.shape[0] == (1 if mode in ("L", "I;16") and fmt != "WEBP" else 3)  # WebP stores grey as RGB
    assert 0 <= out.min() and out.max() <= 1
    grey = to_channels(out, 1)[0]
    # Content survives: the top-left corner is dark in red and bright in green, so compare to Pillow's own grey.
    expected = np.asarray(Image.fromarray(gradient()).convert("L"), dtype=np.float32) / 255
    if mode == "RGBA":
        expected = expected * (128 / 255) + (1 - 128 / 255)  # half transparent on white
    tolerance = 0.08 if fmt == "JPEG" or mode in ("P", "CMYK") else 0.01
    assert np.abs(grey - expected).mean() <= tolerance, f"{fmt} {mode}: mean deviation {np.abs(grey - expected).mean()}"


def test_sixteen_bit_grey_is_scaled_by_65535():
    values = np.array([[0, 257, 65535, 32768]], dtype=np.uint16)
    out = read_image(encode(Image.frombytes("I;16", (4, 1), values.tobytes()), "PNG"))
    assert np.allclose(out[0, 0], values[0] / 65535)


def test_transparent_pixels_become_white():
    rgba = np.zeros((4, 4, 4), dtype=np.uint8)
    rgba[..., 0] = 255  # red, fully transparent except one opaque pixel
    rgba[0, 0, 3] = 255
    out = read_image(encode(Image.fromarray(rgba, "RGBA"), "PNG"))
    assert np.allclose(out[:, 0, 0], [1, 0, 0]) and np.allclose(out[:, 1:, 1:], 1)


def test_exif_orientation_is_applied():
    img = Image.fromarray(gradient(24, 32))
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    data = encode(img, "JPEG", exif=exif.tobytes())
    out = read_image(data)
    assert out.shape == (3, 32, 24)  # rows and columns swapped
    upright = np.asarray(img.transpose(Image.Transpose.ROTATE_270), dtype=np.float32).transpose(2, 0, 1) / 255
    assert np.abs(out - upright).mean() < 0.03


def png_declaring(width: int, height: int) -> bytes:
    """A tiny valid-looking PNG whose header declares width x height grey pixels of zeros."""
    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\x00" * (width + 1) * 16)  # only the first rows: no need to build the bomb for real
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


BAD = {
    "zero bytes": (b"", "empty"),
    "truncated png": (lambda: truncated(encode(make("RGB"), "PNG")), "truncated or corrupt"),
    "random bytes": (np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes(), "not an image"),
    "text file": (b"name,label\nslide_1,tumour\n" * 20, "not an image"),
    "gif (unsupported format)": (lambda: encode_gif(), "not an image in a supported format"),
    "decompression bomb": (png_declaring(20000, 20000), "decompression bomb|MP"),
    "corrupt jpeg": (encode(make("RGB"), "JPEG")[:30] + b"\x00" * 500, "truncated or corrupt|not an image"),
}


def truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def encode_gif() -> bytes:
    buffer = io.BytesIO()
    make("P").save(buffer, format="GIF")
    return buffer.getvalue()


@pytest.mark.parametrize("what", list(BAD))
def test_bad_inputs_raise_one_error_with_a_message(what):
    data, message = BAD[what]
    data = data() if callable(data) else data
    with pytest.raises(ImageError, match=message):
        read_image(data)


def test_limits_on_bytes_and_pixels():
    data = encode(make("RGB"), "PNG")
    with pytest.raises(ImageError, match=r"limit is 0 MB|the limit is"):
        read_image(data, max_bytes=len(data) - 1)
    with pytest.raises(ImageError, match=r"24 x 32 pixels|32 x 24 pixels"):
        read_image(data, max_pixels=500)
    # Pillow's own threshold also holds for an image under our limit but between its two thresholds.
    with pytest.raises(ImageError, match="MP"):
        read_image(png_declaring(12000, 10000), max_pixels=10**9)


def test_fit_resize_takes_the_centred_square():
    image = np.random.default_rng(0).random((3, 40, 60)).astype(np.float32)
    fitted = fit_to_model(image, 40, 3)
    assert np.array_equal(fitted.pixels, image[:, :, 10:50])
    assert fitted.info.region == (0, 10, 40, 40) and "centred 40 x 40 square" in fitted.info.text
    small = fit_to_model(image, 20, 1)
    assert small.pixels.shape == (1, 20, 20) and 0 <= small.pixels.min() and small.pixels.max() <= 1
    assert "ITU-R 601-2" in small.info.text and small.info.channels == (3, 1)


def test_fit_crop_at_native_scale_and_clamped():
    image = np.random.default_rng(1).random((1, 200, 300)).astype(np.float32)
    fitted = fit_to_model(image, 96, 3, mode="crop", crop_origin=(10, 250))
    assert fitted.info.region == (10, 204, 96, 96)
    assert np.array_equal(fitted.pixels, np.repeat(image[:, 10:106, 204:300], 3, axis=0))
    with pytest.raises(ImageError, match="smaller than the 96 x 96 crop"):
        fit_to_model(image[:, :50], 96, 1, mode="crop")
    with pytest.raises(ValueError, match="mode must be"):
        fit_to_model(image, 96, 1, mode="stretch")


def test_luma_matches_pillow():
    rgb = gradient()
    ours = to_channels(rgb.transpose(2, 0, 1).astype(np.float32) / 255, 1)[0]
    pillow = np.asarray(Image.fromarray(rgb).convert("L"), dtype=np.float32) / 255
    assert np.abs(ours - pillow).max() <= 1 / 255 + 1e-6
