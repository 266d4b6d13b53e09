"""A slide's precision (:mod:`app.slides.precision`): the plan records the one decided, its store and its tasks name
it, ``auto`` is decided by the CPUs' features (every worker asked; workers that differ give float32), and the command
line's ``--precision bfloat16`` writes a summary and a GeoJSON that name it, its probabilities within bfloat16's
rounding of float32's. On a tiny pyramidal TIFF of two PCam test patches (one chunk of four cells): bfloat16 is
emulated, and slow, on a CPU without native bfloat16."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from test_slides_engine import CHECKPOINT, PCAM, write_pyramid

import app.slides.precision as slide_precision
import models.precision
from app.cells.evaluation import RegionGrid
from app.cells.mosaic import PCAM_MPP, pcam_test_mosaic
from app.slides.cli import main
from app.slides.engine import SlideGrid
from app.slides.precision import agreed_precision, resolve_precision, worker_precision
from app.slides.reader import open_slide
from app.slides.run import chunk_key, chunk_task, plan_slide, slide_identity, submit_chunk
from app.slides.store import store_key
from models import build_model, load_checkpoint
from models.cpu import bfloat16_kernels
from tests.conftest import require_shared

AMX = frozenset({"amx_bf16", "avx512_bf16", "avx2"})
AVX2 = frozenset({"avx2"})


@pytest.fixture(scope="module")
def model():
    return load_checkpoint(CHECKPOINT)[0]


@pytest.fixture(scope="module")
def tiny_slide(tmp_path_factory):
    require_shared(PCAM / "labels.csv", f"{PCAM} not found (pcam_public lives in ../shared/data)")
    _, card = load_checkpoint(CHECKPOINT)
    mosaic = pcam_test_mosaic(card, PCAM, count=2)  # 96 x 192 pixels: 1 x 4 cells, one chunk
    path = tmp_path_factory.mktemp("slides") / "pair.tif"
    write_pyramid(path, np.round(mosaic.image.transpose(1, 2, 0) * 255).astype(np.uint8), PCAM_MPP)
    return path


@pytest.fixture
def cpu(monkeypatch):
    """Set the CPU's flags the precision is decided by: a CPU (not a GPU) without oneDNN limited below them."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(slide_precision, "worker_device", lambda: torch.device("cpu"))

    def set_flags(flags: frozenset[str]) -> None:
        monkeypatch.setattr(models.precision, "cpu_flags", lambda: flags)

    return set_flags


def test_a_store_is_named_by_its_precision_and_float32_keeps_the_name_stores_had(tiny_slide, tmp_path):
    grid = SlideGrid((1000, 800), (514, 411), RegionGrid(14, 11, 33, 29, 32, 96), 8, 0.5, 0.972)
    # The digest store_key gave before there was a choice of precision (tests/test_slides_stain.py's too).
    assert store_key("abc:123", "f" * 64, grid) == store_key("abc:123", "f" * 64, grid, precision="float32") \
        == "ee4b68c2e0c0cb6704496dbc"
    assert store_key("abc:123", "f" * 64, grid, precision="bfloat16") != "ee4b68c2e0c0cb6704496dbc"
    exact = plan_slide(tiny_slide, CHECKPOINT, tmp_path, precision="float32")
    rounded = plan_slide(tiny_slide, CHECKPOINT, tmp_path, precision="bfloat16")
    assert (exact.precision.name, rounded.precision.name) == ("float32", "bfloat16")
    assert exact.store.folder != rounded.store.folder, "the same slide in two precisions: two stores"
    with open_slide(tiny_slide) as slide:
        identity = slide_identity(slide, tiny_slide)
    assert exact.store.folder.name == store_key(identity, exact.card["weights_sha256"], exact.grid)
    index = exact.chunks[0]
    assert chunk_key(exact, *index) != chunk_key(rounded, *index), "a task's key is its store's"
    submitted = []

    class Client:  # what a chunk's task is sent: the precision as a keyword, only where it is not float32
        def submit(self, *args, **kwargs):
            submitted.append((args, kwargs))

    submit_chunk(Client(), exact, *index)
    submit_chunk(Client(), rounded, *index)
    assert "precision" not in submitted[0][1] and submitted[1][1]["precision"] == "bfloat16"
    assert submitted[0][0] == submitted[1][0]


