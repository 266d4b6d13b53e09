"""Stain normalisation of whole slides (issue 67, :mod:`app.slides.stain`): the slide's one estimate, the store key
that names the normalisation, the engine and the tiles on normalised pixels, and the command line's ``--stain``; on
small pyramidal TIFFs cut from the CMU-1 region the gallery ships."""

from __future__ import annotations

import asyncio
import csv

import numpy as np
import pytest
from PIL import Image
from starlette.requests import Request
from test_slides_engine import CHECKPOINT, write_pyramid

from app.analysis.pathology import model_microns_per_pixel
from app.cells.evaluation import RegionGrid
from app.slides.cli import main
from app.slides.engine import ChunkResult, SlideGrid, evaluate_chunk, read_chunk, slide_grid
from app.slides.library import list_slides
from app.slides.reader import open_slide
from app.slides.run import plan_slide, submit_chunk
from app.slides.stain import SlideStain, StainError, card_reference, known_slide_stain, slide_stain
from app.slides.store import store_key
from app.slides.tiles import deep_zoom, descriptor, parse_route, route_id, tile, tile_rgb
from models import load_checkpoint
from models.stain_normalise import estimate_stain, normalise, pcam_reference
from tests.conftest import REPO

CMU_MPP = 0.499  # the gallery's CMU-1 region (app/gallery)


@pytest.fixture(scope="module")
def crop(tmp_path_factory):
    """A 576 x 480 crop of the CMU-1 region, tissue nearly everywhere, as a two-level tiled TIFF at 0.499 um/px:
    3 x 3 chunks of at most 3 x 3 cells at PCam's scale."""
    region = np.asarray(Image.open(REPO / "app" / "gallery" / "region_cmu1.jpg").convert("RGB"))
    path = tmp_path_factory.mktemp("stain") / "cmu_crop.tif"
    write_pyramid(path, np.ascontiguousarray(region[1700:2180, 700:1276]), CMU_MPP)
    return path


@pytest.fixture(scope="module")
def model_and_card():
    return load_checkpoint(CHECKPOINT)


def test_the_store_key_names_the_normalisation_and_none_is_the_key_stores_had_before():
    grid = SlideGrid((1000, 800), (514, 411), RegionGrid(14, 11, 33, 29, 32, 96), 8, 0.5, 0.972)
    # The digests store_key gave before normalisation existed (app/slides/store.py at b5699a0): stores stay valid.
    assert store_key("abc:123", "f" * 64, grid) == "ee4b68c2e0c0cb6704496dbc"
    assert store_key("abc:123", "f" * 64, grid, element=3) == "7cf836a3bc356c45ce492936"
    assert store_key("abc:123", "f" * 64, grid, stain=None) == "ee4b68c2e0c0cb6704496dbc"
    rng = np.random.default_rng(0)
    source = estimate_stain(rng.integers(0, 256, (1, 64, 64, 3), dtype=np.uint8) // 2 + 100)
    target = pcam_reference()
    keys = {store_key("abc:123", "f" * 64, grid, element=g, stain=stain)
            for g in (0, 3) for stain in (None, SlideStain("macenko", source, target),
                                          SlideStain("reinhard", source, target),
                                          SlideStain("macenko", target, target))}
    assert len(keys) == 8, "each normalisation (method, slide estimate, target) and each element: a store of its own"


def test_the_slide_estimate_is_made_once_from_its_tissue_and_said_in_a_sentence_without(crop, tmp_path):
    assert known_slide_stain(crop) is None or isinstance(known_slide_stain(crop), type(pcam_reference()))
    estimate = slide_stain(crop)
    assert slide_stain(str(crop)) is estimate and known_slide_stain(crop) is estimate, "kept per file"
    with open_slide(crop) as slide:
        assert slide_stain(slide) == estimate, "an open slide's estimate is its file's"
    h, e = estimate.vectors
    assert h[0] > e[0] and np.allclose(np.linalg.norm(estimate.vectors, axis=1), 1.0), "H first: more red OD"
    # A slide whose tissue is one colour: its two stains cannot be told apart; the sentence names it, once per file.
    flat = np.full((400, 480, 3), 255, dtype=np.uint8)
    flat[100:300, 120:360] = (190, 110, 160)
    one_colour = tmp_path / "one_colour.tif"
    write_pyramid(one_colour, flat, CMU_MPP)
    with pytest.raises(StainError, match=r"^one_colour\.tif: ") as raised:
        slide_stain(one_colour)
    assert known_slide_stain(one_colour) == str(raised.value), "its sentence is kept: its tiles do not ask again"


def test_the_engine_on_normalised_pixels_is_the_model_on_normalised_pixels(crop, model_and_card, tmp_path):
    model, card = model_and_card
    stain = SlideStain("macenko", slide_stain(crop), card_reference(card))
    with open_slide(crop) as slide:
        whole = slide.read_region(0, 0, 0, *slide.dimensions)
    normalised = tmp_path / "normalised.tif"
    write_pyramid(normalised, normalise(whole, "macenko", card_reference(card), slide_stain(crop)), CMU_MPP)
    with open_slide(crop) as slide, open_slide(normalised) as other:
        grid = slide_grid(slide, CMU_MPP, card, model_microns_per_pixel(card), chunk=1)
        assert grid == slide_grid(other, CMU_MPP, card, model_microns_per_pixel(card), chunk=1)
        assert not np.array_equal(read_chunk(slide, grid, 2, 3), read_chunk(slide, grid, 2, 3, stain)), "new pixels"
        by_stain = evaluate_chunk(model, card, slide, grid, 2, 3, stain=stain)  # one cell: the crop's centre
        by_pixels = evaluate_chunk(model, card, other, grid, 2, 3)
    assert by_stain.evaluated.all() and set(by_stain.attention) == {"removed", "spatial"}, "the crop is tissue"
    np.testing.assert_array_equal(by_stain.probabilities, by_pixels.probabilities)
    for reading in by_pixels.attention:
        np.testing.assert_array_equal(by_stain.attention[reading], by_pixels.attention[reading])


def call(endpoint, **params):
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b"", "path_params": params}
    return asyncio.run(endpoint(Request(scope)))


