"""Self-describing checkpoints: safetensors weights plus a JSON model card. Loading never unpickles.

``save_checkpoint(model, "run/p4cnn.safetensors", card)`` writes the weights,
with the card also embedded in the safetensors metadata (so a single uploaded
file describes itself), and ``run/p4cnn.json`` beside it for people to read.

The card's fields and their types are those of :mod:`models.card`, whose
:func:`~models.card.validate_card` checks every card written or read here:
``arch``, ``config``, ``group`` rebuild the network; ``input`` says how it
takes an image (``(pixels - mean) / std``, transposed first when
``transposed`` is true); ``dataset``, ``class_names``, ``metrics`` and
``equivariance_error`` describe it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file

from .arch_detection import differences, shapes_of
from .card import CheckpointError, validate_card
from .equivariance import logit_invariance_error
from .network import Network
from .registry import build_model, model_info

__all__ = ["save_checkpoint", "load_checkpoint", "CheckpointError", "card_path", "validate_card"]

CARD_KEY = "model_card"


def card_path(path: str | Path) -> Path:
    """The JSON card that sits beside a ``.safetensors`` file."""
    return Path(path).with_suffix(".json")


def save_checkpoint(model: Network, path: str | Path, card: dict | None = None) -> dict:
    """Write weights and card; returns the card as written.

    ``arch``, ``config``, ``group`` and ``parameters`` are filled in from the
    model. When the card has no ``equivariance_error`` it is measured on a
    random float64 input of the card's input size.

    Args:
        model: a registered network (``model.arch`` set).
        path: destination ``.safetensors`` file; its directory is created.
        card: the rest of the card (``input``, ``dataset``, ``metrics``, ...);
            defaults to ``model.card`` where the model carries one.
    """
    if not getattr(model, "arch", ""):
        raise ValueError("save_checkpoint needs a model built by models.build_model (model.arch is empty)")
    card = dict(card if card is not None else getattr(model, "card", {}))
    card.update(
        arch=model.arch,
        config=dataclasses.asdict(model.config),
        group=model.group.name if model.group else None,
        parameters=sum(p.numel() for p in model.parameters()),
    )
    if "equivariance_error" not in card and model.group is not None and "input" in card:
        spec = card["input"]
        x = torch.randn(2, spec["channels"], spec["size"], spec["size"], generator=torch.Generator().manual_seed(0))
        card["equivariance_error"] = {
            "max_relative_logit_error": logit_invariance_error(model, x.double()),
            "measured_on": "2 random N(0, 1) inputs, float64, every group element",
        }
    validate_card(card)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().contiguous().cpu() for name, t in model.state_dict().items()}
    text = json.dumps(card, indent=2, sort_keys=True)
    # Write to temporary names and rename, so an interrupted save never leaves half a file.
    tmp_weights, tmp_card = path.with_suffix(".safetensors.tmp"), path.with_suffix(".json.tmp")
    save_file(tensors, str(tmp_weights), metadata={CARD_KEY: text})
    tmp_card.write_text(text + "\n")
    for tmp in (tmp_weights, tmp_card):
        tmp.chmod(0o644)  # safetensors writes 0600; checkpoints are shared (e.g. read by the app's non-root user)
    tmp_weights.replace(path)
    tmp_card.replace(card_path(path))
    return card


def load_checkpoint(path: str | Path) -> tuple[Network, dict]:
    """Rebuild a network from its checkpoint. Returns ``(model in eval mode, card)``.

    The card is read from the JSON file beside the weights, or from the
    weights' metadata when there is none.

    Raises:
        CheckpointError: missing, corrupt or inconsistent files, named in the message.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint file at {path}")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path} is not a readable safetensors file ({err})") from None
    side_card = card_path(path)
    try:
        text = side_card.read_text() if side_card.is_file() else metadata.get(CARD_KEY)
        if text is None:
            raise CheckpointError(f"{path} has no model card (neither {side_card.name} nor embedded metadata)")
        card = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"the model card of {path} is not valid JSON ({err})") from None
    if not isinstance(card, dict):
        raise CheckpointError(f"the model card of {path} is not a JSON object")
    validate_card(card, f"model card of {path}")
    try:
        model_info(card["arch"])
        model = build_model(card["arch"], **card["config"])
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{path}: cannot build its architecture ({err})") from None
    group = model.group.name if model.group else None
    if card["group"] != group:
        raise CheckpointError(f"model card of {path}: group {card['group']!r}, but {card['arch']} has group {group!r}")
    load_state(model, tensors, str(path))
    return model.eval(), card


def load_state(model: torch.nn.Module, state: dict, source: str) -> None:
    """``load_state_dict(strict=True)`` with an error that lists what does not fit."""
    wrong = differences(shapes_of(model.state_dict()), shapes_of(state))
    if wrong:
        arch = getattr(model, "arch", type(model).__name__)
        raise CheckpointError(f"{source} does not fit {arch}: {wrong}")
    model.load_state_dict(state, strict=True)
