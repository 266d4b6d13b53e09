"""Deep-zoom tiles of the server's slides over HTTP, beside the app on the same port (``app/server.py``'s
``st.App`` routes): panning and zooming fetch tiles and never rerun the page or use its websocket.

Routes (Starlette):
- ``/slides/{id}.dzi``: the Deep Zoom descriptor OpenSeadragon opens (OpenSlide's ``DeepZoomGenerator``: 254-pixel
  tiles with a 1-pixel overlap, JPEG);
- ``/slides/{id}_files/{level}/{col}_{row}.jpeg``: one tile;
- ``/vendor/openseadragon/...``: OpenSeadragon itself, installed by ``make`` (``npm pack openseadragon``) into
  :data:`VENDOR`, never committed; kept by the browser for a day (Streamlit's middleware compresses it).

The Slide page hands the viewer the descriptor itself (:func:`inline_descriptor`), so that its first tiles are asked
for without a round trip; the viewer's first tiles served also start the slide's plan (:func:`wait_for_tiles`).

A slide is named by its id in the listing (:mod:`app.slides.library`): an unknown id, a level, column or row that
does not exist, or a file that cannot be read answers 404 with a sentence, never a traceback or a file outside
the listing.

The slide moved by an element g of p4m (1..7, :mod:`app.slides.moved`) is named ``{id}-g{g}`` (:func:`moved_id`):
its tiles are the moved slide's, read through the moved view; any other suffix names no listed slide (404).

The slide's pixels stain-normalised to PCam's (:mod:`app.slides.stain`) are named ``{id}~{method}`` (after any
``-g{g}``; :func:`route_id`), method ``macenko`` or ``reinhard``: each tile is the slide's tile as scanned, normalised
with the slide's own estimate as source (made once per file, :func:`app.slides.stain.slide_stain`) and PCam's
reference as target, a tile's pixels at a time (bounded work). An unknown method, or a slide with too little tissue
to estimate its stain, answers 404 with a sentence.
"""

from __future__ import annotations

import functools
import io
import re
import threading
from pathlib import Path

import numpy as np
from PIL import Image
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .http import nosniff, path_number, sentence
from .library import REPO, find_slide
from .moved import ELEMENTS, moved_slide
from .overlay_routes import overlay_routes
from .reader import SlideError, open_slide
from .stain import METHODS, SlideStain, StainError, pcam_target, slide_stain

__all__ = ["slide_routes", "deep_zoom", "inline_descriptor", "tile_bytes", "tile_rgb", "wait_for_tiles", "moved_id",
           "route_id", "parse_slide_id", "parse_route", "VENDOR", "TILE_SIZE", "OVERLAP", "JPEG_QUALITY"]

VENDOR = REPO / "app" / "ui" / "vendor"  # `make vendor` unpacks openseadragon here (git ignores it)
TILE_SIZE, OVERLAP, JPEG_QUALITY = 254, 1, 85
CACHE = "public, max-age=3600"  # tiles of a listed slide never change: its id changes with the file
MOVED = re.compile(r"(?P<slide_id>.+)-g(?P<element>[1-7])")  # a listed id, then one digit 1..7, nothing more


def moved_id(slide_id: str, element: int) -> str:
    """The id under which the tile routes serve slide ``slide_id`` moved by ``element`` (0..7; 0: the slide)."""
    if element not in ELEMENTS:
        raise ValueError(f"a slide is moved by an element of p4m, 0 to 7, not {element}")
    return f"{slide_id}-g{element}" if element else slide_id


def parse_slide_id(slide_id: str) -> tuple[str, int]:
    """``(listed id, element)`` of a route's id (:func:`moved_id`'s inverse); an id without a valid suffix is
    itself, element 0, and names a listed slide only if it is one."""
    match = MOVED.fullmatch(slide_id)
    return (match["slide_id"], int(match["element"])) if match else (slide_id, 0)


def route_id(slide_id: str, element: int = 0, stain: str = "none") -> str:
    """The id under which the tile routes serve slide ``slide_id`` moved by ``element`` with its pixels normalised by
    ``stain`` (one of :data:`app.slides.stain.METHODS`; ``"none"``: as scanned, the id :func:`moved_id` gives)."""
    if stain not in METHODS:
        raise ValueError(f"{stain!r} is no stain normalisation: one of {', '.join(METHODS)}")
    moved = moved_id(slide_id, element)
    return moved if stain == "none" else f"{moved}~{stain}"


def parse_route(route: str) -> tuple[str, str]:
    """``(the moved slide's id, stain)`` of a route's id (:func:`route_id`'s inverse, but for the move: see
    :func:`parse_slide_id`).

    Raises:
        StainError: a ``~`` suffix that names no normalisation (``~none`` included: as scanned has no suffix).
    """
    moved, tilde, stain = route.rpartition("~")
    if not tilde:
        return route, "none"
    if stain not in METHODS or stain == "none":
        raise StainError(f"{stain[:40]!r} names no stain normalisation of the tiles: ~macenko or ~reinhard, or no "
                         "suffix for the slide as scanned")
    return moved, stain


