"""The overlay tiles and the hover lookup over HTTP, beside the slide's tiles (:func:`app.slides.tiles.slide_routes`):

- ``/slides/overlays/{key}/{kind}/{level}/{col}_{row}.png``: a tile of an overlay of the analysis whose store's key
  is ``key`` (:func:`app.slides.overlay_tiles.overlay_tile`);
- ``/slides/overlays/palette.json``: the colours the viewer draws a values tile in
  (:func:`app.slides.overlay_colours.palette`), once per page;
- ``/slides/overlays/{key}/cells/{i}_{j}.json``: cell (i, j)'s state and P(tumour), for the viewer's hover
  (:func:`app.slides.overlay_tiles.cell_value`);
- ``/slides/viewer.js``: the viewer's own code (``app/ui/slide_viewer.js``), which the Slide page's component loads
  once rather than sending it in every message (kept by the browser: the page names its digest in the URL).

An analysis is known once a page has registered its plan. An unknown key, kind or level, a tile or cell that is not
there, a number of more digits than any slide needs, or any other path answers 404 with a sentence, never a 500.
"""

from __future__ import annotations

import re

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .library import REPO
from .overlay_colours import palette
from .overlay_tiles import cell_value, overlay_tile, registered

__all__ = ["overlay_routes", "overlay_base", "VIEWER_JS"]

VIEWER_JS = REPO / "app" / "ui" / "slide_viewer.js"

KEY = re.compile(r"[0-9a-f]{24}")  # app.slides.store.store_key's digest
PAIR = re.compile(r"(\d{1,7})_(\d{1,7})")  # seven digits: ten million tiles or cells a side
LEVEL = re.compile(r"\d{1,2}")
NOSNIFF = {"X-Content-Type-Options": "nosniff"}
# A tile changes as its chunks finish; the viewer names each version in its URL (?v=) and asks again.
HEADERS = {**NOSNIFF, "Cache-Control": "no-cache"}


def overlay_base(key: str) -> str:
    """The URL (relative to the page) under which the overlays of the analysis ``key`` are served."""
    return f"slides/overlays/{key}/"


def _not_found(sentence: str) -> PlainTextResponse:
    return PlainTextResponse(f"{sentence}\n", status_code=404, headers=NOSNIFF)


def _overlay(key: str):
    if not KEY.fullmatch(key):
        return None, f"{key[:40]!r} names no analysis (a key is 24 hexadecimal digits)"
    found = registered(key)
    return found, None if found is not None else (f"no analysis {key} is open on this server (its Slide page "
                                                  "registers it)")


async def tile(request: Request) -> Response:
    params = request.path_params
    overlay, why = _overlay(params["key"])
    if overlay is None:
        return _not_found(why)
    level, pair = LEVEL.fullmatch(params["level"]), PAIR.fullmatch(params["tile"])
    if level is None or pair is None:
        return _not_found(f"level {params['level'][:20]}, tile {params['tile'][:20]}: a level is a number of at most "
                          "two digits, a tile col_row")
    try:
        found = await run_in_threadpool(overlay_tile, overlay, params["kind"], int(level[0]), int(pair[1]),
                                        int(pair[2]))
    except OSError:  # the store's folder gone (a cache cleared): nothing to draw
        return _not_found(f"the chunks of analysis {params['key']} cannot be read")
    if isinstance(found, str):
        return _not_found(found)
    return Response(found, media_type="image/png", headers=HEADERS)


async def cell(request: Request) -> Response:
    params = request.path_params
    overlay, why = _overlay(params["key"])
    if overlay is None:
        return _not_found(why)
    pair = PAIR.fullmatch(params["cell"])
    if pair is None:
        return _not_found(f"cell {params['cell'][:20]}: a cell is i_j, each of at most seven digits")
    try:
        found = await run_in_threadpool(cell_value, overlay, int(pair[1]), int(pair[2]))
    except OSError:
        return _not_found(f"the chunks of analysis {params['key']} cannot be read")
    if isinstance(found, str):
        return _not_found(found)
    return JSONResponse(found, headers=HEADERS)


async def other(request: Request) -> Response:
    return _not_found(f"{request.url.path[:80]} is no overlay tile: /slides/overlays/KEY/KIND/LEVEL/COL_ROW.png")


async def viewer_js(request: Request) -> Response:
    return FileResponse(VIEWER_JS, media_type="text/javascript",
                        headers={**NOSNIFF, "Cache-Control": "public, max-age=86400"})


async def colours(request: Request) -> Response:
    # Asked again by each page (no version in its URL, unlike viewer.js's): a palette kept a day would outlive a
    # change of the code that colours with it.
    return JSONResponse(palette(), headers=HEADERS)


def overlay_routes() -> list:
    """The routes above, for :func:`app.slides.tiles.slide_routes`."""
    return [Route("/slides/viewer.js", viewer_js), Route("/slides/overlays/palette.json", colours),
            Route("/slides/overlays/{key:str}/cells/{cell:str}.json", cell),
            Route("/slides/overlays/{key:str}/{kind:str}/{level:str}/{tile:str}.png", tile),
            Route("/slides/overlays/{rest:path}", other)]
