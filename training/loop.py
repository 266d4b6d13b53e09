"""The training loop: ``train_one_epoch``, then ``fit(cfg, run_dir)`` which resumes, selects on validation and
writes the final checkpoint with its card.

Every epoch draws its randomness (shuffling, augmentation, dropout) from
generators seeded by ``(seed, epoch, rank)`` alone, and the run state is saved
atomically after every epoch; so a run killed at any moment and resumed with
``resume=True`` repeats the lost epoch exactly and ends with the same weights
as an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from models import build_model, load_checkpoint, save_checkpoint
from models.checkpoint import load_state as load_weights
from models.warm_start import attentive_from_plain

from . import provenance
from .config import DATA_SOURCE_FIELDS, TrainConfig, config_differences, config_from_dict
from .curves import plot_curves
from .data import ConcatSplit, DataError, Split, Splits, load_dataset
from .distributed import Context, setup, shard, teardown
from .evaluation import Normaliser, evaluate, measure_equivariance, predict
from .metrics import classification_metrics, confidence_intervals
from .presets import PRESETS, recipe
from .run_files import BEST, STATE, load_state, save_state, write_log

__all__ = ["train_one_epoch", "epoch_order", "selection_score", "fit", "RunExistsError"]


CHECK_SUBSET = 5000
# The curves plot costs 0.2 s, 4 % of a Z2CNN epoch on two cores: redrawn every few epochs and at the end.
CURVES_EVERY = 10


class RunExistsError(RuntimeError):
    """The run folder already holds a run; resume it or choose another folder."""


def _seed(*parts: int) -> int:
    """A 63-bit seed mixed from small integers (``(seed, epoch, rank, stream)``), so streams never collide."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def build_optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def build_scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer):
    if cfg.cosine:
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=cfg.epochs)
    if cfg.plateau_patience > 0:
        return torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="min", factor=cfg.plateau_factor, patience=cfg.plateau_patience
        )
    if cfg.milestones:
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=list(cfg.milestones), gamma=cfg.lr_gamma)
    return None


def train_one_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    split: Split,
    normalise: Normaliser,
    cfg: TrainConfig,
    ctx: Context,
    epoch: int,
    max_steps: int = 0,
    averaged: torch.optim.swa_utils.AveragedModel | None = None,
) -> dict:
    """One pass over the training split in the epoch's seeded order; stops early after ``max_steps`` steps (if > 0).

    With ``averaged``, its exponential moving average of the weights (and BatchNorm statistics) follows every step.

    Returns ``{"train_loss", "train_error", "steps"}`` averaged over this rank's examples
    (with dropout on, as the model trains).
    """
    order = epoch_order(split, cfg, np.random.default_rng(_seed(cfg.seed, epoch, 0, 0)))  # the same on every rank
    augment_rng = torch.Generator().manual_seed(_seed(cfg.seed, epoch, ctx.rank, 1))
    torch.manual_seed(_seed(cfg.seed, epoch, ctx.rank, 2))  # dropout
    steps = math.ceil(len(order) / cfg.batch_size)
    if max_steps:
        steps = min(steps, max_steps)
    model.train()
    loss_sum = torch.zeros((), device=ctx.device)
    wrong = torch.zeros((), device=ctx.device)
    seen = 0
    bar = tqdm(range(steps), desc=f"epoch {epoch + 1}/{cfg.epochs}", disable=not ctx.is_main, leave=False,
               file=sys.stderr, dynamic_ncols=True)
    for step in bar:
        # Each global batch is cut into per-rank parts, so the examples of a step do not depend on the world size.
        indices = shard(order[step * cfg.batch_size : (step + 1) * cfg.batch_size], ctx)
        images, labels = split.get_batch(indices)
        images = torch.from_numpy(images)
        if cfg.augment == "flip_crop":
            from .data.augment import flip_and_crop  # CIFAR only

            images = flip_and_crop(images, augment_rng)
        elif cfg.augment.startswith("group_"):
            from .data.augment import STAIN_SCALES, group_and_stain, jpeg_recompress  # H&E only

            images = group_and_stain(images, augment_rng, **STAIN_SCALES[cfg.augment])
            if cfg.augment.endswith("jpeg"):
                images = jpeg_recompress(images, augment_rng)
        elif cfg.augment == "rotate":
            from .data.augment import random_rotation  # rot-MNIST

            images = random_rotation(images, augment_rng)
        elif cfg.augment == "redraw":
            from .data.augment import redraw_rotation  # rot-MNIST rebuilt from MNIST

            images = redraw_rotation(torch.from_numpy(split.get_upright(indices)), augment_rng)
        labels = torch.from_numpy(labels).to(ctx.device)
        with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
            logits = model(normalise(images)).float()
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if averaged is not None:
            averaged.update_parameters(model)
        with torch.no_grad():
            loss_sum += loss.detach() * len(labels)
            wrong += (logits.argmax(1) != labels).sum()
        seen += len(labels)
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}", lr=f"{optimizer.param_groups[0]['lr']:.2g}")
    bar.close()
    return {"train_loss": loss_sum.item() / seen, "train_error": wrong.item() / seen, "steps": steps}