def test_auto_is_bfloat16_only_on_a_cpu_with_amx(model, cpu):
    cpu(AVX2)
    chosen = resolve_precision("auto", model)
    assert chosen.name == "float32" and "no native bfloat16" in chosen.reason
    assert worker_precision("auto") == "float32" and worker_precision("bfloat16") == "bfloat16"
    emulated = resolve_precision("bfloat16", model)
    assert emulated.name == "bfloat16" and "emulated" in emulated.reason, "asked for, it runs, and says it is slow"
    with pytest.raises(ValueError, match="precision must be one of auto, float32, bfloat16"):
        resolve_precision("float16", model)
    if not bfloat16_kernels.available():
        pytest.skip("the bfloat16 kernels do not build here: auto keeps float32 on any CPU")
    cpu(AMX)
    chosen = resolve_precision("auto", model)
    assert chosen.name == "bfloat16" and "AMX-BF16" in chosen.reason
    assert worker_precision("auto") == "bfloat16"


def test_workers_are_asked_and_workers_that_differ_give_float32(model):
    class Client:
        def __init__(self, chosen):
            self.chosen, self.asked = chosen, []

        def run(self, function, *args):
            self.asked.append((function, args))
            return self.chosen

    agree = Client({"tls://a:1": "bfloat16", "tls://b:1": "bfloat16"})
    chosen = resolve_precision("auto", model, agree)
    assert agree.asked == [(worker_precision, ("auto",))], "each worker decides by its own CPU"
    assert chosen.name == "bfloat16" and "all 2 Dask workers chose bfloat16" in chosen.reason
    differ = resolve_precision("auto", model, Client({"tls://a:1": "bfloat16", "tls://b:1": "float32"}))
    assert differ.name == "float32" and "differ (1 of 2 would choose bfloat16)" in differ.reason
    assert resolve_precision("auto", model, Client({"tls://a:1": "float32"})).name == "float32"
    assert agreed_precision({}).name == "float32", "no worker to ask yet: the exact path"
    asked = Client({"tls://a:1": "float32"})
    assert resolve_precision("bfloat16", model, asked).name == "bfloat16" and not asked.asked, "sent as asked"
    full_attention = resolve_precision("auto", build_model("a_p4cnn"), asked)
    assert full_attention.name == "float32" and not asked.asked, "a network without a bfloat16 path: no one asked"


def test_the_command_line_in_bfloat16_names_it_and_gives_float32s_probabilities_to_its_rounding(
        tiny_slide, tmp_path, capsys, cpu):
    cpu(AVX2)  # this process decides the reason said; the worker runs bfloat16, native or emulated
    argv = [str(tiny_slide), "--out", str(tmp_path), "--checkpoint", str(CHECKPOINT), "--precision", "bfloat16"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "precision: bfloat16 (bfloat16 as asked, but this CPU has no native bfloat16" in err
    assert "Traceback" not in err
    (row,) = csv.DictReader((tmp_path / "summary.csv").open())
    assert (row["status"], row["precision"]) == ("done", "bfloat16")
    cells = np.load(tmp_path / "pair.npz")
    assert str(cells["precision"]) == "bfloat16"
    regions = json.loads((tmp_path / "pair.geojson").read_text())
    assert regions["properties"] == {"precision": "bfloat16"}
    assert all(f["properties"]["metadata"] == {"precision": "bfloat16"} for f in regions["features"])
    # float32's probabilities of the same cells, as a worker computes them, in this process.
    plan = plan_slide(tiny_slide, CHECKPOINT, tmp_path / "float32", precision="float32")
    (index,) = plan.chunks
    exact = chunk_task(str(tiny_slide), PCAM_MPP, str(CHECKPOINT), plan.grid.chunk, *index)
    evaluated = cells["evaluated"]
    assert evaluated.sum() == exact.evaluated.sum() >= 2
    # Measured: 9e-3 at most (AMX-BF16), over 12 cells of the PCam mosaic.
    np.testing.assert_allclose(cells["probabilities"][evaluated], exact.probabilities[exact.evaluated], atol=0.02)
    with pytest.raises(SystemExit) as stopped:
        main([str(tiny_slide), "--out", str(tmp_path), "--precision", "float16"])
    assert stopped.value.code == 2
