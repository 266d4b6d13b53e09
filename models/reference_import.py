"""Import the checkpoints released with the paper's code (github dwromero/att_gconvs).

Their ``.pth`` files are plain state dicts whose names our architectures share
(``c1.weight``, ``c2.channel_attention.weight_fc1``, ``bn1.running_mean``, ...),
with a ``module.`` prefix where the model was wrapped in ``nn.DataParallel``;
the names and shapes alone say which architecture a file holds
(:mod:`models.arch_detection`).
They are read with ``torch.load(weights_only=True)``, which refuses arbitrary
pickled objects.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from .arch_detection import detect_architecture
from .card import validate_card
from .checkpoint import CheckpointError, load_state
from .checkpoint_limits import check_pth_archive
from .network import Network
from .registry import build_model, model_info

__all__ = ["import_reference_checkpoint", "read_state_dict", "reference_card", "PAPER_NAMES", "PAPER_LOG_NOTE",
           "RELEASE_SOURCE"]

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

# The data the paper's code trained on, named as our cards name theirs; the class names are ours, so that a
# release and our model of the same data label their predictions alike.
_DATASETS = {
    "rot_mnist": dict(
        name="rot_mnist",
        source="rot-MNIST (Larochelle et al. 2007): 12,000 train+valid and 50,000 test MNIST digits, each rotated "
               "by a uniform random angle, read by the paper's code from the original .amat files",
        notes="the paper's code validated on the test split",
        class_names=[str(digit) for digit in range(10)],
    ),
    "pcam": dict(
        name="pcam",
        source="PatchCamelyon (Veeling et al. 2018): 96 x 96 H&E patches of lymph node sections, read by the "
               "paper's code from PCam's HDF5 files",
        notes="label: tumour tissue in the central 32x32 pixels",
        class_names=["no_tumor", "tumor"],
    ),
}

# Accuracies their training logs report (rot-MNIST checkpoints were selected on the test set).
_LOGGED_TEST_ACCURACY = {
    "z2cnn": 0.9519,
    "p4cnn": 0.9786,
    "a_p4cnn": 0.9836,
    "fa_p4cnn": 0.9834,
    "p4m_densenet": 0.8912,
}

# How a release's card begins its ``source``: the app tells the paper's checkpoints from ours by it.
RELEASE_SOURCE = "checkpoint released with the paper's code (dwromero/att_gconvs)"
PAPER_LOG_NOTE = ("metrics.paper_logged_test_error is the test error the paper's training log reports for this "
                  "release, not one measured by this project")


def reference_card(arch: str, source: str = "") -> dict:
    """The model card of a checkpoint of the paper's code for architecture ``arch``.

    The card has the fields and types of one of ours (:mod:`models.card`) and passes the same validator; the
    figure of the paper's log is ``metrics["paper_logged_test_error"]``, never ``test_error`` (which we
    measured), and its notes say how it was selected.

    Args:
        arch: our registry name (``p4m_densenet`` for the release called ``f_att_p4m_densenet``).
        source: where the checkpoint came from (its folder's name), for the card's ``source``.

    Raises:
        ValueError: an architecture of a dataset the paper released no checkpoint for.
    """
    info = model_info(arch)
    spec = _INPUTS.get(info.dataset)
    if spec is None:
        raise ValueError(f"the paper released no {info.dataset} checkpoint; cannot describe one for {arch}")
    model = build_model(arch)
    dataset = _DATASETS[info.dataset]
    card = {
        "arch": arch,
        "config": dataclasses.asdict(model.config),
        "group": model.group.name if model.group else None,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dataset": {**dataset, "class_names": list(dataset["class_names"])},
        "class_names": list(dataset["class_names"]),
        "input": {**spec, "mean": list(spec["mean"]), "std": list(spec["std"])},
        "metrics": {},
        "equivariance_error": None,  # not measured on import: the app's proof measures it on every image
        "source": RELEASE_SOURCE + (f": {source}" if source else ""),
        "notes": [],
    }
    if arch in _LOGGED_TEST_ACCURACY:
        card["metrics"]["paper_logged_test_error"] = round(1 - _LOGGED_TEST_ACCURACY[arch], 4)
        card["notes"].append(PAPER_LOG_NOTE + ".")
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
    validate_card(card, f"model card of the paper's {arch}")
    return card


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.pth`` state dict, ``module.`` prefixes removed; nothing but tensors is unpickled.

    Raises:
        CheckpointError: no such file, a zip that would inflate beyond
            :data:`models.checkpoint_limits.MAX_PTH_BYTES`, unreadable, or not a state dict of tensors.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint file at {path}")
    check_pth_archive(path)  # a zip that would inflate beyond the bounds is refused before torch.load inflates it
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        # Untrusted bytes: torch's restricted unpickler raises UnpicklingError, IndexError, KeyError, ... on junk,
        # and any of them means the file is not a state dict it can read.
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{path} is not a loadable PyTorch state dict ({first_line})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} does not hold a state dict of tensors")
    return {key.removeprefix("module."): value for key, value in state.items()}


def import_reference_checkpoint(path: str | Path, arch: str | None = None) -> Network:
    """Load a ``.pth`` of the paper's code into a registered architecture.

    Args:
        path: the ``model.pth`` file.
        arch: our registry name (``z2cnn``, ``p4cnn``, ``a_p4cnn``, ``fa_p4cnn``,
            ``p4m_densenet``, ...) or the paper code's ``--model`` name; None: the one
            architecture its weights fit (:mod:`models.arch_detection`).

    Returns:
        The network in eval mode, with its model card as ``model.card``.

    Raises:
        CheckpointError: unreadable file, not a state dict, weights that do not fit ``arch`` (or, without
            ``arch``, fit no registered architecture, or several).
    """
    if arch is not None:
        arch = PAPER_NAMES.get(arch, arch)
        model_info(arch)
    path = Path(path)
    state = read_state_dict(path)
    if arch is None:
        fits = detect_architecture(state, str(path))
        if len(fits) > 1:
            raise CheckpointError(f"{path} fits {len(fits)} architectures ({', '.join(fits)}): name one")
        arch = fits[0]
    model = build_model(arch)
    load_state(model, state, str(path))
    model.card = reference_card(arch, source=path.parent.name)
    return model.eval()
