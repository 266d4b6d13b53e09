"""Where a slide chunk's evaluation spends its time, against the machine's matrix-product rate in its precision.

    python -m benchmarks.engine_profile [--slide PATH] [--threads 1] [--top 14] [--precision float32|bfloat16]

The CMU demo slide's chunk with the most tissue through the shipped default, on ``--threads`` threads (a Dask worker
runs one per task), in this process, exactly as a worker evaluates it (``app.slides.run.chunk_task``): one warm-up,
then ``--repeats`` evaluations timed (the best kept), then one under ``torch.profiler``, by operator (self CPU time,
the operators' own, their children's left out). The rate in multiply-adds per second (the cell's nominal count,
``benchmarks.cohort_cost.macs_per_cell``: direct convolutions on the plain PyTorch path) is printed against float32
matrix products on as many threads in the same run, so the ratio is measured side by side; with ``--precision
bfloat16`` the chunk runs the network's bfloat16 path (:mod:`models.precision`) and the limit is bfloat16 matrix
products (AMX's where the CPU has it), the count of multiply-adds the same. The bfloat16 kernels between the
convolutions are listed by name (``aagc::...``). On an AVX-512 machine run it under the Makefile's AVX2 switches as
well (its ``AVX2_ONLY`` variables before the command).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from app.slides.run import chunk_task, plan_slide

from .cohort_cost import _fullest_chunk, macs_per_cell, matmul_rate
from .stain import cpu_line

REPO = Path(__file__).resolve().parents[1]
SLIDE = REPO.parent / "shared" / "data" / "slides" / "CMU-1-Small-Region.svs"
CHECKPOINT = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"


def family(name: str) -> str:
    """What an operator is part of, for the summary: the convolutions by their library, the rest by kind."""
    if "nnpack" in name:
        return "convolution, NNPACK (Winograd)"
    if "mkldnn" in name or "onednn" in name or name in ("aten::convolution", "aten::_convolution", "aten::conv2d"):
        return "convolution, oneDNN"
    if name == "aagc::bf16_relu_bn":
        return "batch norm and ReLU, the project's bfloat16 kernel"
    if name.startswith("aagc::") and "spatial_conv" in name:
        return "spatial attention filter, the project's bfloat16 kernels"
    if "aagc" in name or "attention" in name.lower():
        return "attention, the project's kernels"
    if name in ("aten::mm", "aten::bmm", "aten::addmm", "aten::matmul", "aten::linear", "aten::einsum"):
        return "matrix products"
    if name.startswith("aten::") and any(word in name for word in ("batch_norm", "relu", "sigmoid", "mul", "add",
                                                                   "div", "sub", "exp", "clamp", "threshold")):
        return "element-wise (norm, activations, products)"
    if name.startswith("aten::") and any(word in name for word in ("pool", "mean", "sum", "amax", "max")):
        return "pooling and reductions"
    if name.startswith("aten::") and any(word in name for word in ("cat", "copy", "clone", "contiguous", "stack",
                                                                   "empty", "zeros", "flip", "rot90", "permute",
                                                                   "index", "roll", "as_strided", "pad")):
        return "copies and layout"
    return "other (reading, resampling, Python)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slide", type=Path, default=SLIDE)
    parser.add_argument("--checkpoint", type=Path, default=CHECKPOINT)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=14, help="operators listed")
    parser.add_argument("--precision", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as store:
        plan = plan_slide(args.slide, args.checkpoint, Path(store), precision=args.precision)
    index = _fullest_chunk(plan)

    def evaluate():
        return chunk_task(str(plan.slide), plan.scale.microns_per_pixel, str(plan.checkpoint), plan.grid.chunk,
                          *index, precision=args.precision)

    cells = int(evaluate().evaluated.sum())  # the warm-up: the model loaded, the fast paths chosen
    best = float("inf")
    for _ in range(args.repeats):
        started = time.perf_counter()
        evaluate()
        best = min(best, time.perf_counter() - started)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        started = time.perf_counter()
        evaluate()
        profiled_s = time.perf_counter() - started
    macs = macs_per_cell(args.slide, args.checkpoint, None, None)["macs_per_cell"]
    dtype = torch.bfloat16 if args.precision == "bfloat16" else torch.float32
    peak = matmul_rate(args.threads, dtype=dtype)
    rate = cells * macs / best
    print(cpu_line())
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.precision}; {args.slide.name}, chunk {index}: "
          f"{cells} cells")
    print(f"evaluation: best of {args.repeats} {best:.3f} s = {cells / best:.2f} cells/s = {rate / 1e9:.1f} G "
          f"multiply-adds/s ({macs / 1e9:.3f} G a cell); {args.precision} matrix products {peak / 1e9:.1f} G/s: "
          f"{100 * rate / peak:.0f} % of it")
    events = [e for e in profile.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    print(f"\nprofiled evaluation {profiled_s:.3f} s (the profiler's own cost included); self CPU time by kind:\n")
    print("| kind | self CPU | share |\n|---|---|---|")
    kinds = defaultdict(float)
    for e in events:
        kinds[family(e.key)] += e.self_cpu_time_total
    for kind, us in sorted(kinds.items(), key=lambda item: -item[1]):
        print(f"| {kind} | {us / 1e6:.3f} s | {100 * us / total:.1f} % |")
    print(f"\nthe {args.top} operators with the most self CPU time:\n")
    print("| operator | calls | self CPU | share |\n|---|---|---|---|")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:args.top]:
        print(f"| `{e.key}` | {e.count} | {e.self_cpu_time_total / 1e6:.3f} s | "
              f"{100 * e.self_cpu_time_total / total:.1f} % |")


if __name__ == "__main__":
    main()
