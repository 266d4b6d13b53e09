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
from pathlib import Path

import torch

from .atomic import write_atomic

__all__ = ["STATE", "BEST", "save_state", "load_state", "write_log"]

STATE = "state.pt"
BEST = "best.safetensors"


def save_state(run_dir: Path, state: dict) -> None:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_atomic(run_dir / STATE, buffer.getvalue())


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
    write_atomic(run_dir / "log.json", (json.dumps(history, indent=1) + "\n").encode())
    text = io.StringIO()
    columns = list(history[0]) if history else []
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(history)
    write_atomic(run_dir / "log.csv", text.getvalue().encode())
