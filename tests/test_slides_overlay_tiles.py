"""The overlays' deep-zoom tiles (:mod:`app.slides.overlay_tiles`, :mod:`app.slides.overlay_routes`): each pixel the
colour of the stored value under it, transparent where not evaluated, striped where not yet analysed, a finished
chunk changing only the tiles over it, coarse tiles reading no chunk at full resolution, the hover lookup the
stored cell, the store's memory bounded, and every bad URL a 404 with a sentence."""

from __future__ import annotations

import asyncio
import io
import os
import time

import numpy as np
import pytest
from PIL import Image
from starlette.requests import Request

import app.slides.overlay_tiles as overlay_tiles
from app.slides.cell_maps import CELL_MAPS
from app.slides.engine import ATTENTION_POOL
from app.slides.overlay_colours import WAITING, WAITING_GAP, coloured
from app.slides.overlay_routes import overlay_routes
from app.slides.overlay_tiles import TILE, cell_value, overlay_tile, register
from app.slides.store import ChunkStore
from benchmarks.synthetic_store import evaluated_of, fill, spatial_of, synthetic_chunk, synthetic_plan, tumour_of


def decoded(png: bytes) -> np.ndarray:
    return np.array(Image.open(io.BytesIO(png)).convert("RGBA"))


def centres(plan, overlay, level, col, row, shape):
    """The level-0 centre of each pixel of a tile: rows, cols."""
    px = overlay.pyramid.pixel_px(level)
    return (np.arange(shape[0]) + row * TILE + 0.5) * px, (np.arange(shape[1]) + col * TILE + 0.5) * px


def cell_under(plan, y, x):
    """The cell (i, j) under level-0 points, -1 outside: from the cells' own corners (not the module's code)."""
    corners, (h, w) = plan.grid.cell_top_left_px(), plan.grid.cell_size_px()
    i = np.floor((y - corners[0, 0, 0]) / h).astype(int)
    j = np.floor((x - corners[0, 0, 1]) / w).astype(int)
    return (np.where((i >= 0) & (i < plan.grid.cells.rows), i, -1),
            np.where((j >= 0) & (j < plan.grid.cells.cols), j, -1))


def chunk_of(plan, i, j):
    rows, cols = plan.grid.chunk_spans
    ci = next(k for k, (start, length) in enumerate(rows) if start <= i < start + length)
    cj = next(k for k, (start, length) in enumerate(cols) if start <= j < start + length)
    return ci, cj


@pytest.fixture
def half_done(tmp_path):
    """A 29 x 38-cell slide (5 x 5 chunks), all but chunk (0, 1) with tissue, chunks (2, *) not yet analysed."""
    tissue = {(ci, cj) for ci in range(5) for cj in range(5)} - {(0, 1)}
    plan = synthetic_plan(tmp_path, 1000, 1300, tissue_chunks=tissue)
    fill(plan, [index for index in plan.chunks if index[0] != 2])
    return plan, register(plan)


def test_a_tumour_tile_is_the_colour_of_each_cell_under_it_and_says_what_is_not_evaluated(half_done):
    plan, overlay = half_done
    level = overlay.pyramid.max_level
    cols, rows = overlay.pyramid.level_tiles(level)
    for col in range(cols):
        for row in range(rows):
            rgba = decoded(overlay_tile(overlay, "tumour", level, col, row))
            y, x = centres(plan, overlay, level, col, row, rgba.shape)
            i, j = cell_under(plan, y, x)
            for a in range(0, rgba.shape[0], 7):
                for b in range(0, rgba.shape[1], 5):
                    got = rgba[a, b]
                    if i[a] < 0 or j[b] < 0:
                        assert got.tolist() == [0, 0, 0, 0], "outside the grid: nothing"
                        continue
                    chunk = chunk_of(plan, i[a], j[b])
                    if chunk == (0, 1):
                        assert got.tolist() == [0, 0, 0, 0], "a chunk of glass: nothing"
                    elif chunk[0] == 2:
                        assert got.tolist() in (WAITING.tolist(), WAITING_GAP.tolist()), "not yet analysed: stripes"
                    elif not evaluated_of(i[a], j[b]):
                        assert got.tolist() == [0, 0, 0, 0], "too little tissue: nothing"
                    else:
                        expected = coloured(np.array([tumour_of(i[a], j[b])], dtype=np.float32))[0]
                        assert got.tolist() == expected.tolist(), (a, b, i[a], j[b])


