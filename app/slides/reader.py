"""One reader for whole slides and ordinary images: a slide of levels, read by region in level-0 pixels.

Whole slides in vendor formats (Aperio .svs with JPEG or JPEG 2000 tiles, Hamamatsu .ndpi/.vms, MIRAX .mrxs,
Leica .scn, Ventana .bif, Philips TIFF, DICOM WSI, generic tiled TIFF) are read by OpenSlide through
``openslide-python`` and the ``openslide-bin`` wheel (no system package). An ordinary image (PNG, JPEG, a plain
TIFF) is a slide of one level, read by Pillow, whose scale the user gives (:mod:`app.slides.scale`). Both offer
the same interface (:class:`Slide`), so that region and slide mode read through one path.

Every failure to open is a :class:`SlideError` whose message is a sentence for the user (naming the file, never a
path of the server): a missing or empty file, a truncated slide (a truncated .svs loses the directory OpenSlide
needs, so it is refused whole), a file named as a slide that holds something else (a JPEG renamed .svs: the
sentence says it is a JPEG), a file that is neither a slide nor an image, an image or a slide's coarsest level too
large to read in bounded memory. A slide whose coarsest level is large is read with coarser levels built for it once
(:mod:`app.slides.pyramid`); an image is decoded once per file.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np
from PIL import Image

__all__ = ["Slide", "SlideLevels", "SlideError", "open_slide", "MAX_IMAGE_PIXELS", "MAX_LEVEL_PIXELS", "MAX_LEVEL_STEP",
           "MAX_FLOAT_IMAGE_PIXELS", "PYRAMID_ADVICE"]

# Names that promise a slide: a file so named that OpenSlide cannot read is refused, not read as an image.
SLIDE_SUFFIXES = frozenset({".svs", ".svslide", ".ndpi", ".vms", ".vmu", ".scn", ".mrxs", ".bif", ".dcm"})
# An ordinary image is decoded whole (about 9,500 pixels square at most: 270 MB); past this many pixels it must be a
# tiled slide (a pyramidal TIFF) instead.
MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS  # Pillow's own limit before it suspects a decompression bomb
# An image that is not 8-bit (16-bit, float, or with alpha) is converted through floats: 16 bytes a pixel and more.
MAX_FLOAT_IMAGE_PIXELS = 4096 * 4096
# The coarsest level a slide may have is read in strips once, to build its pyramid (app.slides.pyramid): past this
# many pixels (32,768 a side) that read alone would take minutes, and the slide must come with its own levels.
MAX_LEVEL_PIXELS = 2**30
# A deep-zoom tile or the thumbnail reads the level above the one it needs: levels further apart than this make each
# coarse tile read 16 x 16 times its own pixels, or more.
MAX_LEVEL_STEP = 16
PYRAMID_ADVICE = ("make it a tiled pyramidal TIFF first (`vips tiffsave in.png out.tif --tile --pyramid "
                  "--compression jpeg`), then open that")
# 8-bit modes Pillow converts to RGB without a float copy (app.analysis.images.read_image_rgb8).
EIGHT_BIT_MODES = frozenset({"1", "L", "RGB", "CMYK", "YCbCr"})
EXIF_ORIENTATION = 0x0112
# EXIF orientation -> the array as Pillow's ImageOps.exif_transpose turns it (rows first, then columns)
ORIENTED = {2: lambda a: a[:, ::-1], 3: lambda a: a[::-1, ::-1], 4: lambda a: a[::-1],
            5: lambda a: a.transpose(1, 0, 2), 6: lambda a: np.rot90(a, -1),
            7: lambda a: a[::-1, ::-1].transpose(1, 0, 2), 8: lambda a: np.rot90(a)}
THUMBNAIL_STRIP_PIXELS = 2**24  # a thumbnail's level is read in strips of this many pixels (64 MB of RGBA) at most


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
    pyramid: Path | None = None  # the levels built for it (app.slides.pyramid), where its own stop too large

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
        above that size (never upsampled), read in strips of rows where that level is large (bounded memory)."""
        width, height = self.dimensions
        scale = max(width, height) / longest
        level = self.best_level(max(scale, 1.0))
        level_width, level_height = self.level_dimensions[level]
        size = (max(1, round(width / max(scale, 1.0))), max(1, round(height / max(scale, 1.0))))
        if level_width * level_height <= THUMBNAIL_STRIP_PIXELS:
            pixels = self.read_region(0, 0, level, level_width, level_height)
            if size == (level_width, level_height):
                return pixels
            return np.asarray(Image.fromarray(pixels).resize(size, Image.Resampling.BOX))
        return self._thumbnail_by_strips(level, size)

    def _thumbnail_by_strips(self, level: int, size: tuple[int, int]) -> np.ndarray:
        """The level resized to ``size`` by Pillow's box filter, a band of output rows at a time: each band from
        the level's rows it covers (the box filter's source box given exactly, so the bands join seamlessly)."""
        level_width, level_height = self.level_dimensions[level]
        downsample = self.level_downsamples[level]
        rows_per = level_height / size[1]  # level rows per output row
        band = max(1, int(THUMBNAIL_STRIP_PIXELS / level_width / rows_per))  # output rows a strip gives
        out = np.empty((size[1], size[0], 3), dtype=np.uint8)
        for first in range(0, size[1], band):
            last = min(first + band, size[1])
            top, bottom = first * rows_per, last * rows_per
            row0, row1 = int(np.floor(top)), min(level_height, int(np.ceil(bottom)))
            strip = self.read_region(0, round(row0 * downsample), level, level_width, row1 - row0)
            out[first:last] = np.asarray(Image.fromarray(strip).resize(
                (size[0], last - first), Image.Resampling.BOX, box=(0, top - row0, level_width, bottom - row0)))
        return out

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
    from . import pyramid

    vendor = handle.properties.get("openslide.vendor", "unknown")
    if vendor == "generic-tiff" and handle.level_count == 1 and max(handle.dimensions) <= pyramid.PYRAMID_ABOVE:
        # A small plain TIFF is an ordinary image: read it whole, as other images are.
        handle.close()
        return _image_slide(path)
    try:
        handle, built = _bounded_levels(path, handle)
    except SlideError:
        handle.close()
        raise
    slide = Slide(path.name, vendor, tuple(handle.level_dimensions), tuple(handle.level_downsamples),
                  MappingProxyType(dict(handle.properties)), tuple(handle.associated_images), handle, pyramid=built)
    try:  # a truncated file opens (its header is intact) and fails on its first tile: find out now
        slide.read_region(0, 0, slide.level_count - 1, *(min(64, s) for s in slide.level_dimensions[-1]))
    except SlideError:
        slide.close()
        raise SlideError(f"{path.name}: its tiles cannot be read; the file is truncated or damaged") from None
    return slide