def epoch_order(split: Split, cfg: TrainConfig, rng: np.random.Generator) -> np.ndarray:
    """The indices one epoch visits: permutations of the split (``uniform``), or draws by its ``sample_weights``.

    ``cfg.epoch_size`` (when > 0) sets the length; uniform epochs longer than the split chain permutations.
    """
    size = cfg.epoch_size or len(split)
    if cfg.sampling == "weighted":
        weights = getattr(split, "sample_weights", None)
        if weights is None:
            raise ValueError(f"sampling='weighted' needs a training split with sample_weights; "
                             f"{cfg.dataset}'s has none")
        return rng.choice(len(split), size=size, p=weights)
    return np.concatenate([rng.permutation(len(split)) for _ in range(math.ceil(size / len(split)))])[:size]


def selection_score(metrics: dict, select_on: str, epoch: int = 0) -> float:
    """The validation score a run minimises to select its checkpoint (AUC is negated; ``last``: later is better)."""
    if select_on == "last":
        return -float(epoch)
    return -metrics["auc"] if select_on == "auc" else metrics[select_on]


def _initialise_from(model: nn.Module, cfg: TrainConfig) -> None:
    """Start from the weights of ``cfg.init_from``: a checkpoint of the same architecture, or of its plain
    counterpart (an attentive model from the same network without attention, its attention starting as the
    identity: ``models.warm_start``)."""
    source, card = load_checkpoint(cfg.init_from)
    if card.get("arch") == cfg.model:
        load_weights(model, source.state_dict(), cfg.init_from)
        return
    try:
        attentive_from_plain(model, source.state_dict(), f"--init-from {cfg.init_from} ({card.get('arch')})")
    except ValueError as e:
        raise ValueError(f"--init-from {cfg.init_from} is a {card.get('arch')} checkpoint: neither {cfg.model} nor "
                         f"its plain counterpart ({e})") from None


def _build(cfg: TrainConfig) -> nn.Module:
    return build_model(cfg.model, **({} if cfg.dropout is None else {"dropout": cfg.dropout}))


def _card(cfg: TrainConfig, splits: Splits, ctx: Context, *, preset: str, command: str, invocations: list[str],
          invocation_hardware: list[dict | None], code: dict, extra: dict) -> dict:
    spec = splits.spec
    return {
        "input": {"size": spec.size, "channels": spec.channels, "mean": list(spec.mean), "std": list(spec.std),
                  "transposed": False},
        "dataset": {"name": spec.name, "source": spec.source, "notes": spec.notes,
                    "class_names": list(spec.class_names), "splits": splits.sizes(),
                    **({"test_files": list(spec.test_files)} if spec.test_files else {})},
        "class_names": list(spec.class_names),
        "training": {
            "preset": preset,
            "config": dataclasses.asdict(cfg),
            "command": command,
            "invocations": list(invocations),
            "invocation_hardware": list(invocation_hardware),
            **code,  # commit, and where recorded code_sha256 and commit_check
            "hardware": invocation_hardware[-1]["hardware"],  # this piece's, recorded as it started
            "processes": ctx.world_size,
            "torch": torch.__version__,
            **extra,
        },
        "notes": ([spec.notes] if spec.notes else []) + (
            ["trained on the training and validation splits together: its validation metrics are not held out"]
            if cfg.train_on_valid else []),
    }