def test_an_attention_tile_shows_each_stored_pixel_and_kept_is_one_minus_removed(half_done):
    plan, overlay = half_done
    level = overlay.pyramid.max_level  # a cell is 8 tile pixels: the stored maps themselves
    assert min(plan.grid.cell_size_px()) >= overlay_tiles.FINE_CELL_PX * overlay.pyramid.pixel_px(level)
    spatial = decoded(overlay_tile(overlay, "spatial", level, 0, 0))
    kept = decoded(overlay_tile(overlay, "kept", level, 0, 0))
    y, x = centres(plan, overlay, level, 0, 0, spatial.shape)
    i, j = cell_under(plan, y, x)
    model_y = y * plan.grid.model_size[0] / plan.grid.size[0] - plan.grid.cells.cell_origin(0, 0)[0]
    model_x = x * plan.grid.model_size[1] / plan.grid.size[1] - plan.grid.cells.cell_origin(0, 0)[1]
    a, b = np.floor(model_y / ATTENTION_POOL).astype(int), np.floor(model_x / ATTENTION_POOL).astype(int)
    starts = [np.array([start for start, _ in spans]) for spans in plan.grid.chunk_spans]
    ci, cj = np.searchsorted(starts[0], i, side="right") - 1, np.searchsorted(starts[1], j, side="right") - 1
    shown = ((i[:, None] >= 0) & (j[None, :] >= 0) & evaluated_of(i[:, None], j[None, :]) & (ci[:, None] != 2)
             & ~((ci[:, None] == 0) & (cj[None, :] == 1)))
    value = np.float16(spatial_of(a[:, None], b[None, :])).astype(np.float32)
    assert (spatial[shown] == coloured(value)[shown]).all()
    removed = (value / 2).astype(np.float16).astype(np.float32)
    # α⁺ is α⁻ on the reversed scale (index 255 − α⁻'s): one level from round((1 − α⁻)·255) only at a tie, which
    # float16's values meet (0.5 and others): the viewer colours a values tile so, and a tile of its own agrees.
    assert (kept[shown] == coloured(removed, reverse=True)[shown]).all()
    ties = np.abs((removed * 255) % 1 - 0.5) < 1e-6
    assert (ties & shown).any() and (kept[shown] == coloured(1 - removed)[shown]).mean() > 0.95
    checked = int(shown.sum())
    assert checked > 500


def test_a_values_tile_holds_each_overlays_colour_index_and_the_state(half_done):
    """Coloured by the palette the viewer is sent (index to viridis where evaluated, the stripes where not yet, nothing
    else), a values tile is each overlay's own tile, pixel for pixel, at every level: the finest (attention from the
    chunks' maps) and the coarser (from the cell maps)."""
    from app.slides.overlay_colours import EVALUATED, VIRIDIS, WAITING_MARK, palette, waiting_pattern

    plan, overlay = half_done
    said = palette()
    assert np.array_equal(said["viridis"], VIRIDIS) and (said["evaluated"], said["waitingMark"]) == (255, 128)
    assert said["channels"] == dict(tumour=0, spatial=1, removed=2, kept=2) and said["reversed"] == ["kept"]
    geometry = overlay.pyramid
    states = set()
    for level in range(geometry.min_level, geometry.max_level + 1):  # the chunks' maps, then the cell maps
        cols, rows = geometry.level_tiles(level)
        for col in range(cols):
            for row in range(rows):
                values = decoded(overlay_tile(overlay, "values", level, col, row))
                alpha = values[..., 3]
                evaluated, waiting = alpha == EVALUATED, alpha == WAITING_MARK
                assert ((alpha == 0) | evaluated | waiting).all()
                assert not values[~evaluated][:, :3].any(), "no index where nothing is evaluated"
                states |= set(np.unique(alpha).tolist())
                stripes = waiting_pattern(np.arange(values.shape[0]) + row * TILE,
                                          np.arange(values.shape[1]) + col * TILE)
                for kind, indices in [("tumour", values[..., 0]), ("spatial", values[..., 1]),
                                      ("removed", values[..., 2]), ("kept", 255 - values[..., 2])]:
                    drawn = np.zeros_like(values)
                    drawn[evaluated] = VIRIDIS[indices[evaluated]]
                    drawn[waiting] = stripes[waiting]
                    assert np.array_equal(drawn, decoded(overlay_tile(overlay, kind, level, col, row))), (kind, level)
    assert states == {0, WAITING_MARK, EVALUATED}