def test_a_normalised_tile_is_the_tile_normalised_with_the_slides_estimate_and_bad_stains_are_404(crop, monkeypatch,
                                                                                                  tmp_path):
    monkeypatch.setenv("APP_SLIDES", str(crop.parent))
    monkeypatch.setenv("APP_SLIDE_UPLOADS", str(tmp_path / "uploads"))
    entry = next(e for e in list_slides() if e.path == crop)
    assert route_id(entry.slide_id, 5, "macenko") == f"{entry.slide_id}-g5~macenko"
    assert parse_route(route_id(entry.slide_id, 5, "reinhard")) == (f"{entry.slide_id}-g5", "reinhard")
    assert route_id(entry.slide_id, 0, "none") == entry.slide_id
    source = slide_stain(crop)
    for method in ("macenko", "reinhard"):
        for g in (0, 5):
            generator = deep_zoom(str(crop), crop.stat().st_mtime_ns, g)
            deepest = generator.level_count - 1
            for col, row in np.ndindex(*generator.level_tiles[deepest]):
                raw = tile_rgb(route_id(entry.slide_id, g), deepest, col, row)
                np.testing.assert_array_equal(tile_rgb(route_id(entry.slide_id, g, method), deepest, col, row),
                                              normalise(raw, method, pcam_reference(), source))
    ok = call(tile, slide_id=route_id(entry.slide_id, 0, "macenko"), level=str(deepest), col="0", row="0")
    assert (ok.status_code, ok.media_type) == (200, "image/jpeg")
    for bad in ("~vahadane", "~none", "~", "~Macenko", "-g1~x"):
        for response in (call(descriptor, slide_id=entry.slide_id + bad),
                         call(tile, slide_id=entry.slide_id + bad, level=str(deepest), col="0", row="0")):
            assert response.status_code == 404 and b"names no stain normalisation" in response.body, bad


def test_the_command_line_names_its_stain_in_the_summary_and_reads_back_its_normalised_store(crop, tmp_path, capsys):
    out = tmp_path / "out"
    plan = plan_slide(crop, CHECKPOINT, out / ".chunks", chunk=3, stain="macenko")
    assert plan.stain_method == "macenko" and plan.stain.source == slide_stain(crop)
    scanned = plan_slide(crop, CHECKPOINT, out / ".chunks", chunk=3)
    assert scanned.store.folder != plan.store.folder and scanned.stain_method == "none"
    submitted = []

    class Client:  # what a chunk's task is sent: the plan's normalisation, both estimates exactly, as a keyword
        def submit(self, *args, **kwargs):
            submitted.append((args, kwargs))

    submit_chunk(Client(), plan, *plan.chunks[0])
    submit_chunk(Client(), scanned, *plan.chunks[0])
    assert SlideStain.from_dict(submitted[0][1]["stain"]) == plan.stain and "stain" not in submitted[1][1]
    assert submitted[0][0] == submitted[1][0], "the same arguments as a task of the pixels as scanned, and the stain"
    for index in plan.chunks:  # the normalised store filled here (a tumour probability of 0.75 everywhere): the
        i0, i1, j0, j1 = plan.grid.cell_block(*index)  # command reads it back, needs no cluster, computes nothing
        shape = (i1 - i0, j1 - j0)
        plan.store.put(ChunkResult(index, np.ones(shape), np.ones(shape, dtype=bool), np.full((*shape, 2), 0.75), {}))
    argv = [str(crop), "--out", str(out), "--checkpoint", str(CHECKPOINT), "--chunk", "3", "--stain", "macenko"]
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert "stain normalised to PCam's by macenko" in said and f"0 of {len(plan.chunks)} chunks computed" in said
    (row,) = csv.DictReader((out / "summary.csv").open())
    assert (row["slide"], row["status"], row["stain"]) == ("cmu_crop.tif", "done", "macenko")
    assert row["mean_tumour_probability"] == "0.750000", "the normalised store's chunks, not another's"
    assert str(np.load(out / "cmu_crop.npz")["stain"]) == "macenko"


def test_a_slide_without_a_stain_to_estimate_fails_alone_and_a_bad_stain_is_argparses_error(crop, tmp_path, capsys):
    flat = np.full((400, 480, 3), 255, dtype=np.uint8)
    flat[100:300, 120:360] = (190, 110, 160)
    one_colour = tmp_path / "one_colour.tif"
    write_pyramid(one_colour, flat, CMU_MPP)
    out = tmp_path / "out"
    argv = [str(one_colour), "--out", str(out), "--checkpoint", str(CHECKPOINT), "--stain", "reinhard"]
    assert main(argv) == 2
    said, err = capsys.readouterr().err.partition("\n")[::2]  # the precision's line, then the slide's error
    assert said.startswith("precision: ") and err.startswith("error: one_colour.tif: ") and "stain" in err
    assert "Traceback" not in err
    (row,) = csv.DictReader((out / "summary.csv").open())
    assert (row["status"], row["stain"]) == ("error", "reinhard") and row["error"] == err[len("error: "):].strip()
    with pytest.raises(SystemExit) as stopped:
        main([str(crop), "--out", str(out), "--stain", "vahadane"])
    assert stopped.value.code == 2
    assert "argument --stain: invalid choice: 'vahadane' (choose from" in capsys.readouterr().err
