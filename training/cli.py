"""``python -m training``: list presets, train (resumable, one or many processes), run sweeps, evaluate a checkpoint.

    python -m training presets
    python -m training train rot_mnist --model a_p4cnn --fetch
    python -m training train rot_mnist --model a_p4cnn --resume          # after an interruption
    torchrun --nproc_per_node=4 -m training train pcam --data-dir data/pcam
    python -m training evaluate runs/rot_mnist-a_p4cnn-seed0/best.safetensors --data-dir data/rot_mnist
    python -m training sweep table1 --runs-dir ../runs                     # Table 1's runs: the missing ones
    python -m training provenance checkpoints                              # each card's commit: the code that ran?

Every field of the preset can be overridden: ``--epochs 5 --lr 0.01 --milestones 2,4``. What the runs say about
the paper (its tables, their claims, the records kept beside the cards) is ``python -m experiments``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing

import torch

from models import CheckpointError, load_checkpoint
from models.cpu.allocator import retain_freed_memory

from . import provenance, provenance_check
from .config import TrainConfig
from .data import DataError
from .evaluation import evaluate_checkpoint
from .loop import RunExistsError, fit
from .presets import PRESET_NOTES, PRESETS, recipe
from .sweep import SWEEPS, run_sweep

__all__ = ["main", "MOVED"]

# The commands that moved to python -m experiments; python -m training still runs them under these names, in a
# process of python -m experiments (training/__main__.py): the cards and records made before the move name that form.
MOVED = ("report", "table3", "intervals")


def _parser_for(field: dataclasses.Field):
    """How one config field is read from text: ints, floats, strings, comma lists, or 'none'."""
    hint = typing.get_type_hints(TrainConfig)[field.name]
    if hint == tuple[int, ...]:
        return lambda text: tuple(int(part) for part in text.split(",") if part.strip())
    if isinstance(hint, types.UnionType):  # float | None
        inner = next(arg for arg in typing.get_args(hint) if arg is not type(None))
        return lambda text: None if text.lower() == "none" else inner(text)
    return hint


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__.split("\n")[0],
                                     epilog="The paper's tables from the runs (report, table3, intervals) are "
                                            "python -m experiments; the form python -m training report|table3|"
                                            "intervals still runs them there.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("presets", help="list the presets and their values")

    train = commands.add_parser("train", help="train a model with a preset's recipe")
    train.add_argument("preset", choices=sorted(PRESETS))
    train.add_argument("--out", help="run folder (default runs/PRESET-MODEL-seedSEED)")
    train.add_argument("--resume", action="store_true", help="continue the run in --out where it stopped")
    train.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    train.add_argument("--threads", type=int, default=0, help="CPU threads for torch (default: torch's choice)")
    train.add_argument("--time-limit", type=float, default=0.0, metavar="SECONDS",
                       help="stop after the last epoch expected to end within SECONDS (then --resume continues)")
    hints = typing.get_type_hints(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        if hints[field.name] is bool:
            train.add_argument(flag, action="store_true", default=None, help="(preset value if not given)")
        else:
            train.add_argument(flag, type=_parser_for(field), metavar=field.name.upper(), help="override the preset")

    sweep = commands.add_parser("sweep", help="run a sweep's missing runs, resume cut-short ones, skip done ones")
    sweep.add_argument("name", choices=sorted(SWEEPS))
    sweep.add_argument("--runs-dir", default="../runs", help="run folders, outside the work tree (default ../runs)")
    sweep.add_argument("--models", type=_comma_list, help="only these models (comma separated)")
    sweep.add_argument("--seeds", type=lambda text: tuple(int(s) for s in _comma_list(text)),
                       help="only these seeds (comma separated)")
    sweep.add_argument("--threads", type=int, default=0, help="CPU threads for each run")
    sweep.add_argument("--parallel", type=_at_least_one, default=1,
                       help="runs at once (default 1, right for a CPU; on a GPU many small runs share it well)")
    sweep.add_argument("--time-limit", type=float, default=0.0, metavar="SECONDS",
                       help="start no run after SECONDS and stop each at the last epoch that fits (all resumable)")
    sweep.add_argument("--status", action="store_true", help="say what is done, cut short or missing; run nothing")

    provenance_check.add_arguments(commands.add_parser(
        "provenance", help="whether each card's commit is the code that ran (its recorded code hash)"))

    evaluate = commands.add_parser("evaluate", help="re-measure a checkpoint on its dataset")
    evaluate.add_argument("checkpoint")
    evaluate.add_argument("--data-dir", required=True)
    evaluate.add_argument("--split", default="test", choices=["train", "valid", "test"])
    evaluate.add_argument("--limit", type=int, default=0, help="only the first N images of the split")
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                 if getattr(args, f.name) is not None}
    preset = recipe(args.preset, overrides.get("model"))
    if "dataset" in overrides and "data_dir" not in overrides:
        overrides["data_dir"] = f"data/{overrides['dataset']}"
    return dataclasses.replace(preset, **overrides)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.command == "presets":
        for name, cfg in PRESETS.items():
            values = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(cfg).items()
                               if v != getattr(TrainConfig, k, object()))
            print(f"{name}: {PRESET_NOTES[name]}\n    {values}")
        return 0
    if args.command == "provenance":
        return provenance_check.run(args)
    if args.command == "sweep":
        unknown = set(args.models or ()) - set(SWEEPS[args.name].models)
        if unknown:
            print(f"error: {', '.join(sorted(unknown))} not in sweep {args.name}", file=sys.stderr)
            return 2
        missing = run_sweep(args.name, args.runs_dir, models=args.models, seeds=args.seeds, threads=args.threads,
                            parallel=args.parallel, time_limit=args.time_limit, status_only=args.status)
        return 0 if args.status or missing == 0 else 1
    # Training and evaluation allocate and free the same large activations every step; kept, they are reused
    # instead of faulted in afresh (a p4m DenseNet step 2x faster on CPU: benchmarks.densenet_step).
    retain_freed_memory()
    if args.command == "evaluate":
        return _evaluate(args)
    try:
        cfg = config_from_args(args)
    except (TypeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    out = args.out or f"runs/{args.preset}-{cfg.model}-seed{cfg.seed}"
    try:
        fit(cfg, out, resume=args.resume, preset=args.preset, device=args.device,
            command=provenance.command_line(argv), time_limit=args.time_limit)
    except (DataError, RunExistsError, CheckpointError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        torch.set_num_threads(threads)  # --threads is this run's: a caller in the same process keeps its own
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    """Print the measured metrics, and the card's claim beside them."""
    try:
        metrics = evaluate_checkpoint(args.checkpoint, args.data_dir, split=args.split, limit=args.limit)
        claimed = load_checkpoint(args.checkpoint)[1].get("metrics", {})
    except (CheckpointError, DataError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(metrics, indent=1))
    subset = args.split == "test" and args.limit and args.limit == claimed.get("test_first_n")
    key = "test_error_first_n" if subset else f"{args.split}_error"
    if key in claimed and (subset or not args.limit):
        print(f"{args.split} error {100 * metrics['error']:.2f}% measured; the card says {100 * claimed[key]:.2f}%")
    return 0