def _bounded_levels(path: Path, handle):
    """``(handle, pyramid)``: the OpenSlide handle itself where its coarsest level is small, else the handle with
    coarser levels built once (:mod:`app.slides.pyramid`) and the pyramid's path.

    Raises:
        SlideError: a coarsest level too large to read even in strips, or levels too far apart.
    """
    import openslide

    from . import pyramid
    from .pyramid import LevelsWithPyramid, build_from_level

    dimensions, downsamples = handle.level_dimensions, handle.level_downsamples
    for finer, coarser in zip(downsamples[:-1], downsamples[1:], strict=True):
        if coarser / finer > MAX_LEVEL_STEP * (1 + 1e-6):
            raise SlideError(f"{path.name} has levels {coarser / finer:,.0f} times apart (at most "
                             f"{MAX_LEVEL_STEP} are read here): {PYRAMID_ADVICE}")
    width, height = dimensions[-1]
    if max(width, height) <= pyramid.PYRAMID_ABOVE:
        return handle, None
    if width * height > MAX_LEVEL_PIXELS:
        coarsest = "its only level" if len(dimensions) == 1 else "its coarsest level"
        raise SlideError(f"{path.name}: {coarsest} is {width:,} x {height:,} pixels, more than this server reads "
                         f"for an overview ({MAX_LEVEL_PIXELS / 1e6:,.0f} MP); {PYRAMID_ADVICE}")
    last = len(dimensions) - 1

    def read(left: int, top: int, w: int, h: int) -> np.ndarray:
        scale = downsamples[last]
        return _over_white(np.asarray(handle.read_region((round(left * scale), round(top * scale)), last, (w, h))))

    try:
        built = build_from_level(path, read, width, height)
        return LevelsWithPyramid(handle, openslide.OpenSlide(str(built))), built
    except openslide.OpenSlideError as err:
        raise SlideError(f"{path.name}: its tiles cannot be read ({err}); the file is truncated or damaged") from None
    except OSError as err:
        raise SlideError(f"{path.name}: its overview levels could not be written ({err.strerror})") from None


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
    (:func:`app.analysis.images.read_image_rgb8`: EXIF orientation applied, alpha over white, 16-bit rounded to 8),
    once per file: a small one kept decoded in this process, a larger one written as a pyramid
    (:func:`app.slides.pyramid.build_from_pixels`) and read through OpenSlide from then on."""
    import openslide

    from . import pyramid
    from .pyramid import build_from_pixels, pyramid_path

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the size is judged here, from the header
        try:
            with Image.open(path) as image:
                (width, height), mode = image.size, image.mode
                eight_bit = mode in EIGHT_BIT_MODES or (mode == "P" and "transparency" not in image.info)
        except (OSError, ValueError, Image.DecompressionBombError):
            width = height = 0  # left to the decoder, which says what is wrong
            eight_bit = True
    if width * height > MAX_IMAGE_PIXELS:
        raise SlideError(f"{path.name} is {width:,} x {height:,} pixels, more than this server decodes "
                         f"({MAX_IMAGE_PIXELS / 1e6:,.0f} MP): {PYRAMID_ADVICE}")
    if not eight_bit and width * height > MAX_FLOAT_IMAGE_PIXELS:
        raise SlideError(f"{path.name} is a {width:,} x {height:,} image of {mode} pixels (not 8-bit RGB or grey), "
                         f"which this server converts only up to {MAX_FLOAT_IMAGE_PIXELS / 1e6:,.0f} MP: save it as "
                         f"8-bit RGB, or {PYRAMID_ADVICE}")
    stat = path.stat()
    if max(width, height) <= pyramid.PYRAMID_ABOVE:
        pixels, colour = _decoded(str(path), stat.st_size, stat.st_mtime_ns)
        return Slide(path.name, "image", ((pixels.shape[1], pixels.shape[0]),), (1.0,), MappingProxyType({}), (),
                     pixels, colour)
    try:
        built = pyramid_path(path)
        if not built.is_file():
            built = build_from_pixels(path, lambda: _decode_by_strips(path))
        handle = openslide.OpenSlide(str(built))
    except OSError as err:
        raise SlideError(f"{path.name}: its levels could not be written ({err.strerror})") from None
    except openslide.OpenSlideError as err:
        raise SlideError(f"{path.name}: its levels could not be read back ({err})") from None
    colour = "colour=1" in handle.properties.get("tiff.ImageDescription", "")
    return Slide(path.name, "image", tuple(handle.level_dimensions), tuple(handle.level_downsamples),
                 MappingProxyType({}), (), handle, colour, pyramid=built)


@functools.lru_cache(maxsize=4)  # up to 4,096 pixels a side each: 50 MB, 200 MB in all
def _decoded(path: str, size: int, mtime_ns: int) -> tuple[np.ndarray, bool]:
    del size, mtime_ns  # part of the key only: a changed file is decoded again
    pixels, colour = _decode(Path(path))
    pixels.setflags(write=False)  # shared by every slide of this file (and its moved views): read, never written
    return pixels, colour


def _decode_by_strips(path: Path) -> tuple[np.ndarray, bool]:
    """An 8-bit image (one of :data:`EIGHT_BIT_MODES`, or a palette without transparency) decoded as
    :func:`_decode` does, pixel for pixel, holding Pillow's decoded image and the RGB array only: converted to RGB a
    strip of rows at a time (the conversions are per pixel), then oriented by its EXIF tag (numpy's views)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # judged from the header already
        try:
            with Image.open(path) as image:
                image.load()
                width, height = image.size
                orientation = image.getexif().get(EXIF_ORIENTATION, 1)
                pixels = np.empty((height, width, 3), dtype=np.uint8)
                rows = max(1, THUMBNAIL_STRIP_PIXELS // width)
                for top in range(0, height, rows):
                    strip = image.crop((0, top, width, min(height, top + rows))).convert("RGB")
                    pixels[top:top + strip.height] = np.asarray(strip)
                grey = image.mode in ("1", "L")
        except (OSError, ValueError, SyntaxError, EOFError) as err:
            raise SlideError(f"{path.name} is neither a slide OpenSlide reads nor an image this app reads: the "
                             f"image file is truncated or corrupt ({err})") from None
    if image.mode == "P":  # a palette may hold colours or only greys
        grey = bool((pixels[..., 0] == pixels[..., 1]).all() and (pixels[..., 1] == pixels[..., 2]).all())
    moved = ORIENTED.get(orientation)
    if moved is not None:
        pixels = np.ascontiguousarray(moved(pixels))
    return pixels, not grey


def _decode(path: Path) -> tuple[np.ndarray, bool]:
    from ..analysis.images import ImageError, read_image_rgb8

    try:
        return read_image_rgb8(path.read_bytes(), max_bytes=path.stat().st_size, max_pixels=MAX_IMAGE_PIXELS)
    except ImageError as err:
        raise SlideError(f"{path.name} is neither a slide OpenSlide reads nor an image this app reads: "
                         f"{str(err)[0].lower()}{str(err)[1:]}") from None


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
