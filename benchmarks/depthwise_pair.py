"""The spatial attention's 7x7 depthwise pair: this tree's kernels against a baseline commit's, side by side in one run.

    python -m benchmarks.depthwise_pair --baseline aaae5e4~1 [--rounds 7] [--threads 1]

The pair (``models.cpu.attention_kernels.depthwise_pair``: z = w1 * S + w2 * M) runs twice in every training
step of the fully attentive networks (forward, and again where the backward pass recomputes the branch), on
maps of H * Q channels. Both builds of ``attention_kernels.cpp`` (this tree's, and the baseline's, taken with
``git show``) are loaded into one process and timed in alternation, round after round, on a_p4cnn's layer
shapes; the minimum over rounds is kept, so that a busy neighbour on a shared host slows both alike. Prints,
per shape, the forward and the forward plus backward (the input and weight gradients) of each build and the
ratio baseline / this tree (above 1: this tree is faster), under the instruction set of the header: set
``AAGC_NATIVE_MARCH=x86-64-v3`` to time the AVX2 build on an AVX-512 machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks.train_step import instruction_sets  # noqa: E402
from models.cpu import attention_kernels  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# (B, H * Q, X, Y): a_p4cnn's lifting layer, its second layer, and a layer after the pooling (batch 64 / 4 for
# the two large ones, so that a round stays short).
SHAPES = [(16, 40, 26, 26), (16, 160, 24, 24), (64, 160, 8, 8)]
K = 7


def baseline_source(commit: str, folder: Path) -> Path:
    """The commit's ``attention_kernels.cpp`` under ``folder`` (the build looks its rule up by file name)."""
    path = folder / attention_kernels.SOURCE.name
    relative = attention_kernels.SOURCE.relative_to(REPO).as_posix()
    path.write_bytes(subprocess.run(["git", "show", f"{commit}:{relative}"], cwd=REPO, check=True,
                                    capture_output=True).stdout)
    return path


def passes(shape: tuple[int, ...]) -> dict:
    """The forward pass, and forward plus backward, of the pair on random maps of ``shape``."""
    generator = torch.Generator().manual_seed(0)
    maps = [torch.randn(shape, generator=generator).contiguous(memory_format=torch.channels_last).requires_grad_()
            for _ in range(2)]
    weights = [torch.randn(shape[1], K, K, generator=generator, requires_grad=True) for _ in range(2)]
    upstream = torch.randn(shape, generator=generator).contiguous(memory_format=torch.channels_last)

    def forward() -> None:
        with torch.no_grad():
            attention_kernels.depthwise_pair(*maps, *weights, K // 2, 1)

    def both() -> None:
        attention_kernels.depthwise_pair(*maps, *weights, K // 2, 1).backward(upstream)

    return {"forward": forward, "forward + backward": both}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="commit whose attention_kernels.cpp is the baseline")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if attention_kernels._library() is None:
        sys.exit("the attention kernels are not built or not used on this machine (models.cpu.native_build)")
    with tempfile.TemporaryDirectory() as scratch:
        builds = {"baseline": baseline_source(args.baseline, Path(scratch)), "this tree": attention_kernels.SOURCE}
        cases = {shape: passes(shape) for shape in SHAPES}
        best: dict[tuple, float] = {}
        for _ in range(args.rounds):
            for build, source in builds.items():
                attention_kernels.SOURCE = source  # _library() builds (once) and loads the file named here
                for shape, timed in cases.items():
                    for name, run in timed.items():
                        run()  # the build's first call, or a cache warmed by the other build
                        start = time.perf_counter()
                        run()
                        key = (shape, name, build)
                        best[key] = min(best.get(key, float("inf")), time.perf_counter() - start)
        attention_kernels.SOURCE = builds["this tree"]
    print(f"{instruction_sets()} | threads {args.threads} | k {K} | min of {args.rounds} alternating rounds | "
          f"baseline {args.baseline}")
    print(f"{'maps (B, HQ, X, Y)':<22}{'pass':<20}{'baseline ms':>12}{'this tree ms':>14}{'ratio':>8}")
    for shape in SHAPES:
        for name in ("forward", "forward + backward"):
            before, after = (best[(shape, name, build)] * 1e3 for build in ("baseline", "this tree"))
            print(f"{str(shape):<22}{name:<20}{before:>12.2f}{after:>14.2f}{before / after:>8.2f}")


if __name__ == "__main__":
    main()