def test_coarse_tiles_read_each_chunk_once_for_its_cell_means(tmp_path, monkeypatch):
    """A slide of 122 x 122 cells (15 x 15 chunks): its coarsest tile, two pixels a cell, covers every chunk and reads
    each once, for the cell maps; made again, it reads none."""
    plan = synthetic_plan(tmp_path, 4000, 4000)
    fill(plan)
    overlay = register(plan)
    coarse = overlay.pyramid.min_level
    assert min(plan.grid.cell_size_px()) < overlay_tiles.FINE_CELL_PX * overlay.pyramid.pixel_px(coarse)
    reads = []
    get = plan.store.get
    monkeypatch.setattr(plan.store, "get", lambda ci, cj: reads.append((ci, cj)) or get(ci, cj))
    first = overlay_tile(overlay, "spatial", coarse, 0, 0)
    assert sorted(reads) == sorted(plan.chunks), "each chunk read once, for its cells' means"
    reads.clear()
    assert overlay_tile(overlay, "spatial", coarse, 0, 0) is first and not reads, "cached: nothing read again"
    # Each pixel: its cell's mean of the stored maps (nearest cell under the pixel's centre).
    rgba = decoded(first)
    y, x = centres(plan, overlay, coarse, 0, 0, rgba.shape)
    i, j = cell_under(plan, y, x)
    p, q = 120, next(q for q in range(100, 140) if evaluated_of(i[120], j[q]))
    side = plan.grid.cells.cell // ATTENTION_POOL
    a, b = np.meshgrid(np.arange(i[p] * side, (i[p] + 1) * side), np.arange(j[q] * side, (j[q] + 1) * side),
                       indexing="ij")
    mean = np.float16(spatial_of(a, b)).astype(np.float32).mean()
    assert rgba[p, q].tolist() == coloured(np.array([mean], dtype=np.float32))[0].tolist()


def test_a_finished_chunk_changes_only_the_tiles_over_it(half_done):
    plan, overlay = half_done
    fine = overlay.pyramid.max_level
    coarse = overlay.pyramid.min_level
    first = overlay_tile(overlay, "spatial", coarse, 0, 0)
    before = {(col, row): overlay_tile(overlay, "tumour", fine, col, row) for col in range(2) for row in range(1)}
    assert overlay_tile(overlay, "tumour", fine, 0, 0) is before[0, 0], "kept"
    plan.store.put(synthetic_chunk(plan, 2, 0))  # chunk (2, 0) finishes: cells 11-16 x 0-7, under tile (0, 0)
    after = {key: overlay_tile(overlay, "tumour", fine, *key) for key in before}
    assert after[0, 0] != before[0, 0], "the tile over the finished chunk is made again"
    assert after[1, 0] is before[1, 0], "a tile over none of it is the one kept"
    assert overlay_tile(overlay, "spatial", coarse, 0, 0) != first


