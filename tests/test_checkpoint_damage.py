"""Damaged checkpoints are refused: every byte-mutated copy of a shipped ``.safetensors`` either fails to load with
a message or is, provably, the same model (a JSON header whose insignificant whitespace changed); a ``.pth`` of
the paper's, which records no digest, loads only with finite weights. Weights with NaN or infinity are refused in
every format."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from conftest import REPO, release_path
from safetensors import safe_open
from safetensors.torch import save_file

from app.analysis.checkpoints import load_uploaded_checkpoint
from models import CheckpointError, load_checkpoint
from models.checkpoint import save_checkpoint, weights_digest

SHIPPED = ["a_p4cnn_rot_mnist", "fa_p4m_densenet_pcam"]
MUTATIONS = 60  # per file


def mutated(data: bytes, rng: np.random.Generator) -> tuple[bytes, int]:
    """``data`` with one byte at a random position replaced by another value; the position."""
    position = int(rng.integers(len(data)))
    copy = bytearray(data)
    copy[position] = (copy[position] + int(rng.integers(1, 256))) % 256
    return bytes(copy), position


def same_model(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return weights_digest(a.state_dict()) == weights_digest(b.state_dict())


@pytest.mark.parametrize("name", SHIPPED)
def test_every_damaged_copy_of_a_shipped_checkpoint_is_refused(name):
    data = (REPO / "checkpoints" / f"{name}.safetensors").read_bytes()
    original, card = load_checkpoint(REPO / "checkpoints" / f"{name}.safetensors")
    assert card["weights_sha256"] == weights_digest(original.state_dict()), "the shipped card records its digest"
    rng = np.random.default_rng(0)
    # Half the mutations in the header (the card's text and the tensors' offsets), half anywhere.
    header = 8 + int.from_bytes(data[:8], "little")
    refused, unchanged = 0, 0
    for index in range(MUTATIONS):
        damaged, position = mutated(data, rng) if index % 2 else mutated(data[:header], rng)
        damaged = damaged if index % 2 else damaged + data[header:]
        try:
            model, loaded_card = load_uploaded_checkpoint(damaged, f"{name}.safetensors")
        except CheckpointError as err:
            assert f"{name}.safetensors" in str(err), "the message names the file"
            refused += 1
            continue
        # Loaded: only a change JSON ignores (whitespace in the header's padding) may pass.
        assert same_model(model, original) and loaded_card == card, f"byte {position} changed the model silently"
        unchanged += 1
    assert refused + unchanged == MUTATIONS and refused >= MUTATIONS - 3


@pytest.mark.parametrize("arch", ["fa_p4cnn", "p4m_densenet"])
def test_a_damaged_release_loads_only_with_finite_weights(arch):
    data = release_path(arch).read_bytes()
    rng = np.random.default_rng(1)
    for _ in range(MUTATIONS // 2):
        damaged, position = mutated(data, rng)
        try:
            model, _ = load_uploaded_checkpoint(damaged, "model.pth")
        except CheckpointError:
            continue
        finite = all(bool(torch.isfinite(t).all()) for t in model.state_dict().values() if t.is_floating_point())
        assert finite, f"byte {position}: a model with NaN or infinite weights was loaded"


def card_without_digest(card: dict) -> dict:
    return {key: value for key, value in card.items() if key != "weights_sha256"}


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_infinite_weights_are_refused_in_every_format(bad, tmp_path):
    broken, card = load_checkpoint(REPO / "checkpoints" / "p4cnn_rot_mnist.safetensors")
    with torch.no_grad():
        next(broken.parameters()).view(-1)[0] = bad
    # Ours, saved with a matching digest: refused for the values themselves.
    save_checkpoint(broken, tmp_path / "broken.safetensors", card_without_digest(card))
    with pytest.raises(CheckpointError, match="NaN or infinite weights"):
        load_checkpoint(tmp_path / "broken.safetensors")
    # The paper's format: a state dict in a .pth, with no card and no digest.
    state = torch.load(release_path("p4cnn"), weights_only=True, map_location="cpu")
    state[next(iter(state))].view(-1)[0] = bad
    buffer = io.BytesIO()
    torch.save(state, buffer)
    with pytest.raises(CheckpointError, match="NaN or infinite weights"):
        load_uploaded_checkpoint(buffer.getvalue(), "model.pth")


def test_weights_swapped_under_a_card_are_called_damaged(tmp_path):
    model, card = load_checkpoint(REPO / "checkpoints" / "p4cnn_rot_mnist.safetensors")
    path = tmp_path / "swapped.safetensors"
    save_checkpoint(model, path, card_without_digest(card))
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    other = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    next(t for t in other.values() if t.is_floating_point()).view(-1)[0] += 1.0
    save_file(other, str(path), metadata=metadata)  # the same card and metadata, other weights
    with pytest.raises(CheckpointError, match="is damaged: its weights do not match the digest"):
        load_checkpoint(path)
