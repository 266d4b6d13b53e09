"""The files of a run folder, written so that a kill at any moment leaves a usable folder.

``state.pt`` (everything needed to resume, loaded with ``weights_only=True``:
tensors and plain containers, never arbitrary objects), ``best.safetensors`` +
``best.json`` (the model selected on validation, a regular checkpoint),
``log.csv`` / ``log.json`` (one row per epoch) and ``curves.png``.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import torch

__all__ = ["STATE", "BEST", "atomic_write_bytes", "save_state", "load_state", "write_log"]

STATE = "state.pt"
BEST = "best.safetensors"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file, flush it to disk, then rename over ``path``: readers see old or new, never half."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def save_state(run_dir: Path, state: dict) -> None:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(run_dir / STATE, buffer.getvalue())


def load_state(run_dir: Path) -> dict:
    path = run_dir / STATE
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"nothing to resume: {path} does not exist") from None
    except Exception as err:  # torch raises many types for a damaged zip or a refused object
        raise ValueError(f"{path} is not a resumable run state ({type(err).__name__}: {err})") from None


def write_log(run_dir: Path, history: list[dict]) -> None:
    """``log.json`` and ``log.csv`` with one row per finished epoch."""
    atomic_write_bytes(run_dir / "log.json", (json.dumps(history, indent=1) + "\n").encode())
    text = io.StringIO()
    columns = list(history[0]) if history else []
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(history)
    atomic_write_bytes(run_dir / "log.csv", text.getvalue().encode())