def test_the_outline_is_the_tissue_masks_edge(half_done):
    plan, overlay = half_done
    rgba = decoded(overlay_tile(overlay, "outline", overlay.pyramid.min_level, 0, 0))
    drawn = rgba[..., 3] > 0
    assert drawn.any() and (rgba[drawn] == [0, 229, 255, 255]).all()
    # The mask is the square [16, 48) of a 64 x 64 thumbnail: its edge, and nothing inside or outside it.
    y, x = centres(plan, overlay, overlay.pyramid.min_level, 0, 0, rgba.shape)
    mask_y, mask_x = (y / plan.grid.size[0] * 64).astype(int), (x / plan.grid.size[1] * 64).astype(int)
    inside = ((mask_y[:, None] >= 19) & (mask_y[:, None] < 45) & (mask_x[None] >= 19) & (mask_x[None] < 45))
    outside = ((mask_y < 15) | (mask_y >= 50))[:, None] | ((mask_x < 15) | (mask_x >= 50))[None, :]
    assert not drawn[inside].any() and not drawn[outside].any()


def test_zoomed_in_past_the_mask_the_outline_stays_two_tile_pixels_wide_across_tiles_and_rings_a_hole(tmp_path):
    """At the finest level a mask pixel is about 4 x 5 tile pixels: the outline is the edge of the mask as the
    level samples it (every tile pixel with a 4-neighbour off the tissue, widened to a 2 x 2 square down and right),
    the same over the whole level as tile by tile, and a hole of 2 x 2 mask pixels is a ring with its middle clear."""
    plan = synthetic_plan(tmp_path, 1000, 1300)
    plan.tissue[30:32, 30:32] = False
    overlay = register(plan)
    level = overlay.pyramid.max_level
    cols, rows = overlay.pyramid.level_tiles(level)
    assert cols == 2, "the level has a seam between two tiles"
    drawn = np.concatenate([np.concatenate([decoded(overlay_tile(overlay, "outline", level, col, row))[..., 3] > 0
                                            for col in range(cols)], axis=1) for row in range(rows)], axis=0)
    y, x = centres(plan, overlay, level, 0, 0, drawn.shape)
    mask = plan.tissue[np.ix_((y / plan.grid.size[0] * 64).astype(int), (x / plan.grid.size[1] * 64).astype(int))]
    padded = np.pad(mask, 1, mode="edge")
    edge = mask & ~(padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:])
    widened = edge.copy()  # each edge pixel drawn as the 2 x 2 square it is the top-left corner of
    widened[1:] |= edge[:-1]
    widened[:, 1:] |= widened[:, :-1].copy()
    assert np.array_equal(drawn, widened)
    middle = drawn.shape[0] // 2
    runs = np.flatnonzero(np.diff(drawn[middle].astype(int)))
    assert runs[1] - runs[0] == 2, "the square's left edge is two tile pixels across"
    hole_y = np.flatnonzero((y >= 30.5 * plan.grid.size[0] / 64) & (y < 31.5 * plan.grid.size[0] / 64))
    hole_x = np.flatnonzero((x >= 30.5 * plan.grid.size[1] / 64) & (x < 31.5 * plan.grid.size[1] / 64))
    assert not drawn[np.ix_(hole_y, hole_x)].any() and drawn[hole_y[0] - 3:hole_y[-1] + 4, hole_x].any()


def test_hover_answers_the_stored_cell(half_done):
    plan, overlay = half_done
    assert cell_value(overlay, 3, 4) == dict(cell=[3, 4], state="evaluated", tumour=round(float(tumour_of(3, 4)), 4))
    assert cell_value(overlay, 3, 6)["state"] == "not evaluated", "(3 + 6) % 5 == 4: too little tissue"
    assert cell_value(overlay, 12, 0) == dict(cell=[12, 0], state="waiting", tumour=None)
    assert cell_value(overlay, 0, 10)["state"] == "not evaluated", "chunk (0, 1) is glass"
    assert cell_value(overlay, 29, 0) == "the grid has 29 x 38 cells, not (29, 0)"


def test_a_stores_memory_is_bounded_and_its_chunks_stay_on_disk(tmp_path):
    plan = synthetic_plan(tmp_path, 1000, 1300)
    fill(plan)
    one = synthetic_chunk(plan, 0, 0)
    size = one.tissue.nbytes + one.evaluated.nbytes + one.probabilities.nbytes + sum(
        m.nbytes for m in one.attention.values())
    store = ChunkStore(tmp_path, plan.store.folder.name, held_bytes=3 * size)
    for index in plan.chunks:
        assert store.get(*index) is not None
    assert store.held == 3 and store.finished() == set(plan.chunks), "three held, all 25 on disk"
    versions = store.versions()
    assert set(versions) == set(plan.chunks)
    store.put(synthetic_chunk(plan, 0, 0))
    assert store.versions()[0, 0] != versions[0, 0], "a chunk written again has a new version"