@functools.lru_cache(maxsize=64)
def _tile_stain(path: str, mtime_ns: int, method: str) -> SlideStain:
    """The normalisation of the slide at ``path``'s tiles: from its own estimate to PCam's reference, made once."""
    del mtime_ns  # part of the key only (slide_stain keeps its estimate by the file's identity too)
    return SlideStain(method, slide_stain(path), pcam_target())


class _OpenSlideView:
    """A slide of :mod:`app.slides.reader` (a moved one, or an image) with the interface of an OpenSlide object that
    ``DeepZoomGenerator`` reads: its levels, properties (the scanned area's bounds, moved) and regions as RGBA
    images (opaque: the reader has put transparent pixels over white already)."""

    def __init__(self, slide):
        self._slide = slide
        self.properties = slide.properties
        self.dimensions = slide.dimensions
        self.level_count = slide.level_count
        self.level_dimensions = slide.level_dimensions
        self.level_downsamples = slide.level_downsamples
        self.associated_images = {}

    def get_best_level_for_downsample(self, downsample: float) -> int:
        return self._slide.best_level(downsample)

    def read_region(self, location: tuple[int, int], level: int, size: tuple[int, int]) -> Image.Image:
        rgb = self._slide.read_region(location[0], location[1], level, size[0], size[1])
        alpha = np.full(rgb.shape[:2] + (1,), 255, dtype=np.uint8)
        return Image.fromarray(np.concatenate([rgb, alpha], axis=-1), "RGBA")

    def close(self) -> None:
        self._slide.close()


# OpenSeadragon changes only with `make vendor`: a browser asks again after a day (the ETag then says it is the same).
VENDOR_CACHE = "public, max-age=86400"
DZI_NAMESPACE = "http://schemas.microsoft.com/deepzoom/2008"
_served: dict[str, threading.Event] = {}  # slide id -> set once a tile of it has been served
_served_lock = threading.Lock()


@functools.lru_cache(maxsize=16)
def deep_zoom(path: str, mtime_ns: int, element: int = 0):
    """OpenSlide's Deep Zoom generator of the slide at ``path`` moved by ``element`` (0: as scanned, OpenSlide's
    own object; an image and a moved slide through the slide reader), kept while the file is unchanged."""
    import openslide
    from openslide.deepzoom import DeepZoomGenerator

    del mtime_ns  # part of the key only
    slide = open_slide(path)
    if element == 0 and slide.vendor != "image" and slide.pyramid is None:
        slide.close()
        source = openslide.open_slide(path)
    else:  # a moved slide, an image as the engine reads it (EXIF orientation applied, not as OpenSlide would), or a
        # slide read with the coarser levels built for it (app.slides.pyramid): through the slide reader
        source = _OpenSlideView(moved_slide(slide, element))
    return DeepZoomGenerator(source, tile_size=TILE_SIZE, overlap=OVERLAP, limit_bounds=True)


def _generator(slide_id: str):
    """The deep-zoom generator of a route's id (its stain suffix, if any, left aside), or None for no listed slide.

    Raises:
        StainError: a stain suffix that names no normalisation.
    """
    moved, _ = parse_route(slide_id)
    listed, element = parse_slide_id(moved)
    entry = find_slide(listed)
    if entry is None:
        return None
    return deep_zoom(str(entry.path), entry.path.stat().st_mtime_ns, element)


def _stain_of(slide_id: str) -> SlideStain | None:
    """The normalisation a route's id names for its tiles (None: as scanned).

    Raises:
        StainError: an unknown method, or a slide with too little tissue to estimate its stain.
    """
    moved, stain = parse_route(slide_id)
    if stain == "none":
        return None
    entry = find_slide(parse_slide_id(moved)[0])
    return None if entry is None else _tile_stain(str(entry.path), entry.path.stat().st_mtime_ns, stain)


def inline_descriptor(slide_id: str) -> dict | None:
    """The Deep Zoom descriptor of the listed slide ``slide_id`` in OpenSeadragon's inline form (the ``.dzi`` route's
    XML as an object, with the tiles' URL relative to the page), or None where no slide has that id.

    The viewer opens it without fetching the ``.dzi``: the first tiles are asked for as soon as OpenSeadragon runs,
    and the generator the tiles need is made here, during the page's run, not when they are asked for.

    Raises:
        openslide.OpenSlideError: the slide cannot be read.
    """
    generator = _generator(slide_id)
    if generator is None:
        return None
    width, height = generator.level_dimensions[-1]
    return {"Image": {"xmlns": DZI_NAMESPACE, "Url": f"slides/{slide_id}_files/", "Format": "jpeg",
                      "Overlap": str(OVERLAP), "TileSize": str(TILE_SIZE),
                      "Size": {"Width": str(width), "Height": str(height)}}}


