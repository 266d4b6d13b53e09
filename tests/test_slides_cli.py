"""``python -m app.slides`` (:mod:`app.slides.cli`) on a real pyramidal TIFF of PCam test patches with a real Dask
``LocalCluster``: the per-cell arrays, the heatmap and QuPath's GeoJSON; finished chunks kept and not redone, a
damaged chunk found by its checksum and redone; a slide without a scale refused with a sentence."""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest
import shapely.geometry
from PIL import Image
from test_slides_connection import Listener
from test_slides_engine import CHECKPOINT, PCAM, write_pyramid

from app.cells.mosaic import PCAM_MPP, pcam_test_mosaic
from app.slides.cli import main
from app.slides.engine import ChunkResult
from app.slides.regions import AREA
from app.slides.store import ChunkStore
from models import load_checkpoint
from tests.conftest import REPO, require_shared

pytest.importorskip("dask.distributed")
TCGA = REPO.parent / "shared" / "data" / "slides" / "tcga-cr-7395-01a-01-ts1.svs"


@pytest.fixture(scope="module")
def mosaic_slide(tmp_path_factory):
    require_shared(PCAM / "labels.csv", f"{PCAM} not found (pcam_public lives in ../shared/data)")
    _, card = load_checkpoint(CHECKPOINT)
    mosaic = pcam_test_mosaic(card, PCAM, count=9)
    path = tmp_path_factory.mktemp("slides") / "mosaic.tif"
    write_pyramid(path, np.round(mosaic.image.transpose(1, 2, 0) * 255).astype(np.uint8), PCAM_MPP)
    return path


def progress_lines(text: str) -> list[str]:
    return [part.strip() for part in text.replace("\r", "\n").splitlines() if "chunks" in part]


def chunk_counts(text: str) -> list[tuple[int, int]]:
    """``(done, total)`` chunks of each state of the progress bar on stderr."""
    return [tuple(int(v) for v in re.search(r"(\d+)/(\d+) chunks", line).groups()) for line in progress_lines(text)]


