"""Which registered architecture a state dict holds, from its tensors' names and shapes alone.

A release of the paper's code is a bare state dict: nothing in the file names its architecture, and the
paper's names can mislead (its ``f_att_p4m_densenet`` is a plain p4m DenseNet). The names and shapes of a
network's parameters and buffers are its *signature*; no two registered architectures share one (a test
holds it), so the weights say which architecture they are. Should two ever coincide, every fit is returned
and the caller asks which.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch

from .card import CheckpointError
from .registry import build_model, list_models

__all__ = ["Shapes", "signature", "shapes_of", "differences", "matching_architectures", "detect_architecture"]

Shapes = dict[str, tuple[int, ...]]


@functools.cache
def _signature(arch: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    # Built once per process: all registered architectures together take about half a second.
    return tuple(sorted((key, tuple(value.shape)) for key, value in build_model(arch).state_dict().items()))


def signature(arch: str) -> Shapes:
    """Every parameter's and buffer's name in ``arch``'s state dict, with its shape."""
    return dict(_signature(arch))


def shapes_of(state: Mapping[str, torch.Tensor]) -> Shapes:
    """A state dict's names and shapes, without the ``module.`` prefix of ``nn.DataParallel``."""
    return {key.removeprefix("module."): tuple(value.shape) for key, value in state.items()}


def differences(expected: Shapes, found: Shapes, limit: int = 5) -> str:
    """What keeps ``found`` from fitting ``expected``, e.g. ``"missing ['c1.weight']; unexpected [...]"``;
    empty where they are the same. At most ``limit`` names of each kind."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    wrong = sorted(f"{key} {found[key]} != {expected[key]}" for key in set(found) & set(expected)
                   if found[key] != expected[key])
    parts = [f"{what} {names[:limit]}" for what, names in
             (("missing", missing), ("unexpected", unexpected), ("wrong shapes", wrong)) if names]
    return "; ".join(parts)


def _distance(expected: Shapes, found: Shapes) -> int:
    """How many names are missing, unexpected or of the wrong shape."""
    return len(set(expected.items()) ^ set(found.items()))


def matching_architectures(state: Mapping[str, torch.Tensor]) -> list[str]:
    """The registered architectures whose signature ``state`` has exactly, sorted (normally one, or none)."""
    shapes = tuple(sorted(shapes_of(state).items()))
    return [arch for arch in list_models() if _signature(arch) == shapes]


def detect_architecture(state: Mapping[str, torch.Tensor], source: str = "the state dict") -> list[str]:
    """Like :func:`matching_architectures`, but where none fits, an error that names the nearest and how it differs.

    Args:
        state: a state dict (``module.`` prefixes allowed).
        source: how the message names it, e.g. the uploaded file's name.

    Raises:
        CheckpointError: no registered architecture fits.
    """
    fits = matching_architectures(state)
    if fits:
        return fits
    found = shapes_of(state)
    nearest = min(list_models(), key=lambda arch: (_distance(signature(arch), found), arch))
    raise CheckpointError(f"{source} fits no registered architecture ({len(found)} tensors); the nearest, "
                          f"{nearest}: {differences(signature(nearest), found)}")
