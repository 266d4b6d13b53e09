"""Where a checkpoint came from: the exact command, the commit, the hardware."""

from __future__ import annotations

import hashlib
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import torch

__all__ = ["command_line", "from_scratch", "git_commit", "hardware", "on_cpu", "sha256_file"]

REPO = Path(__file__).resolve().parent.parent
TRAINING_CODE = ("models", "training")


def command_line(argv: list[str] | None = None) -> str:
    """The command as a user would retype it from the repo root."""
    argv = sys.argv[1:] if argv is None else argv
    return "python -m training " + " ".join(shlex.quote(arg) for arg in argv)


def from_scratch(command: str) -> str:
    """The command that trains the same run from scratch: ``command`` without its ``--resume`` flag and without
    a ``--time-limit`` (which cuts a call short, not the run)."""
    words, kept = iter(shlex.split(command)), []
    for word in words:
        if word == "--time-limit":
            next(words, None)
        elif word != "--resume" and not word.startswith("--time-limit="):
            kept.append(word)
    return shlex.join(kept)


def git_commit() -> str:
    """HEAD of the repo, with ``+dirty`` when the code that decides the weights differs from it.

    That code is ``models/`` and ``training/`` (untracked files there count too); edits
    elsewhere (the app, docs) do not change what a run computes. ``unknown`` outside git.
    """
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", *TRAINING_CODE], cwd=REPO,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def hardware(device: torch.device, processes: int = 1) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = _cpu_name()
        name += f", {torch.get_num_threads()} threads"
    return f"{processes} x {name}" if processes > 1 else name


def on_cpu(hardware_text: str) -> bool:
    """Whether a :func:`hardware` string names a CPU (its name and threads) rather than a GPU."""
    return hardware_text.endswith(" threads")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks: what names a checkpoint or a source image in a record."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
