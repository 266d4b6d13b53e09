"""``python -m training.timed_sweep``: several PCam runs side by side on one GPU, each fitted to a wall-clock budget.

    python -m training.timed_sweep --data-dir DIR --runs-dir DIR --budget-s 480 --pack OUT/sweep.tar

Why: a lent GPU comes for minutes, not hours, and one fa_p4m_densenet run keeps an H100-class chip mostly idle
(its step is a few thousand small kernels, bound by Python's dispatch on one core). So the runs of
:data:`RUNS` train at once, one process each, and each gets a cosine schedule as long as the budget allows:

1. calibrate: every run's training step (batch, augmentation, precision as it will train) is timed on
   synthetic patches, all runs at once so that each sees the others' load, while the decoded PCam cache is
   built once (so that the runs do not decode 34,673 JPEGs four times over);
2. train: ``python -m training train pcam_public`` per run, ``--epochs`` = the epochs that fit the time left;
3. pack: whatever each run left (its selected checkpoint and card, log, state) into one tar, also when a run
   had to be stopped at the deadline (its checkpoint is then the best so far, its card provisional).

Each run is an ordinary training run (seeded, resumable, its card naming the command), so any of them can be
continued or repeated anywhere with ``--resume``. ``python -m tools.device_chunks`` stages the data for the
machine (the device tool does not send ``../shared``).

What :data:`RUNS` gave on an H200 (2026-11-27, docs/pathology.md; then with ``--ema 0.999`` in :data:`COMMON`):
a step of 118 ms alone, 320 ms with four at once (1.5x the throughput of one), so 9 epochs each in 8 minutes;
none beat the shipped model on validation.
Its in-run validation of the moving average was wrong then (a stale filter bank: ``models.gconv.
forget_filter_banks``, now called before every evaluation), and the average's weights, measured afterwards, were
worse than the last ones in every run: EMA is not worth keeping at these lengths.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import torch

from .data.base import DataError
from .data.pcam_public import read_labels

# name -> extra arguments of ``python -m training train pcam_public`` (the preset gives the rest: Adam,
# weight decay 1e-4, batch 64, epochs of 7,456 draws, selection on validation NLL, a cosine schedule).
RUNS: dict[str, list[str]] = {
    # the shipped model, one long cycle more, from its own weights
    "fa_cont_lr2.5e-4": ["--init-from", "checkpoints/fa_p4m_densenet_pcam.safetensors", "--lr", "2.5e-4",
                         "--augment", "group_stain_jpeg"],
    # the same with a larger restart
    "fa_cont_lr1e-3": ["--init-from", "checkpoints/fa_p4m_densenet_pcam.safetensors", "--lr", "1e-3",
                       "--augment", "group_stain_jpeg"],
    # the same with twice the stain jitter (the test split's tumours are the ones missed: a shift of stain?)
    "fa_cont_strong": ["--init-from", "checkpoints/fa_p4m_densenet_pcam.safetensors", "--lr", "5e-4",
                       "--augment", "group_stain_strong"],
    # the attentive model from the shipped p4m_densenet (attention starting as the identity), in one long cycle
    "fa_from_p4m": ["--init-from", "checkpoints/p4m_densenet_pcam.safetensors", "--lr", "1e-3",
                    "--augment", "group_stain_jpeg"],
}
COMMON = ["--model", "fa_p4m_densenet", "--precision", "bf16"]
MAX_EPOCHS = 200


def step_seconds(extra: list[str], steps: int, device: str) -> float:
    """Seconds of one training step of the run with these arguments, on synthetic patches (after warm-up)."""
    from models import build_model

    from .cli import build_parser, config_from_args
    from .data.base import ArraySplit
    from .distributed import setup
    from .evaluation import Normaliser
    from .loop import build_optimizer, train_one_epoch

    cfg = config_from_args(build_parser().parse_args(["train", "pcam_public", *COMMON, *extra]))
    cfg = dataclasses.replace(cfg, init_from=None, epoch_size=0)
    ctx = setup(device)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (cfg.batch_size * (steps + 5), 3, 96, 96), dtype=np.uint8)
    split = ArraySplit(images, rng.integers(0, 2, len(images)))
    model = build_model(cfg.model).to(ctx.device)
    optimizer = build_optimizer(cfg, model)
    normalise = Normaliser((0.5,) * 3, (0.25,) * 3, ctx.device)
    train_one_epoch(model, optimizer, split, normalise, cfg, ctx, 0, max_steps=5)  # warm-up
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    done = train_one_epoch(model, optimizer, split, normalise, cfg, ctx, 1, max_steps=steps)["steps"]
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / done


def _calibrate(names: list[str], steps: int, device: str, threads: int) -> dict[str, float]:
    """Each run's step time, measured with all of them stepping at once (as they will train)."""
    workers = {name: subprocess.Popen(
        [sys.executable, "-m", "training.timed_sweep", "--step-seconds", name, "--calibration-steps", str(steps),
         "--device", device], env={**os.environ, "OMP_NUM_THREADS": str(threads)}, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True)
        for name in names}
    seconds = {}
    for name, worker in workers.items():
        out, _ = worker.communicate()
        if worker.returncode != 0:
            raise RuntimeError(f"calibrating {name} failed (exit {worker.returncode})")
        seconds[name] = float(out.strip().splitlines()[-1])
    return seconds


