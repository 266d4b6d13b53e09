"""One reader for whole slides and ordinary images: a slide of levels, read by region in level-0 pixels.

Whole slides in vendor formats (Aperio .svs with JPEG or JPEG 2000 tiles, Hamamatsu .ndpi/.vms, MIRAX .mrxs,
Leica .scn, Ventana .bif, Philips TIFF, DICOM WSI, generic tiled TIFF) are read by OpenSlide through
``openslide-python`` and the ``openslide-bin`` wheel (no system package). An ordinary image (PNG, JPEG, a plain
TIFF) is a slide of one level, read by Pillow, whose scale the user gives (:mod:`app.slides.scale`). Both offer
the same interface (:class:`Slide`), so that region and slide mode read through one path.

Every failure to open is a :class:`SlideError` whose message is a sentence for the user (naming the file, never a
path of the server): a missing or empty file, a truncated slide (a truncated .svs loses the directory OpenSlide
needs, so it is refused whole), a file named as a slide that holds something else (a JPEG renamed .svs: the
sentence says it is a JPEG), a file that is neither a slide nor an image, an image too large to hold decoded.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np
from PIL import Image

__all__ = ["Slide", "SlideLevels", "SlideError", "open_slide", "MAX_IMAGE_PIXELS"]

# Names that promise a slide: a file so named that OpenSlide cannot read is refused, not read as an image.
SLIDE_SUFFIXES = frozenset({".svs", ".svslide", ".ndpi", ".vms", ".vmu", ".scn", ".mrxs", ".bif", ".dcm"})
# An ordinary image is decoded whole (about 9,500 pixels square at most: 270 MB); past this many pixels it must be a
# tiled slide (a pyramidal TIFF) instead.
MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS  # Pillow's own limit before it suspects a decompression bomb


class SlideError(ValueError):
    """A file that cannot be read as a slide; the message is meant for the user."""


class SlideLevels:
    """What a slide, or a view of one (:class:`app.slides.moved.MovedSlide`), derives from its levels, and its use
    in a ``with`` block (closed at its end)."""

    level_dimensions: tuple[tuple[int, int], ...]

    @property
    def dimensions(self) -> tuple[int, int]:
        """``(width, height)`` of level 0."""
        return self.level_dimensions[0]

    @property
    def level_count(self) -> int:
        return len(self.level_dimensions)

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class Slide(SlideLevels):
    """An open slide: its levels, its properties and associated images, and its pixels by region.

    Attributes:
        name: the file's name.
        vendor: OpenSlide's vendor (``aperio``, ``hamamatsu``, ``generic-tiff``, ...) or ``image`` for a plain image.
        level_dimensions: ``(width, height)`` of each level, level 0 the full resolution.
        level_downsamples: each level's downsample from level 0.
        properties: the slide's metadata (OpenSlide's ``openslide.*`` keys and the vendor's own).
        associated: names of the associated images (``label``, ``macro``, ``thumbnail``) the slide holds.
        colour: False for an image of grey levels (its pixels repeat them in R, G and B), which an H&E model cannot
            judge.
    """

    name: str
    vendor: str
    level_dimensions: tuple[tuple[int, int], ...]
    level_downsamples: tuple[float, ...]
    properties: MappingProxyType
    associated: tuple[str, ...]
    _handle: object = field(repr=False)
    colour: bool = True

    def read_region(self, left: int, top: int, level: int, width: int, height: int) -> np.ndarray:
        """RGB uint8 ``(height, width, 3)`` of level ``level`` whose top-left corner is level-0 pixel
        ``(left, top)``; outside the slide, white (glass). Transparent pixels (no scanned data) are white too.

        Raises:
            SlideError: a level that does not exist, a negative size, or a tile the file cannot decode.
        """
        if not 0 <= level < self.level_count:
            raise SlideError(f"{self.name} has levels 0 to {self.level_count - 1}, not {level}")
        if width < 0 or height < 0:
            raise SlideError(f"a region of {width} x {height} pixels cannot be read")
        if isinstance(self._handle, np.ndarray):
            return _crop_white(self._handle, left, top, width, height)
        try:
            rgba = np.asarray(self._handle.read_region((int(left), int(top)), level, (int(width), int(height))))
        except Exception as err:  # OpenSlide raises its own error types for a tile it cannot decode
            raise SlideError(f"{self.name}: a tile could not be read ({err}); the file may be damaged") from err
        return _over_white(rgba)

    def best_level(self, downsample: float) -> int:
        """The level with the largest downsample at most ``downsample`` (level 0 when none is)."""
        return max((i for i, d in enumerate(self.level_downsamples) if d <= downsample * (1 + 1e-9)), default=0)

    def thumbnail(self, longest: int) -> np.ndarray:
        """The whole slide as RGB uint8 with its longer side ``longest`` pixels at most, from the level nearest
        above that size (never upsampled)."""
        width, height = self.dimensions
        scale = max(width, height) / longest
        level = self.best_level(max(scale, 1.0))
        level_width, level_height = self.level_dimensions[level]
        pixels = self.read_region(0, 0, level, level_width, level_height)
        size = (max(1, round(width / max(scale, 1.0))), max(1, round(height / max(scale, 1.0))))
        if size == (level_width, level_height):
            return pixels
        return np.asarray(Image.fromarray(pixels).resize(size, Image.Resampling.BOX))

    def associated_image(self, name: str) -> np.ndarray:
        """The associated image ``name`` (one of :attr:`associated`) as RGB uint8.

        Raises:
            SlideError: the slide has no such image.
        """
        if name not in self.associated:
            raise SlideError(f"{self.name} has no {name} image (it has: {', '.join(self.associated) or 'none'})")
        return _over_white(np.asarray(self._handle.associated_images[name]))

    def close(self) -> None:
        if not isinstance(self._handle, np.ndarray):
            self._handle.close()


def open_slide(path: str | Path) -> Slide:
    """``path`` as a :class:`Slide`: through OpenSlide where it is a slide, else as a one-level image.

    Raises:
        SlideError: the file is missing, empty, damaged, or neither a slide nor an image.
    """
    path = Path(path)
    if not path.is_file():
        raise SlideError(f"{path.name}: no such file")
    if path.stat().st_size == 0:
        raise SlideError(f"{path.name} is empty (0 bytes)")
    import openslide  # the wheel loads a native library: only where a slide is opened

    try:
        handle = openslide.OpenSlide(str(path))
    except openslide.OpenSlideUnsupportedFormatError:
        if path.suffix.lower() in SLIDE_SUFFIXES:
            raise SlideError(_not_a_slide(path)) from None
        return _image_slide(path)
    except openslide.OpenSlideError as err:
        raise SlideError(f"{path.name} is a slide OpenSlide cannot read ({err}); the file may be truncated or "
                         "damaged") from err
    vendor = handle.properties.get("openslide.vendor", "unknown")
    if vendor == "generic-tiff" and handle.level_count == 1 and max(handle.dimensions) <= 4096:
        # A small plain TIFF is an ordinary image: read it whole, as other images are.
        handle.close()
        return _image_slide(path)
    slide = Slide(path.name, vendor, tuple(handle.level_dimensions), tuple(handle.level_downsamples),
                  MappingProxyType(dict(handle.properties)), tuple(handle.associated_images), handle)
    try:  # a truncated file opens (its header is intact) and fails on its first tile: find out now
        slide.read_region(0, 0, slide.level_count - 1, *(min(64, s) for s in slide.level_dimensions[-1]))
    except SlideError:
        slide.close()
        raise SlideError(f"{path.name}: its tiles cannot be read; the file is truncated or damaged") from None
    return slide


def _not_a_slide(path: Path) -> str:
    """Why a file named as a slide is not one OpenSlide reads: what its first bytes say it is."""
    with path.open("rb") as file:
        head = file.read(4)
    if head in (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+"):
        return (f"{path.name} is a TIFF-based slide that OpenSlide cannot read: the file is truncated or damaged "
                "(copy it again from its source)")
    try:
        with Image.open(path) as image:
            kind = image.format
    except (OSError, ValueError):
        return f"{path.name} is not a slide: OpenSlide does not recognise its contents"
    return (f"{path.name} is named as a slide ({path.suffix}) but holds a {kind} image: give it its image's name "
            f"(.{kind.lower()}) to open it as an image of one level")


def _image_slide(path: Path) -> Slide:
    """An ordinary image as a slide of one level, decoded as the patch page decodes an upload
    (:func:`app.analysis.images.read_image_rgb8`: EXIF orientation applied, alpha over white, 16-bit rounded to 8)."""
    from ..analysis.images import ImageError, read_image_rgb8

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the size is judged here, from the header
        try:
            with Image.open(path) as image:
                width, height = image.size
        except (OSError, ValueError, Image.DecompressionBombError):
            width = height = 0  # left to the decoder, which says what is wrong
    if width * height > MAX_IMAGE_PIXELS:
        raise SlideError(f"{path.name} is {width} x {height} pixels, too large to read whole: save it as a tiled "
                         "pyramidal TIFF (or another slide format) instead")
    try:
        pixels, colour = read_image_rgb8(path.read_bytes(), max_bytes=path.stat().st_size,
                                         max_pixels=MAX_IMAGE_PIXELS)
    except ImageError as err:
        raise SlideError(f"{path.name} is neither a slide OpenSlide reads nor an image this app reads: "
                         f"{str(err)[0].lower()}{str(err)[1:]}") from None
    height, width = pixels.shape[:2]
    return Slide(path.name, "image", ((width, height),), (1.0,), MappingProxyType({}), (), pixels, colour)


def _over_white(rgba: np.ndarray) -> np.ndarray:
    """RGB uint8 of RGBA composited over white (OpenSlide marks regions without scanned data transparent)."""
    if rgba.ndim == 2:
        return np.repeat(rgba[..., None], 3, axis=-1)
    if rgba.shape[-1] == 3:
        return rgba
    if rgba[..., 3].min() == 255:  # scanned everywhere, the usual case: no blending needed
        return np.ascontiguousarray(rgba[..., :3])
    alpha = rgba[..., 3:4].astype(np.float32) / 255
    return np.round(rgba[..., :3] * alpha + 255 * (1 - alpha)).astype(np.uint8)


def _crop_white(pixels: np.ndarray, left: int, top: int, width: int, height: int) -> np.ndarray:
    """``pixels[top:top+height, left:left+width]`` padded with white where it leaves the image."""
    out = np.full((height, width, 3), 255, dtype=np.uint8)
    rows, cols = pixels.shape[:2]
    r0, c0 = max(top, 0), max(left, 0)
    r1, c1 = min(top + height, rows), min(left + width, cols)
    if r1 > r0 and c1 > c0:
        out[r0 - top:r1 - top, c0 - left:c1 - left] = pixels[r0:r1, c0:c1]
    return out