def fit(
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    preset: str = "",
    device: str = "auto",
    command: str = "",
    time_limit: float = 0.0,
) -> dict | None:
    """Train, select on validation, evaluate on test, write ``best.safetensors`` with its final card.

    Args:
        cfg: the run.
        run_dir: folder for state, logs, curves and the checkpoint.
        resume: continue the run saved in ``run_dir`` (its config must equal ``cfg`` but for ``epochs``).
        preset: the preset's name, for the card.
        device: ``auto``, ``cpu`` or ``cuda``.
        command: the command line, for the card.
        time_limit: seconds this call may take (0: no limit); it stops after the last epoch that it expects to
            end within them, the run resumable as after any interruption (a lent GPU's minutes, a session's end).

    Returns:
        The final card, or None when the time limit stopped the run before its last epoch.
    """
    run_dir = Path(run_dir)
    ctx = setup(device)
    try:
        return _fit(cfg, run_dir, ctx, resume=resume, preset=preset, command=command or provenance.command_line(),
                    time_limit=time_limit)
    finally:
        teardown(ctx)


def _fit(cfg: TrainConfig, run_dir: Path, ctx: Context, *, resume: bool, preset: str, command: str,
         time_limit: float = 0.0) -> dict | None:
    called = time.time()
    state = _start_or_resume(cfg, run_dir, resume)
    if state.get("finished") and state["epoch"] >= cfg.epochs:
        if ctx.is_main:
            print(f"{run_dir} is already finished; its checkpoint is {run_dir / BEST}")
        return load_checkpoint(run_dir / BEST)[1]
    splits = load_dataset(cfg.dataset, cfg.data_dir, **({"fetch": True} if cfg.fetch else {}))
    normalise = Normaliser.for_spec(splits.spec, ctx.device)
    torch.manual_seed(cfg.seed)  # initialisation
    model = _build(cfg)
    if cfg.init_from and "model" not in state:
        _initialise_from(model, cfg)
    model = model.to(ctx.device)
    optimizer = build_optimizer(cfg, model)
    scheduler = build_scheduler(cfg, optimizer)
    # The weights evaluated, selected and saved: an exponential moving average of the trained ones, when asked for.
    averaged = (torch.optim.swa_utils.AveragedModel(
        model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(cfg.ema), use_buffers=True)
        if cfg.ema else None)
    selected = model if averaged is None else averaged.module
    if "model" in state:
        model.load_state_dict(state["model"])
        if averaged is not None:
            averaged.load_state_dict(state["averaged"])
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(state["scheduler"])
    trained = nn.parallel.DistributedDataParallel(model) if ctx.distributed else model
    calibration = splits.spec.num_classes == 2
    training = ConcatSplit(splits.train, splits.valid) if cfg.train_on_valid else splits.train
    if cfg.augment == "redraw":  # fail before the first step: no upright digits, or IDX files that do not match
        if not hasattr(training, "get_upright"):
            raise DataError(f"augment='redraw' needs the upright digits of rot-MNIST rebuilt from MNIST; "
                            f"{cfg.dataset} has none")
        training.get_upright(np.arange(1))
    history: list[dict] = state["history"]
    eval_args = dict(batch_size=cfg.eval_batch_size, max_batches=cfg.max_eval_batches)
    # The code as this piece starts: the code that trains it, whatever is edited while it runs (the card's
    # commit and code hash are the first piece's; each piece's own are kept beside its machine). Every invocation
    # is kept; the card's "command" is the one that trains the same run from scratch (no --resume): runs are
    # deterministic per epoch, so it reproduces the interrupted-and-resumed run exactly.
    first = record_invocation(state, command, provenance.hardware(ctx.device, ctx.world_size),
                              provenance.code_record())
    base_card = dict(preset=preset, command=provenance.from_scratch(command), invocations=state["invocations"],
                     invocation_hardware=state["invocation_hardware"], code=first)
    started = time.time() - state["seconds"]
    epoch = state["epoch"]
    epoch_seconds: list[float] = []  # this call's epochs (a resumed run's earlier ones may have run elsewhere)
    while epoch < cfg.epochs and not (cfg.max_steps and state["steps"] >= cfg.max_steps):
        if time_limit and not _another_epoch_fits(time_limit - (time.time() - called), epoch_seconds,
                                                  last=epoch + 1 == cfg.epochs, ctx=ctx):
            if ctx.is_main:
                print(f"stopped after epoch {epoch}/{cfg.epochs}: another would pass the time limit of "
                      f"{time_limit:.0f} s; the same command with --resume continues the run", flush=True)
            return None
        tick = time.time()
        lr = optimizer.param_groups[0]["lr"]
        budget = cfg.max_steps - state["steps"] if cfg.max_steps else 0
        row = train_one_epoch(trained, optimizer, training, normalise, cfg, ctx, epoch, budget, averaged)
        valid = evaluate(selected, splits.valid, normalise, ctx, calibration=calibration, **eval_args)
        score = selection_score(valid, cfg.select_on, epoch + 1)
        state["steps"] += row.pop("steps")
        epoch += 1
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            scheduler.step(score)
        elif scheduler is not None:
            scheduler.step()
        history.append({"epoch": epoch, "lr": lr, **row, "valid_error": valid["error"], "valid_nll": valid["nll"],
                        **({"valid_auc": valid["auc"]} if "auc" in valid else {}),
                        "seconds": round(time.time() - tick, 2)})
        # Runs saved before selection metrics existed kept their best validation error under this name.
        best = state.setdefault("best_valid_score", state.get("best_valid_error", math.inf))
        improved = score < best
        if improved:
            state["best_valid_score"], state["best_epoch"] = score, epoch
        if ctx.is_main:
            if improved:
                card = _card(cfg, splits, ctx, **base_card, extra={"epochs_completed": epoch, "provisional": True})
                card.update(metrics={"valid_error": valid["error"], "valid_nll": valid["nll"]},
                            equivariance_error=None)
                save_checkpoint(selected, run_dir / BEST, card)
            if averaged is not None:
                state["averaged"] = averaged.state_dict()
            state.update(epoch=epoch, seconds=time.time() - started, model=model.state_dict(),
                         optimizer=optimizer.state_dict(),
                         scheduler=scheduler.state_dict() if scheduler is not None else None)
            save_state(run_dir, state)
            write_log(run_dir, history)
            if epoch % CURVES_EVERY == 0 or epoch == cfg.epochs:
                plot_curves(history, run_dir / "curves.png", title=f"{cfg.model} on {cfg.dataset}")
            auc = f", valid AUC {valid['auc']:.4f}" if "auc" in valid else ""
            print(f"epoch {epoch}/{cfg.epochs}: train loss {row['train_loss']:.4f}, train error "
                  f"{100 * row['train_error']:.2f}%, valid error {100 * valid['error']:.2f}%, valid NLL "
                  f"{valid['nll']:.4f}{auc}"
                  f"{' (best)' if improved else ''}, {history[-1]['seconds']:.1f} s", flush=True)
        epoch_seconds.append(time.time() - tick)
        if ctx.distributed:
            torch.distributed.barrier()  # the other ranks read best.safetensors only once rank 0 has written it
    if ctx.distributed:
        state["max_parameter_difference_between_ranks"] = _rank_disagreement(model, ctx)
    return _finish(cfg, run_dir, ctx, splits, state, base_card, calibration, epoch, time.time() - started)


