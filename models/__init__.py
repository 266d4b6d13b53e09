"""Attentive group equivariant CNNs (Romero, Bekkers, Tomczak, Hoogendoorn, ICML 2020) in PyTorch.

Conventions: images ``(B, C, X, Y)``; group feature maps ``(B, C, G, X, Y)``
with G = 4 (p4) or 8 (p4m), elements ordered as in :mod:`models.groups`.
"""

from . import architectures  # noqa: F401  (registers the architectures)
from .groups import P4, P4M, Group, get_group
from .network import Network, Trace
from .registry import build_model, list_models, model_info

__all__ = [
    "Group",
    "Network",
    "P4",
    "P4M",
    "Trace",
    "build_model",
    "get_group",
    "list_models",
    "model_info",
]

from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint  # noqa: E402
from .reference_import import import_reference_checkpoint  # noqa: E402

__all__ += ["CheckpointError", "import_reference_checkpoint", "load_checkpoint", "save_checkpoint"]
