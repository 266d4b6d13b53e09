"""Compiled CPU kernels: a C++ file built with the machine's compiler on first use, cached, loaded with ctypes.

Built with ``$CXX`` (else ``g++``), about five seconds per file, into ``cache_root()`` under a hash of the
source, the flags and the CPU (``-march=native``: a cache shared with another CPU must not load it). Callers
fall back to their PyTorch path, which computes the same function, where this returns None: no compiler,
``AAGC_NATIVE=0``, or a failed build (which also warns).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

from .user_cache import cache_root

__all__ = ["build_library", "FLAGS"]

FLAGS = ["-O3", "-march=native", "-fopenmp", "-std=c++20", "-shared", "-fPIC"]


def _cpu_signature() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    return platform.machine() + flags


@functools.cache
def build_library(source: Path) -> ctypes.CDLL | None:
    """The compiled C++ file ``source``, built on first use and cached; None where it cannot be had."""
    if os.environ.get("AAGC_NATIVE", "1") == "0":
        return None
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        return None
    digest = hashlib.sha256(source.read_bytes() + " ".join([compiler, *FLAGS, _cpu_signature()]).encode())
    target = cache_root() / f"{source.stem}-{digest.hexdigest()[:16]}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            # Build beside the target and rename: concurrent first uses never load a half-written file.
            with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
                built = Path(scratch) / target.name
                subprocess.run([compiler, *FLAGS, str(source), "-o", str(built)], check=True, capture_output=True)
                os.replace(built, target)
        except (OSError, subprocess.CalledProcessError) as error:
            detail = getattr(error, "stderr", b"") or b""
            warnings.warn(
                f"could not build the kernels {source.name} ({error}; "
                f"{detail.decode(errors='replace')[-500:]}); using the slower PyTorch path",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
    return ctypes.CDLL(str(target))
