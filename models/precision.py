"""Which precision a network runs in: float32, the exact path, or bfloat16 where the CPU computes it natively.

float32 (and float64 in the checks) is the path every proof of equivariance and every comparison with the paper's
code uses. bfloat16 is the fast path of a CPU with native bfloat16 products: a network is run in bfloat16 by giving
it a bfloat16 input, and its layers then convolve through oneDNN in bfloat16 channels last and attend through
:mod:`models.cpu.bfloat16_kernels`, with every statistic summed in float32 (the model's weights stay float32, so one
model serves both precisions). The PCam models were trained with their convolutions in bfloat16 (their cards'
``training.config.precision``), so it is the precision they were fitted in, not only a faster one.

``auto`` picks bfloat16 only where it was measured faster than float32 on the same CPU (``python -m
benchmarks.bfloat16_engine``): with AMX-BF16 (Intel Sapphire Rapids and later). Without native bfloat16 (AVX2-only
CPUs) PyTorch emulates it, many times slower, so ``auto`` keeps float32 there; so it does where oneDNN is limited
below those instructions (``ONEDNN_MAX_CPU_ISA``, as the Makefile's AVX2 switches set), where the kernels cannot be
built, and for a network with a layer the bfloat16 path does not cover.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .cpu import bfloat16_kernels

__all__ = ["PRECISIONS", "DTYPES", "Precision", "choose_precision", "cpu_flags", "native_bfloat16", "bfloat16_covers"]

PRECISIONS = ("auto", "float32", "bfloat16")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # the network's input dtype per precision

# The bfloat16 instructions, by /proc/cpuinfo's flag, and the oneDNN ISA limits below which oneDNN does not use them.
_NAMES = {"amx_bf16": "AMX-BF16", "avx512_bf16": "AVX512-BF16"}
_ONEDNN_BELOW = {
    "avx512_bf16": {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"},
    "amx_bf16": {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
                 "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512"},
}
# Where bfloat16 was measured faster than float32 for the PCam DenseNets (docs/slides.md, benchmarks.bfloat16_engine):
# only with AMX. With AVX512-BF16 alone (AMX switched off on the same Xeon) it was slower.
MEASURED_FASTER = ("amx_bf16",)


@dataclass(frozen=True)
class Precision:
    """The precision a run uses and why, in a sentence for the user.

    Attributes:
        name: ``"float32"`` or ``"bfloat16"``: what stores, summaries and exports record.
        reason: why it was chosen (what the CPU has, what was asked).
    """

    name: str
    reason: str

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.name]


@functools.cache
def _proc_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith(("flags", "Features"))), "")
    return frozenset(line.partition(":")[2].split())


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as Linux reports them (empty where /proc/cpuinfo cannot be read)."""
    return _proc_flags()


def native_bfloat16(flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """The native bfloat16 instructions among ``flags`` (default: this CPU's) that oneDNN may use here, widest
    first: ``("amx_bf16", "avx512_bf16")`` on a Sapphire Rapids Xeon, ``("avx512_bf16",)`` on AMD Zen 4, ``()`` on
    an AVX2-only CPU or under ``ONEDNN_MAX_CPU_ISA`` below them."""
    flags = cpu_flags() if flags is None else flags
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "ALL")).upper()
    return tuple(flag for flag in ("amx_bf16", "avx512_bf16") if flag in flags and limit not in _ONEDNN_BELOW[flag])


def bfloat16_covers(model: nn.Module) -> bool:
    """Whether every layer of ``model`` has a bfloat16 path: no attention, or alpha_F with statistics (the PCam
    networks); full attention (the rotated-MNIST networks) has none."""
    from .attention import InputChannelAttention, InputSpatialAttention  # the attention modules import this package
    from .attention.parts import AttentiveLayer

    def covered(layer: AttentiveLayer) -> bool:
        spatial = layer.spatial_attention
        return (isinstance(layer.channel_attention, InputChannelAttention)
                and isinstance(spatial, InputSpatialAttention) and spatial.statistics)

    return all(covered(module) for module in model.modules() if isinstance(module, AttentiveLayer))


def choose_precision(requested: str = "auto", model: nn.Module | None = None,
                     flags: frozenset[str] | None = None) -> Precision:
    """The precision to run ``model`` in on this CPU (or one with ``flags``), for a request of :data:`PRECISIONS`.

    ``bfloat16`` asked on a CPU without native bfloat16 runs, emulated, and the reason says that it is slow; asked
    for a network it does not cover, or where its kernels cannot be built (its layers would then attend in float32
    and go on in float32), float32 runs and the reason says why: the name is always what ran.

    Raises:
        ValueError: ``requested`` is not one of :data:`PRECISIONS`.
    """
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {requested!r}")
    if requested == "float32":
        return Precision("float32", "float32 as asked: the exact path")
    native = native_bfloat16(flags)
    covered = model is None or bfloat16_covers(model)
    if requested == "bfloat16":
        if not covered:
            return Precision("float32", "bfloat16 was asked, but this network has layers without a bfloat16 path "
                                        "(full attention): float32 ran")
        if not bfloat16_kernels.available():  # the layers would attend in float32 and go on in float32
            return Precision("float32", "bfloat16 was asked, but its kernels cannot be built here (no C++ compiler, "
                                        "or AAGC_NATIVE=0): float32 ran")
        if not native:
            return Precision("bfloat16", "bfloat16 as asked, but this CPU has no native bfloat16 (neither AMX-BF16 "
                                         "nor AVX512-BF16): it is emulated, several times slower than float32")
        return Precision("bfloat16", f"bfloat16 as asked, on the CPU's {_NAMES[native[0]]}")
    fast = [flag for flag in native if flag in MEASURED_FASTER]
    if fast and covered and bfloat16_kernels.available():
        return Precision("bfloat16", f"auto: this CPU has {_NAMES[fast[0]]}, where bfloat16 was measured several "
                                     "times faster than float32 for this network")
    if not covered:
        return Precision("float32", "auto: this network has layers without a bfloat16 path: float32, the exact path")
    if native:
        return Precision("float32", f"auto: this CPU's {_NAMES[native[0]]} without AMX was not measured faster than "
                                    "float32: float32, the exact path")
    return Precision("float32", "auto: this CPU has no native bfloat16: float32, the exact path")
