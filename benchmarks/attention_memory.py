"""Peak memory of a training step of the full-attention p4 All-CNN-C, against batch size.

The paper could not train its alpha-p4 All-CNN-C on CIFAR-10: it needed about
72 GB of GPU memory at batch 128 (against 5 GB for the p4 All-CNN-C), because
the straightforward attentive convolution keeps the un-summed responses of every
layer for the backward pass. This measures ``a_p4_allcnnc`` (32x32 inputs, our
default implementation) and the same network with the straightforward layers
(``full_attentive_conv_reference.py``, what the paper's code computes), each
batch size in a fresh process.

Where no GPU is at hand (as on the machines this was written on) it runs on CPU
and extrapolates to batch 128 with a least-squares line through the measured
batch sizes. Memory is the process's peak RSS above its level just before the
step. glibc keeps freed blocks of up to 32 MB in the process, so the default RSS
overstates live memory; ``--allocator live`` runs the workers with
``MALLOC_MMAP_THRESHOLD_`` fixed at 128 KiB, so that large blocks go back to the
system when freed and the peak RSS follows the peak of live tensors, the
quantity a GPU's ``max_memory_allocated`` reports. ``both`` (the default) prints
both.

Run from the repository root::

    python -m benchmarks.attention_memory
    python -m benchmarks.attention_memory --batches 2 4 8 16 --reference-batches 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.train_step import describe_failure, max_rss_mib, training_step  # noqa: E402

MODEL = "a_p4_allcnnc"
TARGET_BATCH = 128
PAPER_GB = 72.0
LIVE_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


def use_straightforward_layers(model) -> None:
    """Swap every efficient full-attention layer for the straightforward one (same parameters and maths)."""
    from models.attention import (
        AttentiveGroupConv,
        AttentiveLiftingConv,
        ReferenceAttentiveGroupConv,
        ReferenceAttentiveLiftingConv,
    )

    swap = {AttentiveLiftingConv: ReferenceAttentiveLiftingConv, AttentiveGroupConv: ReferenceAttentiveGroupConv}
    for module in model.modules():
        if type(module) in swap:
            module.__class__ = swap[type(module)]


def measure(implementation: str, batch: int, threads: int) -> dict:
    """One training step in this (fresh) process; peak RSS above the level before it."""
    import torch

    import models

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = models.build_model(MODEL).train()
    if implementation == "straightforward":
        use_straightforward_layers(model)
    x = torch.randn(batch, 3, 32, 32)
    base = max_rss_mib()
    training_step(model, x)
    return {"implementation": implementation, "batch": batch, "delta_mib": max_rss_mib() - base}


def run(implementation: str, batch: int, args, env: dict) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", implementation, str(batch),
           "--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, check=False)
    if proc.returncode != 0:
        return {"implementation": implementation, "batch": batch, "error": describe_failure(proc)}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def linear_fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of memory against batch size."""
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_m = sum(m for _, m in points) / n
    var = sum((b - mean_b) ** 2 for b, _ in points)
    slope = sum((b - mean_b) * (m - mean_m) for b, m in points) / var if var else 0.0
    return mean_m - slope * mean_b, slope


def report(implementation: str, results: list[dict]) -> float | None:
    good = [(r["batch"], r["delta_mib"]) for r in results if "error" not in r]
    for r in results:
        shown = f"{r['delta_mib']:9.0f} MiB" if "error" not in r else f"FAILED: {r['error']}"
        print(f"  {implementation:16s} batch {r['batch']:4d}: {shown}")
    if len(good) < 2:
        print(f"  {implementation:16s} too few batch sizes for a fit")
        return None
    intercept, slope = linear_fit(good)
    at_target = (intercept + slope * TARGET_BATCH) / 1024
    print(f"  {implementation:16s} fit: {intercept:.0f} MiB + {slope:.1f} MiB per sample"
          f" -> {at_target:.1f} GiB at batch {TARGET_BATCH} (extrapolated)")
    return at_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--reference-batches", type=int, nargs="*", default=[1, 2],
                        help="batch sizes for the straightforward layers (none to skip)")
    parser.add_argument("--allocator", choices=["default", "live", "both"], default="both")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", nargs=2, metavar=("IMPLEMENTATION", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.worker[0], int(args.worker[1]), args.threads)))
        return

    import torch

    device = "GPU" if torch.cuda.is_available() else "CPU"
    print(f"{MODEL}: training-step peak memory on {device} (process RSS above the level before the step), "
          f"32x32 inputs; batch {TARGET_BATCH} from a linear fit. The paper: about {PAPER_GB:.0f} GB at "
          f"batch {TARGET_BATCH} on GPU.")
    modes = ["default", "live"] if args.allocator == "both" else [args.allocator]
    for mode in modes:
        env = LIVE_ENV if mode == "live" else {}
        print(f"allocator: {mode}" + (" (MALLOC_MMAP_THRESHOLD_=131072)" if env else " (glibc default)"))
        ours = report("efficient", [run("efficient", b, args, env) for b in args.batches])
        if args.reference_batches:
            theirs = report("straightforward",
                            [run("straightforward", b, args, env) for b in args.reference_batches])
            if ours and theirs:
                print(f"  straightforward / efficient at batch {TARGET_BATCH}: {theirs / ours:.1f}x")


if __name__ == "__main__":
    main()