def test_a_stores_listing_is_kept_while_its_folder_is_unchanged_and_never_hides_a_chunk_written_since(tmp_path,
                                                                                                 monkeypatch):
    """The tiles of a view each ask for the versions under them: one listing serves them while nothing is written
    (a listing within the clock's granularity of a change is not kept: it could miss a name renamed in the same
    tick)."""
    import app.slides.store as store_module

    plan = synthetic_plan(tmp_path, 1000, 1300)
    fill(plan)
    store = ChunkStore(tmp_path, plan.store.folder.name)
    listings = []
    scandir = os.scandir
    monkeypatch.setattr(store_module.os, "scandir", lambda path: listings.append(path) or scandir(path))
    time.sleep(2 * store_module.SETTLED_NS / 1e9)
    first = store.versions()
    assert store.versions() == first and store.versions([(0, 0), (0, 1)]) == {k: first[k] for k in [(0, 0), (0, 1)]}
    assert len(listings) == 1, "the folder listed once"
    store.put(synthetic_chunk(plan, 0, 0))
    again = store.versions()
    assert again[0, 0] != first[0, 0] and len(listings) == 2, "listed again after a write, the new version seen"
    store.put(synthetic_chunk(plan, 0, 1))
    assert store.versions()[0, 1] != first[0, 1], "a write just after a listing is seen too"


def serve(path: str):
    """The response of the overlay routes to ``path``, as Starlette routes it."""
    for route in overlay_routes():
        match, scope = route.matches({"type": "http", "method": "GET", "path": path})
        if match.name == "FULL":
            request = Request({"type": "http", "method": "GET", "path": path, "headers": [], "query_string": b"",
                               **scope})
            return asyncio.run(route.endpoint(request))
    raise AssertionError(f"no route for {path}")


def test_the_routes_serve_tiles_and_cells_and_say_why_in_a_404(half_done):
    plan, overlay = half_done
    key, level = overlay.key, overlay.pyramid.max_level
    good = serve(f"/slides/overlays/{key}/tumour/{level}/0_0.png")
    assert good.status_code == 200 and good.media_type == "image/png"
    assert good.headers["x-content-type-options"] == "nosniff"
    assert good.body == overlay_tile(overlay, "tumour", level, 0, 0)
    values = serve(f"/slides/overlays/{key}/values/{level}/0_0.png")
    assert values.status_code == 200 and values.body == overlay_tile(overlay, "values", level, 0, 0)
    palette = serve("/slides/overlays/palette.json")
    assert palette.status_code == 200 and b'"viridis"' in palette.body
    assert palette.headers["x-content-type-options"] == "nosniff" and palette.headers["cache-control"] == "no-cache"
    answer = serve(f"/slides/overlays/{key}/cells/3_4.json")
    assert answer.status_code == 200 and b'"evaluated"' in answer.body
    bad = {
        "/slides/overlays/ffffffffffffffffffffffff/tumour/9/0_0.png":
            "no analysis ffffffffffffffffffffffff is open on this server (its Slide page registers it)",
        "/slides/overlays/..%2F..%2Fetc/tumour/9/0_0.png":
            "'..%2F..%2Fetc' names no analysis (a key is 24 hexadecimal digits)",
        f"/slides/overlays/{key}/colour/{level}/0_0.png":
            "an overlay is one of tumour, spatial, removed, kept, values, outline, not colour",
        f"/slides/overlays/{key}/tumour/3/0_0.png": f"the overlays have levels {overlay.pyramid.min_level} to "
                                                    f"{level}, not 3",
        f"/slides/overlays/{key}/tumour/{level}/5_0.png": f"level {level} of the overlays has 2 x 1 tiles, not (5, 0)",
        f"/slides/overlays/{key}/tumour/{level}/{'9' * 5000}_0.png":
            f"level {level}, tile {'9' * 20}: a level is a number of at most two digits, a tile col_row",
        f"/slides/overlays/{key}/tumour/{'9' * 400}/0_0.png":
            f"level {'9' * 20}, tile 0_0: a level is a number of at most two digits, a tile col_row",
        f"/slides/overlays/{key}/cells/99_0.json": "the grid has 29 x 38 cells, not (99, 0)",
        f"/slides/overlays/{key}/cells/-1_0.json": "cell -1_0: a cell is i_j, each of at most seven digits",
        "/slides/overlays/../../etc/passwd": "/slides/overlays/../../etc/passwd is no overlay tile: "
                                            "/slides/overlays/KEY/KIND/LEVEL/COL_ROW.png",
    }
    for path, sentence in bad.items():
        response = serve(path)
        assert response.status_code == 404 and response.body.decode() == sentence + "\n", path
        assert response.headers["x-content-type-options"] == "nosniff"


