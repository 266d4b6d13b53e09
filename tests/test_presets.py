"""Every preset trains for a few steps on tiny files in its dataset's real format and writes a complete checkpoint."""

from __future__ import annotations

import json

import pytest
from test_data_cifar10 import write_batches
from test_data_pcam import write_h5
from test_data_rot_mnist import write_amat

from models import load_checkpoint
from training.cli import main as cli_main
from training.presets import PRESETS

WRITERS = {
    "rot_mnist": lambda root: write_amat(root, n_train=12, n_test=6),
    "cifar10": lambda root: write_batches(root, n=6),
    "pcam": lambda root: write_h5(root, counts={"train": 6, "valid": 4, "test": 4}),
}
SMOKE = ["--max-steps", "2", "--batch-size", "4", "--eval-batch-size", "4", "--max-eval-batches", "1",
         "--equivariance-images", "2", "--threads", "1"]


@pytest.mark.parametrize("preset", [name for name, cfg in PRESETS.items() if cfg.dataset in WRITERS])
def test_preset_smoke_run(preset, tmp_path):
    cfg = PRESETS[preset]
    data = tmp_path / "data"
    data.mkdir()
    WRITERS[cfg.dataset](data)
    out = tmp_path / "run"
    assert cli_main(["train", preset, "--data-dir", str(data), "--out", str(out), *SMOKE]) == 0
    model, card = load_checkpoint(out / "best.safetensors")
    assert card["arch"] == cfg.model and card["training"]["steps"] == 2
    assert card["training"]["config"]["optimizer"] == cfg.optimizer
    assert card["training"]["config"]["lr"] == cfg.lr
    assert card["equivariance_error"]["max_relative_logit_error"] < 1e-3
    if cfg.dataset.startswith("pcam"):
        assert {"test_auc", "test_ece", "test_reliability"} <= set(card["metrics"])
    assert json.loads((out / "log.json").read_text())[0]["epoch"] == 1
