"""The PCam network's bfloat16 path against float32, side by side: patches per second, and its convolutions' rates.

    python -m benchmarks.bfloat16_engine [--checkpoint PATH] [--patches 64] [--rounds 5] [--threads 1 2]
                                         [--no-amx]

Real PCam test patches (``../shared/data/pcam_public``, else the gallery's twelve, repeated) through the shipped
default in batches of the slide engine's size (:data:`app.cells.evaluation.BATCH`), the first attentive layer
traced as the engine traces it (``position_logits``), float32 and bfloat16 alternating round by round and the best
round of each kept: a machine whose speed drifts (a shared host's AMX unit does, by 2-5x over minutes here) moves
both alike. For each thread count: patches per second of each and their ratio. Then the 3x3 convolutions of the
network's shapes (batch 8) in float32, float32 channels last and bfloat16 channels last, in G multiply-adds/s, and
matrix products of 2048 x 2048 in float32 and bfloat16: the limits.

``--no-amx`` runs the same in a child process with oneDNN held to AVX512-BF16 (``ONEDNN_MAX_CPU_ISA``) and the
spatial filter on the AVX-512 loop (``AAGC_AMX=0``): what a CPU with AVX512-BF16 and no AMX (AMD Zen 4) would run,
measured on this one. Under the Makefile's AVX2 switches it measures what an AVX2-only CPU runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from app.analysis.frames import InputFrame
from app.cells.evaluation import BATCH
from benchmarks.cohort_cost import matmul_rate
from benchmarks.stain import cpu_line
from models import load_checkpoint
from models.cpu.allocator import retain_freed_memory
from models.precision import choose_precision

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"
# (input channels, output channels, input side): the DenseNet's dense layers' 3x3 convolutions, p4m, 9 channels each
CONVOLUTIONS = ((3, 72, 96), (72, 72, 94), (144, 72, 46), (216, 72, 22), (288, 72, 10))


def real_patches(count: int) -> np.ndarray:
    """``(count, 3, 96, 96)`` float32 in [0, 1]: PCam test patches, else the gallery's repeated."""
    labels = REPO.parent / "shared" / "data" / "pcam_public" / "labels.csv"
    if labels.is_file():
        rows = [line.split(",") for line in labels.read_text().splitlines()[1:]]
        files = [labels.parent / row[0] for row in rows if row[2] == "test"][:count]
    else:
        gallery = sorted((REPO / "app" / "gallery").glob("pcam_*.jpg"))
        files = [gallery[i % len(gallery)] for i in range(count)]
    images = np.stack([np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255 for path in files])
    return images.transpose(0, 3, 1, 2).copy()


def patches_per_second(model, x: torch.Tensor, rounds: int, layer: str) -> dict[str, float]:
    """The best of ``rounds`` rounds of each precision over ``x``, the precisions alternating."""
    best = {"float32": float("inf"), "bfloat16": float("inf")}
    inputs = {"float32": x, "bfloat16": x.bfloat16()}
    with torch.inference_mode():
        for batch in inputs.values():  # warm-up: filter banks made, kernels built, primitives created
            model.position_logits(batch[:BATCH], record=(layer,))
        for _ in range(rounds):
            for name, batch in inputs.items():
                started = time.perf_counter()
                for first in range(0, len(batch), BATCH):
                    model.position_logits(batch[first:first + BATCH], record=(layer,))
                best[name] = min(best[name], time.perf_counter() - started)
    return {name: len(x) / seconds for name, seconds in best.items()}


def convolution_rates(repeats: int = 5) -> list[tuple[str, dict[str, float]]]:
    """G multiply-adds/s of each of :data:`CONVOLUTIONS` (batch 8, one thread) in three forms."""
    rows = []
    with torch.inference_mode():
        for c_in, c_out, side in CONVOLUTIONS:
            x, w = torch.randn(8, c_in, side, side), torch.randn(c_out, c_in, 3, 3) * 0.1
            macs = 8 * c_out * c_in * 9 * (side - 2) ** 2
            forms = {"float32": (x, w), "float32 channels last": (x.contiguous(memory_format=torch.channels_last), w),
                     "bfloat16 channels last": (x.bfloat16().contiguous(memory_format=torch.channels_last),
                                                w.bfloat16().contiguous(memory_format=torch.channels_last))}
            rates = {}
            for name, (xx, ww) in forms.items():
                F.conv2d(xx, ww)
                best = float("inf")
                for _ in range(repeats):
                    started = time.perf_counter()
                    F.conv2d(xx, ww)
                    best = min(best, time.perf_counter() - started)
                rates[name] = macs / best / 1e9
            rows.append((f"{c_in} -> {c_out} on {side} x {side}", rates))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=CHECKPOINT)
    parser.add_argument("--patches", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--no-amx", action="store_true", help="as a CPU with AVX512-BF16 and no AMX (a child process)")
    args = parser.parse_args(argv)
    if args.no_amx:
        env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX512_CORE_BF16", AAGC_AMX="0", PYTHONPATH=str(REPO))
        command = [sys.executable, "-m", "benchmarks.bfloat16_engine", "--checkpoint", str(args.checkpoint),
                   "--patches", str(args.patches), "--rounds", str(args.rounds), "--threads", *map(str, args.threads)]
        print("oneDNN held to AVX512-BF16, the spatial filter on the AVX-512 loop (AMX unused):")
        subprocess.run(command, env=env, cwd=REPO, check=True)
        return
    retain_freed_memory()  # as the app and the slide workers run: freed pages kept, not faulted in again
    model, card = load_checkpoint(args.checkpoint)
    layer = next(name for name, module in model.named_modules() if hasattr(module, "channel_attention"))
    frame = InputFrame.from_card(card, model.group)
    x = frame.to_network(torch.from_numpy(real_patches(args.patches)))
    print(cpu_line())
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL")
    print(f"torch {torch.__version__}; {args.checkpoint.name}; {args.patches} real PCam patches in batches of {BATCH};"
          f" ONEDNN_MAX_CPU_ISA={limit}; {choose_precision('auto', model).reason}")
    print("\n| threads | float32 patches/s | bfloat16 patches/s | bfloat16 / float32 |\n|---|---|---|---|")
    before = torch.get_num_threads()
    for threads in args.threads:
        torch.set_num_threads(threads)
        rates = patches_per_second(model, x, args.rounds, layer)
        print(f"| {threads} | {rates['float32']:.1f} | {rates['bfloat16']:.1f} | "
              f"{rates['bfloat16'] / rates['float32']:.2f} |")
    torch.set_num_threads(1)
    print("\n3x3 convolutions, batch 8, one thread, G multiply-adds/s:\n")
    rows = convolution_rates()
    names = list(rows[0][1])
    print("| convolution | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    for label, rates in rows:
        print(f"| {label} | " + " | ".join(f"{rates[name]:.0f}" for name in names) + " |")
    torch.set_num_threads(before)
    print(f"\nmatrix products 2048 x 2048, one thread: float32 {matmul_rate(1) / 1e9:.0f} G/s, bfloat16 "
          f"{matmul_rate(1, dtype=torch.bfloat16) / 1e9:.0f} G/s")


if __name__ == "__main__":
    main()
