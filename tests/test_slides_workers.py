"""Where chunks run (:mod:`app.slides.workers`): a worker that sees CUDA picks its GPU, one that does not its CPU;
the device-agnostic path gives the CPU's probabilities exactly; a cluster described in words. CI has no GPU: the
choice is tested by telling PyTorch it sees one."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from test_slides_engine import CHECKPOINT, PCAM, write_pyramid

import app.slides.run as run
from app.analysis.pathology import model_microns_per_pixel
from app.cells.mosaic import PCAM_MPP, pcam_test_mosaic
from app.slides.engine import evaluate_chunk, slide_grid
from app.slides.reader import open_slide
from app.slides.workers import describe_cluster, prepare_device, worker_device
from models import load_checkpoint
from models.cpu.allocator import freed_memory_environ
from tests.conftest import require_shared


def test_a_worker_that_sees_cuda_picks_its_gpu_and_one_that_does_not_its_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert worker_device() == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert worker_device() == torch.device("cpu")


def test_a_gpu_computes_in_full_float32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        prepare_device(torch.device("cpu"))
        assert torch.backends.cudnn.allow_tf32, "a CPU worker changes nothing"
        prepare_device(torch.device("cuda", 0))
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_the_workers_path_gives_the_cpus_probabilities_exactly(tmp_path, monkeypatch):
    """A task's model goes to the worker's device (here its CPU) and its results come back: the same numbers, bit
    for bit, as the engine with the model as loaded."""
    require_shared(PCAM / "labels.csv", f"{PCAM} not found (pcam_public lives in ../shared/data)")
    model, card = load_checkpoint(CHECKPOINT)
    mosaic = pcam_test_mosaic(card, PCAM, count=4)
    write_pyramid(tmp_path / "m.tif", np.round(mosaic.image.transpose(1, 2, 0) * 255).astype(np.uint8), PCAM_MPP)
    picked = []
    monkeypatch.setattr(run, "worker_device", lambda: picked.append("cpu") or torch.device("cpu"))
    run._worker_model.cache_clear()
    try:
        through_worker = run.chunk_task(str(tmp_path / "m.tif"), PCAM_MPP, str(CHECKPOINT), 4, 0, 0)
    finally:
        run._worker_model.cache_clear()
    assert picked == ["cpu"]
    with open_slide(tmp_path / "m.tif") as slide:
        grid = slide_grid(slide, PCAM_MPP, card, model_microns_per_pixel(card), chunk=4)
        direct = evaluate_chunk(model, card, slide, grid, 0, 0)
    assert through_worker.evaluated.sum() > 0
    np.testing.assert_array_equal(through_worker.probabilities, direct.probabilities)
    for reading in direct.attention:
        np.testing.assert_array_equal(through_worker.attention[reading], direct.attention[reading])


@pytest.mark.parametrize(("devices", "address", "sentence"), [
    ({"a": "cuda", "b": "cuda", "c": "cpu"}, "tcp://127.0.0.1:8786",
     "3 workers, 2 with a GPU, on the Dask scheduler at tcp://127.0.0.1:8786"),
    ({"a": "cpu"}, None, "1 worker, none with a GPU, on a local Dask cluster"),
])
def test_a_cluster_in_words(devices, address, sentence):
    assert describe_cluster(devices, address) == sentence


def test_a_local_clusters_workers_start_with_freed_memory_kept_in_one_arena(monkeypatch):
    """glibc reads these when a worker starts (models.cpu.allocator): set by the time the worker runs anything."""
    monkeypatch.delenv("AAGC_KEEP_FREED_MEMORY", raising=False)
    saved = dict(os.environ)  # Dask's nanny writes its workers' start-up variables into this process's environment
    client = run.local_client(1, 1)
    try:
        seen = client.run(lambda: {key: os.environ.get(key) for key in freed_memory_environ()})
    finally:
        run.close_client(client)
        os.environ.clear()
        os.environ.update(saved)
    assert list(seen.values()) == [freed_memory_environ()]
