"""Import the checkpoints released with the paper's code (github dwromero/att_gconvs).

Their ``.pth`` files are plain state dicts whose names our architectures share
(``c1.weight``, ``c2.channel_attention.weight_fc1``, ``bn1.running_mean``, ...),
with a ``module.`` prefix where the model was wrapped in ``nn.DataParallel``.
They are read with ``torch.load(weights_only=True)``, which refuses arbitrary
pickled objects.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import torch

from .checkpoint import CheckpointError, load_state
from .network import Network
from .registry import build_model, model_info

__all__ = ["import_reference_checkpoint", "reference_card", "PAPER_NAMES"]

# The paper code's --model names, for users who know those.
PAPER_NAMES = {
    "att_p4cnn": "a_p4cnn",
    "ch_att_p4cnn": "ach_p4cnn",
    "sp_att_p4cnn": "asp_p4cnn",
    "f_att_p4cnn": "fa_p4cnn",
    "RomHog_att_p4cnn": "arh_p4cnn",
    "f_att_p4_allcnnc": "fa_p4_allcnnc",
    "f_att_p4m_allcnnc": "fa_p4m_allcnnc",
    "f_att_p4m_resnet44": "fa_p4m_resnet44",
    "f_att_p4_densenet": "fa_p4_densenet",
    # Their run_experiment.py builds a plain P4MDenseNet for this name, so the
    # released "f_att_p4m_densenet" checkpoint has no attention weights.
    "f_att_p4m_densenet": "p4m_densenet",
}

# How the paper's models expect their input (from its data-loading code).
_INPUTS = {
    # rot-MNIST .amat rows store each digit transposed; their loader normalises
    # with the training set's scalar mean/std, about 0.1307 / 0.3081.
    "rot_mnist": dict(size=28, channels=1, mean=[0.1307], std=[0.3081], transposed=True),
    "pcam": dict(size=96, channels=3, mean=[0.701, 0.538, 0.692], std=[0.235, 0.277, 0.213], transposed=False),
    "cifar10": None,  # no CIFAR-10 checkpoint was released
}

# Accuracies their training logs report (rot-MNIST checkpoints were selected on the test set).
_LOGGED_TEST_ACCURACY = {
    "z2cnn": 0.9519,
    "p4cnn": 0.9786,
    "a_p4cnn": 0.9836,
    "fa_p4cnn": 0.9834,
    "p4m_densenet": 0.8912,
}


def reference_card(arch: str, source: str = "") -> dict:
    """The model card of a checkpoint of the paper's code for architecture ``arch``."""
    info = model_info(arch)
    spec = _INPUTS.get(info.dataset)
    if spec is None:
        raise ValueError(f"the paper released no {info.dataset} checkpoint; cannot describe one for {arch}")
    card = {
        "dataset": {"rot_mnist": "rot-MNIST (Larochelle et al. 2007)", "pcam": "PatchCamelyon"}[info.dataset],
        "input": dict(spec),
        "metrics": {},
        "source": f"checkpoint released with the paper's code (dwromero/att_gconvs){': ' + source if source else ''}",
        "notes": [],
    }
    if arch in _LOGGED_TEST_ACCURACY:
        card["metrics"]["test_error_logged_by_paper_code"] = round(1 - _LOGGED_TEST_ACCURACY[arch], 4)
    if info.dataset == "rot_mnist":
        card["notes"].append(
            "Selected on the test set by the paper's code (it used the test split for validation)."
        )
        card["notes"].append(
            "Trained on digits stored transposed (the rot-MNIST .amat layout): transpose images first."
        )
    if arch == "p4m_densenet":
        card["notes"].append(
            "Released as 'f_att_p4m_densenet', but the paper's code built a plain P4MDenseNet "
            "for that name: no attention."
        )
    return card


def import_reference_checkpoint(path: str | Path, arch: str) -> Network:
    """Load a ``.pth`` of the paper's code into the registered architecture ``arch``.

    Args:
        path: the ``model.pth`` file.
        arch: our registry name (``z2cnn``, ``p4cnn``, ``a_p4cnn``, ``fa_p4cnn``,
            ``p4m_densenet``, ...) or the paper code's ``--model`` name.

    Returns:
        The network in eval mode, with its model card as ``model.card``.

    Raises:
        CheckpointError: unreadable file, not a state dict, or weights that do not fit ``arch``.
    """
    arch = PAPER_NAMES.get(arch, arch)
    model_info(arch)
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint file at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, OSError, ValueError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{path} is not a loadable PyTorch state dict ({first_line})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} does not hold a state dict of tensors")
    state = {key.removeprefix("module."): value for key, value in state.items()}
    model = build_model(arch)
    load_state(model, state, str(path))
    model.card = reference_card(arch, source=path.parent.name)
    return model.eval()
