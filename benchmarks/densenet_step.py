"""The PCam DenseNets before and after the speed work, side by side in one run: training step, inference batch,
peak memory.

    python -m benchmarks.densenet_step [--baseline 4ba8abb] [--models densenet p4m_densenet fa_p4m_densenet]
        [--batch 64] [--threads 2] [--repeats 3] [--rounds 2] [--json out.json]

Three set-ups, each as ``python -m training`` ran or runs with it:

* "before": the ``models`` package of a baseline commit (default: the code before the speed work), extracted
  with ``git archive`` into a temporary folder, with glibc's default allocator (freed activations go back to
  the system and are faulted in afresh next step);
* "after, glibc default": this tree's ``models``, same allocator: what the code changes alone give;
* "after": this tree's ``models`` with freed memory kept for reuse (:mod:`models.cpu.allocator`), as training
  runs since 2026-11-27;
* "after, PyTorch path": the same with ``AAGC_NATIVE=0`` (no compiled kernels); ``x torch``, "after" over it,
  must not exceed 1 on the CPU at hand (the header names its instruction set, as in ``benchmarks.train_step``).

Every measurement runs in a fresh process (this file with ``--worker``) with the one package on its path: a
training step (forward, cross-entropy, backward; median of ``--repeats`` after one warm-up) and an inference
batch (eval mode, ``inference_mode``), each with the process's peak RSS above its baseline after building the
model and the batch. Rounds alternate the set-ups, so that a machine whose speed drifts (other work, a training
run beside it) affects all alike; the ratio of the medians over rounds to "before" is the figure to read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    # Appended, not prepended: a worker's PYTHONPATH names the models package it measures, which must win.
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from benchmarks.train_step import describe_failure, instruction_sets, keep_freed_memory, max_rss_mib  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BASELINE = "4ba8abb"  # main before the DenseNet speed work (2026-11-26)
MODELS = ["densenet", "p4m_densenet", "fa_p4m_densenet"]
MODES = ("train", "infer")
# (label, which tree's models, keep freed memory, PyTorch's path only)
SETUPS = (("before", "baseline", False, False), ("after_default_malloc", "tree", False, False),
          ("after", "tree", True, False), ("after_pytorch", "tree", True, True))
SHOWN = {"after_default_malloc": "after, glibc default", "after": "after", "after_pytorch": "after, PyTorch path"}


def build_step(name: str, mode: str, batch: int, threads: int, keep_freed: bool = False):
    """``(model, step)``: a fresh model and its training step (forward, cross-entropy, backward) or inference
    batch (eval, ``inference_mode``) on a fixed random batch of 96 x 96 RGB patches; ``keep_freed``: freed
    memory kept for reuse, as training does (only this tree's ``models`` has the allocator)."""
    import torch
    import torch.nn.functional as F

    import models

    if keep_freed:
        keep_freed_memory()

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = models.build_model(name).train(mode == "train")
    x = torch.randn(batch, 3, 96, 96)
    labels = torch.randint(0, 2, (batch,))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        if mode == "train":
            F.cross_entropy(model(x), labels).backward()
        else:
            with torch.inference_mode():
                model(x)

    return model, step


def measure(name: str, mode: str, batch: int, threads: int, repeats: int, keep_freed: bool = False) -> dict:
    """One model's training step or inference batch, in this process (a worker)."""
    import models

    _, step = build_step(name, mode, batch, threads, keep_freed)
    base = max_rss_mib()

    def once() -> float:
        start = time.perf_counter()
        step()
        return time.perf_counter() - start

    once()  # warm-up: allocator pools, kernel builds, lazy initialisations
    times = [once() for _ in range(repeats)]
    return {"seconds": statistics.median(times), "times": times, "delta_mib": max_rss_mib() - base,
            "models_from": str(Path(models.__file__).parent.parent)}


def worker_result(code: Path, script: str, *worker_args: str, pytorch_path: bool = False) -> dict:
    """Run ``script --worker ...`` in a fresh process whose ``models`` is the package in folder ``code`` (with
    ``AAGC_NATIVE=0`` if ``pytorch_path``); its last line of output, as JSON, or ``{"error": ...}``."""
    env = dict(os.environ, PYTHONPATH=str(code), **({"AAGC_NATIVE": "0"} if pytorch_path else {}))
    proc = subprocess.run([sys.executable, script, "--worker", *worker_args], check=False, capture_output=True,
                          text=True, env=env, cwd=code)
    if proc.returncode != 0:
        return {"error": describe_failure(proc)}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_worker(code: Path, name: str, mode: str, args: argparse.Namespace, keep_freed: bool = False,
               pytorch_path: bool = False) -> dict:
    result = worker_result(code, str(Path(__file__).resolve()), name, "--mode", mode, "--batch", str(args.batch),
                           "--threads", str(args.threads), "--repeats", str(args.repeats),
                           *(["--keep-freed"] if keep_freed else []), pytorch_path=pytorch_path)
    if "error" not in result and Path(result["models_from"]).resolve() != code.resolve():
        return {"error": f"the worker imported models from {result['models_from']}, not {code}"}
    return result


def extract(commit: str, into: Path) -> None:
    """The ``models`` package of ``commit`` into folder ``into``."""
    archive = subprocess.run(["git", "archive", commit, "models"], cwd=REPO, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help="commit whose models package is 'before'")
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="before/after pairs per model and mode")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--keep-freed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args.worker, args.mode, args.batch, args.threads, args.repeats, args.keep_freed)))
        return 0

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    print(f"before: models of {args.baseline}, glibc's default allocator | after: this tree (HEAD "
          f"{head.stdout.strip()}), glibc's default and freed memory kept (as training) | batch {args.batch} "
          f"| threads {args.threads} | median of {args.repeats} per process, {args.rounds} alternating rounds | "
          f"load avg {os.getloadavg()[0]:.1f}\n{instruction_sets()}")
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        before = Path(scratch)
        extract(args.baseline, before)
        for name in args.models:
            for mode in MODES:
                runs = {label: [] for label, *_ in SETUPS}
                for _ in range(args.rounds):
                    for label, tree, keep_freed, pytorch_path in SETUPS:
                        code = before if tree == "baseline" else REPO
                        runs[label].append(run_worker(code, name, mode, args, keep_freed, pytorch_path))
                row = {"model": name, "mode": mode, "runs": runs}
                failed = [r["error"] for rs in runs.values() for r in rs if "error" in r]
                if failed:
                    row["error"] = failed[0]
                else:
                    for label, rs in runs.items():
                        row[f"{label}_s"] = statistics.median(r["seconds"] for r in rs)
                        row[f"{label}_mib"] = max(r["delta_mib"] for r in rs)
                    for label, *_ in SETUPS[1:]:
                        row[f"{label}_speedup"] = row["before_s"] / row[f"{label}_s"]
                    row["x_torch"] = row["after_s"] / row["after_pytorch_s"]
                results.append(row)
                print(line(row), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if any("error" in r for r in results) else 0


def line(row: dict) -> str:
    if "error" in row:
        return f"{row['model']:16s} {row['mode']:5s} FAILED: {row['error']}"
    parts = [f"{row['model']:16s} {row['mode']:5s} before {row['before_s']:6.3f} s {row['before_mib']:5.0f} MiB"]
    for label, *_ in SETUPS[1:]:
        parts.append(f"{SHOWN[label]} {row[f'{label}_s']:6.3f} s "
                     f"{row[f'{label}_mib']:5.0f} MiB {row[f'{label}_speedup']:.2f}x")
    parts.append(f"x torch {row['x_torch']:.2f}")
    return " | ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
