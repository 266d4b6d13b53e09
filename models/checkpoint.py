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

A checkpoint knows when it is damaged: the card records ``weights_sha256``, a digest of every tensor
(:func:`weights_digest`), and the file's metadata a digest of the embedded card's text, so a changed byte of
either is refused with a message rather than loaded as other weights. Weights holding NaN or infinity are
refused in every format (:func:`load_state`, which the paper's ``.pth`` files go through too).
Loading is bounded before anything is built (:mod:`models.checkpoint_limits`): a small card cannot ask for a
network of any size, nor a header for tensors the file does not hold.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .arch_detection import differences, shapes_of
from .card import CheckpointError, validate_card
from .checkpoint_limits import check_config, check_header_fits, planned_state, read_safetensors_header
from .equivariance import logit_invariance_error
from .network import Network
from .registry import build_model

__all__ = ["save_checkpoint", "load_checkpoint", "CheckpointError", "card_path", "card_text", "validate_card",
           "weights_digest"]

CARD_KEY = "model_card"
CARD_DIGEST_KEY = "model_card_sha256"  # metadata: SHA-256 of the embedded card's text


def weights_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor in name order: its name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous().cpu()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def card_path(path: str | Path) -> Path:
    """The JSON card that sits beside a ``.safetensors`` file."""
    return Path(path).with_suffix(".json")


def card_text(card: dict) -> str:
    """A card as JSON text, as the ``.json`` beside a checkpoint holds it (the embedded card lacks the last newline);
    a copy of a card kept elsewhere (a sweep's results folder) is written the same way, byte for byte."""
    return json.dumps(card, indent=2, sort_keys=True) + "\n"


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
    tensors = {name: t.detach().contiguous().cpu() for name, t in model.state_dict().items()}
    card["weights_sha256"] = weights_digest(tensors)
    validate_card(card)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = card_text(card).removesuffix("\n")
    # Write to temporary names and rename, so an interrupted save never leaves half a file.
    tmp_weights, tmp_card = path.with_suffix(".safetensors.tmp"), path.with_suffix(".json.tmp")
    save_file(tensors, str(tmp_weights), metadata={CARD_KEY: text, CARD_DIGEST_KEY: _text_digest(text)})
    tmp_card.write_text(text + "\n")
    for tmp in (tmp_weights, tmp_card):
        tmp.chmod(0o644)  # safetensors writes 0600; checkpoints are shared (e.g. read by the app's non-root user)
    tmp_weights.replace(path)
    tmp_card.replace(card_path(path))
    return card


def load_checkpoint(path: str | Path) -> tuple[Network, dict]:
    """Rebuild a network from its checkpoint. Returns ``(model in eval mode, card)``.

    The card is read from the JSON file beside the weights, or from the
    weights' metadata when there is none. Nothing is built or read beyond the
    header until the card's config is within :mod:`models.checkpoint_limits`'
    bounds and the file's tensor table is that of the network it describes.

    Raises:
        CheckpointError: missing, corrupt, inconsistent or out-of-bounds files, named in the message.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint file at {path}")
    try:
        found, metadata = read_safetensors_header(path)  # the tensor table, checked against the file's size
    except OSError as err:
        raise CheckpointError(f"{path} is not a readable safetensors file ({err})") from None
    embedded = metadata.get(CARD_KEY)
    if embedded is not None and CARD_DIGEST_KEY in metadata and _text_digest(embedded) != metadata[CARD_DIGEST_KEY]:
        raise CheckpointError(f"{path} is damaged: its embedded model card does not match the digest stored with it")
    side_card = card_path(path)
    try:
        text = side_card.read_text() if side_card.is_file() else embedded
        if text is None:
            raise CheckpointError(f"{path} has no model card (neither {side_card.name} nor embedded metadata)")
        card = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as err:
        raise CheckpointError(f"the model card of {path} is not valid JSON ({err})") from None
    if not isinstance(card, dict):
        raise CheckpointError(f"the model card of {path} is not a JSON object")
    validate_card(card, f"model card of {path}")
    # Bounded before anything is built or read: the config's limits, the network planned on the meta device, and
    # the file's own tensor table held to it (models.checkpoint_limits).
    check_config(card, f"model card of {path}")
    planned = planned_state(card, f"model card of {path}")
    check_header_fits(found, planned, str(path), card["arch"])
    try:
        tensors = load_file(str(path))
        model = build_model(card["arch"], **card["config"])
    except (SafetensorError, OSError, ValueError, TypeError) as err:
        raise CheckpointError(f"{path} is not a readable checkpoint ({err})") from None
    except (RuntimeError, MemoryError) as err:  # within the bounds above, but more than this machine has now
        raise CheckpointError(f"{path}: its model cannot be built here ({type(err).__name__}: "
                              f"{str(err).strip()[:200]})") from None
    group = model.group.name if model.group else None
    if card["group"] != group:
        raise CheckpointError(f"model card of {path}: group {card['group']!r}, but {card['arch']} has group {group!r}")
    load_state(model, tensors, str(path))  # first: weights of another architecture are named as such
    if "weights_sha256" in card and weights_digest(tensors) != card["weights_sha256"]:
        raise CheckpointError(f"{path} is damaged: its weights do not match the digest its model card records "
                              "(weights_sha256); get the file again")
    return model.eval(), card


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def load_state(model: torch.nn.Module, state: dict, source: str) -> None:
    """``load_state_dict(strict=True)`` with an error that lists what does not fit, and none for weights that hold
    NaN or infinity (a damaged file, or a diverged run: its outputs would be NaN)."""
    wrong = differences(shapes_of(model.state_dict()), shapes_of(state))
    if wrong:
        arch = getattr(model, "arch", type(model).__name__)
        raise CheckpointError(f"{source} does not fit {arch}: {wrong}")
    broken = [name for name, t in state.items()
              if torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if broken:
        raise CheckpointError(f"{source} holds NaN or infinite weights ({', '.join(broken[:3])}"
                              f"{', ...' if len(broken) > 3 else ''}): damaged, or from a run that diverged")
    model.load_state_dict(state, strict=True)