def _another_epoch_fits(seconds_left: float, epoch_seconds: list[float], *, last: bool, ctx: Context) -> bool:
    """Whether one more epoch is expected to end in ``seconds_left``: as long as this call's slowest so far (runs
    sharing a device speed up as others end, rarely slow down), half as long again for the last one's final
    evaluation. The first epoch of a call always runs: nothing measured yet says what an epoch costs here.
    Every rank follows rank 0, so that none waits at a barrier for ranks that stopped."""
    fits = not epoch_seconds or seconds_left >= max(epoch_seconds) * (1.5 if last else 1.0)
    if ctx.distributed:
        flag = torch.tensor([float(fits)], device=ctx.device)
        torch.distributed.broadcast(flag, 0)
        fits = bool(flag.item())
    return fits


def _rank_disagreement(model: nn.Module, ctx: Context) -> float:
    """Largest difference of any parameter between any rank and rank 0 (0.0 when DDP kept them in step).

    BatchNorm running statistics are left out: each rank's come from its own share of the batches.
    """
    flat = torch.cat([p.detach().flatten().double() for p in model.parameters()])
    copies = [torch.empty_like(flat) for _ in range(ctx.world_size)]
    torch.distributed.all_gather(copies, flat)
    return max((c - copies[0]).abs().max().item() for c in copies)


def record_invocation(state: dict, command: str, hardware: str, code: dict) -> dict:
    """Add this piece of the run to ``state``: its command to ``invocations`` and, at the same index in
    ``invocation_hardware``, the machine it runs on, the epoch it starts from and the code it runs (``code``:
    :func:`~training.provenance.code_record`'s commit, code hash and whether they agree),
    so that a run resumed elsewhere (a GPU's state finished on a CPU) or on newer code says which epochs ran where
    and on what; the card's ``hardware`` names the last piece's machine only, its ``commit`` the first piece's
    code. Pieces run before machines were recorded get None.

    Returns:
        The first piece's code (``state["code"]``), what the card records: a run begun before code hashes
        (its state has a ``commit`` and no ``code``) has its first piece's commit alone.
    """
    state.setdefault("invocations", []).append(command)
    pieces = state.setdefault("invocation_hardware", [])
    pieces += [None] * (len(state["invocations"]) - 1 - len(pieces))
    pieces.append({"hardware": hardware, "from_epoch": state["epoch"], **code})
    first = state.setdefault("code", {"commit": state["commit"]} if "commit" in state else dict(code))
    state.setdefault("commit", first["commit"])  # where code before code hashes reads it
    return first