def epochs_that_fit(step_s: float, seconds_left: float, batch_size: int, epoch_size: int, valid_size: int,
                    eval_batch_size: int) -> int:
    """Epochs of this step time that fit ``seconds_left``: each epoch's steps, its validation (a forward pass of
    a batch twice the size costs about a training step's time at these sizes, where dispatch dominates) and a
    second for saving, with 15 % to spare."""
    steps = math.ceil(epoch_size / batch_size) + math.ceil(valid_size / eval_batch_size)
    return max(1, min(MAX_EPOCHS, int(seconds_left / (1.15 * (steps * step_s + 1.0)))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.timed_sweep", description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="../shared/data/pcam_public")
    parser.add_argument("--runs-dir", default="../runs/pcam_timed")
    parser.add_argument("--budget-s", type=float, default=480.0, help="wall clock for everything, packing included")
    parser.add_argument("--finish-s", type=float, default=45.0,
                        help="kept for each run's final evaluation and the packing")
    parser.add_argument("--pack", default="", help="tar file to write every run's results to")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--threads", type=int, default=3, help="CPU threads per run")
    parser.add_argument("--only", default="", help="comma-separated names of RUNS (default: all)")
    parser.add_argument("--calibration-steps", type=int, default=20, help="timed steps per run (after 5 warm-up)")
    parser.add_argument("--step-seconds", default="", help=argparse.SUPPRESS)  # a calibration worker
    args = parser.parse_args(argv)
    if args.step_seconds:
        print(step_seconds(RUNS[args.step_seconds], args.calibration_steps, args.device))
        return 0
    started = time.time()
    deadline = started + args.budget_s
    # The validation split, evaluated after every epoch, counted from the data the runs will read.
    try:
        valid_size = sum(record.split == "valid" for record in read_labels(Path(args.data_dir)))
    except DataError as error:
        parser.error(str(error))
    names = [n for n in RUNS if not args.only or n in args.only.split(",")]
    unknown = set(args.only.split(",")) - set(RUNS) if args.only else set()
    if unknown:
        parser.error(f"unknown runs {sorted(unknown)}; known: {', '.join(RUNS)}")
    cache = subprocess.Popen([sys.executable, "-c", "import sys; from training.data import load_dataset; "
                              "load_dataset('pcam_public', sys.argv[1])", args.data_dir])
    step_s = _calibrate(names, args.calibration_steps, args.device, args.threads)
    if cache.wait() != 0:
        raise RuntimeError(f"reading {args.data_dir} failed (exit {cache.returncode})")
    print(f"calibration ({time.time() - started:.0f} s): "
          + ", ".join(f"{n} {1000 * s:.0f} ms a step" for n, s in step_s.items()), flush=True)
    from .presets import recipe

    preset = recipe("pcam_public")
    seconds_left = deadline - time.time() - args.finish_s - 20  # 20 s: each run's start (imports, cache, CUDA)
    runs_dir = Path(args.runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)
    workers = {}
    for name in names:
        epochs = epochs_that_fit(step_s[name], seconds_left, preset.batch_size, preset.epoch_size, valid_size,
                                 preset.eval_batch_size)
        command = [sys.executable, "-m", "training", "train", "pcam_public", "--out", str(runs_dir / name),
                   "--data-dir", args.data_dir, "--device", args.device, "--threads", str(args.threads),
                   "--epochs", str(epochs), *COMMON, *RUNS[name]]
        print(f"{name}: {epochs} epochs: {' '.join(command[1:])}", flush=True)
        with open(runs_dir / f"{name}.log", "w") as log:
            workers[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    for name, worker in workers.items():
        try:
            worker.wait(timeout=max(1.0, deadline - time.time() - 15))
        except subprocess.TimeoutExpired:
            worker.terminate()  # its best checkpoint so far stays, with a provisional card
            worker.wait()
            print(f"{name}: stopped at the deadline", flush=True)
        else:
            print(f"{name}: exit {worker.returncode}", flush=True)
    if args.pack:
        with tarfile.open(args.pack, "w") as tar:
            for name in names:
                for path in [runs_dir / f"{name}.log", *sorted((runs_dir / name).glob("*"))]:
                    if path.is_file():
                        tar.add(path, arcname=str(path.relative_to(runs_dir)))
        print(f"packed {args.pack} ({os.path.getsize(args.pack) / 2**20:.1f} MiB)")
    print(json.dumps({"wall_s": round(time.time() - started, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
