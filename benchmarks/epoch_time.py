"""Where a rot-MNIST training epoch's time goes, per model, before and after the CPU dropout, in one run.

For each model this runs the real ``train_one_epoch`` twice on the real rot-MNIST training split (recipe batch
128, seeded alike): once with ``torch.nn.Dropout`` swapped in ("before": it draws its mask with
``bernoulli_``) and once with the library's ``models.Dropout`` ("after"). Beside them, from one instrumented
epoch: batching (indexing the in-memory arrays and normalising), forward, backward, optimiser step; then the
validation pass (2,000 digits) and the per-epoch bookkeeping of the loop (state file, logs, curves plot).

Run from the repository root (rot-MNIST under data/rot_mnist, e.g. after ``python -m training train rot_mnist
--fetch``)::

    python -m benchmarks.epoch_time --threads 2
    python -m benchmarks.epoch_time --models a_p4cnn --steps 20     # first 20 steps, scaled to the epoch
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models import build_model
from models.dropout import Dropout
from training.curves import plot_curves
from training.data import load_dataset
from training.distributed import setup
from training.evaluation import Normaliser, evaluate
from training.loop import build_optimizer, train_one_epoch
from training.presets import recipe
from training.run_files import save_state, write_log

MODELS = ["z2cnn", "p4cnn", "fa_p4cnn", "a_p4cnn"]


def with_torch_dropout(model: nn.Module) -> nn.Module:
    """The model as it was before: every ``models.Dropout`` replaced by ``nn.Dropout`` of the same p."""
    for name, child in model.named_children():
        if isinstance(child, Dropout):
            setattr(model, name, nn.Dropout(child.p))
        else:
            with_torch_dropout(child)
    return model


def timed_epoch(cfg, splits, normalise, ctx, torch_dropout: bool, steps: int) -> float:
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, dropout=cfg.dropout)
    if torch_dropout:
        with_torch_dropout(model)
    optimizer = build_optimizer(cfg, model)
    start = time.perf_counter()
    train_one_epoch(model, optimizer, splits.train, normalise, cfg, ctx, epoch=0, max_steps=steps)
    return time.perf_counter() - start


def breakdown(cfg, splits, normalise, steps: int) -> dict[str, float]:
    """Seconds per step spent batching, forward, backward and in the optimiser (after)."""
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, dropout=cfg.dropout).train()
    optimizer = build_optimizer(cfg, model)
    order = np.random.default_rng(0).permutation(len(splits.train))
    parts = dict.fromkeys(("batching", "forward", "backward", "optimiser"), 0.0)
    for step in range(steps):
        ticks = [time.perf_counter()]
        images, labels = splits.train.get_batch(order[step * cfg.batch_size:(step + 1) * cfg.batch_size])
        images, labels = normalise(images), torch.from_numpy(labels)
        ticks.append(time.perf_counter())
        loss = F.cross_entropy(model(images), labels)
        ticks.append(time.perf_counter())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        ticks.append(time.perf_counter())
        optimizer.step()
        ticks.append(time.perf_counter())
        for name, begin, end in zip(parts, ticks[:-1], ticks[1:], strict=True):
            parts[name] += end - begin
    return {name: value / steps for name, value in parts.items()}


def bookkeeping_seconds(cfg) -> float:
    """One epoch's end as the loop does it at epoch 100: state file, logs, curves plot."""
    model = build_model(cfg.model, dropout=cfg.dropout)
    optimizer = build_optimizer(cfg, model)
    history = [{"epoch": e, "lr": 1e-3, "train_loss": 0.1, "train_error": 0.02, "valid_error": 0.02,
                "valid_nll": 0.1, "seconds": 10.0} for e in range(1, 101)]
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        save_state(Path(folder), {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 100})
        write_log(Path(folder), history)
        plot_curves(history, Path(folder) / "curves.png", title=cfg.model)
        return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma separated (default: the shipped four)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=0, help="time only the first N steps, scaled to the epoch")
    parser.add_argument("--data-dir", default="data/rot_mnist")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    splits = load_dataset("rot_mnist", args.data_dir)
    ctx = setup("cpu")
    normalise = Normaliser.for_spec(splits.spec, ctx.device)
    print(f"torch {torch.__version__}, {args.threads} threads; rot-MNIST {len(splits.train):,} training digits")
    print("| model | epoch before (s) | epoch after (s) | after / before | batching | forward | backward "
          "| optimiser | valid pass (s) | bookkeeping (s) | full recipe after (min) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        cfg = recipe("rot_mnist", model)
        epoch_steps = math.ceil(len(splits.train) / cfg.batch_size)
        steps = min(args.steps or epoch_steps, epoch_steps)
        scale = epoch_steps / steps
        before = timed_epoch(cfg, splits, normalise, ctx, True, steps) * scale
        after = timed_epoch(cfg, splits, normalise, ctx, False, steps) * scale
        parts = breakdown(cfg, splits, normalise, min(steps, 20))
        start = time.perf_counter()
        evaluate(build_model(model), splits.valid, normalise, ctx, batch_size=cfg.eval_batch_size)
        valid = time.perf_counter() - start
        book = bookkeeping_seconds(cfg)
        per_epoch = {name: f"{1000 * value:.0f} ms" for name, value in parts.items()}
        print(f"| {model} | {before:.1f} | {after:.1f} | {after / before:.2f} | {per_epoch['batching']} "
              f"| {per_epoch['forward']} | {per_epoch['backward']} | {per_epoch['optimiser']} | {valid:.1f} "
              f"| {book:.2f} | {cfg.epochs * (after + valid + book) / 60:.0f} ({cfg.epochs} epochs) |", flush=True)
    print("batching ... optimiser: per step (batch 128), after; an epoch is "
          f"{math.ceil(len(splits.train) / 128)} steps.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