def test_a_slide_gives_its_cells_heatmap_and_regions_and_resumes_from_its_chunks(mosaic_slide, tmp_path, capsys):
    argv = [str(mosaic_slide), "--out", str(tmp_path), "--checkpoint", str(CHECKPOINT), "--chunk", "3"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    total = chunk_counts(err)[0][1]
    assert 4 <= total <= 9, "the chunks with tissue of 3 x 3 (of 3 x 3 cells each; the mosaic's rim is glass)"
    assert chunk_counts(err)[0] == (0, total) and chunk_counts(err)[-1] == (total, total)
    assert progress_lines(err)[0].startswith("[------------------------] 0/") and "0/1 slides" in err
    assert progress_lines(err)[-1].startswith("[########################] ") and "1/1 slides" in err
    assert out.startswith("mosaic.tif: ") and "recorded in the slide" in out
    assert f"; {total} of {total} chunks computed" in out
    cells = np.load(tmp_path / "mosaic.npz")
    assert cells["probability"].shape == cells["evaluated"].shape == (7, 7)
    assert np.allclose(cells["cell_size_px"], 32) and cells["cell_top_left_px"][3, 3].tolist() == [128.0, 128.0]
    assert str(cells["method"]) == "crops" and float(cells["model_microns_per_pixel"]) == PCAM_MPP
    assert Image.open(tmp_path / "mosaic.png").size == (288, 288)
    regions = json.loads((tmp_path / "mosaic.geojson").read_text())
    tumour = cells["evaluated"] & (np.nan_to_num(cells["probability"]) >= 0.5)
    assert sum(f["properties"]["measurements"]["Cells"] for f in regions["features"]) == tumour.sum()
    assert all(f["properties"]["classification"]["name"] == "Tumor" for f in regions["features"])
    for feature in regions["features"]:  # one valid polygon per region, of its cells' area (32 px of 0.972 um)
        assert feature["geometry"]["type"] == "Polygon" and shapely.geometry.shape(feature["geometry"]).is_valid
        measurements = feature["properties"]["measurements"]
        assert measurements[AREA] == pytest.approx(measurements["Cells"] * (32 * PCAM_MPP) ** 2, rel=1e-9)

    # Again: every chunk is read back, none computed.
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert chunk_counts(err) == [(total, total)] and f"; 0 of {total} chunks computed" in out
    # One chunk lost and one damaged: exactly those two are computed again, and the result is the same.
    lost, damaged = sorted(next((tmp_path / ".chunks").iterdir()).glob("chunk-*.npz"))[:2]
    lost.unlink()
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert chunk_counts(err)[0] == (total - 2, total) and f"; 2 of {total} chunks computed" in out
    again = np.load(tmp_path / "mosaic.npz")
    np.testing.assert_array_equal(again["probability"], cells["probability"])


def test_a_slide_without_a_scale_is_refused_with_a_sentence(tmp_path, capsys):
    slide = require_shared(TCGA, f"{TCGA} not found (the real slides live in ../shared/data/slides)")
    assert main([str(slide), "--out", str(tmp_path), "--checkpoint", str(CHECKPOINT)]) == 2
    said, err = capsys.readouterr().err.partition("\n")[::2]  # the precision's line, then the slide's error
    assert said.startswith("precision: ")
    assert err.startswith("error: tcga-cr-7395-01a-01-ts1.svs: the slide records neither its scale nor its "
                          "objective power") and "Traceback" not in err


def test_an_unreachable_scheduler_is_named(mosaic_slide, tmp_path, capsys, monkeypatch):
    import app.slides.connection as connection

    monkeypatch.setattr(connection, "CONNECT_DEADLINE_S", 2.0)
    silent = Listener()  # accepts, and says nothing: Dask's own client waited for it for over 150 s
    try:
        for address, why in (("tcp://127.0.0.1:9", "nothing listens there (connection refused)"),
                             ("http://127.0.0.1:9", "http:// is not a Dask scheduler's scheme; name it as "
                                                    "tls://HOST:PORT, or tcp://HOST:PORT on a trusted network only"),
                             (silent.address, "it accepted the connection but said nothing within 2 s (not a Dask "
                                              "scheduler, or a network that drops its answers)")):
            argv = [str(mosaic_slide), "--out", str(tmp_path), "--checkpoint", str(CHECKPOINT), "--scheduler", address]
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert err == f"error: no Dask scheduler answers at {address}: {why}\n"
    finally:
        silent.close()


def test_the_store_refuses_bytes_that_do_not_match_their_checksum(tmp_path):
    store = ChunkStore(tmp_path, "key")
    result = ChunkResult((2, 3), np.ones((2, 2)), np.ones((2, 2), dtype=bool), np.full((2, 2, 2), 0.25),
                         {"spatial": np.zeros((16, 16), dtype=np.float16)})
    store.put(result)
    back = store.get(2, 3)
    assert back.index == (2, 3) and np.array_equal(back.probabilities, result.probabilities)
    assert set(back.attention) == {"spatial"} and store.done() == {(2, 3)}
    path = tmp_path / "key" / "chunk-2-3.npz"
    path.write_bytes(path.read_bytes()[:-10])
    assert store.get(2, 3) is None and store.done() == set()


def test_a_slide_named_twice_runs_once_and_a_copy_shares_its_chunks(mosaic_slide, tmp_path, capsys):
    copy = tmp_path / "copy.tif"
    copy.write_bytes(mosaic_slide.read_bytes())
    out = tmp_path / "out"
    argv = [str(mosaic_slide), str(mosaic_slide), str(copy), "--out", str(out), "--checkpoint", str(CHECKPOINT),
            "--chunk", "3"]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [row["slide"] for row in rows] == ["mosaic.tif", "copy.tif"], "named twice, run once"
    assert all(row["status"] == "done" for row in rows) and "2 of 2 slides done" in stdout
    stores = list((out / ".chunks").iterdir())
    assert len(stores) == 1, "one slide's pixels, one store"
    np.testing.assert_array_equal(np.load(out / "copy.npz")["probability"], np.load(out / "mosaic.npz")["probability"])


def test_an_image_gives_region_modes_cells_through_the_slide_engine(tmp_path, capsys):
    """One engine on an image: ``python -m app.slides IMAGE --mpp X`` (the image a slide of one level, its cells in
    chunks on Dask) gives ``python -m app.region IMAGE --mpp X --npz``'s cells: the same grid, tissue and
    probabilities (to float32 round-off of the resampling's summation order), where the slide's tissue mask sends
    chunks to be evaluated."""
    from app.region.cli import main as region_main

    region = Image.open(REPO / "app" / "gallery" / "region_cmu1.jpg").crop((500, 1000, 1460, 1800))
    image = tmp_path / "cmu_crop.png"
    region.save(image)  # lossless: both commands decode the same pixels
    assert region_main([str(image), "--mpp", "0.499", "--npz", str(tmp_path / "region.npz")]) == 0
    assert main([str(image), "--mpp", "0.499", "--out", str(tmp_path / "slides"), "--checkpoint", str(CHECKPOINT),
                 "--precision", "float32"]) == 0  # region mode's precision
    capsys.readouterr()
    by_region, by_slide = np.load(tmp_path / "region.npz"), np.load(tmp_path / "slides" / "cmu_crop.npz")
    for key in ("cell_top_left_px", "cell_size_px", "microns_per_pixel", "model_microns_per_pixel"):
        np.testing.assert_allclose(by_slide[key], by_region[key], rtol=0, atol=1e-9, err_msg=key)
    np.testing.assert_array_equal(by_slide["tissue"] > 0, by_region["tissue"] > 0)
    both = by_slide["evaluated"] & by_region["evaluated"]
    assert np.array_equal(both, by_slide["evaluated"]), "the slide evaluates only cells region mode evaluates"
    assert both.sum() >= 0.9 * by_region["evaluated"].sum(), "its tissue mask leaves out little of the crop"
    np.testing.assert_allclose(by_slide["probabilities"][both], by_region["probabilities"][both], rtol=0, atol=1e-5)