def _tiles_event(slide_id: str) -> threading.Event:
    with _served_lock:
        return _served.setdefault(slide_id, threading.Event())


def wait_for_tiles(slide_id: str, timeout_s: float) -> bool:
    """Wait until a tile of ``slide_id`` has been served by this process (True), at most ``timeout_s`` (False).

    Work that can wait for a viewer's first tiles (the slide's plan) waits on this: on a machine of two cores it
    would otherwise share them with the tiles while the user looks at an empty viewer.
    """
    return _tiles_event(slide_id).wait(timeout_s)


async def descriptor(request: Request) -> Response:
    slide_id = request.path_params["slide_id"]
    try:
        generator = await run_in_threadpool(_generator, slide_id)
    except (SlideError, StainError) as err:  # a slide refused (too large, levels too far apart), a stain unknown
        return sentence(str(err))
    except Exception:  # OpenSlide's errors for a file it cannot read: a sentence, not a traceback
        return sentence("this slide cannot be read")
    if generator is None:
        return sentence("no slide is listed under this id")
    return nosniff(Response(generator.get_dzi("jpeg"), media_type="application/xml",
                            headers={"Cache-Control": CACHE}))


def tile_rgb(slide_id: str, level: int, col: int, row: int) -> np.ndarray | str:
    """Tile (col, row) of deep-zoom level ``level`` of the route's slide ``slide_id`` as RGB uint8 ``(h, w, 3)``,
    normalised where the id names a stain (:func:`route_id`), or the sentence saying why there is none.

    Raises:
        StainError: an unknown stain, or a slide with too little tissue to estimate its stain.
    """
    generator = _generator(slide_id)
    if generator is None:
        return "no slide is listed under this id"
    if not 0 <= level < generator.level_count:
        return f"this slide has deep-zoom levels 0 to {generator.level_count - 1}, not {level}"
    cols, rows = generator.level_tiles[level]
    if not (0 <= col < cols and 0 <= row < rows):
        return f"level {level} of this slide has {cols} x {rows} tiles, not ({col}, {row})"
    stain = _stain_of(slide_id)  # before the tile is read: a slide without enough tissue reads nothing
    rgb = np.asarray(generator.get_tile(level, (col, row)).convert("RGB"))
    return rgb if stain is None else stain.apply(rgb)  # a tile's pixels, 254 + 2 a side at most


def tile_bytes(slide_id: str, level: int, col: int, row: int) -> bytes | str:
    """Tile (col, row) of deep-zoom level ``level`` of the route's slide ``slide_id`` as JPEG bytes
    (:func:`tile_rgb`), or the sentence saying why there is none."""
    rgb = tile_rgb(slide_id, level, col, row)
    if isinstance(rgb, str):
        return rgb
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


async def tile(request: Request) -> Response:
    params = request.path_params
    level, col, row = (path_number(str(params[key])) for key in ("level", "col", "row"))  # text, as routed
    if level is None or col is None or row is None:  # a number too long to be a tile's: no such tile
        return sentence("no such tile: a level, column and row are numbers of at most 9 digits")
    try:
        found = await run_in_threadpool(tile_bytes, params["slide_id"], level, col, row)
    except (SlideError, StainError) as err:  # a slide refused, a stain unknown or not estimable: their sentences
        return sentence(str(err))
    except Exception:  # a tile the file cannot decode: a damaged slide
        return sentence("a tile of this slide cannot be read: the file may be damaged")
    if isinstance(found, str):
        return sentence(found)
    _tiles_event(params["slide_id"]).set()
    return nosniff(Response(found, media_type="image/jpeg", headers={"Cache-Control": CACHE}))


class _Vendor(StaticFiles):
    """OpenSeadragon's files, kept by the browser for a day (Starlette's ``StaticFiles`` sends no ``Cache-Control``):
    a second visit of the Slide page in another session does not ask for the script again."""

    def file_response(self, *args, **kwargs) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = VENDOR_CACHE
        return nosniff(response)


def slide_routes(vendor: Path = VENDOR) -> list:
    """The routes above and the overlays' (:mod:`app.slides.overlay_routes`), for ``st.App(routes=...)``;
    OpenSeadragon's files only where ``make`` installed them."""
    routes = [*overlay_routes(), Route("/slides/{slide_id:str}.dzi", descriptor),
              Route("/slides/{slide_id:str}_files/{level:str}/{col:str}_{row:str}.jpeg", tile)]
    if (vendor / "openseadragon").is_dir():
        routes.append(Mount("/vendor", app=_Vendor(directory=vendor), name="vendor"))
    return routes
