"""Compiled CPU kernels: a C++ file built with the machine's compiler on first use, cached, loaded with ctypes.

Built with ``$CXX`` (else ``g++``), about five seconds per file, into ``cache_root()`` under a hash of the
source, the flags and the CPU (``-march=native``: a cache shared with another CPU must not load it). Callers
fall back to their PyTorch path, which computes the same function, where this returns None: no compiler,
``AAGC_NATIVE=0``, a failed build (which also warns), or an instruction set on which the kernels were not
measured faster than PyTorch's own path (:data:`FASTER_THAN_PYTORCH`; ``AAGC_NATIVE=1`` uses them anyway).
``AAGC_NATIVE_MARCH`` builds for another target than the machine's (``x86-64-v3``: AVX2 code, measurable on an
AVX-512 machine).
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

__all__ = ["build_library", "instruction_set", "kernels_wanted", "FASTER_THAN_PYTORCH", "FLAGS"]

FLAGS = ["-O3", "-fopenmp", "-std=c++20", "-shared", "-fPIC"]


# The instruction sets on which each kernel file was measured faster than PyTorch's path on the same CPU
# (docs/speed.md, one table per instruction set; benchmarks.train_step and benchmarks.densenet_step print both
# paths side by side). Elsewhere (ARM, x86 without AVX2: not measured) PyTorch's path runs, so that the default
# is never slower than it.
FASTER_THAN_PYTORCH: dict[str, frozenset[str]] = {
    "attention_kernels.cpp": frozenset({"avx512", "avx2"}),
    # 1.99x the layers' fallback on a bfloat16 input on AVX-512 (which attends in float32 and goes on in float32).
    # On AVX2 they run only where bfloat16 is asked (models.precision: auto keeps float32), so that it really runs.
    "bfloat16_kernels.cpp": frozenset({"avx512", "avx2"}),
    "input_attention_kernels.cpp": frozenset({"avx512", "avx2"}),
    "relu_bn_kernels.cpp": frozenset({"avx512", "avx2"}),
}

# Files whose loops gain from 512-bit vectors where the CPU has them (GCC builds for -march=native with 256-bit
# ones by default on AVX-512 CPUs): the bfloat16 kernels' spatial filter ran at 51 G multiply-adds/s with 256-bit
# vectors on a Sapphire Rapids core (benchmarks.bfloat16_engine).
WIDE_VECTORS: dict[str, list[str]] = {"bfloat16_kernels.cpp": ["-mprefer-vector-width=512"]}

# The compiler's predefined macros that name a vector instruction set, widest first.
_INSTRUCTION_SETS = [("__AVX512F__", "avx512"), ("__AVX2__", "avx2"), ("__AVX__", "avx"), ("__ARM_NEON", "neon"),
                     ("__SSE2__", "sse2")]


def _march(march: str | None) -> str:
    return march or os.environ.get("AAGC_NATIVE_MARCH") or "native"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++"))


def instruction_set(march: str | None = None) -> str:
    """The vector instruction set that code built for ``-march=march`` (default: this machine) uses.

    One of ``avx512``, ``avx2``, ``avx``, ``neon``, ``sse2``, ``scalar``; ``none`` where no compiler is found, it
    does not run or it refuses the target.
    """
    compiler = _compiler()
    return "none" if compiler is None else _instruction_set(compiler, _march(march))


@functools.cache
def _instruction_set(compiler: str, march: str) -> str:
    try:
        macros = subprocess.run([compiler, f"-march={march}", "-dM", "-E", "-x", "c++", os.devnull],
                                check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "none"
    defined = {line.split()[1] for line in macros.splitlines() if line.startswith("#define ")}
    return next((name for macro, name in _INSTRUCTION_SETS if macro in defined), "scalar")


def kernels_wanted(source: Path, isa: str) -> bool:
    """Whether ``source``'s kernels built for ``isa`` are to be used: ``AAGC_NATIVE`` (0: never, 1: always), else
    where they were measured faster than PyTorch (:data:`FASTER_THAN_PYTORCH`)."""
    choice = os.environ.get("AAGC_NATIVE", "auto")
    if choice in ("0", "1"):
        return choice == "1"
    return isa in FASTER_THAN_PYTORCH.get(source.name, frozenset())


def _cpu_signature() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    return platform.machine() + flags


def _warn_no_build(source: Path, reason: str) -> None:
    warnings.warn(f"could not build the kernels {source.name} ({reason}); using the slower PyTorch path",
                  RuntimeWarning, stacklevel=3)


@functools.cache
def build_library(source: Path, march: str | None = None) -> ctypes.CDLL | None:
    """The compiled C++ file ``source``, built on first use and cached; None where it cannot be had or is not wanted.

    ``march``: the target (``-march``), by default ``$AAGC_NATIVE_MARCH`` or this machine.
    """
    compiler = _compiler()
    if compiler is None or os.environ.get("AAGC_NATIVE") == "0":
        return None
    flags = [*FLAGS, f"-march={_march(march)}"]
    isa = _instruction_set(compiler, _march(march))
    flags += WIDE_VECTORS.get(source.name, []) if isa == "avx512" else []
    if isa == "none":
        _warn_no_build(source, f"{compiler} {flags[-1]} does not run")
        return None
    if not kernels_wanted(source, isa):
        return None
    digest = hashlib.sha256(source.read_bytes() + " ".join([compiler, *flags, _cpu_signature()]).encode())
    target = cache_root() / f"{source.stem}-{digest.hexdigest()[:16]}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            # Build beside the target and rename: concurrent first uses never load a half-written file.
            with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
                built = Path(scratch) / target.name
                subprocess.run([compiler, *flags, str(source), "-o", str(built)], check=True, capture_output=True)
                os.replace(built, target)
        except (OSError, subprocess.CalledProcessError) as error:
            detail = getattr(error, "stderr", b"") or b""
            _warn_no_build(source, f"{error}; {detail.decode(errors='replace')[-500:]}")
            return None
    return ctypes.CDLL(str(target))
