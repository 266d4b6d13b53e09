"""Shared fixtures: the reference outputs of the paper's code, where they are available.

The reference folder is ``../shared/reference`` beside the repository (or
``$REFERENCE_DIR``). Without it the tests that read it skip with a message;
with ``REQUIRE_REFERENCE=1`` (set by ``.ci/run``) they fail instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]  # the repository's root, for every test (they import it from here)
REFERENCE = Path(os.environ.get("REFERENCE_DIR", REPO.parent / "shared" / "reference"))


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Each test starts with PyTorch's thread count of the session: a test that runs a command in-process with
    ``--threads 1`` (the training CLI, the benchmarks) would otherwise leave every later test on one thread."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def require_shared(path: Path, message: str) -> Path:
    """``path`` when it exists; else skip with ``message``, or fail under REQUIRE_REFERENCE=1 (CI), where
    ``../shared`` (the reference outputs and the real datasets) must be there."""
    if not path.exists():
        if os.environ.get("REQUIRE_REFERENCE") == "1":
            pytest.fail(message + "; REQUIRE_REFERENCE=1 makes this an error")
        pytest.skip(message)
    return path


def reference_path(name: str) -> Path:
    """Path of a reference file, skipping (or failing under REQUIRE_REFERENCE=1) when it is absent."""
    path = REFERENCE / name
    return require_shared(path, f"reference file {path} not found (the paper's outputs live in ../shared/reference)")


@pytest.fixture(scope="session")
def layers_synthetic():
    return np.load(reference_path("layers_synthetic.npz"))


# The five checkpoints released with the paper's code, by our registry name (the folder says theirs).
RELEASES = {
    "z2cnn": "model_z2cnn_optim_adam_lr_0.001_wd_0.0001_seed_0",
    "p4cnn": "model_p4cnn_optim_adam_lr_0.001_wd_0.0001_seed_0",
    "a_p4cnn": "model_att_p4cnn_optim_adam_lr_0.001_wd_0.0001_seed_0",
    "fa_p4cnn": "model_f_att_p4cnn_optim_adam_lr_0.001_wd_0.0001_seed_0",
    "p4m_densenet": "model_f_att_p4m_densenet_optim_adam_lr_0.001_wd_0.0001_seed_1_dilatedkernelseverywhere_"
                    "pat20onmaxacc",
}


def release_path(arch: str) -> Path:
    """The ``model.pth`` of the paper's release of ``arch`` (skips, or fails under REQUIRE_REFERENCE=1, without it)."""
    return reference_path(f"checkpoints/{RELEASES[arch]}/model.pth")
