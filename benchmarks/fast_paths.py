"""The faster paths in ``models/`` beside the plain operations they replace, timed side by side in one run.

    python -m benchmarks.fast_paths [--threads 2] [--repeats 20]

Each row times the plain operation and ours on the same float32 tensor, shaped
as where the app's p4m DenseNet (batch of the 8 transforms of a 96 x 96 patch)
or the full attentive P4CNN's training step (batch 64) meets it, and prints the
median milliseconds and their ratio. Both compute the same values up to
round-off; ``tests/test_fast_paths.py`` and the layer tests check that.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.train_step import instruction_sets  # noqa: E402
from models.attention.full_attentive_conv import _MaxOverFirst  # noqa: E402
from models.attention.statistics import maximum  # noqa: E402
from models.gconv import conv2d  # noqa: E402
from models.pooling import spatial_avg_pool  # noqa: E402


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(2):  # warm-up: oneDNN primitives, allocations
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def backward_of(forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> Callable[[], object]:
    """Forward and backward of ``forward`` at ``x`` with a ones gradient."""
    leaf = x.detach().requires_grad_()

    def run():
        forward(leaf).sum().backward()
        leaf.grad = None

    return run


def first_max_by_cumsum(x: torch.Tensor, peak: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The first-maximum gradient as it was computed before: a cumulative sum of the tie mask."""
    hits = x == peak
    return (hits & (hits.cumsum(dim=0, dtype=torch.int16) == 1)) * grad


def cases() -> list[tuple[str, str, Callable[[], object], Callable[[], object]]]:
    """(what, shape, plain, ours) for every fast path."""
    torch.manual_seed(0)
    rows = []

    x = torch.randn(8, 144, 92, 92)  # the DenseNet's first transition
    w = torch.randn(144, 144, 1, 1)
    with torch.inference_mode():
        rows.append(("1x1 conv, forward", "8x144x92x92", lambda: F.conv2d(x, w), lambda: conv2d(x, w)))
    rows.append(("1x1 conv, fwd+bwd", "8x144x92x92",
                 backward_of(lambda t: F.conv2d(t, w), x), backward_of(lambda t: conv2d(t, w), x)))
    with torch.inference_mode():  # with gradients spatial_avg_pool is F.avg_pool2d
        rows.append(("2x2 avg pool, no grad", "8x144x92x92",
                     lambda: F.avg_pool2d(x, 2), lambda: spatial_avg_pool(x, 2)))

    for batch in (8, 16):  # the app's 8 transforms of a patch; region mode's 16 contexts
        planes, bank = torch.relu(torch.randn(batch, 72, 94, 94)), torch.randn(72, 72, 3, 3)  # the first dense layer
        with torch.inference_mode():
            rows.append(("3x3 conv (NNPACK), no grad", f"{batch}x72x94x94",
                         lambda planes=planes, bank=bank: F.conv2d(planes, bank),
                         lambda planes=planes, bank=bank: conv2d(planes, bank)))

    # The alpha_F spatial attention of the p4m DenseNet's first dense layer: 2 statistics x 8 orientations in,
    # 8 orientations out, 7x7 dilated by 4 (the plain operation: oneDNN on NCHW, ours through channels-last).
    stats, att_bank = torch.randn(8, 16, 94, 94), torch.randn(8, 16, 7, 7)
    with torch.inference_mode():
        rows.append(("7x7 dilated conv, no grad", "8x16x94x94",
                     lambda: F.conv2d(stats, att_bank, padding=12, dilation=4),
                     lambda: conv2d(stats, att_bank, padding=12, dilation=4)))
    big_stats = torch.randn(32, 16, 46, 46)  # a training batch's second dense block
    rows.append(("7x7 dilated conv, fwd+bwd", "32x16x46x46",
                 backward_of(lambda t: F.conv2d(t, att_bank, padding=12, dilation=4), big_stats),
                 backward_of(lambda t: conv2d(t, att_bank, padding=12, dilation=4), big_stats)))

    f = torch.randn(8, 18, 8, 92, 92)  # an alpha_F layer's input: (B, C, G, X, Y)
    channel, spatial = torch.rand(8, 18, 8, 1, 1), torch.rand(8, 1, 8, 92, 92)
    with torch.inference_mode():
        rows.append(("max over channels, no grad", "8x18x8x92x92",
                     lambda: f.max(dim=1).values, lambda: maximum(f, dim=1)))
        attended = channel * f
        rows.append(("f - s * (c f)", "8x18x8x92x92",
                     lambda: f - spatial * attended, lambda: torch.addcmul(f, spatial, attended, value=-1)))

    # A chunk of f~ of the full attentive P4CNN's second layer: (C_in, G_in, samples, filters, positions),
    # with the zeros (ties) that ReLU inputs give.
    responses = torch.relu(torch.randn(10, 4, 4, 40, 576))
    peak, grad = responses.amax(dim=0), torch.randn(4, 4, 40, 576)

    class Context:
        saved_tensors = (responses, peak)

    rows.append(("first-max gradient (channel max)", "10x4x4x40x576",
                 lambda: first_max_by_cumsum(responses, peak, grad), lambda: _MaxOverFirst.backward(Context, grad)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, float32; median ms of {args.repeats}")
    print(instruction_sets())
    print(f"{'operation':34s} {'shape':>15s} {'plain':>9s} {'ours':>9s} {'speed-up':>9s}")
    for what, shape, plain, ours in cases():
        before, after = median_ms(plain, args.repeats), median_ms(ours, args.repeats)
        print(f"{what:34s} {shape:>15s} {before:9.2f} {after:9.2f} {before / after:8.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