def _start_or_resume(cfg: TrainConfig, run_dir: Path, resume: bool) -> dict:
    fresh = {"config": dataclasses.asdict(cfg), "epoch": 0, "steps": 0, "seconds": 0.0, "history": [],
             "best_valid_score": math.inf, "best_epoch": 0}
    if not resume:
        if (run_dir / STATE).exists():
            raise RunExistsError(f"{run_dir} already holds a run: pass --resume to continue it, or another --out")
        run_dir.mkdir(parents=True, exist_ok=True)
        return fresh
    state = load_state(run_dir)
    saved = config_from_dict(state["config"])
    # Only the length (to extend or cut short a run) and where the data comes from may change on resume;
    # anything else would be another run.
    if saved.cosine and saved.epochs != cfg.epochs:
        raise ValueError(f"{run_dir} follows a cosine schedule over {saved.epochs} epochs; its length cannot change")
    diff = config_differences(saved, cfg, ignore=DATA_SOURCE_FIELDS | {"epochs"})
    if diff:
        raise ValueError(f"{run_dir} was started with a different config; differences (saved, now): {diff}")
    state["config"] = dataclasses.asdict(cfg)
    return state


def _finish(cfg, run_dir, ctx, splits, state, base_card, calibration, epochs_done, seconds) -> dict:
    """Evaluate the model selected on validation on every split and write its final card."""
    model = _build(cfg)
    best, _ = load_checkpoint(run_dir / BEST)
    load_weights(model, best.state_dict(), str(run_dir / BEST))
    model = model.to(ctx.device).eval()
    normalise = Normaliser.for_spec(splits.spec, ctx.device)
    eval_args = dict(batch_size=cfg.eval_batch_size, max_batches=cfg.max_eval_batches)
    test_probs, test_labels = predict(model, splits.test, normalise, ctx, **eval_args)
    valid = evaluate(model, splits.valid, normalise, ctx, calibration=calibration, **eval_args)
    card = None
    if ctx.is_main:
        test = classification_metrics(test_probs, test_labels, calibration=calibration)
        # A subset that a test can re-measure in seconds: the first SUBSET test images.
        subset = classification_metrics(test_probs[:CHECK_SUBSET], test_labels[:CHECK_SUBSET])
        metrics = {"test_error": test.pop("error"), "test_nll": test.pop("nll"), "test_count": test.pop("count"),
                   "test_error_first_n": subset["error"], "test_first_n": subset["count"],
                   "valid_error": valid["error"], "valid_nll": valid["nll"]}
        metrics.update({f"test_{key}": value for key, value in test.items()})
        if "auc" in valid:
            metrics["valid_auc"] = valid["auc"]
        if calibration:
            metrics["test_intervals"] = confidence_intervals(test_probs, test_labels)
        equivariance = measure_equivariance(model, splits.test, normalise, cfg.equivariance_images)
        preset = base_card["preset"]
        extra = {"epochs_completed": epochs_done, "epochs_planned": cfg.epochs,
                 "recipe_epochs": recipe(preset, cfg.model).epochs if preset in PRESETS else None,
                 "best_epoch": state["best_epoch"],
                 **({"max_parameter_difference_between_ranks": state["max_parameter_difference_between_ranks"]}
                    if ctx.distributed else {}),
                 "steps": state["steps"], "wall_time_s": round(seconds, 1), "provisional": False}
        card = _card(cfg, splits, ctx, **base_card, extra=extra)
        card.update(metrics=metrics, equivariance_error=equivariance)
        card = save_checkpoint(model.cpu(), run_dir / BEST, card)
        state.update(finished=True)
        save_state(run_dir, state)
        print(f"done: test error {100 * metrics['test_error']:.2f}% (best epoch {state['best_epoch']}), "
              f"equivariance error {equivariance['max_relative_logit_error']}; {run_dir / BEST}", flush=True)
    return card
