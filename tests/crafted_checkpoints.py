"""Hostile checkpoints made by the tests themselves, small on disk: a card that describes a huge network, a card
whose weights disagree with it, and a deflate bomb. Shared by the checkpoint tests and the server's abuse test."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from models.checkpoint import CARD_DIGEST_KEY, CARD_KEY
from tests.conftest import REPO

SHIPPED_CARD = REPO / "checkpoints" / "p4cnn_rot_mnist.json"


def card_with(**config) -> dict:
    """The shipped p4cnn's card with ``config`` fields changed (and no weights digest, so the file is judged by its
    shape alone)."""
    card = json.loads(SHIPPED_CARD.read_text())
    card["config"] = {**card["config"], **config}
    card.pop("weights_sha256", None)
    return card


def card_only_checkpoint(path: Path, card: dict, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """A ``.safetensors`` file holding ``card`` embedded (and its digest) with ``tensors``, by default one tiny
    tensor: a few kilobytes that describe whatever network the card says."""
    text = json.dumps(card, indent=2, sort_keys=True)
    metadata = {CARD_KEY: text, CARD_DIGEST_KEY: hashlib.sha256(text.encode()).hexdigest()}
    save_file(tensors if tensors is not None else {"c1.weight": torch.zeros(1)}, str(path), metadata=metadata)
    return path


def deflate_bomb(path: Path, elements: int = 2**26) -> Path:
    """A real ``torch.save`` of ``elements`` float32 zeros (256 MiB by default) re-zipped with deflate: about
    0.25 MB on disk, which ``torch.load`` would inflate whole. Zeros, not ``torch.empty``: memory the allocator
    hands back for reuse (after other tests in the process) holds old values, which deflate cannot shrink; the re-zip
    streams 1 MiB at a time."""
    plain = path.with_suffix(".stored")
    torch.save({"c1.weight": torch.zeros(elements, dtype=torch.float32)}, plain)
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as out:
        for member in source.infolist():
            with source.open(member) as reading, out.open(member.filename, "w", force_zip64=True) as writing:
                while block := reading.read(2**20):
                    writing.write(block)
    plain.unlink()
    return path


def legacy_storage_bomb(path: Path, elements: int = 2**31 - 1) -> Path:
    """A ``.pth`` in PyTorch's legacy (non-zip) format, the paper's releases' format, whose pickle declares a storage
    of ``elements`` float32 (8 GiB by default) while the file holds 1,000: 4 KB on disk."""
    buffer = io.BytesIO()
    torch.save({"c1.weight": torch.zeros(1000)}, buffer, _use_new_zipfile_serialization=False)
    data = buffer.getvalue()
    declared = data.index(b"M" + (1000).to_bytes(2, "little"))  # the storage's numel, pickled as BININT2
    path.write_bytes(data[:declared] + b"J" + elements.to_bytes(4, "little") + data[declared + 3:])  # as BININT
    return path