def test_the_cell_maps_are_kept_for_the_next_server(tmp_path, monkeypatch):
    """A server started again reads the cell maps kept beside the chunks, and reads again only a chunk written since."""
    plan = synthetic_plan(tmp_path, 1000, 1300)
    fill(plan)
    first = overlay_tiles.overlay_tile(register(plan), "tumour", overlay_tiles.pyramid(plan.grid).min_level, 0, 0)
    assert (plan.store.folder / CELL_MAPS).is_file(), "all 25 chunks in: the maps are kept"
    monkeypatch.setattr(overlay_tiles, "_registry", type(overlay_tiles._registry)())
    monkeypatch.setattr(overlay_tiles, "_tiles", type(overlay_tiles._tiles)())
    again = synthetic_plan(tmp_path, 1000, 1300)  # the next server's plan: the same store
    again.store.put(synthetic_chunk(again, 4, 4))
    reads = []
    get = again.store.get
    monkeypatch.setattr(again.store, "get", lambda ci, cj: reads.append((ci, cj)) or get(ci, cj))
    overlay = register(again)
    assert overlay_tile(overlay, "tumour", overlay.pyramid.min_level, 0, 0) == first
    assert reads == [(4, 4)], "only the chunk written since is read"
    (again.store.folder / CELL_MAPS).write_bytes(b"damaged")
    monkeypatch.setattr(overlay_tiles, "_registry", type(overlay_tiles._registry)())
    assert not register(again).maps.versions, "a damaged file is ignored: the chunks are read again"


def test_the_colours_and_stripes_of_a_tile_are_their_formulas():
    """viridis at round(clip(v, 0, 1) * 255), NaN and inf transparent black, in float32 and float64 (the quick
    path for the range every overlay has); the stripes at (row + col) // 6 mod 2 for any tile's offset."""
    from app.slides.overlay_colours import VIRIDIS, WAITING_STRIPE, waiting_pattern

    ties = (np.arange(256) + 0.5) / 255  # halfway between two colours
    values = np.concatenate([np.linspace(-0.5, 1.5, 4001), ties, [np.nan, np.inf, -np.inf]])
    for dtype in (np.float32, np.float64):
        v = values.astype(dtype)
        finite = np.isfinite(v)
        expected = VIRIDIS[np.round(np.clip(np.where(finite, v, 0), 0, 1) * 255).astype(int)]
        expected[~finite] = 0
        assert np.array_equal(coloured(v), expected)
        general = VIRIDIS[np.round(np.clip((np.where(finite, v, 0.25) - 0.25) / 0.5, 0, 1) * 255).astype(int)]
        general[~finite] = 0
        assert np.array_equal(coloured(v, 0.25, 0.75), general)  # another range: the general path
    for row0, col0 in [(0, 0), (5, 7), (256, 512), (1001, 13)]:
        rows, cols = np.arange(row0, row0 + 200), np.arange(col0, col0 + 256)
        stripe = ((rows[:, None] + cols[None, :]) // WAITING_STRIPE) % 2 == 0
        assert np.array_equal(waiting_pattern(rows, cols), np.where(stripe[..., None], WAITING, WAITING_GAP))
